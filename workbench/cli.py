"""The ``ssm-workbench`` command.

    ssm-workbench                      open the TUI
    ssm-workbench run PROFILE.toml     replay a profile headlessly (progress bars)
    ssm-workbench run --dry-run PROFILE   the runs it would launch, with parameters and memory
    ssm-workbench export               comparison table from the store
    ssm-workbench score PROFILE        MAD score: per setting best over lr x wd, mean per task, over tasks
    ssm-workbench plot [PROFILE]       figures (PNG + SVG): curves, metric vs length, eval sets
    ssm-workbench serve                the TUI in a browser (127.0.0.1 by default)
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
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workbench import __version__, slurm

STATE_STYLE = {"pending": "dim", "running": "cyan", "finished": "green", "failed": "red",
               "crashed": "magenta", "killed": "yellow", "preempted": "bold cyan"}


def _store(args):
    """The store of ``--store`` (or the default). One that cannot be written here opens
    read-only, said once on stderr; one that cannot be opened at all raises StoreError,
    which :func:`main` prints as one line."""
    from workbench.store import Store

    store = Store(args.store) if args.store else Store()
    if store.readonly:
        print(f"store {store.root} is read-only ({store.readonly_reason}): showing it as it is",
              file=sys.stderr)
    return store


def _console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or 160 columns when output is piped (tables
    would otherwise be squeezed to 80 and truncate run names)."""
    import shutil

    return Console(width=shutil.get_terminal_size((160, 24)).columns, stderr=stderr)


def _fmt(v, digits=4):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def refresh(store) -> None:
    """Bring the store up to date: dead local workers become crashed, Slurm runs get their
    rows ingested, their jobs submitted and their states read (workbench/slurm.py). A
    read-only store is left as it is (both do nothing there)."""
    store.reap()
    try:
        slurm.sync(store)
    except slurm.SlurmError as e:
        print(f"slurm: {e}", file=sys.stderr)


# --------------------------------------------------------------------------- commands
def cmd_tui(args) -> int:
    from workbench.tui.app import WorkbenchApp

    WorkbenchApp(store=_store(args), profiles_dir=Path(args.profiles_dir),
                 figures_dir=getattr(args, "out", None)).run()
    return 0


def cmd_profile_check(args) -> int:
    from workbench.spec.profile import ProfileError, expand, load, summary

    err = Console(stderr=True)
    code = 0
    for f in args.files:
        try:
            p = load(f, overrides=args.set)
        except ProfileError as e:  # soft_wrap: a long path must not break the one-line error
            err.print(str(e), markup=False, highlight=False, soft_wrap=True)
            code = 2
            continue
        n = len(expand(p))
        ests, why = _estimates(p)
        if why:
            print(f"{f}: {why}", file=sys.stderr)
            code = 2
            continue
        print(f"{'✓' if all(e.fits for e in ests) else '✗'} {f}: profile '{p.name}', {summary(p, n)}",
              flush=True)
        _print_estimates(_console(), ests, per_run=False)
        if _refuse_too_big(ests, args.force):
            code = 2
    return code


# --------------------------------------------------------------------------- estimates
def _estimates(prof, jobs: int | None = None, runs_per_gpu: int | None = None):
    """(each run's RunEstimate, None), or ([], why) when the profile's device is not here
    (train.device = "cuda" without a GPU); see workbench/spec/estimate.py."""
    from workbench.spec import estimate

    try:
        return estimate.estimate_profile(prof, estimate.share_of(prof, jobs, runs_per_gpu)), None
    except estimate.EstimateError as e:
        return [], str(e)


