"""formatting.set_text re-lays out a Static whenever its height on screen changes, not only
when its count of newlines does: a one-line hint or error that wraps to several rows,
replaced by a short one, left blank rows under the field (the sweep form's step-count hint
under "train for" after a grid error), and a short one replaced by a long one kept one row
and cut the rest (issue 42 items 5 and 6: lines must not be cut)."""
from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from workbench.tui.formatting import set_text

LONG = ("vocab_size is the size of a trained BPE (tokenizer = 'bpe') or a pretrained "
        "tokenizer's embedding rows; tokenizer 'bytes' has its own")
SHORT = "= 195 steps of 1,024 tokens"


class _Hints(App):
    CSS = "#box { width: 40; height: auto; } #hint { height: auto; } #below { height: 1; }"

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Static("", id="hint")
            yield Static("the next field", id="below")


async def test_a_wrapped_line_replaced_by_a_short_one_leaves_no_blank_rows_and_back():
    app = _Hints()
    async with app.run_test(size=(60, 20)) as pilot:
        hint = app.query_one("#hint", Static)
        below = app.query_one("#below", Static)
        set_text(hint, LONG)
        await pilot.pause()
        tall = hint.size.height
        assert tall >= 3, f"the long line wraps to several rows at width 40: {tall}"
        assert below.region.y == hint.region.y + tall
        set_text(hint, SHORT)  # no newline in either: the same count of "\n"
        await pilot.pause()
        assert hint.size.height == 1, f"a one-row text kept {hint.size.height} rows (blank rows left)"
        assert below.region.y == hint.region.y + 1, "the next field did not move up"
        set_text(hint, LONG)
        await pilot.pause()
        assert hint.size.height == tall, f"the long text was cut to {hint.size.height} row(s)"
