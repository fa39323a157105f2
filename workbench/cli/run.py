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
from workbench.execute.dispatch import describe
from workbench.execute.executor import ExecutorError
from workbench.store.progress import command


def cmd_tui(args) -> int:
    from workbench.tui.app import WorkbenchApp

    WorkbenchApp(store=_store(args), profiles_dir=Path(args.profiles_dir),
                 figures_dir=getattr(args, "out", None)).run()
    return 0


def cmd_profile_check(args) -> int:
    """Each file is valid (its runs' sizes and estimated peaks), invalid (each problem with
    its file, key and line; or runs that cannot fit here), or needs data: a profile whose
    [[needs]] (data sets, checkpoints the repository does not ship) are absent, with the
    commands that fetch them; that is no failure. Then one line of counts. Exit 2 only when
    some profile is invalid. While it works, a transient progress line on stderr (a
    terminal's) names the file and counts its runs' estimates."""
    from workbench.spec.profile import DataAbsent, EvalProfile, ProfileError, expand, load, summary

    err = Console(stderr=True)
    out = _console()
    valid = invalid = too_big = absent = unknown = 0
    with _Progress(len(args.files)) as progress:
        out, err = progress.console(out), progress.console(err)
        for i, f in enumerate(args.files):
            progress.file(i, f)
            try:
                p = load(f, overrides=args.set, check_data=True)
            except DataAbsent as e:
                absent += 1
                out.print(f"↓ {f}: profile '{e.profile.name}', {_summary(e.profile)}: needs data that is "
                          f"absent (not shipped with the repository; not an error). Fetch it from the "
                          f"directory you run ssm-workbench in, then check again:",
                          markup=False, highlight=False, soft_wrap=True)
                for n in e.needs:  # soft_wrap: a command must stay one line, to be pasted
                    out.print(f"    {n.path}{f' ({n.what})' if n.what else ''}:", markup=False, highlight=False,
                              soft_wrap=True)
                    out.print(f"      {n.fetch}", markup=False, highlight=False, soft_wrap=True)
                continue
            except ProfileError as e:  # soft_wrap: a long path must not break the one-line error
                err.print(str(e), markup=False, highlight=False, soft_wrap=True)
                invalid += 1
                continue
            if isinstance(p, EvalProfile):  # evaluations: no training estimate to make
                from workbench.spec.eval_profile import check_tasks

                progress.step("checking lm-eval task names (the first time: indexing lm-eval's tasks)")
                try:
                    note = check_tasks(p, f)
                    from workbench.cli.eval_cmd import checked_specs
                    from workbench.spec.eval_profile import eval_specs

                    checked_specs(args, eval_specs(p), create=False)  # run:N in the store (eval_queue.preflight)
                except ProfileError as e:
                    err.print(str(e), markup=False, highlight=False, soft_wrap=True)
                    invalid += 1
                    continue
                except ValueError as e:  # one line a refused model
                    for line in str(e).splitlines():
                        err.print(f"{f}: {line}", markup=False, highlight=False, soft_wrap=True)
                    invalid += 1
                    continue
                out.print(f"✓ {f}: profile '{p.name}', {_summary(p)}", markup=False, highlight=False,
                          soft_wrap=True)
                if note:
                    out.print(f"  {note}", markup=False, highlight=False, soft_wrap=True)
                valid += 1
                continue
            n = len(expand(p))
            ests, why = _estimates(p, progress=progress)
            if why:
                print(f"{f}: {why}", file=sys.stderr)
                invalid += 1
                continue
            fits = [e.fits for e in ests]
            mark = "✗" if False in fits else "?" if None in fits else "✓"
            out.print(f"{mark} {f}: profile '{p.name}', {summary(p, n)}", markup=False, highlight=False,
                      soft_wrap=True)
            _print_estimates(out, ests, per_run=False)
            from workbench.spec.check import data_notes  # the lm corpus: tokens per split
            for note in data_notes(p):
                out.print(f"  {note}", markup=False, highlight=False, soft_wrap=True)
            if _refuse_too_big(ests, args.force):
                invalid += 1
                too_big += 1
            else:
                valid += 1
                unknown += None in fits
    notes = [f"{too_big} of them with runs that cannot fit here"] if too_big else []
    parts = [f"{valid} valid" + (f" ({unknown} without a full estimate: see its notes)" if unknown else ""),
             f"{invalid} invalid" + (f" ({notes[0]})" if notes else ""),
             f"{absent} need{'s' if absent == 1 else ''} data that is absent" + (" (the commands above fetch it)"
                                                                               if absent else "")]
    total = len(args.files)
    out.print(f"{total} profile{'s' if total != 1 else ''}: {', '.join(parts)}", markup=False, highlight=False,
              soft_wrap=True)
    return 2 if invalid else 0