def _print_estimates(console: Console, ests, per_run: bool) -> None:
    """Parameters and estimated peak memory: one row per run, or (per_run False) one per
    model and length, seeds listed (they change no size)."""
    from workbench.spec.estimate import fmt_bytes, fmt_count

    rows: dict = {}
    for e in ests:
        # grouped: one row per distinct size (a grid over d_model or a task parameter gives several)
        key = (e.model, e.seq_len, e.seed) if per_run else (e.model, e.task, e.seq_len, e.params, e.peak)
        rows.setdefault(key, []).append(e)
    t = Table(box=None, pad_edge=False, show_edge=False)
    for c in ("model", "task", "L", "seed" if per_run else "seeds", "params", "est. peak", "device", "fits"):
        t.add_column(c, justify="right" if c in ("L", "params", "est. peak") else "left")
    for group in rows.values():
        e = group[0]
        fits = ("–" if e.limit is None else "yes" if e.fits else f"[red]no[/red] (> {fmt_bytes(e.limit)})")
        t.add_row(e.model, e.task, _fmt(e.seq_len), ",".join(dict.fromkeys(str(g.seed) for g in group)),
                  fmt_count(e.params), fmt_bytes(e.peak) if e.error is None else "? (see below)",
                  e.device, fits)
    console.print(t)
    limits = {e.limit_what for e in ests if e.limit_what}
    notes = sorted({e.error for e in ests if e.error})
    for what in sorted(limits):
        console.print(f"  limit: {what}", markup=False, highlight=False)
    for n in notes:
        console.print(f"  {n}", markup=False, highlight=False)


def _refuse_too_big(ests, force: bool) -> bool:
    """Say which runs cannot fit (the numbers and the limit); True when that refuses."""
    from workbench.spec.estimate import too_big

    bad = too_big(ests)
    if not bad:
        return False
    verb = "would not fit; going on because of --force" if force else "cannot fit"
    lines = [f"{len(bad)} run(s) {verb}:", *(f"  {e.refusal()}" for e in bad)]
    if not force:
        lines.append("lower train.batch_size, the sequence lengths, d_model or n_layers "
                     "(or pass --force to launch anyway)")
    print("\n".join(lines), file=sys.stderr)  # unwrapped: the numbers stay on one line
    return not force


def cmd_run(args) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from workbench import scheduler
    from workbench.spec.profile import ProfileError, load

    console = _console()
    try:
        prof = load(args.profile, overrides=args.set)
    except ProfileError as e:
        Console(stderr=True).print(str(e), markup=False, highlight=False, soft_wrap=True)
        return 2
    if args.executor:
        prof = prof.model_copy(update={"executor": args.executor})
    # the resource estimate, before anything is queued (and before the store is opened)
    ests, why = _estimates(prof, args.jobs, args.runs_per_gpu)
    if why:
        print(f"{args.profile}: {why}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(prof, ests, args)
    if _refuse_too_big(ests, args.force):
        return 2
    store = _store(args)
    try:
        ids = scheduler.submit(store, prof, jobs=args.jobs, runs_per_gpu=args.runs_per_gpu, fresh=args.fresh)
    except slurm.SlurmError as e:
        Console(stderr=True).print(f"slurm: {e}", markup=False, highlight=False)
        return 2
    done = [f"{len(getattr(ids, k))} {k}" for k in ("queued", "resumed", "restarted", "skipped", "attached")
            if getattr(ids, k, None)]
    where = " as Slurm jobs" if prof.executor == "slurm" else ""
    console.print(f"profile [bold]{prof.name}[/bold]: {len(ids)} run(s){where} (ids {ids[0]}–{ids[-1]}: "
                  f"{', '.join(done) or 'nothing to do'}); store {store.root}", highlight=False)
    for rid, why in getattr(ids, "refused", []):
        console.print(f"  run {rid} not requeued: {why}", markup=False, highlight=False)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                      console=console, transient=False, disable=args.quiet) as progress:
            bars = {}
            for r in store.runs(ids=ids):
                desc = f"#{r.id} {r.label} L={r.seq_len} s={r.seed}"
                bars[r.id] = progress.add_task(desc, total=1.0, status="pending")
            while True:
                refresh(store)
                runs = store.runs(ids=ids)
                for r in runs:
                    status = f"[{STATE_STYLE[r.state]}]{r.state}[/]"
                    if r.last_loss is not None:
                        status += f" loss {r.last_loss:.3f}"
                    if r.last_accuracy is not None:
                        status += f" acc {r.last_accuracy:.3f}"
                    if slurm.is_slurm(r):
                        status += f" [dim]{slurm.describe(r)}[/dim]"
                    if r.stall_note():
                        status += f" [yellow]stalled: {r.stall_note()}[/yellow]"
                    progress.update(bars[r.id], completed=r.progress, status=status)
                if all(r.finished for r in runs):
                    break
                if store.disk_full:  # reap could not record a dead worker: waiting would never end
                    console.print(f"[red]{store.disk_full}[/red]\nthe runs go on if they can "
                                  "(`ssm-workbench runs` to watch)", highlight=False)
                    return 1
                time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("\ninterrupted: the runs go on in the background "
                      "(`ssm-workbench runs` to watch, `ssm-workbench kill ID` to stop)")
        return 130
    runs = store.runs(ids=ids)
    bad = [r for r in runs if r.state != "finished"]
    _print_runs(console, runs)
    if bad:
        console.print(f"[red]{len(bad)} of {len(runs)} run(s) did not finish:[/red]")
        for r in bad:
            first = (r.error or "").strip().splitlines()
            console.print(f"  #{r.id} {r.label} L={r.seq_len} seed={r.seed}: {r.state}: "
                          f"{first[0] if first else ''}", markup=False, highlight=False)
        return 1
    console.print(f"all {len(runs)} run(s) finished. Table: ssm-workbench export --profile {prof.name}")
    return 0


