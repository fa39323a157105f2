"""A grid point that the task cannot build is said under "other grid axes", where its
values are, as they are typed (issue 42 item 6: a task.tokenizer grid refused while
vocab_size is set was "shown under 'train for'", as the budget's step count failed, and not
at all with a budget in steps); the budget's line then only says why it has no count."""
from __future__ import annotations

from textual.widgets import Static

from helpers import paste_into, until
from test_tui import SIZE, fill_form, make_app, settle, store  # noqa: F401
from test_tui_lm import LM_PROFILE, corpus, wait_budget_steps
from workbench.spec import profile as profiles


async def test_a_refused_grid_point_is_said_under_the_grid_axes(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")  # (the form, mounted)
        await settle(pilot)
        form = await fill_form(pilot, profiles.loads(LM_PROFILE.format(source=corpus(tmp_path))))
        err = form.query_one("#err-grid_axes", Static)

        def shown() -> str:
            return str(err.render()) if err.display else ""

        # the form's vocab_size (300) beside a "bytes" point
        await paste_into(pilot, "#grid_axes", 'task.tokenizer = bytes, {name = "bpe", vocab_size = 512}')
        await until(pilot, lambda: "vocab_size is the size of a trained BPE" in shown())
        assert shown().startswith('grid point task.tokenizer = "bytes": lm: '), shown()
        steps = await wait_budget_steps(pilot, form)
        assert "vocab_size is the size" not in steps and "grid point is refused" in steps, steps
        # left and entered again: still said (the schema alone finds nothing there)
        form.query_one("#grid_axes").focus()
        await pilot.press("tab")
        await settle(pilot)
        assert "vocab_size is the size" in shown()
        # vocab_size cleared: the tables pair each tokenizer with its size, nothing to say
        await paste_into(pilot, "#param-vocab_size", "")
        await until(pilot, lambda: shown() == "")
        # a BPE too small for its bytes is said at the point that asks for it
        await paste_into(pilot, "#grid_axes", 'task.tokenizer = bytes, {name = "bpe", vocab_size = 256}')
        await until(pilot, lambda: "vocab_size must be >= 258" in shown())
        assert 'task.tokenizer = {name = "bpe", vocab_size = 256}' in shown(), shown()
