"""``ssm-workbench run`` (and ``--dry-run``), ``profile check`` and ``tui``: a profile's
estimates, its launch and its progress bars."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workbench.cli.common import STATE_STYLE, _console, _fmt, _store, refresh
from workbench.cli.runs import _print_runs
from workbench.execute.executor import ExecutorError, describe
from workbench.store.progress import command


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

    from workbench.execute import scheduler
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
    except ExecutorError as e:
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
                    where = describe(r)
                    if where:
                        status += f" [dim]{where}[/dim]"
                    if r.stall_note():
                        status += f" [yellow]stalled: {r.stall_note()}[/yellow]"
                    progress.update(bars[r.id], completed=r.progress, status=status)
                if all(r.finished for r in runs):
                    break
                if store.disk_full:  # reap could not record a dead worker: waiting would never end
                    console.print(f"[red]{store.disk_full}[/red]\nthe runs go on if they can "
                                  f"(`{command(store.root)} runs` to watch)", highlight=False)
                    return 1
                # a scheduler killed mid-sweep starts no more runs: this process spawned it
                # and is the one waiting, so it starts it again (or says why it stops waiting)
                revived = scheduler.revive(store)
                if revived is not None:
                    console.print(revived, style=None if revived.restarted else "red",
                                  markup=False, highlight=False, soft_wrap=True)
                    if not revived.restarted:
                        return 1
                time.sleep(0.5)
    except KeyboardInterrupt:
        cmd = command(store.root)
        console.print(f"\ninterrupted: the runs go on in the background "
                      f"(`{cmd} runs` to watch, `{cmd} kill ID` to stop)", markup=False, highlight=False)
        return 130
    runs = store.runs(ids=ids)
    bad = [r for r in runs if r.state != "finished"]
    _print_runs(console, runs, store_root=store.root)
    if bad:
        console.print(f"[red]{len(bad)} of {len(runs)} run(s) did not finish:[/red]")
        for r in bad:
            first = (r.error or "").strip().splitlines()
            console.print(f"  #{r.id} {r.label} L={r.seq_len} seed={r.seed}: {r.state}: "
                          f"{first[0] if first else ''}", markup=False, highlight=False)
        return 1
    # typed as this command was (./run.sh, the venv's path), so that it works when pasted
    console.print(f"all {len(runs)} run(s) finished. Table: {command(store.root)} export --profile "
                  f"{shlex.quote(prof.name)}", markup=False, highlight=False, soft_wrap=True)
    return 0


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