def _worker_cell(r) -> str:
    """'1234@node1' (pid at the host's first name label): which process to look at or kill."""
    if r.pid is None and not r.host:
        return "–"
    return f"{r.pid if r.pid is not None else '?'}@{(r.host or '?').split('.')[0]}"


def _dry_run(prof, ests, args) -> int:
    """What `run` would launch: one row (or JSON object) per run, with its task setting and
    each grid value under its dotted key, and the count; no store is touched."""
    import json

    from workbench.spec.profile import expand, summary
    from workbench.spec.estimate import fmt_bytes, fmt_count

    specs = expand(prof)
    grid_keys = list(prof.sweep.grid)
    v2 = prof.schema_version >= 2
    refused = _refuse_too_big(ests, args.force)
    if args.format == "json":
        rows = []
        for spec, e in zip(specs, ests):
            row = e.to_dict()
            if v2:
                row["task_setting"] = spec.task_setting
                row.update(spec.grid or {})
            rows.append(row)
        print(json.dumps(rows, indent=1))
        return 2 if refused else 0
    console = _console()
    t = Table(box=None, pad_edge=False, show_edge=False)
    cols = ["model", "task", *(["setting"] if v2 else []), "L", "seed", *grid_keys, "params", "est. peak",
            "device", "fits"]
    for c in cols:
        t.add_column(c, justify="right" if c in ("L", "seed", "params", "est. peak", *grid_keys) else "left")
    for spec, e in zip(specs, ests):
        fits = ("–" if e.limit is None else "yes" if e.fits else f"[red]no[/red] (> {fmt_bytes(e.limit)})")
        t.add_row(e.model, e.task, *([spec.task_setting] if v2 else []), _fmt(e.seq_len), str(e.seed),
                  *(_fmt(spec.grid[k]) for k in grid_keys), fmt_count(e.params),
                  fmt_bytes(e.peak) if e.error is None else "? (see below)", e.device, fits)
    console.print(t)
    for what in sorted({e.limit_what for e in ests if e.limit_what}):
        console.print(f"  limit: {what}", markup=False, highlight=False)
    for n in sorted({e.error for e in ests if e.error}):
        console.print(f"  {n}", markup=False, highlight=False)
    where = " as Slurm jobs" if prof.executor == "slurm" else ""
    console.print(f"profile {prof.name}: {len(ests)} run(s) would be launched{where} "
                  f"({summary(prof, len(specs))}; dry run: nothing queued)", markup=False, highlight=False)
    return 2 if refused else 0


RUNS_HEADERS = ("id", "profile", "model", "task", "L", "seed", "state", "progress", "loss", "acc", "time",
                "device", "worker")
