"""``ssm-workbench eval MODEL... --tasks T1,T2``: lm-evaluation-harness tasks on models, as
runs of the store (workbench/train/eval_run.py).

MODEL: a Hugging Face causal LM (a local folder or a hub id such as
``state-spaces/mamba-130m-hf``), or ``run:N``, a finished ``lm`` run of the store (one still
training, or stopped, is refused: ``--allow-unfinished`` scores its last checkpoint, recorded
as ``run:N@stepS``, an evaluation of its own). Every model is checked before anything is
queued (workbench/execute/eval_queue.py ``preflight``: the run exists, is an lm run, has
finished; a folder has its weights whole and a tokenizer that fits them), each refusal one
line. Tasks:
lm-eval's own names (``lambada_openai``, ``hellaswag``, ...) and the tasks of the folders
given with ``--include`` (lm-eval YAML files with local data files). One run per model, queued
on the local scheduler like a training run; the command waits with a progress bar per run
(``--detach``: it returns at once; Ctrl-C leaves the runs going). ``--inline`` runs them in
this process instead, one after the other. Asking again for the same evaluation (same
model, tasks and settings, in the same ``--profile``) does not evaluate twice: a finished run
is shown again, an unfinished one goes on at its next task (``--fresh``: a new run).
Results: ``export --profile eval --metric acc,acc_norm,perplexity --cols eval_set`` (each value
with lm-eval's standard error beside it). ``--output-path DIR [--log-samples]`` also writes
lm-eval's own files, as ``lm_eval --output_path DIR --log_samples`` does (per task a
``results_<date>.json`` and ``samples_<task>_<date>.jsonl`` under ``DIR/<model>/``); the
folder is not part of the run's identity. Labels and model references are printed as written
(no rich markup or emoji codes: ``run:abc:`` is not ``run🔤``).
"""
from __future__ import annotations

import importlib.util
import shlex
import sys
import time

from workbench.execute import eval_queue

INSTALL_HINT = ("evaluation needs lm-evaluation-harness, an optional extra: "
                "pip install 'ssm-workbench[eval]' (or pip install 'lm-eval>=0.4')")


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="lm-evaluation-harness tasks on HF models or workbench LM runs "
                                    "(runs in the store)")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="a Hugging Face folder or hub id (owner/name), or run:N (a finished lm run)")
    p.add_argument("--from", dest="from_profile", metavar="PROFILE.toml",
                   help="an evaluation profile ([eval] table: models, tasks, settings) instead of "
                        "MODEL... and --tasks; its runs are the ones `run PROFILE.toml` queues")
    p.add_argument("--tasks", action="append", metavar="T1,T2",
                   help="lm-eval task names, comma-separated (repeatable; required without --from)")
    p.add_argument("--include", action="append", default=[], metavar="DIR",
                   help="a folder of lm-eval task YAML files (with local data files) whose tasks "
                        "--tasks may name (repeatable)")
    p.add_argument("--limit", type=float, help="at most this many documents per task (a fraction "
                   "if < 1): for a quick look, not for reported numbers")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: the task's, mostly 0)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--devices", type=int, default=1, metavar="N",
                   help="ranks, each holding the model, that split each task's documents (default 1; "
                        "on a GPU machine one GPU each)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights' dtype for Hugging Face models (default float32)")
    p.add_argument("--max-length", type=int, help="context length in tokens (default: the model "
                   "config's, else 2048 as lm-eval's hf model; a run's: its training seq_len)")
    p.add_argument("--bootstrap-iters", type=int, default=100000,
                   help="bootstrap resamples for standard errors of non-mean metrics such as "
                        "perplexity (lm-eval's default 100000; 0 = none)")
    p.add_argument("--output-path", metavar="DIR",
                   help="also write lm-eval's own files here, as lm_eval --output_path does: per task a "
                        "results_<date>.json under DIR/<model>/ (not part of the run's identity)")
    p.add_argument("--log-samples", action="store_true",
                   help="with --output-path: per task also samples_<task>_<date>.jsonl, every document's "
                        "prompt, responses and metrics (lm_eval --log_samples)")
    p.add_argument("--profile", default="eval", help="the store's profile name for these runs "
                   "(default 'eval'): what export/report --profile selects")
    p.add_argument("--label", action="append", default=[],
                   help="a display label per MODEL, in order (default: the model reference)")
    p.add_argument("--fresh", action="store_true", help="evaluate again even when the store holds "
                   "this evaluation")
    p.add_argument("--allow-unfinished", action="store_true",
                   help="score a run:N that has not finished (still training, stopped) at its last checkpoint; "
                        "recorded with the step (run:N@stepS), never as the run's result")
    p.add_argument("--executor", choices=["local", "slurm"],
                   help="where the runs execute (default: --from's profile's `executor`, else local); "
                        "slurm: one sbatch job per model (one task, one device)")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="a [slurm] setting for --executor slurm, e.g. partition=gpu, time=02:00:00, "
                        "gpus_per_run=0, setup='[\"module load cuda\"]' (repeatable; with --from: over "
                        "the profile's [slurm] table)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="queue the runs and return")
    mode.add_argument("--inline", action="store_true", help="run them in this process, no scheduler")
    mode.add_argument("--dry-run", action="store_true", help="check the models' references and the task "
                      "names (no network), list the runs; nothing queued, no store touched")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_eval)


