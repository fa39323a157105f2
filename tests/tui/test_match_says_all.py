"""Match size that says everything (issue 42, item 5; workbench/spec/match.py, expand.py,
workbench/tui/form_match.py): every model's solved values or its own reason, in full;
every unmatched model named (CLI and form); the nearest reachable count offered when the
tolerance cannot be met; the run count saying that nothing launches while a model cannot
be matched; the refusal not repeated under "train for". And the registry's fast build for
counting (models.registry.build_shapes, issue 42 item 8) gives every registry entry the
built model's parameter counts and state size, so the speed-up cannot drift."""
from __future__ import annotations

import pytest
from textual.widgets import Select, Static

import models
from test_tui import make_app, settle, store, type_into  # noqa: F401
from test_tui_devices_match import load, no_memory_probe, open_form, profile_text, solved, text  # noqa: F401
from workbench.spec import match
from workbench.spec import profile as profiles
from workbench.spec.profile import ProfileError

STATE = """schema_version = 2
name = "st"
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
[sweep]
models = ["transformer", "lstm", "hyena", "mamba"]
seq_lens = [16]
seeds = [0]
[train]
steps = 4
batch_size = 4
device = "cpu"
[sweep.match]
state_size = 4096
"""


# --------------------------------------------------------------------------- CLI / profile check
def test_every_model_that_cannot_be_matched_is_named_with_its_own_reason():
    with pytest.raises(ProfileError) as e:
        profiles.loads(STATE, "st.toml")
    lines = [x for x in str(e.value).splitlines() if "sweep.match" in x]
    # transformer and hyena refused, each with its own reason; lstm and mamba are matched
    assert len(lines) == 2, str(e.value)
    transformer = next(x for x in lines if "'transformer'" in x)
    hyena = next(x for x in lines if "'hyena'" in x)
    assert "KV cache" in transformer
    assert "no fixed-size state" in hyena and "attention" not in hyena and "convolution" in hyena


def test_expand_names_all_unmatched_models_in_one_error():
    prof = profiles.loads(STATE.replace('"transformer", "lstm", "hyena", "mamba"', '"lstm", "mamba"'), "st.toml")
    data = prof.model_dump(mode="json", exclude_unset=True)
    data["sweep"]["models"] = ["transformer", "lstm", "hyena", "mamba"]
    from workbench.spec.expand import MatchRefused

    with pytest.raises(MatchRefused) as e:
        profiles.expand(profiles.Profile.model_validate(data))
    assert set(e.value.reasons.values()) == {"transformer", "hyena"}
    assert "transformer" in str(e.value) and "hyena" in str(e.value)


def test_the_nearest_reachable_count_is_offered_when_the_tolerance_cannot_be_met():
    # mamba at tiny-1m's width and depth: its state moves in steps of 4 layers x 256 channels
    with pytest.raises(match.MatchError) as e:
        match.solve("mamba", "state_size", 10_000, d_model=128, n_layers=4)
    err = e.value
    assert err.nearest and abs(err.nearest[0] / 10_000 - 1) > match.TOLERANCE
    assert f"the nearest it reaches: state_size = {err.nearest[0]:,}" in str(err)
    # the offer is one the model meets exactly
    again = match.solve("mamba", "state_size", err.nearest[0], d_model=128, n_layers=4)
    assert again.got == err.nearest[0]


# --------------------------------------------------------------------------- the form
async def test_the_form_shows_every_line_in_full_and_the_run_count_that_really_launches(store, tmp_path):  # noqa: F811
    path = tmp_path / "dm.toml"
    path.write_text(profile_text(models=("rwkv7", "transformer", "hyena", "lstm")))
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        form.query_one("#match_kind", Select).value = "state_size"
        await type_into(pilot, "#match_value", "4096")
        lines = (await solved(pilot, form)).splitlines()
        hint = form.query_one("#match-solved", Static)
        # each model's line or its own reason
        assert any(x.startswith("rwkv7: d_model = ") for x in lines), lines
        assert any(x.startswith("lstm: d_model = ") for x in lines), lines
        hyena = next(x for x in lines if "hyena" in x)
        assert "convolution" in hyena and "attention" not in hyena
        assert any("transformer" in x and "KV cache" in x for x in lines), lines
        # laid out in full: the widget is as tall as its wrapped text
        width = hint.content_region.width
        need = sum(max(1, -(-len(x) // width)) for x in lines)
        assert hint.content_region.height >= need, (hint.content_region, lines)
        # the run count says that nothing launches while two models cannot be matched
        count = text(form.query_one("#run-count", Static))
        assert count.startswith("no run launches while 2 models cannot be matched"), count
        assert "transformer" in count and "hyena" in count
        # the refusal is not repeated under "train for" (a budget in tokens counts its steps)
        form.query_one("#budget_kind", Select).value = "tokens"
        await type_into(pilot, "#budget", "4096")
        await pilot.pause()
        if form._budget_timer is not None:  # counted now, not after the typing pause
            form._budget_timer.stop()
            form._budget_steps_now()
        await settle(pilot)
        steps = text(form.query_one("#budget-steps", Static))
        assert "KV cache" not in steps and "no fixed-size state" not in steps, steps
        # unpicking them: the count is the runs again
        from workbench.tui.model_picker import ModelPicker

        form.query_one("#models", ModelPicker).set_picked(["rwkv7", "lstm"])
        await pilot.pause()
        await solved(pilot, form)
        assert text(form.query_one("#run-count", Static)).startswith("will launch 2 runs")


async def test_one_solved_line_longer_than_the_pane_is_not_cut(store, tmp_path):  # noqa: F811
    """A progress line, then one answer line of the same newline count but wrapped to two:
    the widget grows to two lines (the cut of `rwkv7: d_model = 704 (996,864 state floats,`)."""
    path = tmp_path / "dm.toml"
    path.write_text(profile_text(models=("rwkv7",)))
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        form.query_one("#match_kind", Select).value = "state_size"
        await type_into(pilot, "#match_value", "1M")
        line = (await solved(pilot, form))
        hint = form.query_one("#match-solved", Static)
        assert line.startswith("rwkv7: d_model = ") and len(line) > hint.content_region.width, line
        assert hint.content_region.height >= 2, hint.content_region


# --------------------------------------------------------------------------- the fast count
@pytest.mark.parametrize("name", [n for n in models.names() if models.entry(n).family != "pretrained"])
def test_counts_from_build_shapes_equal_the_built_models(name):
    import torch

    from models.compute import param_counts

    kw = {"d_model": 64, "n_layers": 2}
    fast = models.registry.build_shapes(name, **kw)
    torch.manual_seed(0)
    real = models.build(name, **kw)
    assert param_counts(fast) == param_counts(real)
    assert models.registry.param_count(fast) == models.registry.param_count(real)
    assert models.state_size(fast) == models.state_size(real)
    # past the CPU budget the meta device counts the same
    meta = models.registry.build_for_shapes(lambda: models.build(name, **kw), limit=0)
    assert next(meta.parameters()).device.type in ("meta", "cpu")
    assert param_counts(meta) == param_counts(real)
    assert models.state_size(meta) == models.state_size(real)