RUNS_RIGHT = {"id", "L", "seed", "progress", "loss", "acc", "time"}
BOXED_MAX = 300  # more runs than this: plain aligned columns (a rich Table of 5,000 rows takes ~9 s)


def _print_runs(console: Console, runs, progress_of=None) -> None:
    """The runs as a table, then one progress line per profile (``progress_of``: the runs
    to count progress over, default ``runs``; :mod:`workbench.store.progress`), then notes on
    stalled runs. Up to BOXED_MAX runs a boxed rich table, beyond that plain columns."""
    from rich.markup import escape

    from workbench.store import progress

    rows, states, stalled = [], [], []
    for r in runs:
        el = r.elapsed
        note = r.stall_note()
        if note:
            stalled.append((r, note))
        states.append((r.state, bool(note)))
        rows.append([str(r.id), r.profile, r.label, r.task, _fmt(r.seq_len), str(r.seed),
                     r.state + (" stalled" if note else ""), f"{100 * r.progress:.0f}%",
                     _fmt(r.last_loss), _fmt(r.last_accuracy), "–" if el is None else f"{el:.0f}s",
                     slurm.describe(r) if slurm.is_slurm(r) else (r.device or "–"), _worker_cell(r)])

    def state_markup(state: str, note: bool, text: str) -> str:
        # text: the cell as laid out (padded); the words styled as before
        word, rest = text[:len(state)], text[len(state):]
        if note:
            rest = rest.replace("stalled", "[yellow]stalled[/]", 1)
        return f"[{STATE_STYLE.get(state, '')}]{word}[/]{rest}"

    if len(rows) <= BOXED_MAX:
        t = Table(title=None, show_lines=False)
        for c in RUNS_HEADERS:
            t.add_column(c, justify="right" if c in RUNS_RIGHT else "left")
        for cells, (state, note) in zip(rows, states):
            cells = [escape(c) for c in cells]
            cells[6] = state_markup(state, note, cells[6])
            t.add_row(*cells)
        console.print(t)
    else:
        # written straight to the console's file: rich's markup parsing and rendering of
        # 5,000 lines took ~0.8 s; the state words get the same colours as ANSI codes
        from rich.style import Style

        widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(RUNS_HEADERS)]
        color = console.is_terminal and not console.no_color and console._color_system is not None

        def paint(text: str, style: str) -> str:
            return Style.parse(style).render(text, color_system=console._color_system) if color and style else text

        def line(cells):
            return "  ".join(c.rjust(w) if h in RUNS_RIGHT else c.ljust(w)
                             for c, w, h in zip(cells, widths, RUNS_HEADERS)).rstrip()

        at = sum(widths[:6]) + 2 * 6  # where the state column starts
        words = {}  # (state, stalled) -> the painted cell
        out = [paint(line(RUNS_HEADERS), "bold")]
        for cells, (state, note) in zip(rows, states):
            text = line(cells)
            if (state, note) not in words:
                cell = text[at:at + widths[6]]
                words[state, note] = (paint(state, STATE_STYLE.get(state, "")) + cell[len(state):].replace(
                    "stalled", paint("stalled", "yellow"), 1))
            out.append(text[:at] + words[state, note] + text[at + widths[6]:])
        console.file.write("\n".join(out) + "\n")
    for p in progress.by_profile(runs if progress_of is None else progress_of):
        console.print(p.text(), markup=False, highlight=False)
    for r, note in stalled:  # why a silent run is not called crashed, and what to do about it
        console.print(f"run {r.id}: {note}: {r.worker}; not declared crashed while its process exists "
                      f"(`kill -CONT {r.pid}` wakes a stopped one, `ssm-workbench kill {r.id}` stops it)",
                      markup=False, highlight=False)


