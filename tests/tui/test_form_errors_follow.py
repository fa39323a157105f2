"""A field's problem, shown as the field was left (issue 42 item 4), follows the form
afterwards: it goes as soon as the value is corrected, in the field or in its unit, and it
never names a value the field no longer holds. Before, the budget's message stayed until the
field was entered and left again: "train for: '500k' is not a whole number" under a budget
switched to bytes of text (which takes 500k), or "'abc' is not a number of bytes" under a
field that held 200k. A value that cannot be read is said once, not again as the schema's
"give exactly one of train.epochs or train.steps, or a budget ..." that follows from it."""
from __future__ import annotations

from textual.widgets import Input, Select, Static

from helpers import until
from test_tui import SIZE, fill_form, make_app, settle, store  # noqa: F401
from test_tui_lm import LM_PROFILE, corpus
from workbench.spec import profile as profiles


async def test_a_budget_problem_goes_with_a_new_unit_or_a_corrected_value(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")  # (the form, mounted)
        await settle(pilot)
        form = await fill_form(pilot, profiles.loads(LM_PROFILE.format(source=corpus(tmp_path))))
        kind = app.query_one("#budget_kind", Select)
        kind.value = "steps"
        await settle(pilot)
        field = form.query_one("#budget", Input)
        err = form.query_one("#err-budget", Static)
        field.focus()
        await pilot.pause()
        await pilot.press("ctrl+u", *"500k", "tab")
        await settle(pilot)
        assert err.display and "'500k' is not a whole number" in str(err.render())
        # the unit changes (the focus is not in the field): 500k bytes of text is a budget
        kind.value = "bytes"
        await until(pilot, lambda: not err.display)
        # a value that cannot be read: one message, not also the schema's on the missing budget
        field.focus()
        await pilot.pause()
        await pilot.press("ctrl+u", *"abc", "tab")
        await settle(pilot)
        shown = str(err.render())
        assert err.display and "'abc' is not a number of bytes" in shown
        assert "give exactly one" not in shown, shown
        # corrected in the field, still focused: the message goes without leaving it
        field.focus()
        await pilot.pause()
        await pilot.press("ctrl+u", *"200k")
        await until(pilot, lambda: not err.display)
        assert field.has_focus and field.value == "200k"