def specs_of(args) -> list[dict]:
    from workbench.spec.eval_spec import eval_spec

    if args.from_profile:
        return _profile_specs(args)
    if not args.models or not args.tasks:
        raise ValueError("give MODEL... and --tasks, or --from PROFILE.toml")
    tasks = [t.strip() for arg in args.tasks for t in arg.split(",") if t.strip()]
    if args.label and len(args.label) != len(args.models):
        raise ValueError(f"--label given {len(args.label)} time(s) for {len(args.models)} model(s)")
    from pathlib import Path
    include = []
    for d in args.include:
        if not Path(d).expanduser().is_dir():
            raise ValueError(f"--include {d}: no such folder")
        include.append(str(Path(d).expanduser().resolve()))
    for model in args.models:
        bad = run_ref_problem(model)
        if bad:
            raise ValueError(bad)
    outputs = output_options(args)
    out = []
    for i, model in enumerate(args.models):
        # a local folder is stored by its absolute path: the worker runs elsewhere
        ref = str(Path(model).resolve()) if Path(model).expanduser().is_dir() else model
        out.append(eval_spec(ref, tasks, profile=args.profile,
                             label=args.label[i] if args.label else model,
                             include=include, limit=args.limit, num_fewshot=args.num_fewshot,
                             batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                             max_length=args.max_length, bootstrap_iters=args.bootstrap_iters,
                             devices=args.devices, allow_unfinished=args.allow_unfinished, **outputs))
    return out


def run_ref_problem(ref: str) -> str | None:
    """Why ``ref`` is no model reference when it starts with ``run:`` and what follows is not a
    run id (``run:abc``), in one line; else None (checked before lm-eval's task names)."""
    if ref.startswith("run:") and not ref[4:].isdigit():
        return f"model {ref!r}: a run is written run:N, N its id (a whole number), e.g. run:12"
    return None


def output_options(args) -> dict:
    """``--output-path DIR`` (an absolute path: the worker runs elsewhere) and ``--log-samples``
    as eval_spec options; --log-samples without a folder is refused (lm-eval's CLI refuses it too)."""
    from pathlib import Path

    if getattr(args, "log_samples", False) and not getattr(args, "output_path", None):
        raise ValueError("--log-samples writes lm-eval's per-document files into --output-path DIR: give it too")
    if not getattr(args, "output_path", None):
        return {}
    from workbench.spec.eval_profile import output_folder_problem

    why = output_folder_problem(args.output_path)
    if why:
        raise ValueError(f"--output-path {why}")
    out = Path(args.output_path).expanduser().resolve()
    return {"output_path": str(out), "log_samples": bool(args.log_samples)}