def cmd_runs(args) -> int:
    """``runs``: the table, then each profile's progress (done/total, ETA), counted over
    all of its runs even when --state shows some of them."""
    from workbench.store.progress import table_runs

    store = _store(args)
    # as refresh(), but Slurm's sync is handed the light rows (it reads their info only):
    # the table shows no spec, and decoding 5,000 specs took ~0.5 s
    store.reap()
    everything = table_runs(store)
    try:
        if slurm.sync(store, runs=everything)["live"]:
            everything = table_runs(store)  # as the sync left them
    except slurm.SlurmError as e:
        print(f"slurm: {e}", file=sys.stderr)
    if args.profile:
        everything = [r for r in everything if r.profile == args.profile]
    runs = [r for r in everything if r.state in args.state] if args.state else everything
    if not runs:
        print(f"no runs in {store.root}" + (f" for profile {args.profile!r}" if args.profile else ""))
        return 0
    _print_runs(_console(), runs, progress_of=everything)
    return 0


def cmd_show(args) -> int:
    import json

    store = _store(args)
    store.reap()
    r = store.get(args.id)
    if r is None:
        print(f"no run {args.id}", file=sys.stderr)
        return 2
    c = Console()
    c.print(f"run #{r.id}: {r.label} ({r.model}) on {r.task} L={r.seq_len} seed={r.seed}: "
            f"[{STATE_STYLE[r.state]}]{r.state}[/]")
    c.print(f"worker: {r.worker or 'not started'}" + (f" ({r.device})" if r.device else ""),
            markup=False, highlight=False)
    note = r.stall_note()
    if note:
        c.print(f"[yellow]stalled:[/yellow] {note}; not declared crashed while its process exists")
    c.print_json(json.dumps({"spec": r.spec, "info": r.info}, default=str))
    res = store.results([r.id]).get(r.id, {})
    for es, vals in sorted(res.items()):
        c.print(f"results{f' [{es}]' if es else ''}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(vals.items())),
                highlight=False, markup=False)
    if r.error:
        c.print("[red]error:[/red]")
        c.print(r.error, markup=False, highlight=False)
    c.print(f"log: {r.log_path}")
    return 0


def cmd_kill(args) -> int:
    from workbench import scheduler

    store = _store(args)
    code = 0
    for i in args.ids:
        try:
            ok = scheduler.kill(store, i)
        except KeyError as e:
            print(str(e.args[0]), file=sys.stderr)
            code = 2
            continue
        print(f"run {i}: {'killed' if ok else 'had already ended'}")
    return code


def cmd_models(args) -> int:
    import models

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
    from workbench import report

    store = _store(args)
    store.reap()
    try:
        text = report.render(store, args.profiles, args.digits)
    except (prof.ProfileError, OSError) as e:
        print(e, file=sys.stderr)
        return 2
    if args.into:
        report.write_into(args.into, text)
        print(f"wrote the report block of {args.into} ({len(args.profiles)} profile(s))")
    else:
        print(text, end="")
    return 0


