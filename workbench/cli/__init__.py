"""The ``ssm-workbench`` command.

    ssm-workbench                      open the TUI
    ssm-workbench run PROFILE.toml     replay a profile headlessly (progress bars)
    ssm-workbench run --dry-run PROFILE   the runs it would launch, with parameters and memory
    ssm-workbench export               comparison table from the store
    ssm-workbench export --format tensorboard [-o DIR]   runs as TensorBoard event files
    ssm-workbench score PROFILE        MAD score: per setting best over lr x wd, mean per task, over tasks
    ssm-workbench plot [PROFILE]       figures (PNG + SVG): curves, metric vs length, eval sets, scaling
    ssm-workbench serve                the TUI in a browser (127.0.0.1 by default)
    ssm-workbench eval MODEL... --tasks T1,T2 [--include DIR]   lm-eval tasks on HF models / lm runs
    ssm-workbench sample run:N|MODEL --prompt TEXT [--seed S]   text from an lm run / HF model, streamed
    ssm-workbench runs | show ID | kill ID...
    ssm-workbench models | tasks
    ssm-workbench profile check FILE...   validate; parameters and estimated peak memory
    ssm-workbench bench ...            speed/memory benchmark table
    ssm-workbench doctor [--json]      what this machine can do (GPU, kernels, store), and why not

``--store DIR`` (or ``$SSM_WORKBENCH_STORE``) picks the store; see workbench.store.
Exit codes: 0 success, 1 a run did not finish, 2 bad input (profile, arguments).
"""

from __future__ import annotations

import argparse
import sys

from workbench import __version__
from workbench.cli.common import STATE_STYLE
from workbench.cli.run import cmd_profile_check, cmd_run, cmd_tui
from workbench.cli.runs import cmd_kill, cmd_runs, cmd_show
from workbench.cli.tables import cmd_bench, cmd_doctor, cmd_export, cmd_models, cmd_report, cmd_score, cmd_tasks


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _table_output(p: argparse.ArgumentParser, tensorboard: bool = False) -> None:
    """A table command's output options (export, score); export also writes TensorBoard
    event files (a folder per run under --output, default <store>/tensorboard)."""
    p.add_argument("--format", choices=["md", "csv", "latex", "json"] + ["tensorboard"] * tensorboard,
                   default="md")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--output", "-o")


