"""What a row of the runs table shows, without the widget: the columns and their widths,
each run's cells (:func:`row_cells`) and whether they changed (:func:`row_key`), grid points
in few characters (:func:`grid_labels`, :func:`compact`), the sort order (:func:`order`) and
which columns fit a width (:func:`layout`). Plain functions of :class:`~workbench.store.Run`
rows, used by :mod:`workbench.tui.runs_table` and tested without an app.

Language-model runs (task ``lm``) show their latest eval bits per byte in the accuracy
column (read by :func:`table_runs` into the run's info as :data:`LM_FIGURE`): a next-token
accuracy says little of a language model, and its loss in nats per token does not compare
runs with different tokenizers, where bits per byte does. The column's header says what it
holds (:func:`accuracy_header`: ``eval bpb`` when every row shown is a language model's,
``eval acc|bpb`` when some are, else ``eval acc``), and the loss column is headed ``train
loss`` (the last training loss the worker reported): train and eval figures are labelled
apart, as in the run view and the compare view.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

from rich.text import Text

from workbench.execute import dispatch
from workbench.results.aggregate import sort_key
from workbench.spec.eval_spec import TASK as EVAL_TASK
from workbench.store import STATES, Run, Store, progress, queries
from workbench.tui.formatting import accuracy, duration, number, percent, state_text


LM_FIGURE = "eval_bits_per_byte"  # an lm run's info key, set on read (never stored)
_LM_SEEN: "weakref.WeakKeyDictionary[Store, dict[int, tuple]]" = weakref.WeakKeyDictionary()


def table_runs(store: Store, profile: str | None = None) -> list[Run]:
    """The runs as the table shows them: :func:`workbench.store.progress.table_runs` with each
    run's grid point and task setting, and each language model's latest eval bits per byte
    (:func:`lm_figures`; the app's poll reads with this)."""
    runs = progress.table_runs(store, profile, grid=True)
    lm_figures(store, runs)
    return runs


def lm_figures(store: Store, runs: list[Run]) -> None:
    """Set ``info[LM_FIGURE]`` of every ``lm`` run of ``runs`` to its latest eval bits per
    byte (its last evaluation's; the final results' where no evaluation logged one). Read
    from the store only for runs whose step, state or accuracy moved since the last read
    through this Store (an evaluation moves them), so a poll of a finished sweep reads
    nothing."""
    seen = _LM_SEEN.setdefault(store, {})
    lm = [r for r in runs if r.task == "lm"]
    stale = [r.id for r in lm if seen.get(r.id, (None,))[0] != (r.state, r.step, r.last_accuracy, r.ended)]
    got = queries.latest_values(store, stale, "eval", "bits_per_byte")
    for r in lm:
        sig = (r.state, r.step, r.last_accuracy, r.ended)
        if r.id in stale:
            seen[r.id] = (sig, got.get(r.id))
        value = seen[r.id][1]
        if value is not None:
            r.info = {**(r.info or {}), LM_FIGURE: value}


def lm_figure(run: Run) -> float | None:
    """A language model's figure for the accuracy column (None for other runs)."""
    return (run.info or {}).get(LM_FIGURE) if run.task == "lm" else None


def _bpb(v: float) -> str:
    """Bits per byte in the accuracy column's five characters: 1.234, 12.35."""
    return f"{v:.3f}" if v < 10 else f"{v:.4g}"


def accuracy_header(runs: Iterable[Run]) -> str:
    """The accuracy column's header for the rows ``runs``: ``eval acc`` (no language model
    among them), ``eval bpb`` (all are) or ``eval acc|bpb`` (some are): an evaluation's
    figure, labelled apart from the train loss beside it. Evaluation runs, whose cell is
    always empty, do not count (they made a column of bits per byte read acc|bpb)."""
    runs = list(runs)
    # an evaluation run's cell stays empty (its results are per lm-eval task): it decides nothing
    kinds = {r.task == "lm" for r in runs if r.task != EVAL_TASK} or {r.task == "lm" for r in runs}
    return "eval bpb" if kinds == {True} else "eval acc|bpb" if True in kinds else "eval acc"


# (column key, header, fixed content width or None = measured from the cells). The columns
# that change while a run trains have a fixed width, the widest their format prints
# (state: 'preempted'; progress: '100%'; loss: 4 significant digits, '1.235e-05';
# accuracy: '1.000'; elapsed: '59m59s'), so a cell update never re-lays out the table.
# A column is never narrower than its header, plus the sort mark (" ▲") on the sort column.
COLUMNS = [
    ("mark", "", 1), ("id", "id", None), ("profile", "profile", None), ("model", "model", None),
    ("task", "task", None), ("seq_len", "seq_len", None), ("grid", "grid", None), ("seed", "seed", None),
    ("state", "state", 9), ("progress", "progress", 4), ("loss", "train loss", 9),
    ("accuracy", "eval acc", 5), ("elapsed", "elapsed", 6), ("device", "device", None),
]
HEADERS = {k: label for k, label, _ in COLUMNS}
WIDTHS = {k: w for k, _, w in COLUMNS}
FIXED = {k for k, _, w in COLUMNS if w}
SORTABLE = [k for k, *_ in COLUMNS if k != "mark"]
ALWAYS = ("mark", "id", "state", "progress", "accuracy")  # never dropped, however narrow
# What tells runs apart (a sweep's axes), in the order they are kept when they vary
# between the rows shown: two runs of a length sweep must not read the same at 80x24.
AXES = ("model", "seq_len", "task", "grid", "seed", "profile")
KEEP = AXES + ("loss", "elapsed", "device")  # the columns shown while they fit
MEASURED = KEEP + ("id",)  # widths (of those not FIXED) and variety measured
# least width when truncated (…): never the key columns id, model, seq_len, state, accuracy
TRUNCATE = {"task": 10, "grid": 10, "profile": 8}
PAD = 1  # DataTable's cell padding, each side
SORT_MARK = 2  # " ▲" after the sort column's header
STATE_ORDER = {s: i for i, s in enumerate(("running", "pending") + tuple(s for s in STATES
                                                                        if s not in ("running", "pending")))}
MARK = Text("●", style="bold yellow")
ABBREV = {"weight_decay": "wd", "batch_size": "bs", "warmup_steps": "warmup", "learning_rate": "lr"}


# --------------------------------------------------------------------------- grid values
def grid_labels(keys: Iterable[str]) -> dict[str, str]:
    """Each dotted grid key's short label: its last part (``train.lr`` -> ``lr``,
    ``train.weight_decay`` -> ``wd`` by :data:`ABBREV`), or as many trailing parts as tell it
    apart from the other keys (``model.d_model`` and ``task.d_model`` stay whole)."""
    keys = list(dict.fromkeys(keys))
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != k and (o == tail or o.endswith("." + tail)) for o in keys):
                break
        short = ABBREV.get(tail, tail) if n == 1 else tail
        # an abbreviation must not collide with another key's label
        out[k] = short if short == tail or not any(
            o != k and (o.split(".")[-1] == short) for o in keys) else tail
    return out


