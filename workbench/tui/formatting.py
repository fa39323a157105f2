"""Small text helpers shared by the runs table and the run view; state colours come from
:mod:`workbench.store.states` (the CLI uses the same table)."""
from __future__ import annotations

from rich.text import Text

from workbench.store.states import STATE_STYLES, state_style  # noqa: F401  (one table for CLI and TUI)


def id_ranges(ids: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1..3, 7, 9..10' (the ids a launch queued: the app's sweep
    summary and the eval form's)."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in out)


def state_text(state: str) -> Text:
    return Text(state, style=state_style(state))


def duration(seconds: float | None) -> str:
    """12s, 4m05s, 2h03m; '' when not started. Whole seconds: a running run's cell
    then changes once a second, not on every 2 Hz poll (each change is a repaint)."""
    if seconds is None:
        return ""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def number(v: float | None, digits: int = 4) -> str:
    if v is None:
        return ""
    return f"{v:.{digits}g}"


def count(v: float | None) -> str:
    """A large count in SI units, 3 significant digits: 2,007,040 -> '2.01M', 950 -> '950'."""
    if v is None:
        return ""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def accuracy(v: float | None) -> str:
    """An accuracy with three decimals always: '1.000' beside '0.997' and '0.094' (with
    significant digits, 1.0 printed as '1' and 0.09375 as '0.0938' in one column)."""
    return "" if v is None else f"{v:.3f}"


def percent(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def set_text(widget, content) -> bool:
    """Update a Static only when its content changed, and re-lay out the screen only when
    its height on screen does. Over SSH every repaint is bytes: a layout pass repaints the
    whole screen (plots included), a same-size update repaints just the widget. The height
    is the rows the text wraps to at the widget's width, not its count of newlines: a
    one-line message wrapped to four rows and replaced by a short one left three blank rows,
    and a short one replaced by a long one was cut to one row."""
    old = getattr(widget, "_wb_content", None)
    if old is not None and old == content:
        return False
    widget._wb_content = content
    width, height = widget.content_size
    if old is None or not width:  # never laid out (or hidden): by its lines, as laid out later
        same_size = old is not None and str(old).count("\n") == str(content).count("\n")
        widget.update(content, layout=not same_size)
        return True
    widget.update(content, layout=False)
    widget.clear_cached_dimensions()
    if widget.get_content_height(widget.content_size, widget.content_size, width) != height:
        widget.refresh(layout=True)
    return True