def _profile_specs(args) -> list[dict]:
    """The runs of evaluation profile ``--from`` (workbench/spec/eval_profile.py); MODEL and
    --tasks may not be given beside it (the profile says them). Sets ``args.profile``,
    ``args.executor`` and ``args.slurm_settings`` from it (--executor and --slurm are
    applied to the file as ``--set`` overrides, so they are validated with it); its task
    names are checked (a ProfileError naming the unknown ones)."""
    from workbench.spec.eval_profile import EvalProfile, check_tasks, eval_specs
    from workbench.spec.profile import ProfileError, load

    if args.models or args.tasks or args.include or args.label or args.output_path or args.log_samples:
        raise ValueError("--from PROFILE.toml names the models, tasks, task folders and outputs: give no "
                         "MODEL, --tasks, --include, --label, --output-path or --log-samples beside it "
                         "([eval] output_path, log_samples)")
    overrides = [f"slurm.{kv}" for kv in args.slurm]
    if getattr(args, "allow_unfinished", False):
        overrides.append("eval.allow_unfinished=true")
    if args.executor:
        overrides.append(f'executor="{args.executor}"')
    try:
        prof = load(args.from_profile, overrides=overrides)  # a ProfileError: cmd_eval prints it
    except ProfileError as e:  # named as typed here: --slurm K=V, --executor E (not --set)
        text = str(e).replace("from --set slurm.", "from --slurm ")
        raise ProfileError(text.replace(f'from --set executor="{args.executor}"', f"from --executor {args.executor}")) \
            from None
    if not isinstance(prof, EvalProfile):
        raise ValueError(f"{args.from_profile} is a training profile, not an evaluation profile (no [eval] "
                         f"table): `run {args.from_profile}` trains it")
    check_tasks(prof, args.from_profile, announce=lambda line: print(f"eval: {line}", file=sys.stderr))
    args.profile, args.executor, args.slurm_settings = prof.name, prof.executor, prof.slurm
    return eval_specs(prof)


