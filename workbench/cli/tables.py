"""``ssm-workbench models``, ``tasks``, ``report``, ``export``, ``score``, ``doctor`` and
``bench``: the registries, result tables and the machine's capabilities."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.table import Table

from workbench.cli.common import NoStore, _console, _store, command


def _write_out(text: str, output: str | None) -> int:
    """``text`` into ``output`` (saying so, with its full path), or onto stdout; exit code 0,
    or 1 with one line when the file cannot be written (a full disk): then nothing is left
    in its place (:func:`workbench.results.export.write_atomic`)."""
    from workbench.results.export import CannotWrite, write_atomic

    if output:
        try:
            path = write_atomic(Path(output).expanduser(), text)
        except CannotWrite as e:
            print(f"ssm-workbench: {e}", file=sys.stderr)
            return 1
        print(f"wrote {path.absolute()}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_models(args) -> int:
    import models

    if getattr(args, "flops", False):  # models.compute's table (no FlopCounterMode check)
        from models.compute import format_table, table_rows
        print(format_table(table_rows(args.d_model, args.seq_len, check=False), args.d_model,
                           args.seq_len))
        return 0
    t = Table("model", "family", "init", "description", "options")
    for n in models.names():
        e = models.entry(n)
        init = "checkpoint" if e.family == "pretrained" else e.init  # only the head is new
        t.add_row(n, e.family, init, e.description, ", ".join(f"{k}={v!r}" for k, v in e.options().items()))
    _console().print(t)
    print("init: the default init scheme, the one the model's reference code uses (mamba: "
          "state-spaces/mamba, tied head; hf: Hugging Face GPT-Neo, tied head; torch: PyTorch "
          "module defaults, untied; checkpoint: the checkpoint folder's weights, only the task "
          "head is initialised). Set init_scheme / init_std / tie_embeddings under [model] or per "
          "model; details in models/init_schemes.py.")
    return 0


def cmd_tasks(args) -> int:
    import tasks

    t = Table("task", "description", "parameters")
    for n in tasks.names():
        t.add_row(n, tasks.describe(n), ", ".join(f"{k}={v!r}" for k, v in tasks.parameters(n).items()))
    _console().print(t)
    return 0


def cmd_report(args) -> int:
    from workbench.spec import profile as prof
    from workbench.results import report

    from workbench.results.export import CannotWrite

    store = _store(args, create=False)
    store.reap()
    try:
        text = report.render(store, args.profiles, args.digits)
    except (prof.ProfileError, OSError) as e:
        print(e, file=sys.stderr)
        return 2
    if args.into:
        try:
            report.write_into(args.into, text)
        except CannotWrite as e:  # a full disk: the file keeps its previous content
            print(f"ssm-workbench: {e}", file=sys.stderr)
            return 1
        print(f"wrote the report block of {args.into} ({len(args.profiles)} profile(s))")
    else:
        print(text, end="")
    return 0


def cmd_export(args) -> int:
    from workbench.results import export

    store = _store(args, create=False)
    store.reap()
    states = ["finished"] if not args.include_unfinished else ["finished", "failed", "crashed", "killed",
                                                                 "preempted", "running"]
    if getattr(args, "scaling", False) or getattr(args, "kind", "table") == "scaling":
        return _export_scaling(args, store, states)
    if args.format == "tensorboard":
        return _export_tensorboard(args, store, states)
    recs = export.records(store, profile=args.profile, states=states)
    if not recs:
        print("no finished runs" + (f" for profile {args.profile!r}" if args.profile else "")
              + f" in {store.root}", file=sys.stderr)
        return 1
    rows = [f for f in (args.rows or "model").split(",") if f]
    cols = [f for f in args.cols.split(",") if f] if args.cols is not None else export.default_cols(recs)
    metrics = list(dict.fromkeys(m.strip() for text in (args.metric or [export.default_metric(recs)])
                                 for m in text.split(",") if m.strip()))
    best_over = [k.strip() for k in args.best_over.split(",") if k.strip()] if args.best_over else []
    have = {k for r in recs for k in r}
    for m in metrics + ([args.select_metric] if args.select_metric else []):
        if m not in export.METRICS and m not in have:
            print(f"unknown metric {m!r}; known: {', '.join(export.METRICS)}", file=sys.stderr)
            return 2
    for f in ((args.rows or "").split(",") + (args.cols or "").split(",")):
        if f and f not in have:  # a field the user named (the defaults may be absent in old runs)
            print(f"no run has field {f!r}; fields: {', '.join(export.fields_of(recs))}", file=sys.stderr)
            return 2
    try:
        if args.format not in export.FORMATS:
            raise ValueError(f"unknown format {args.format!r}; expected md, csv, latex or json")
        b = export.build(recs, metrics, rows, cols, best_over, args.select_on, args.select_metric)
        text = export.render_built(b, cols, args.format, args.digits, json_all=not args.metric)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if b["added"]:  # like with like: said on stderr, so a CSV or JSON on stdout stays clean
        print(export.agg.split_note(b["added"]), file=sys.stderr)
    return _write_out(text, args.output)


def _export_tensorboard(args, store, states) -> int:
    """``export --format tensorboard``: one TensorBoard folder per run (curves, results,
    hparams; workbench/results/tensorboard.py) under --output (default <store>/tensorboard)."""
    from workbench.results import tensorboard as tb

    runs = store.runs(profile=args.profile, states=states, ids=args.run)
    if not runs:
        print("no finished runs" + (f" for profile {args.profile!r}" if args.profile else "")
              + (f" among run(s) {', '.join(map(str, args.run))}" if args.run else "")
              + f" in {store.root}", file=sys.stderr)
        return 1
    root = Path(args.output).expanduser() if args.output else tb.default_root(store.root)
    try:
        folders = tb.export_runs(store, runs, root)
    except tb.TensorBoardMissing as e:
        print(f"ssm-workbench: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        from workbench.results.export import cannot_write_text

        print(f"ssm-workbench: {cannot_write_text(root, e)}", file=sys.stderr)
        return 1
    print(f"wrote {len(folders)} run folder(s) of TensorBoard events under {root.absolute()}; "
          f"view them: tensorboard --logdir {shlex.quote(str(root.absolute()))}")
    return 0


def _export_scaling(args, store, states) -> int:
    """``export --scaling``: the fits of workbench/results/scaling.py as a table, one row per
    model and value of every setting that is not its size; a row that is no law says why in
    the table (its status), and when no row is one a line on stderr says so. 2 when there is
    nothing to fit or the input is bad."""
    from workbench.results import scaling

    metrics = [m.strip() for text in (args.metric or ["loss"]) for m in text.split(",") if m.strip()]
    if len(metrics) != 1:
        print(f"--scaling fits one metric; got {', '.join(metrics)}", file=sys.stderr)
        return 2
    try:
        res = scaling.analyse(store, args.profile, metrics[0], "irreducible" if args.irreducible else "power",
                              reference=args.reference, at=args.at, bootstrap=args.bootstrap, states=states)
        text = scaling.render(res, args.format, args.digits)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not res["fits"]:
        print(f"no scaling law among the {len(res['groups'])} row(s): each says why", file=sys.stderr)
    return _write_out(text, args.output)


def cmd_score(args) -> int:
    """``ssm-workbench score PROFILE``: the MAD score table (workbench/results/score.py).
    0 printed, 1 settings unfinished (without --allow-partial) or nothing scored, 2 bad input."""
    from workbench.spec import profile as prof
    from workbench.results import score

    expected, name, source = None, args.profile, None
    if args.profile.endswith(".toml") or Path(args.profile).is_file():
        try:
            p = prof.load(args.profile, check_registries=False)
        except prof.ProfileError as e:
            print(e, file=sys.stderr)
            return 2
        if isinstance(p, prof.EvalProfile):
            print(f"{args.profile}: an evaluation profile has no MAD score (`report {args.profile}` "
                  f"shows its numbers)", file=sys.stderr)
            return 2
        name, expected, source = p.name, [s.fields for s in prof.expand(p)], args.profile
    try:
        store = _store(args, create=False)  # reading: a missing store is said, not made
    except NoStore as e:
        if expected is None:
            raise
        print(f"nothing of profile {name!r} has run: no store in {e.root} yet, none of its "
              f"{score.size_text(expected)}\n" + _run_hint(e.root, source), file=sys.stderr)
        return 1
    store.reap()
    if expected is None and name not in store.profiles():
        print(f"no profile {name!r} in {store.root}; known: {', '.join(store.profiles()) or 'none'}",
              file=sys.stderr)
        return 2
    over = [k.strip() for k in args.best_over.split(",") if k.strip()] if args.best_over is not None else None
    try:
        res = score.compute(store, name, expected, over, args.select_on)
    except score.ScoreError as e:
        hint = "" if e.code != 1 else "\n" + (_run_hint(store.root, source) if not e.ran else
                                              _wait_hint(store.root, name, source))
        print(f"{e}{hint}", file=sys.stderr)
        return e.code
    if res["missing"] and not args.allow_partial:
        print(f"{name!r}: {score.missing_count(res)} have unfinished runs; no MAD score over "
              f"fewer settings (--allow-partial shows one, marked partial):\n" + score.missing_text(res),
              file=sys.stderr)
        return 1
    text = score.render(res, args.format, args.digits)
    return _write_out(text, args.output)


def _run_hint(root, source: str | None) -> str:
    """What to type to run a profile's runs (its file when the user named one)."""
    return f"run them: `{command(root)} run {shlex.quote(source) if source else 'PROFILE.toml'}`"


def _wait_hint(root, name: str, source: str | None) -> str:
    """Where a profile's unfinished runs are, and how to finish them."""
    cmd = command(root)
    return (f"see where they are: `{cmd} runs --profile {shlex.quote(name)}`; replaying the profile "
            f"resumes unfinished ones: `{cmd} run {shlex.quote(source) if source else 'PROFILE.toml'}`")


def cmd_doctor(args) -> int:
    import json

    from workbench.cli import doctor

    rows = doctor.probe(args.store)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
    else:
        doctor.render(rows, _console())
    return doctor.exit_code(rows)


def cmd_bench(args) -> int:
    from workbench.cli import bench

    return bench.main(args.rest)


# --------------------------------------------------------------------------- parser
