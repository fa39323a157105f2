"""The sweep form while a new task's parameter inputs are being rebuilt: a field left in
that window (its Blurred handler checks the whole form) must wait for the inputs, not
query one that is gone. Seen under load in CI: the app died with NoMatches '#param-source'
when the name field's blur was handled between removing the old inputs and mounting the
lm task's."""
from __future__ import annotations

import asyncio

from textual.containers import Vertical
from textual.widgets import Input, Select

from test_tui import SIZE, make_app, settle, store  # noqa: F401
from workbench.tui.sweep_form import SweepForm


async def test_a_field_left_while_the_task_inputs_are_rebuilt_waits_for_them(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        await settle(pilot)
        box = form.query_one("#task-params", Vertical)
        removed, resume = asyncio.Event(), asyncio.Event()
        remove_children = box.remove_children

        async def remove_then_hold(*args, **kwargs):
            await remove_children(*args, **kwargs)
            removed.set()
            await resume.wait()   # the window between removing the old inputs and mounting

        box.remove_children = remove_then_hold
        app.query_one("#task", Select).value = "lm"   # _task_changed rebuilds, held in the window
        try:
            await asyncio.wait_for(removed.wait(), 30)
            assert not form.query("#param-source")   # the lm inputs are not there yet
            name = form.query_one("#name", Input)
            form._field_left(Input.Blurred(name, name.value))   # must not raise NoMatches
            assert form.build_profile(focus=False) is None
        finally:
            resume.set()   # (else the app cannot shut down after a failure)
        await settle(pilot)
        assert form.query("#param-source") and form._params_task == "lm"
