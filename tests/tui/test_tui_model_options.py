"""The sweep form shows the options of the picked models under the model picker (issue 42
item 5: that ``allow_neg_eigval`` exists was only in the README, and heads nowhere)."""
from __future__ import annotations

import models
from test_tui import FakeScheduler, make_app, settle, store  # noqa: F401
from workbench.tui.model_picker import ModelPicker
from workbench.tui.sweep_form import SweepForm


def pane_text(form: SweepForm) -> str:
    pane = form.query_one("#models-options")
    return str(pane.render()) if pane.display else ""


async def test_picked_models_options_are_listed_with_defaults(store, tmp_path):
    assert models.entry("gated_deltaproduct").options()["allow_neg_eigval"] is False
    assert models.entry("transformer").options()["n_heads"] == 4
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f2")
        await settle(pilot)
        form = pilot.app.query_one(SweepForm)
        picker = form.query_one("#models", ModelPicker)
        assert pane_text(form) == ""  # nothing picked: nothing shown
        picker.focus()
        await pilot.press(*"gated_deltaproduct", "space")  # picked as a user does
        await settle(pilot)
        assert picker.picked == ["gated_deltaproduct"]
        text = pane_text(form)
        assert "allow_neg_eigval = false" in text and "num_householder = 2" in text
        assert "negative state-transition eigenvalues" in text  # with what it means
        # a mixer's own options too (models/option_help.py), not name = default only
        line = next(x for x in text.splitlines() if "num_householder = 2" in x)
        assert "Householder) steps per token" in line
        assert "n_heads = 4" not in text.split("gated_deltaproduct")[0]
        picker.set_picked(["gated_deltaproduct", "transformer"])
        await settle(pilot)
        text = pane_text(form)
        assert "transformer options" in text and "gated_deltaproduct options" in text
        transformer_part = text.split("transformer options")[1]
        assert "n_heads = 4" in transformer_part and "attn_scale = none" in transformer_part
        assert not form.query_one("#models-options").can_focus
        picker.set_picked(["transformer"])
        await settle(pilot)
        text = pane_text(form)
        assert "allow_neg_eigval" not in text and "n_heads = 4" in text
        picker.set_picked([])
        await settle(pilot)
        assert pane_text(form) == ""
