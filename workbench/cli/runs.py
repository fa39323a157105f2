"""``ssm-workbench runs``, ``show`` and ``kill``: the runs of a store as a table, one run
in detail, killing runs."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from workbench.cli.common import STATE_STYLE, _console, _fmt, _store, refresh
from workbench.execute.executor import describe


def _worker_cell(r) -> str:
    """'1234@node1' (pid at the host's first name label): which process to look at or kill."""
    if r.pid is None and not r.host:
        return "–"
    return f"{r.pid if r.pid is not None else '?'}@{(r.host or '?').split('.')[0]}"


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
                     describe(r) or r.device or "–", _worker_cell(r)])

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
    # the executors' sync is handed the light rows (it reads their info only): the table
    # shows no spec, and decoding 5,000 specs took ~0.5 s. It only reads: `runs` submits nothing
    store.reap()
    everything = table_runs(store)
    if refresh(store, runs=everything):
        everything = table_runs(store)  # as the sync left them
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
    from workbench.execute import scheduler

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