def slurm_settings(args, device: str):
    """The SlurmSettings of ``--slurm KEY=VALUE`` (values parsed as TOML, a bare word as a
    string), checked as an evaluation profile's [slurm] table is; ValueError in one line."""
    import tomllib

    from pydantic import ValidationError

    from workbench.spec.eval_profile import slurm_refusal
    from workbench.spec.slurm_settings import SlurmSettings

    if args.slurm and args.executor != "slurm":
        raise ValueError("--slurm settings are for --executor slurm")
    values = {}
    for kv in args.slurm:
        key, sep, raw = kv.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--slurm {kv!r}: expected KEY=VALUE, e.g. partition=gpu")
        try:
            values[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            values[key.strip()] = raw
    try:
        settings = SlurmSettings(**values)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ValueError(f"--slurm {where}: unknown setting; known: "
                             f"{', '.join(SlurmSettings.model_fields)}") from None
        raise ValueError(f"--slurm {where}: {err['msg']}") from None
    bad = slurm_refusal(settings, device)
    if bad:
        raise ValueError(f"--slurm {bad[0]}: {bad[1]}")
    return settings


def check_task_names(specs: list[dict]) -> None:
    """Every task of ``specs`` is lm-eval's or an include folder's (lm-eval is installed:
    cmd_eval asked); a ValueError naming the unknown ones and their closest names."""
    from workbench.spec import lm_eval_tasks

    for tasks, include in dict.fromkeys((tuple(s["eval"]["tasks"]), tuple(s["eval"]["include"])) for s in specs):
        unknown = lm_eval_tasks.unknown_tasks(list(tasks), list(include),
                                              announce=lambda line: print(f"eval: {line}", file=sys.stderr))
        if unknown:
            raise ValueError(lm_eval_tasks.describe(unknown, list(include), own="--include DIR"))


def run_specs(store, specs: list[dict], profile: str, *, fresh: bool = False, quiet: bool = False,
              inline: bool = False, detach: bool = False, executor: str = "local", slurm=None,
              checked: bool = False) -> int:
    """Queue (or find) the runs of ``specs`` and start, wait for and summarise them: what
    ``eval`` does after reading its arguments, and ``run`` does for an evaluation profile.
    ``executor``: "local" (the scheduler of this machine) or "slurm" (an sbatch job per run
    with ``slurm``, a SlurmSettings; workbench/execute/slurm.py). The models are checked
    first (eval_queue.preflight, each refusal a line on stderr, exit 2) unless ``checked``
    says the caller did."""
    from workbench.cli.common import _console
    from workbench.execute.executor import ExecutorError
    from workbench.store.progress import command
    from workbench.train.eval_models import ModelRefError

    console = _console()
    try:
        if not checked:
            specs = eval_queue.preflight(store, specs)
        sources = eval_queue.sources(store, specs) if executor == "slurm" else {}
    except (ModelRefError, eval_queue.Refused) as e:  # one line a model
        for line in str(e).splitlines():
            print(f"eval: {line}", file=sys.stderr)
        return 2
    ids, notes = eval_queue.submit(store, specs, fresh)
    for line in notes:
        console.print(line, markup=False, highlight=False)
    if inline:
        _run_inline(store, ids)
        return _summary(store, ids, console, profile)
    try:
        eval_queue.start(store, ids, executor, slurm, sources)
    except ExecutorError as e:
        print(f"{executor}: {e}", file=sys.stderr)
        return 2
    where = " as Slurm jobs" if executor == "slurm" else ""
    if detach:
        console.print(f"queued run(s) {', '.join(map(str, ids))}{where}; `{command(store.root)} runs` to watch",
                      markup=False, highlight=False)
        return 0
    code = _wait(store, ids, console, quiet)
    if code is not None:
        return code
    return _summary(store, ids, console, profile)


def cmd_eval(args) -> int:
    from workbench.cli.common import _store

    if importlib.util.find_spec("lm_eval") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    from workbench.spec.profile import ProfileError

    args.slurm_settings = None
    try:
        specs = specs_of(args)  # with --from: the profile's task names are checked here
        if not args.from_profile:
            if args.executor == "slurm" or args.slurm:
                args.slurm_settings = slurm_settings(args, args.device)
            check_task_names(specs)
        if args.executor == "slurm" and args.inline:
            raise ValueError("--inline runs the evaluations in this process: not with --executor slurm")
        if (args.executor or "local") == "local":
            check_devices(specs)
        elif any(int(s["eval"].get("devices", 1)) > 1 for s in specs):
            raise ValueError("devices > 1 runs on this machine's scheduler; a Slurm evaluation is one "
                             "process (its ranks are not split across a job yet)")
    except ProfileError as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    store = None
    try:
        store, specs = checked_specs(args, specs)
    except ValueError as e:  # eval_queue.Refused, ModelRefError: one line a model
        for line in str(e).splitlines():
            print(f"eval: {line}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(specs, args)
    return run_specs(store if store is not None else _store(args), specs, args.profile, fresh=args.fresh,
                     quiet=args.quiet, inline=args.inline, detach=args.detach, executor=args.executor or "local",
                     slurm=args.slurm_settings, checked=True)


def checked_specs(args, specs: list[dict], create: bool | None = None):
    """(the store, or None where there is none and no model needs it; ``specs`` through
    eval_queue.preflight: a ValueError, one line a refused model). ``create`` (default: not
    a dry run) opens the store as a launch does; else no store is created: a ``run:N`` reads
    an existing one, and none at all means no such run (``run --dry-run`` and ``profile
    check`` of an evaluation profile ask the same)."""
    from workbench.cli.common import _store, store_root
    from workbench.store.progress import no_store_at

    store = None
    runs = any(s["model"].startswith("run:") for s in specs)
    if create if create is not None else not getattr(args, "dry_run", False):
        store = _store(args)
    elif runs and not no_store_at(store_root(args)):
        store = _store(args, create=False)
    if store is None and runs:
        first = next(s["model"] for s in specs if s["model"].startswith("run:"))
        raise ValueError(f"model {first}: no such run (no store at {store_root(args)})")
    return store, eval_queue.preflight(store, specs)


def check_devices(specs: list[dict]) -> None:
    """A run asking for more ranks than this machine has GPUs is refused before it is
    queued, in the scheduler's words (one rank per GPU; without a GPU they are CPU processes)."""
    from workbench.execute.scheduler import devices_refusal, visible_gpus

    gpus = visible_gpus()
    for s in specs:
        why = devices_refusal(int(s["eval"].get("devices", 1)), gpus, key="eval.devices")
        if why:
            raise ValueError(why)


def ranks_lines(specs: list[dict]) -> list[str]:
    """One line per distinct eval.devices > 1 of the runs: how many ranks each runs on (as
    `run --dry-run` says a training run's ranks)."""
    out: dict[str, None] = {}
    for s in specs:
        n = int(s["eval"].get("devices", 1))
        if n > 1:
            out[f"  ranks: {n} per run (each holds the whole model and scores 1 document in {n} of "
                f"each task; rank 0 gathers the metrics and writes the run)"] = None
    return list(out)


def _dry_run(specs: list[dict], args) -> int:
    """The runs ``eval`` would queue (task names checked, model references as given; no
    download, no store)."""
    from rich.table import Table
    from rich.text import Text

    from workbench.cli.common import _console

    console = _console()
    t = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("model", "checkpoint", "tasks", "include"):
        t.add_column(col, no_wrap=col in ("model", "checkpoint"))
    for s in specs:
        t.add_row(*(Text(v) for v in (s["label"], s["fields"].get("checkpoint", s["model"]),  # as typed: no markup
                                      ", ".join(s["eval"]["tasks"]), ", ".join(s["eval"]["include"]))))
    console.print(t)
    for line in ranks_lines(specs):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    where = " as Slurm jobs" if args.executor == "slurm" else ""
    console.print(f"{len(specs)} evaluation run(s) would be launched{where} into profile {args.profile!r} "
                  f"(models and task names checked; dry run: nothing queued)", markup=False, highlight=False, soft_wrap=True)
    return 0


def _run_inline(store, ids: list[int]) -> None:
    import os

    from workbench.train import worker

    for r in store.runs(ids=ids):
        if r.state == "pending" and store.mark_started(r.id, os.getpid(), "local", None):
            worker.run(str(store.root), r.id)


def _wait(store, ids: list[int], console, quiet: bool) -> int | None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from workbench.cli.common import STATE_STYLE, refresh
    from workbench.execute import scheduler
    from workbench.store.progress import command

    try:
        # the description holds the run's label as the user wrote it: plain text (no markup, no
        # emoji codes: a label "run:abc:" is not "run🔤"); the status is ours, with its colour markup
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.fields[status]}"),
                      TimeElapsedColumn(), console=console, disable=quiet) as progress:
            bars = {r.id: progress.add_task(f"#{r.id} {r.label}", total=1.0, status=r.state)
                    for r in store.runs(ids=ids)}
            while True:
                refresh(store)
                runs = store.runs(ids=ids)
                for r in runs:
                    status = f"[{STATE_STYLE[r.state]}]{r.state}[/]"
                    if r.total_steps:
                        status += f" {r.step}/{r.total_steps} task(s)"
                    progress.update(bars[r.id], completed=r.progress, status=status)
                if all(r.finished for r in runs):
                    return None
                revived = scheduler.revive(store)
                if revived is not None and not revived.restarted:
                    console.print(revived, style="red", markup=False, highlight=False)
                    return 1
                time.sleep(0.5)
    except KeyboardInterrupt:
        cmd = command(store.root)
        console.print(f"\ninterrupted: the evaluations go on in the background (`{cmd} runs` to "
                      f"watch, `{cmd} kill ID` to stop)", markup=False, highlight=False)
        return 130