def _summary(p) -> str:
    """A profile's one-line summary: a training sweep's or an evaluation profile's."""
    from workbench.spec import eval_profile
    from workbench.spec.profile import summary

    return eval_profile.summary(p) if isinstance(p, eval_profile.EvalProfile) else summary(p)


class _Progress:
    """A transient progress line on stderr while profiles are loaded and their runs
    estimated: which file, and how many of its runs have an estimate (a model's first probe
    takes up to a few seconds on a busy CPU; later ones come from the cache). Only where
    stderr is a terminal: piped output gets the results alone."""

    def __init__(self, files: int = 1):
        self.files = files
        self.bar = None

    def __enter__(self) -> "_Progress":
        if sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=None)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def console(self, console: Console) -> Console:
        """Where results print while the line shows: through its own console when ``console``
        writes to this terminal (rich writes past the live line's redirect of stdout, so a
        result started on the progress line), else ``console`` (piped output)."""
        return self.bar.console if self.bar is not None and console.file.isatty() else console

    def file(self, i: int, path: str) -> None:
        self.where = f"[{i + 1}/{self.files}] {path}" if self.files > 1 else str(path)
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.where}: checking", total=None, completed=0)

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.where}: {what}", total=None, completed=0)

    def runs(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.where}: estimating runs", total=total,
                            completed=done)


# --------------------------------------------------------------------------- estimates
def _estimates(prof, jobs: int | None = None, runs_per_gpu: int | None = None, label: str | None = None,
               progress: _Progress | None = None):
    """(each run's RunEstimate, None), or ([], why) when the profile's device is not here
    (train.device = "cuda" without a GPU); see workbench/spec/estimate.py. With ``label``
    (the profile's file) and no ``progress``, it shows its own progress line."""
    from workbench.spec import estimate

    if progress is None:
        with _Progress() as own:
            own.file(0, label or prof.name)
            return _estimates(prof, jobs, runs_per_gpu, progress=own)
    try:
        return estimate.estimate_profile(prof, estimate.share_of(prof, jobs, runs_per_gpu),
                                         progress=progress.runs), None
    except estimate.EstimateError as e:
        return [], str(e)