def _select_on(p: argparse.ArgumentParser, what: str, test_note: str) -> None:
    p.add_argument("--select-on", choices=["validation", "test"], default="validation",
                   help=f"split {what}: validation (eval set 'valid', the default) or test ({test_note})")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ssm-workbench", description="Compare sequence models from a terminal.")
    ap.add_argument("--version", action="version", version=f"ssm-workbench {__version__}")
    ap.add_argument("--store", help="store directory (default $SSM_WORKBENCH_STORE or ~/.local/share/ssm-workbench)")
    sub = ap.add_subparsers(dest="cmd")

    p = sub.add_parser("tui", help="open the terminal UI (the default)")
    p.add_argument("--profiles-dir", default="profiles")
    p.add_argument("--out", default=None, help="folder for figures and tables written from the "
                   "TUI, one folder per profile (default: the store folder's figures/)")
    p.set_defaults(fn=cmd_tui)

    p = sub.add_parser("run", help="replay a profile headlessly")
    p.add_argument("profile")
    p.add_argument("--jobs", type=int, help="concurrent CPU runs (default 1; GPU: see --runs-per-gpu)")
    p.add_argument("--runs-per-gpu", type=_positive_int, metavar="N",
                   help="concurrent runs per visible GPU (default: the profile's runs_per_gpu, else 1); "
                        "no effect on a machine without a GPU (use --jobs there)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile setting, e.g. --set task.data_path=/data/aclImdb "
                        "--set model.options.pretrained_mamba.path=/ckpt/mamba-130m-hf (repeatable)")
    p.add_argument("--fresh", action="store_true",
                   help="add every run anew (default: skip finished runs, resume unfinished ones)")
    p.add_argument("--executor", choices=["local", "slurm"],
                   help="where the runs execute (default: the profile's `executor`, else local); "
                        "slurm: one sbatch job per run with the profile's [slurm] settings")
    p.add_argument("--dry-run", action="store_true",
                   help="list the runs (model, task, seq_len, seed, params, estimated peak memory) "
                        "and their count; queue nothing, open no store")
    p.add_argument("--format", choices=["table", "json"], default="table",
                   help="--dry-run output: a table, or a JSON list with one object per run")
    p.add_argument("--force", action="store_true",
                   help="launch runs whose estimated peak memory exceeds the device's")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("export", help="print a comparison table, or write runs as TensorBoard event files")
    p.add_argument("--profile")
    p.add_argument("--metric", action="append", metavar="NAME[,NAME...]",
                   help="metric(s) to show, comma-separated and/or repeated: one table per metric "
                        "(default: bits_per_byte for a profile of lm runs, else accuracy, lm-eval's acc, "
                        "perplexity or loss, the first the runs hold; JSON without --metric holds every metric)")
    p.add_argument("--rows", help="run field(s) of the rows, comma-separated: model, task, "
                   "task_setting, seq_len, a grid key such as train.lr, eval_set, ... (default model)")
    p.add_argument("--cols", help="run field(s) of the columns (as --rows; default seq_len, eval_set for "
                   "evaluation runs, '' for none)")
    p.add_argument("--best-over", metavar="KEY[,KEY...]",
                   help="grid keys to select over (e.g. train.lr,train.weight_decay): each cell shows "
                        "the test numbers of the grid point with the best mean selection metric")
    _select_on(p, "the --best-over choice is made on", "labelled 'selected on test'")
    p.add_argument("--select-metric", metavar="NAME",
                   help="metric the --best-over choice maximises/minimises (default: the first "
                        "requested accuracy-like metric, else accuracy)")
    _table_output(p, tensorboard=True)
    p.add_argument("--include-unfinished", action="store_true")
    p.add_argument("--run", type=int, action="append", metavar="ID",
                   help="--format tensorboard: only these runs (repeatable; default every run of --profile)")
    p.add_argument("--scaling", action="store_true",
                   help="the scaling table instead: per model (and value of each other setting that "
                        "varies, e.g. task.tokenizer) the power-law fit of --metric (default loss) "
                        "against training FLOPs along size, a, b ± se, (E), compute multiplier vs "
                        "--reference; a row with < 3 sizes or a loss that does not fall says why")
    p.add_argument("--kind", choices=["table", "scaling"], default="table",
                   help="table (the default) or scaling (the same as --scaling)")
    p.add_argument("--reference", metavar="MODEL",
                   help="scaling: the model multipliers are against (default the profile's first)")
    p.add_argument("--irreducible", action="store_true", help="scaling: fit L = E + a C^-b")
    p.add_argument("--at", type=float, metavar="FLOPS",
                   help="scaling: the compute C* the multipliers are read at (default the geometric "
                        "mean of the smallest and largest measured compute)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="B",
                   help="scaling: standard errors from B resamples of the points (default: the fit's covariance)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("score", help="MAD score (mad-lab's rule): per model, per task and over tasks")
    p.add_argument("profile", help="profile file (its expansion gives the settings expected) or a profile "
                                   "name in the store")
    _select_on(p, "each setting's best grid point is chosen on", "mad-lab's rule; labelled 'selected on test'")
    p.add_argument("--best-over", metavar="KEY[,KEY...]",
                   help="grid keys to select over per setting (default train.lr,train.weight_decay, "
                        "those the runs have; '' for none)")
    p.add_argument("--allow-partial", action="store_true",
                   help="print the table although settings are unfinished (tasks show k/N settings, "
                        "the MAD score is marked partial)")
    _table_output(p)
    p.set_defaults(fn=cmd_score)

    p = sub.add_parser("report", help="published vs ours, from the store: reproduction tables of profiles")
    p.add_argument("profiles", nargs="+", help="profile files whose runs (finished, in --store) to report")
    p.add_argument("--into", metavar="FILE",
                   help="replace the report block of FILE (e.g. docs/RESULTS.md) instead of printing")
    p.add_argument("--digits", type=int, default=3)
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--profile")
    p.add_argument("--state", action="append", choices=list(STATE_STYLE))
    p.set_defaults(fn=cmd_runs)

    p = sub.add_parser("show", help="one run: settings, results, error")
    p.add_argument("id", type=int)
    p.set_defaults(fn=cmd_show)

    p = sub.add_parser("kill", help="kill runs")
    p.add_argument("ids", type=int, nargs="+")
    p.set_defaults(fn=cmd_kill)

    p = sub.add_parser("models", help="list the model registry")
    p.add_argument("--flops", action="store_true",
                   help="each entry's parameters and training FLOPs per token instead (models.compute)")
    p.add_argument("--seq-len", type=int, default=2048, help="with --flops: the sequence length")
    p.add_argument("--d-model", type=int, default=768, help="with --flops: the width (12 layers for "
                   "attention + MLP entries, 24 for one-mixer layers)")
    p.set_defaults(fn=cmd_models)
    sub.add_parser("tasks", help="list the task registry").set_defaults(fn=cmd_tasks)

    p = sub.add_parser("profile", help="profile tools")
    psub = p.add_subparsers(dest="pcmd", required=True)
    c = psub.add_parser("check", help="validate profiles")
    c.add_argument("files", nargs="+")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting before checking, as for `run --set`")
    c.add_argument("--force", action="store_true",
                   help="report runs that cannot fit in the device's memory without failing")
    c.set_defaults(fn=cmd_profile_check)

    p = sub.add_parser("doctor", help="what this machine can do (GPU, driver, kernels, store) and why not;"
                                      " exit 1 if the store is not writable")
    p.add_argument("--json", action="store_true", help="the rows as JSON (component, status, detail)")
    p.set_defaults(fn=cmd_doctor)

    from workbench.results import plot_cli  # each imports its heavy libraries only when run
    from workbench.execute import resume
    from workbench.cli import eval_cmd, sample, serve

    plot_cli.add_parser(sub)
    serve.add_parser(sub)
    eval_cmd.add_parser(sub)
    sample.add_parser(sub)
    resume.add_parser(sub)

    p = sub.add_parser("bench", help="speed/memory benchmark table (see `bench --help`)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":  # the benchmark has its own options, --help included
        from workbench.cli import bench

        return int(bench.main(argv[1:]) or 0)
    args = parser().parse_args(argv)
    from workbench.store import StoreError

    try:
        if not getattr(args, "fn", None):
            args.profiles_dir, args.out = "profiles", None
            return cmd_tui(args)
        return int(args.fn(args) or 0)
    except StoreError as e:  # a store that cannot be opened or written: one line, no traceback
        print(f"ssm-workbench: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