def _summary(store, ids: list[int], console, profile: str) -> int:
    """Each run's numbers per task (acc, acc_norm, perplexity with standard errors); 1 if
    any run did not finish."""
    from rich.table import Table
    from rich.text import Text

    from workbench.store.progress import command

    runs = store.runs(ids=ids)
    res = store.results(ids)
    table = Table(title="lm-eval results", show_lines=False)
    for col in ("run", "model", "task", "acc", "acc_norm", "perplexity", "other"):
        table.add_column(col)
    for r in runs:
        for task, vals in sorted(res.get(r.id, {}).items()):
            if not task:
                continue
            cell = lambda m: (f"{vals[m]:.4f}" + (f" ± {vals[m + '_stderr']:.4f}"
                              if vals.get(m + "_stderr") is not None else "")) if vals.get(m) is not None else ""
            other = ", ".join(f"{k} {v:.4g}" for k, v in vals.items()
                              if v is not None and k not in ("acc", "acc_norm", "perplexity", "samples")
                              and not k.endswith("_stderr"))
            table.add_row(str(r.id), Text(r.label), Text(task), cell("acc"), cell("acc_norm"), cell("perplexity"),
                          other)
    console.print(table)
    bad = [r for r in runs if r.state != "finished"]
    for r in bad:
        first = (r.error or "").strip().splitlines()
        console.print(f"#{r.id} {r.label}: {r.state}: {first[0] if first else ''}", markup=False, highlight=False)
    if not bad:
        # the metrics these tasks measured (Table 3's first): a rolling task has no acc
        seen = {k for r in runs for task, vals in res.get(r.id, {}).items() if task for k, v in vals.items()
                if v is not None and k != "samples" and not k.endswith("_stderr")}
        metrics = [m for m in ("acc", "acc_norm", "perplexity") if m in seen] + sorted(
            seen - {"acc", "acc_norm", "perplexity"})
        console.print(f"Table: {command(store.root)} export --profile {shlex.quote(profile)} "
                      f"--metric {','.join(metrics or ['acc'])} --cols eval_set", markup=False, highlight=False,
                      soft_wrap=True)
    return 1 if bad else 0
