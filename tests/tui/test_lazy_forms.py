"""The sweep and evaluation forms are mounted when their tab is first shown (most of the
app's widgets: a start that never opens them skips building them), by any way of showing
it: its key, a click on its tab, a palette command, a form handing over to the other."""
from __future__ import annotations

from textual.widgets import TabbedContent

from test_tui import SIZE, FakeScheduler, make_app, settle, store  # noqa: F401
from workbench.tui.dialogs import PathScreen
from workbench.tui.eval_form import EvalForm
from workbench.tui.sweep_form import SweepForm


async def test_a_form_is_built_when_its_tab_is_first_shown_by_key_or_click(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert not app.query(SweepForm) and not app.query(EvalForm)
        await pilot.press("f2")  # its key: built, shown, on its model list
        assert app.query_one("#models") in app.focused.ancestors_with_self
        assert len(app.query(SweepForm)) == 1 and not app.query(EvalForm)
        await pilot.press("f1", "f2")  # shown again: the same form, not a second one
        assert len(app.query(SweepForm)) == 1
        app.query_one(TabbedContent).active = "eval"  # what a click on its tab does
        await settle(pilot)
        assert len(app.query(EvalForm)) == 1
        assert app.query_one("#ev-models").display


async def test_a_palette_command_builds_the_form_it_acts_on(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.run_action("open_profile")  # from the runs table, the form never shown
        await settle(pilot)
        assert isinstance(app.screen, PathScreen) and app.query_one(TabbedContent).active == "sweep"
        await pilot.press("escape")
        await app.run_action("open_eval_profile")
        await settle(pilot)
        assert isinstance(app.screen, PathScreen)
        assert app.query_one(TabbedContent).active == "eval" and len(app.query(EvalForm)) == 1