def _print_estimates(console: Console, ests, per_run: bool) -> None:
    """Parameters and estimated peak memory: one row per run, or (per_run False) one per
    model and length, seeds listed (they change no size)."""
    from workbench.spec.estimate import fmt_count

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
        t.add_row(e.model, e.task, _fmt(e.seq_len), ",".join(dict.fromkeys(str(g.seed) for g in group)),
                  fmt_count(e.params), e.peak_text(), e.device, e.fits_text())
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

    from workbench.execute import launch, scheduler
    from workbench.spec.profile import EvalProfile, ProfileError, load

    console = _console()
    try:
        prof = load(args.profile, overrides=args.set, check_data=True)  # data: before anything is queued
    except ProfileError as e:
        Console(stderr=True).print(str(e), markup=False, highlight=False, soft_wrap=True)
        return 2
    if isinstance(prof, EvalProfile):
        return _run_evals(prof, args)
    if args.executor:
        prof = prof.model_copy(update={"executor": args.executor})
    # the resource estimate, before anything is queued (and before the store is opened)
    ests, why = _estimates(prof, args.jobs, args.runs_per_gpu, label=args.profile)
    if why:
        print(f"{args.profile}: {why}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(prof, ests, args)
    if _refuse_too_big(ests, args.force):
        return 2
    store = _store(args)
    if warning := name_reuse_warning(store, prof, args.profile):
        Console(stderr=True).print(warning, markup=False, highlight=False, soft_wrap=True)
    try:
        ids = launch.submit(store, prof, jobs=args.jobs, runs_per_gpu=args.runs_per_gpu, fresh=args.fresh)
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
    if getattr(ids, "data_note", None):  # finished runs whose corpus changed: trained again
        console.print(ids.data_note, markup=False, highlight=False, soft_wrap=True)
    from workbench.tui.run_cells import lm_figure, lm_figures

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
                lm_figures(store, runs)  # (read again only for runs that moved)
                for r in runs:
                    status = f"[{STATE_STYLE[r.state]}]{r.state}[/]"
                    if r.last_loss is not None:
                        status += f" train loss {r.last_loss:.3f}"
                    figure = lm_figure(r) if r.task == "lm" else r.last_accuracy
                    if figure is not None:  # a language model's: its eval bits per byte
                        status += f" eval {'bpb' if r.task == 'lm' else 'acc'} {figure:.3f}"
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
    _print_runs(console, runs, store_root=store.root, store=store)
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


def name_reuse_warning(store, prof, path: str) -> str | None:
    """One line when the store already holds runs under ``prof``'s name that are another
    sweep (another task, task parameter, training setting or grid axis:
    :mod:`workbench.spec.sweep_identity`), naming the difference and a fresh name to use
    instead; None when the name is free or holds this same sweep (a replay, which goes on
    skipping its finished runs: the warning changes nothing that is queued)."""
    from workbench.spec import sweep_identity
    from workbench.spec.profile import expand

    def held_under(name: str) -> list[dict]:
        return [r.spec for r in store.runs(profile=name)]

    held = held_under(prof.name)
    if not held:
        return None
    specs = [s.to_dict() for s in expand(prof)]
    diffs = sweep_identity.differences(specs, held)
    if not diffs:
        return None
    base = sweep_identity.proposal_base(specs, held, prof.name)
    fresh = sweep_identity.fresh_name(base, specs, held_under, avoid=[prof.name])
    return (f"warning: profile {prof.name!r} in store {store.root} already holds {len(held)} run(s) of another "
            f"sweep ({sweep_identity.one_line(diffs)}; this sweep's value vs the store's): their results will "
            f"be read as one sweep; rename it (name = \"{fresh}\" in {path}, or --set name={fresh})")


def _budget_lines(specs) -> list[str]:
    """One line per distinct run (seeds aside): the budget asked (tokens, FLOPs, tokens per
    parameter, steps; epochs give FLOPs per token only), the steps it became, the tokens,
    the training FLOPs per token and in all (workbench.spec.budget.run_compute)."""
    from workbench.spec.budget import run_compute
    from workbench.spec.estimate import fmt_count

    out: dict[str, None] = {}
    for s in specs:
        b = run_compute(s)
        if not b:
            continue
        (kind, asked), = b["asked"].items()
        point = "".join(f" {k.removeprefix('model.')}={v}" for k, v in (s.grid or {}).items())
        fpt = b.get("flops_per_token")
        per_token = f"{fpt:.3g} FLOPs/token" if fpt is not None else f"FLOPs not counted ({b.get('why', '?')})"
        flops = f", {b['flops']:.3g} FLOPs" if b.get("flops") is not None else ""
        params = (f", N {fmt_count(b['params_non_embedding'])}" if b.get("params_non_embedding") is not None
                  else "")
        asked = f"{asked:,}" if isinstance(asked, int) else f"{asked:.4g}"
        if "steps" not in b:  # epochs
            out[f"  {s.label} L={b['seq_len']}{point}: {kind} {asked}: {per_token}{params}"] = None
            continue
        if b["steps"] is None:  # train.bytes before its corpus is tokenised (budget.resolve_bytes)
            out[f"  {s.label} L={b['seq_len']}{point}: {kind} {asked}: steps from bytes, resolved at launch "
                f"(the tokenizer's bytes per token on the training split) x {b['tokens_per_step']:,} tokens, "
                f"{per_token}{params}"] = None
            continue
        if kind == "bytes":  # resolved from the prepared token cache
            asked += f" at {b['bytes_per_token']:.3f} bytes/token ({b.get('resolved', 'resolved')})"
        became = f" -> {b['steps']:,} steps" if kind != "steps" else ""
        out[f"  {s.label} L={b['seq_len']}{point}: {kind} {asked}{became} x "
            f"{b['tokens_per_step']:,} = {b['tokens']:,} tokens, {per_token}{flops}{params}"] = None
    return list(out)


def _dry_run(prof, ests, args) -> int:
    """What `run` would launch: one row (or JSON object) per run, with its task setting and
    each grid value under its dotted key, and the count; no store is touched."""
    import json

    from workbench.spec.profile import expand, summary
    from workbench.spec.estimate import fmt_count

    from workbench.spec.budget import run_compute

    specs = expand(prof)
    # the runs' grid keys: a task.tokenizer table adds task.vocab_size (expand.grid_values)
    grid_keys = list(dict.fromkeys([*prof.sweep.grid, *(k for s in specs for k in (s.grid or {}))]))
    v2 = prof.schema_version >= 2
    refused = _refuse_too_big(ests, args.force)
    if args.format == "json":
        rows = []
        for spec, e in zip(specs, ests):
            row = e.to_dict()
            if v2:
                row["task_setting"] = spec.task_setting
                row.update(spec.grid or {})
            if spec.budget:  # train.tokens / flops / tokens_per_param and the steps it became
                row["budget"] = spec.budget
            if spec.match:  # [sweep.match]: the knob values solved for the target
                row["match"] = spec.match
            if (spec.train.devices or 1) > 1:  # data-parallel ranks and how they hold the model
                row.update(devices=spec.train.devices, sharding=spec.train.sharding or "ddp")
            compute = run_compute(spec)   # any budget: tokens, FLOPs per token and in all
            if compute:
                row["compute"] = compute
            rows.append(row)
        print(json.dumps(rows, indent=1))
        return 2 if refused else 0
    from workbench.cli.runs import fit_columns

    console = _console()
    cols = ["model", "task", *(["setting"] if v2 else []), "L", "seed", *grid_keys, "params", "est. peak",
            "device", "fits"]
    right = {"L", "seed", "params", "est. peak", *grid_keys}
    rows = []
    for spec, e in zip(specs, ests):
        rows.append([e.model, e.task, *([spec.task_setting] if v2 else []), _fmt(e.seq_len), str(e.seed),
                     *(_fmt((spec.grid or {}).get(k)) for k in grid_keys), fmt_count(e.params),
                     e.peak_text(), e.device, e.fits_text()])
    # Columns chosen for the terminal's width as `runs` does (issue 32: at 80 columns every
    # cell read 'transf…', 'train…'): these whole, always; then the sweep's axes that vary,
    # then the rest while they fit; a column is shown whole or left out (and named below).
    key = ("model", "L", "params", "est. peak", "fits")
    natural = {c: max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(cols)}
    varies = {c for i, c in enumerate(cols) if len({row[i] for row in rows}) > 1}
    show = fit_columns(console.width, natural, varies, 2, key=key,
                       optional=("seed", *grid_keys, "setting", "task", "device"),
                       axes={"seed", "setting", "task", *grid_keys}) or set(key)
    keep = [i for i, c in enumerate(cols) if c in show]
    t = Table(box=None, pad_edge=False, show_edge=False)
    for i in keep:
        t.add_column(cols[i], justify="right" if cols[i] in right else "left", no_wrap=True,
                     min_width=natural[cols[i]])
    for row in rows:
        t.add_row(*(row[i] for i in keep))
    console.print(t)
    left_out = [c for c in cols if c not in show]
    if left_out:
        same = [f"{c} {rows[0][cols.index(c)]}" for c in left_out if c not in varies]
        console.print(f"  (left out at {console.width} columns: {', '.join(left_out)}"
                      + (f"; the same on every row: {', '.join(same)}" if same else "")
                      + "; a wider terminal or --format json shows them)", markup=False, highlight=False,
                      soft_wrap=True)
    for line in _budget_lines(specs) + _match_lines(specs) + _ranks_lines(specs):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for what in sorted({e.limit_what for e in ests if e.limit_what}):
        console.print(f"  limit: {what}", markup=False, highlight=False)
    for n in sorted({e.error for e in ests if e.error}):
        console.print(f"  {n}", markup=False, highlight=False)
    where = " as Slurm jobs" if prof.executor == "slurm" else ""
    console.print(f"profile {prof.name}: {len(ests)} run(s) would be launched{where} "
                  f"({summary(prof, len(specs))}; dry run: nothing queued)", markup=False, highlight=False,
                  soft_wrap=True)
    return 2 if refused else 0


def _ranks_lines(specs) -> list[str]:
    """One line per distinct (train.devices > 1, train.sharding) of the runs: how many
    data-parallel ranks each trains on and how they hold the model."""
    how = {"ddp": "every rank holds the whole model, gradients and optimizer state",
           "fsdp": "each rank holds 1/N of the weights, gradients and optimizer state, sharded per block"}
    out: dict[str, None] = {}
    for s in specs:
        n, sharding = s.train.devices or 1, s.train.sharding or "ddp"
        if n > 1:
            out[f"  ranks: {n} per run, sharding {sharding} ({how[sharding]})"] = None
    return list(out)


def _match_lines(specs) -> list[str]:
    """One line per model and distinct solution of [sweep.match]: the knob values solved
    and the count they give, e.g. "  matched: mamba2: d_model = 272, d_state = 86
    (999,790 non-embedding params, -0.02% of 1,000,000)"."""
    from workbench.spec.match import Solved

    lines: list[str] = []
    for spec in specs:
        if spec.match:
            m = spec.match
            line = (f"  matched: {spec.label}"
                    + f": {Solved(m['target'], m['value'], m['solved'], m['got']).text()}")
            if line not in lines:
                lines.append(line)
    return lines


def _run_evals(prof, args) -> int:
    """``run`` of an evaluation profile: its evaluation runs (one per model) through the
    eval runner (workbench/cli/eval_cmd.py); ``--dry-run`` lists them and queues nothing."""
    import importlib.util
    import json

    from workbench.cli import eval_cmd
    from workbench.spec.eval_profile import check_tasks, eval_specs, summary
    from workbench.spec.profile import ProfileError, load

    try:
        if args.executor and args.executor != prof.executor:  # validated as if the file said it
            prof = load(args.profile, overrides=[*(args.set or []), f'executor="{args.executor}"'])
        note = check_tasks(prof, args.profile,  # unknown lm-eval task names: refused here
                           announce=lambda line: print(f"{args.profile}: {line}", file=sys.stderr))
    except ProfileError as e:
        Console(stderr=True).print(str(e), markup=False, highlight=False, soft_wrap=True)
        return 2
    if note:
        Console(stderr=True).print(f"{args.profile}: {note}", markup=False, highlight=False, soft_wrap=True)
    specs = eval_specs(prof)
    try:
        if prof.executor == "local":
            eval_cmd.check_devices(specs)  # more ranks than GPUs: refused before anything is queued
    except ValueError as e:
        print(f"{args.profile}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:  # the models, as a launch checks them (eval_queue.preflight; no store created)
            specs = eval_cmd.checked_specs(args, specs, create=False)[1]
        except ValueError as e:
            for line in str(e).splitlines():
                print(f"{args.profile}: {line}", file=sys.stderr)
            return 2
        if getattr(args, "format", None) == "json":
            print(json.dumps([{"label": s["label"], "model": s["model"], **s["eval"]} for s in specs], indent=1))
            return 0
        console = _console()
        t = Table(box=None, pad_edge=False, show_edge=False)
        for col in ("model", "checkpoint", "tasks"):
            t.add_column(col, no_wrap=col != "tasks")
        for s in specs:
            t.add_row(s["label"], s["model"], ", ".join(s["eval"]["tasks"]))
        console.print(t)
        for line in eval_cmd.ranks_lines(specs):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        where = " as Slurm jobs" if prof.executor == "slurm" else ""
        console.print(f"profile {prof.name}: {len(specs)} evaluation run(s) would be launched{where} "
                      f"({summary(prof)}; dry run: nothing queued)", markup=False, highlight=False, soft_wrap=True)
        return 0
    if importlib.util.find_spec("lm_eval") is None:
        print(eval_cmd.INSTALL_HINT, file=sys.stderr)
        return 2
    return eval_cmd.run_specs(_store(args), specs, prof.name, fresh=args.fresh, quiet=args.quiet,
                              executor=prof.executor, slurm=prof.slurm)