def compact(v: Any) -> str:
    """A grid value in few characters: 1e-4 rather than 0.0001, 0.1, 16, cosine."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        plain = f"{v:.4g}"
        if v != 0:
            mant, _, exp = f"{v:.3e}".partition("e")
            sci = f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"
            if len(sci) < len(plain):
                return sci
        return plain
    if isinstance(v, (list, tuple)):
        return ",".join(compact(x) for x in v)
    return str(v)


def grid_text(run: Run, labels: dict[str, str]) -> str:
    """The run's grid point, ``key=value`` each; a tokenizer and its vocabulary size (one
    grid value, ``{name = "bpe", vocab_size = 1024}``) as ``tokenizer=bpe/1024``: at 80x24
    'tokenizer=bpe vocab_size=1024' was cut to 'tokenizer=bpe vocab_si…', the same for every
    vocabulary size (issue 42 items 4, 6)."""
    return " ".join(f"{labels.get(k, k)}={v}" if labels.get(k, k) else v for k, v in grid_items(run))


def grid_items(run: Run) -> list[tuple[str, str]]:
    """The run's grid point as (dotted key, compact value) pairs, as :func:`grid_text` shows
    them (a tokenizer and its vocabulary size as one ``bpe/1024``). A key whose label is ""
    shows its value alone: the runs table does that when one key is the whole grid of
    every row and its header names it (``tokenizer``: ``bytes``, ``bpe/1024``)."""
    grid = dict(run.spec.get("grid") or {})
    if isinstance(grid.get("task.tokenizer"), str) and grid.get("task.vocab_size") is not None:
        grid["task.tokenizer"] = f"{grid['task.tokenizer']}/{compact(grid.pop('task.vocab_size'))}"
    return [(k, compact(v)) for k, v in grid.items()]


def redundant_axes(rows: Iterable[dict[str, str]], varies: set[str]) -> set[str]:
    """The varying axes (:data:`AXES`, in that order) that tell apart no two of ``rows``
    (each a row's column -> cell text) that the varying axes before them do not already
    tell apart: a runs table of several profiles whose eval runs differ from the lm runs
    in model, task and seq_len alike needs one of those columns, not three, and the grid
    point that tells two runs of one profile apart must not be the one left out at 80x24
    (issue 42 item 4)."""
    rows = list(rows)
    if not rows:
        return set()
    groups = 1   # rows told apart so far: none, one group
    keys: list[tuple] = [() for _ in rows]
    out = set()
    for axis in AXES:
        if axis not in varies:
            continue
        refined = [k + (row.get(axis, ""),) for k, row in zip(keys, rows)]
        n = len(set(refined))
        if n == groups:
            out.add(axis)
        else:
            keys, groups = refined, n
    return out


def task_text(run: Run) -> str:
    setting = run.spec.get("task_setting")
    return run.task if setting in (None, "baseline") else f"{run.task} [{setting}]"


# --------------------------------------------------------------------------- rows
def row_key(run: Run, marked: bool) -> tuple | None:
    """What :func:`row_cells` shows of a run, or None when it changes with the clock (a
    running run's elapsed time): equal keys mean equal cells, so those are not rebuilt.
    (The grid point and task setting never change for a run.)"""
    if run.state == "running" or (run.started is not None and run.ended is None):
        return None
    return (marked, run.profile, run.label, run.task, run.seq_len, run.seed, run.state,
            run.progress, run.last_loss, run.last_accuracy, run.started, run.ended, run.device,
            run.slot, dispatch.describe(run), lm_figure(run))


def _t(s: str, justify: str = "left") -> Text:
    # Text, never str: DataTable reads a str cell as markup ("[seq_len=512]" would vanish)
    return Text(s, justify=justify, no_wrap=True, overflow="ellipsis")


def row_cells(run: Run, marked: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The table cells of one run, by column key."""
    return {
        "mark": MARK if marked else "",
        "id": _t(str(run.id), "right"),
        "profile": _t(run.profile),
        "model": _t(run.label),
        "task": _t(task_text(run)),
        "seq_len": _t("" if run.seq_len is None else str(run.seq_len), "right"),
        "grid": _t(grid_text(run, labels or {})),
        "seed": _t(str(run.seed), "right"),
        "state": state_text(run.state),
        "progress": _t(percent(run.progress), "right"),
        "loss": _t(number(run.last_loss), "right"),
        # a language model: its eval bits per byte (the header says so: accuracy_header)
        "accuracy": _t(accuracy(run.last_accuracy) if run.task != "lm" else
                       "" if lm_figure(run) is None else _bpb(lm_figure(run)), "right"),
        "elapsed": _t(duration(run.elapsed), "right"),
        # which GPU, when there are several: the scheduler's slot is the CUDA index; Slurm
        # runs: the job id and Slurm's state (PENDING with its reason, TIMEOUT, NODE_FAIL...)
        "device": _t(dispatch.describe(run) or
                     (f"{run.device}:{run.slot}" if run.device == "cuda" and run.slot else (run.device or ""))),
    }


def sort_value(run: Run, column: str, grid_keys: list[str]) -> Any:
    """The value a column sorts by (None: sorted last in either direction)."""
    if column == "task":
        return (run.task, run.spec.get("task_setting") or "")
    if column == "grid":
        grid = run.spec.get("grid") or {}
        return tuple(sort_key(grid.get(k)) for k in grid_keys) if grid else None
    if column == "state":
        return STATE_ORDER.get(run.state, len(STATE_ORDER))
    if column == "model":
        return run.label
    if column == "accuracy":
        return run.last_accuracy if run.task != "lm" else lm_figure(run)
    if column == "loss":
        return run.last_loss
    if column == "elapsed":
        return run.elapsed
    if column == "device":
        return run.device
    return getattr(run, column)


def order(runs: list[Run], column: str = "id", reverse: bool = False,
          grid_keys: list[str] | None = None) -> list[int]:
    """The run ids sorted by ``column`` (ties by id, ascending), empty values last."""
    keyed = [(sort_value(r, column, grid_keys or []), r.id) for r in sorted(runs, key=lambda r: r.id)]
    have = [x for x in keyed if x[0] is not None]
    have.sort(key=lambda x: x[0], reverse=reverse)  # stable: equal values keep id order
    return [rid for _, rid in have] + [rid for v, rid in keyed if v is None]


# --------------------------------------------------------------------------- layout
def column_width(key: str, content: int, sort_column: str | None = None) -> int:
    """A column's width: its widest cell (``content``; a fixed column's format width), never
    narrower than its header and, on the sort column, the sort mark."""
    return max(content, WIDTHS[key] or 0, len(HEADERS[key]) + (SORT_MARK if key == sort_column else 0), 1)


def rank(key: str, varies: set[str], empty: set[str]) -> int:
    """Which columns a narrow table keeps first (lower first): the axes whose value differs
    between the rows shown (a length sweep's seq_len, a model comparison's model); the
    model (a key column) even when it is the same on every row; the loss and elapsed time;
    axes that are the same on every row (they tell no row from another); the device;
    columns empty on every row (shown where there is room all the same: when their values
    come, a loss as runs start, the columns then stay as they are instead of moving)."""
    if key in empty:
        return 6
    if key in AXES and key in varies:
        return 1
    if key == "model":
        return 2
    if key in ("loss", "elapsed"):
        return 3
    if key in AXES:
        return 4
    return 5


def layout(avail: int, natural: dict[str, int], varies: set[str], empty: set[str] = frozenset(),
           sort_column: str | None = "id") -> dict[str, int]:
    """The columns to show in ``avail`` cells of width: key -> the column's width (its
    :func:`column_width`, or less for a truncated column). :data:`ALWAYS` first, then
    :data:`KEEP` by :func:`rank` (KEEP order within a rank). A column that does not fit is
    truncated if it may be (:data:`TRUNCATE`, never a key column) and its least width
    fits beside the room kept for the varying axes after it that cannot be truncated, else
    left out. ``natural``: each column's widest cell (headers are added here)."""
    width = {k: column_width(k, natural.get(k, 0), sort_column) for k, *_ in COLUMNS}
    out = {k: width[k] for k in ALWAYS}
    used = sum(width[k] + 2 * PAD for k in ALWAYS)
    ranked = sorted(KEEP, key=lambda k: rank(k, varies, empty))  # stable: KEEP order within
    for i, k in enumerate(ranked):
        need = width[k] + 2 * PAD
        # a truncatable column leaves room for the later varying axes that cannot shrink,
        # and for the later varying axes that can, at their least width: a task setting
        # shown in full must not crowd out the grid point that tells two runs apart (at
        # 80x24 a seed column, 0 on every row, took what was left; issue 42 item 4)
        later = 0 if k not in TRUNCATE else sum(
            width[j] + 2 * PAD for j in ranked[i + 1:] if rank(j, varies, empty) <= 2 and j not in TRUNCATE) + sum(
            min(width[j], TRUNCATE[j]) + 2 * PAD for j in ranked[i + 1:]
            if rank(j, varies, empty) == 1 and j in TRUNCATE)
        if used + need + later <= avail:
            out[k] = width[k]
            used += need
        elif k in TRUNCATE and avail - used - later - 2 * PAD >= TRUNCATE[k]:
            out[k] = avail - used - later - 2 * PAD
            used += out[k] + 2 * PAD
    return {k: out[k] for k, *_ in COLUMNS if k in out}