def cmd_export(args) -> int:
    from workbench import export

    store = _store(args)
    store.reap()
    states = ["finished"] if not args.include_unfinished else ["finished", "failed", "crashed", "killed",
                                                                 "preempted", "running"]
    recs = export.records(store, profile=args.profile, states=states)
    if not recs:
        print("no finished runs" + (f" for profile {args.profile!r}" if args.profile else "")
              + f" in {store.root}", file=sys.stderr)
        return 1
    rows = [f for f in (args.rows or "model").split(",") if f]
    cols = [f for f in (args.cols if args.cols is not None else "seq_len").split(",") if f]
    metrics = list(dict.fromkeys(m.strip() for text in (args.metric or ["accuracy"])
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
        text = export.render(recs, metrics, rows, cols, args.format, args.digits, best_over=best_over,
                             select_on=args.select_on, select_metric=args.select_metric,
                             json_all=not args.metric)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_score(args) -> int:
    """``ssm-workbench score PROFILE``: the MAD score table (workbench/results/score.py).
    0 printed, 1 settings unfinished (without --allow-partial) or nothing scored, 2 bad input."""
    from workbench.spec import profile as prof
    from workbench.results import score

    expected, name = None, args.profile
    if args.profile.endswith(".toml") or Path(args.profile).is_file():
        try:
            p = prof.load(args.profile, check_registries=False)
        except prof.ProfileError as e:
            print(e, file=sys.stderr)
            return 2
        name, expected = p.name, [s.fields for s in prof.expand(p)]
    store = _store(args)
    store.reap()
    if expected is None and name not in store.profiles():
        print(f"no profile {name!r} in {store.root}; known: {', '.join(store.profiles()) or 'none'}",
              file=sys.stderr)
        return 2
    over = [k.strip() for k in args.best_over.split(",") if k.strip()] if args.best_over is not None else None
    try:
        res = score.compute(store, name, expected, over, args.select_on)
    except score.ScoreError as e:
        print(e, file=sys.stderr)
        return e.code
    if res["missing"] and not args.allow_partial:
        print(f"{len(res['missing'])} setting(s) of {name!r} have unfinished runs; no MAD score over "
              f"fewer settings (--allow-partial shows one, marked partial):\n" + score.missing_text(res),
              file=sys.stderr)
        return 1
    text = score.render(res, args.format, args.digits)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_doctor(args) -> int:
    import json

    from workbench import doctor

    rows = doctor.probe(args.store)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
    else:
        doctor.render(rows, _console())
    return doctor.exit_code(rows)


def cmd_bench(args) -> int:
    from workbench import bench

    return bench.main(args.rest)


# --------------------------------------------------------------------------- parser
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


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

    p = sub.add_parser("export", help="print a comparison table")
    p.add_argument("--profile")
    p.add_argument("--metric", action="append", metavar="NAME[,NAME...]",
                   help="metric(s) to show, comma-separated and/or repeated: one table per metric "
                        "(default accuracy; JSON without --metric holds every metric)")
    p.add_argument("--rows", help="run field(s) of the rows, comma-separated: model, task, "
                   "task_setting, seq_len, a grid key such as train.lr, eval_set, ... (default model)")
    p.add_argument("--cols", help="run field(s) of the columns (as --rows; default seq_len, '' for none)")
    p.add_argument("--best-over", metavar="KEY[,KEY...]",
                   help="grid keys to select over (e.g. train.lr,train.weight_decay): each cell shows "
                        "the test numbers of the grid point with the best mean selection metric")
    p.add_argument("--select-on", choices=["validation", "test"], default="validation",
                   help="split the --best-over choice is made on: validation (eval set 'valid', "
                        "the default) or test (labelled 'selected on test')")
    p.add_argument("--select-metric", metavar="NAME",
                   help="metric the --best-over choice maximises/minimises (default: the first "
                        "requested accuracy-like metric, else accuracy)")
    p.add_argument("--format", choices=["md", "csv", "latex", "json"], default="md")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--output", "-o")
    p.add_argument("--include-unfinished", action="store_true")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("score", help="MAD score (mad-lab's rule): per model, per task and over tasks")
    p.add_argument("profile", help="profile file (its expansion gives the settings expected) or a profile "
                                   "name in the store")
    p.add_argument("--select-on", choices=["validation", "test"], default="validation",
                   help="split each setting's best grid point is chosen on: validation (eval set 'valid', "
                        "the default) or test (mad-lab's rule; labelled 'selected on test')")
    p.add_argument("--best-over", metavar="KEY[,KEY...]",
                   help="grid keys to select over per setting (default train.lr,train.weight_decay, "
                        "those the runs have; '' for none)")
    p.add_argument("--allow-partial", action="store_true",
                   help="print the table although settings are unfinished (tasks show k/N settings, "
                        "the MAD score is marked partial)")
    p.add_argument("--format", choices=["md", "csv", "latex", "json"], default="md")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--output", "-o")
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

    sub.add_parser("models", help="list the model registry").set_defaults(fn=cmd_models)
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

    from workbench import plot_cli, resume, serve  # each imports its heavy libraries only when run

    plot_cli.add_parser(sub)
    serve.add_parser(sub)
    resume.add_parser(sub)

    p = sub.add_parser("bench", help="speed/memory benchmark table (see `bench --help`)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":  # the benchmark has its own options, --help included
        from workbench import bench

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
