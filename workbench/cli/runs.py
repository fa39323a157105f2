"""``ssm-workbench runs``, ``show`` and ``kill``: the runs of a store as a table, one run
in detail, killing runs."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from workbench.cli.common import STATE_STYLE, NoStore, _console, _fmt, _store, refresh
from workbench.execute.dispatch import describe


def _worker_cell(r) -> str:
    """'1234@node1' (pid at the host's first name label): which process to look at or kill."""
    if r.pid is None and not r.host:
        return "–"
    return f"{r.pid if r.pid is not None else '?'}@{(r.host or '?').split('.')[0]}"


RUNS_HEADERS = ("id", "profile", "model", "task", "L", "seed", "state", "progress", "loss", "acc", "time",
                "device", "worker")
GRID = "grid"  # the run's grid point (lr=1e-4 wd=0.1), after seed: only where runs have one
RUNS_RIGHT = {"id", "L", "seed", "progress", "loss", "acc", "time"}
BOXED_MAX = 300  # more runs than this: plain aligned columns (a rich Table of 5,000 rows takes ~9 s)
# Which columns a narrow terminal keeps (issue 32: at 80 columns every cell was cut to 'ma…'):
# these always, at their full width, never cut...
KEY_COLUMNS = ("id", "model", "L", "state", "acc")
# ...then these while they fit, by :func:`rank` (this order within a rank): the sweep's axes
# (those of AXES whose value varies among the runs shown) first, since two runs of a seed or
# grid sweep must not read the same; then what each run measured; then the axes that are
# the same on every row (they tell no run from another); then where it ran
OPTIONAL_COLUMNS = ("seed", GRID, "task", "profile", "progress", "loss", "time", "device", "worker")
AXES = {"profile", "task", "seed", GRID}
MEASURED = {"progress", "loss", "time"}


def rank(column: str, varies: set[str], axes: set[str] = AXES) -> int:
    """Which optional columns a narrow table keeps first (lower first; module note above)."""
    if column in axes:
        return 0 if column in varies else 2
    return 1 if column in MEASURED else 3


def fit_columns(width: int, natural: dict[str, int], varies: set[str], per_column: int, extra: int = 0,
                key: tuple[str, ...] = KEY_COLUMNS, optional: tuple[str, ...] = OPTIONAL_COLUMNS,
                axes: set[str] = AXES) -> set[str] | None:
    """The columns to show in ``width`` terminal columns, each at its ``natural`` width (its
    widest cell or header) plus ``per_column`` (padding and rule) and ``extra`` once (the
    outer rule): :data:`KEY_COLUMNS` (None when even they do not fit), then the optional
    ones that fit, by :func:`rank`. A column is shown whole or not at all: cutting a cell to
    'ma…' tells nothing."""
    used = extra + sum(natural[k] + per_column for k in key if k in natural)
    if used > width:
        return None
    chosen = {k for k in key if k in natural}
    for k in sorted((k for k in optional if k in natural), key=lambda k: rank(k, varies, axes)):
        # stable: the optional order within a rank
        need = natural[k] + per_column
        if used + need <= width:
            chosen.add(k)
            used += need
    return chosen


LM_RESULTS = ("loss", "perplexity", "bits_per_byte")  # `show` lists an lm run's results from these


def headers_shown(runs) -> dict[str, str]:
    """The headers of the loss and accuracy columns: ``train_loss`` (the last training loss
    the worker reported) and the TUI's :func:`~workbench.tui.run_cells.accuracy_header`
    (``eval_acc``, ``eval_bpb`` or ``eval_acc|bpb``) with words joined by '_', so a header
    stays one word to ``awk`` and ``split()``, as the cells are."""
    from workbench.tui.run_cells import accuracy_header

    return {"loss": "train_loss", "acc": accuracy_header(runs).replace(" ", "_")}


def _acc(v) -> str:
    # three decimals, always: 1.0 printed as '1' beside '0.997' reads like another kind of number
    return "–" if v is None else f"{v:.3f}"


def _print_runs(console: Console, runs, progress_of=None, store_root=None, store=None) -> None:
    """The runs as a table that fits ``console.width`` (:func:`fit_columns`), then one
    progress line per profile (``progress_of``: the runs to count progress over, default
    ``runs``; :mod:`workbench.store.progress`), then notes on stalled runs (their commands
    with ``--store store_root`` where that is not the default store). Up to
    BOXED_MAX runs a boxed rich table, beyond that (or where a box leaves no room for the
    key columns) plain columns. As in the TUI's runs table, train and eval figures are
    labelled apart (:func:`headers_shown`) and a language model's (``store`` given) is its
    latest eval bits per byte, not its next-token accuracy."""
    from rich.markup import escape

    from workbench.store import progress
    from workbench.tui.run_cells import (grid_labels, grid_text, lm_figure, lm_figures,
                                         task_text)

    if store is not None:
        lm_figures(store, runs)
    labels = grid_labels(k for r in runs for k in (r.spec.get("grid") or {}))
    headers = list(RUNS_HEADERS)
    if labels:
        headers.insert(headers.index("seed") + 1, GRID)
    rows, states, stalled = [], [], []
    for r in runs:
        el = r.elapsed
        note = r.stall_note()
        if note:
            stalled.append((r, note))
        states.append((r.state, bool(note)))
        cells = {"id": str(r.id), "profile": r.profile, "model": r.label, "task": task_text(r),
                 "L": _fmt(r.seq_len), "seed": str(r.seed), GRID: grid_text(r, labels),
                 "state": r.state + (" stalled" if note else ""), "progress": f"{100 * r.progress:.0f}%",
                 "loss": _fmt(r.last_loss), "acc": _acc(r.last_accuracy if r.task != "lm" else lm_figure(r)),
                 "time": "–" if el is None else f"{el:.0f}s",
                 "device": describe(r) or r.device or "–", "worker": _worker_cell(r)}
        rows.append([cells[h] for h in headers])
    shown = headers_shown(runs)
    natural = {h: max([len(shown.get(h, h))] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)}
    varies = {h for i, h in enumerate(headers) if len({row[i] for row in rows}) > 1}
    boxed = len(rows) <= BOXED_MAX
    # a rich box: '│ ' + cell + ' ' per column and one closing rule; plain: two spaces between
    show = fit_columns(console.width, natural, varies, 3, 1) if boxed else None
    if show is None:
        boxed = False
        show = fit_columns(console.width, natural, varies, 2) or set(KEY_COLUMNS)
    keep = [i for i, h in enumerate(headers) if h in show]
    headers = [headers[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]
    at_state = headers.index("state")

    def state_markup(state: str, note: bool, text: str) -> str:
        # text: the cell as laid out (padded); the words styled as before
        word, rest = text[:len(state)], text[len(state):]
        if note:
            rest = rest.replace("stalled", "[yellow]stalled[/]", 1)
        return f"[{STATE_STYLE.get(state, '')}]{word}[/]{rest}"

    if boxed:
        t = Table(title=None, show_lines=False)
        for c in headers:
            # whole cells (fit_columns left room for them): never folded or cut
            t.add_column(shown.get(c, c), justify="right" if c in RUNS_RIGHT else "left", no_wrap=True,
                         min_width=natural[c])
        for cells, (state, note) in zip(rows, states):
            cells = [escape(c) for c in cells]
            cells[at_state] = state_markup(state, note, cells[at_state])
            t.add_row(*cells)
        console.print(t)
    else:
        # written straight to the console's file: rich's markup parsing and rendering of
        # 5,000 lines took ~0.8 s; the state words get the same colours as ANSI codes
        from rich.style import Style

        widths = [natural[h] for h in headers]
        color = console.is_terminal and not console.no_color and console._color_system is not None

        def paint(text: str, style: str) -> str:
            return Style.parse(style).render(text, color_system=console._color_system) if color and style else text

        def line(cells):
            return "  ".join(c.rjust(w) if h in RUNS_RIGHT else c.ljust(w)
                             for c, w, h in zip(cells, widths, headers)).rstrip()

        at = sum(widths[:at_state]) + 2 * at_state  # where the state column starts
        words = {}  # (state, stalled) -> the painted cell
        out = [paint(line([shown.get(h, h) for h in headers]), "bold")]
        for cells, (state, note) in zip(rows, states):
            text = line(cells)
            if (state, note) not in words:
                cell = text[at:at + widths[at_state]]
                words[state, note] = (paint(state, STATE_STYLE.get(state, "")) + cell[len(state):].replace(
                    "stalled", paint("stalled", "yellow"), 1))
            out.append(text[:at] + words[state, note] + text[at + widths[at_state]:])
        console.file.write("\n".join(out) + "\n")
    # soft_wrap: a line longer than the terminal is left to it, never broken inside a command
    for p in progress.by_profile(runs if progress_of is None else progress_of):
        console.print(p.text(), markup=False, highlight=False, soft_wrap=True)
    for r, note in stalled:  # why a silent run is not called crashed, and what to do about it
        cmd = progress.command(store_root)
        console.print(f"run {r.id}: {note}: {r.worker}; not declared crashed while its process exists "
                      f"(`kill -CONT {r.pid}` wakes a stopped one, `{cmd} kill {r.id}` stops it)",
                      markup=False, highlight=False, soft_wrap=True)


def cmd_runs(args) -> int:
    """``runs``: the table, then each profile's progress (done/total, ETA), counted over
    all of its runs even when --state shows some of them."""
    from workbench.store.progress import table_runs

    try:
        store = _store(args, create=False)
    except NoStore as e:  # nothing ran there: not an error, and no store is made by looking
        print(f"no runs in {e.root} (no store there yet)")
        return 0
    # the executors' sync is handed the light rows (it reads their info only, and the grid
    # point of each run, cached): decoding 5,000 specs took ~0.5 s. It only reads: `runs`
    # submits nothing (a dead scheduler is said under the table, with the command to restart it)
    store.reap()
    everything = table_runs(store, grid=True)
    if refresh(store, runs=everything):
        everything = table_runs(store, grid=True)  # as the sync left them
    if args.profile:
        everything = [r for r in everything if r.profile == args.profile]
    runs = [r for r in everything if r.state in args.state] if args.state else everything
    if not runs:
        print(f"no runs in {store.root}" + (f" for profile {args.profile!r}" if args.profile else ""))
        return 0
    _print_runs(_console(), runs, progress_of=everything, store_root=store.root, store=store)
    return 0


def _data_lines(r, store_root) -> list[str]:
    """What an lm run trained on (its info's ``data``, tasks/lm/fingerprint.py) and where its
    tokenizer is kept, for ``show``; a run its replay trained again on a changed corpus says so."""
    info = r.info or {}
    data = info.get("data")
    out = []
    if isinstance(data, dict) and data.get("fingerprint"):
        tokens = data.get("tokens") or {}
        split = " / ".join(f"{s} {n:,}" for s, n in tokens.items()) if tokens else "?"
        tok = (data.get("tokenizer") or {}).get("kind", "?")
        out.append(f"data: {data.get('source')!r} fingerprint {data['fingerprint']} "
                   f"(token cache {data.get('cache_key')}); tokens {split}; tokenizer {tok}")
    elif r.task == "lm":
        out.append("data: no fingerprint recorded (trained before runs kept one)")
    if r.task == "lm":
        from workbench.store.layout import checkpoint_folder  # (train/checkpoint.py imports torch)

        where = checkpoint_folder(info.get("slurm_shared") or store_root, r.id)
        kept = (where / "tokenizer_config.json").is_file()
        out.append(f"tokenizer: {'kept in ' + str(where) if kept else 'not kept (none written yet)'}")
    sup = info.get("superseded_by")
    if isinstance(sup, dict):
        out.append(f"superseded by run {sup.get('run')}: {sup.get('why')}")
    return out


def cmd_show(args) -> int:
    import json

    store = _store(args, create=False)
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
    for line in _data_lines(r, store.root):
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    c.print_json(json.dumps({"spec": r.spec, "info": r.info}, default=str))
    res = store.results([r.id]).get(r.id, {})
    # a language model's eval loss, perplexity and bits per byte first, as the run view lists them
    first = LM_RESULTS if r.task == "lm" else ()
    for es, vals in sorted(res.items()):
        keys = sorted(vals, key=lambda k: (first.index(k) if k in first else len(first), k))
        c.print(f"results{f' [{es}]' if es else ''}: " + ", ".join(f"{k}={_fmt(vals[k])}" for k in keys),
                highlight=False, markup=False)
    if r.error:
        c.print("[red]error:[/red]")
        c.print(r.error, markup=False, highlight=False)
    c.print(f"log: {r.log_path}")
    return 0


def cmd_kill(args) -> int:
    from workbench.execute import launch

    store = _store(args, create=False)  # no store: no run to kill, and none is made
    code = 0
    for i in args.ids:
        try:
            ok = launch.kill(store, i)
        except KeyError as e:
            print(str(e.args[0]), file=sys.stderr)
            code = 2
            continue
        print(f"run {i}: {'killed' if ok else 'had already ended'}")
    return code
