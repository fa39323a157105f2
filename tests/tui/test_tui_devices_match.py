"""Pilot tests of the sweep form's devices field (train.devices: validated, round-tripped,
checked against this machine's GPUs with the scheduler's own rule, in the launch summary),
its models matched by size ([sweep.match]: set, solved per model by the profile's own
solver, refused with the reason, round-tripped), and of an evaluation profile loaded
(into the evaluation form) and then launched (never a launch of the sweep form's sweep)."""
from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
from textual.widgets import Input, Select, Static

from test_tui import SIZE, make_app, settle, store, type_into  # noqa: F401
from workbench.execute.scheduler import devices_refusal
from workbench.spec import profile as profiles
from workbench.tui.form_match import devices_text
from workbench.tui.model_picker import ModelPicker
from workbench.tui import form_launch
from workbench.tui.sweep_form import SweepForm

TASK = "mad_selective_copying"


@pytest.fixture(autouse=True)
def no_memory_probe(monkeypatch):
    """The launch's memory estimate (its probe builds and runs the model: seconds on a busy
    machine) is not what these tests are about: the launches here skip it."""
    monkeypatch.setattr(form_launch, "estimate_text", lambda prof: ("peak memory not estimated", None))


def text(widget) -> str:
    return str(widget.render())


def profile_text(name: str = "dm", models=("lstm", "transformer"), **extra) -> str:
    data = {"schema_version": 2, "name": name,
            "task": {"name": TASK, "vocab_size": 8, "num_tokens_to_copy": 2,
                     "num_train_examples": 64, "num_test_examples": 16},
            "sweep": {"models": list(models), "seq_lens": [16], "seeds": [0]},
            "train": {"steps": 4, "batch_size": 4, "device": "cpu"}}
    for key, value in extra.items():
        section, _, sub = key.partition("__")
        data.setdefault(section, {})[sub] = value
    return tomli_w.dumps(data)


async def open_form(pilot) -> SweepForm:
    await pilot.press("f2")
    await pilot.pause()
    return pilot.app.query_one(SweepForm)


async def solved(pilot, form: SweepForm) -> str:
    """The per-model lines once the match's timer and solving thread are done."""
    form._match_timer is not None and form._match_timer.stop()
    if form._match_timer is not None:
        form._match_now()
    await settle(pilot)
    return text(form.query_one("#match-solved", Static))


async def load(pilot, form: SweepForm, path: Path) -> None:
    await pilot.press("ctrl+o")
    await pilot.pause()
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await settle(pilot)


async def save(pilot, form: SweepForm, path: Path) -> None:
    await pilot.press("ctrl+s")
    await pilot.pause()
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await settle(pilot)
    assert path.exists(), text(form.query_one("#form-status", Static))


# --------------------------------------------------------------------------- devices
def test_devices_line_uses_the_schedulers_rule():
    assert devices_refusal(2, ["0"]) and devices_refusal(2, ["0", "1"]) is None
    assert devices_refusal(4, []) is None  # no GPU: CPU ranks
    line, ok = devices_text("2", "local", ["0"])
    assert not ok and line == f"cannot launch here: {devices_refusal(2, ['0'])}" and "\n" not in line
    assert devices_text("2", "local", ["0", "1"])[1] and devices_text("1", "local", ["0"]) == ("", True)
    assert devices_text("2", "slurm", [])[1] and "CPU processes" in devices_text("3", "local", [])[0]


async def test_devices_field_validates_round_trips_and_shows_in_the_summary(store, tmp_path):  # noqa: F811
    path = tmp_path / "dm.toml"
    path.write_text(profile_text(train__devices=2))
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        assert form.query_one("#devices", Input).value == "2"
        prof = form.build_profile()
        assert prof is not None and prof.train.devices == 2
        out = tmp_path / "again.toml"
        await save(pilot, form, out)
        assert profiles.load(out).train.devices == 2
        for bad, words in (("0", "devices must be greater than 0"), ("two", "devices: 'two' is not a whole number"),
                           ("3", "is not divisible by devices = 3")):
            await type_into(pilot, "#devices", bad)
            assert form.build_profile() is None
            assert words in text(form.query_one("#err-devices", Static)), bad
        await type_into(pilot, "#devices", "")  # empty: one process, nothing written
        assert form.build_profile().train.devices is None
        form.query_one("#sharding", Select).value = "fsdp"  # FSDP needs ranks to shard over
        await pilot.pause()
        assert form.build_profile() is None and "fsdp" in text(form.query_one("#err-devices", Static))
        await type_into(pilot, "#devices", "2")
        assert form.build_profile().train.sharding == "fsdp"
        await save(pilot, form, out)
        assert profiles.load(out).train.sharding == "fsdp"
        await load(pilot, form, out)
        assert form.query_one("#sharding", Select).value == "fsdp"
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert app.scheduler.submitted and app.scheduler.submitted[-1].train.devices == 2
        assert "each run on 2 devices (FSDP)" in text(form.query_one("#form-status", Static))


async def test_more_devices_than_gpus_is_said_before_launch(store, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the scheduler's view: one GPU
    path = tmp_path / "dm.toml"
    path.write_text(profile_text(train__device="auto"))
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        await type_into(pilot, "#devices", "2")
        await pilot.pause()
        note = text(form.query_one("#devices-note", Static))
        assert note == f"cannot launch here: {devices_refusal(2, ['0'])}"
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert not app.scheduler.submitted
        assert "this machine shows 1 GPU(s)" in text(form.query_one("#form-status", Static))
        await type_into(pilot, "#devices", "1")
        await pilot.pause()
        assert not form.query_one("#devices-note", Static).display
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert len(app.scheduler.submitted) == 1


# --------------------------------------------------------------------------- [sweep.match]
async def test_match_target_is_solved_per_model_as_run_does(store, tmp_path):  # noqa: F811
    path = tmp_path / "dm.toml"
    path.write_text(profile_text())
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        assert form.query_one("#d_model", Input).value == "64"
        await type_into(pilot, "#match_value", "100k")
        await pilot.pause()
        # the width is the match's now: not written, its placeholder says so
        d_model = form.query_one("#d_model", Input)
        assert d_model.value == "" and "match" in d_model.placeholder
        lines = (await solved(pilot, form)).splitlines()
        prof = form.build_profile()
        assert prof is not None and prof.sweep.match.target() == ("params", 100_000)
        want = {s.label: s.match for s in profiles.expand(prof)}  # what `run` solves for these runs
        assert set(want) == {"lstm", "transformer"}
        for label, m in want.items():
            line = next(x for x in lines if x.startswith(f"{label}: "))
            assert all(f"{k} = {v}" in line for k, v in m["solved"].items()), line
            assert f"({m['got']:,} params, " in line, line
        # load -> save keeps [sweep.match] and leaves d_model to it
        out = tmp_path / "matched.toml"
        await save(pilot, form, out)
        again = profiles.load(out)
        assert again.sweep.match.target() == ("params", 100_000) and "d_model" not in again.model.model_fields_set
        await type_into(pilot, "#match_value", "")  # no target: the width comes back
        await pilot.pause()
        assert d_model.value == "64" and not form.query_one("#match-solved", Static).display
        await load(pilot, form, out)
        assert form.query_one("#match_value", Input).value == "100000" and d_model.value == ""
        assert form.build_profile().sweep.match == again.sweep.match


async def test_a_target_a_model_cannot_meet_is_refused_with_the_reason(store, tmp_path):  # noqa: F811
    path = tmp_path / "dm.toml"
    path.write_text(profile_text(models=("lstm", "transformer")))
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await load(pilot, form, path)
        form.query_one("#match_kind", Select).value = "state_size"
        await type_into(pilot, "#match_value", "4096")
        lines = (await solved(pilot, form)).splitlines()
        assert any(x.startswith("lstm: d_model = ") for x in lines), lines
        refusal = next(x for x in lines if "transformer" in x)
        assert "cannot be matched by state_size" in refusal and "no fixed-size state" in refusal
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert not app.scheduler.submitted
        assert "no fixed-size state" in text(form.query_one("#err-match_value", Static))
        form.query_one("#models", ModelPicker).set_picked(["lstm"])
        await pilot.pause()
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert app.scheduler.submitted and app.scheduler.submitted[-1].sweep.match.state_size == 4096
        assert "models matched to 4,096 state floats" in text(form.query_one("#form-status", Static))


# --------------------------------------------------------------------------- eval profiles
async def test_ctrl_r_after_an_evaluation_profile_does_not_launch_the_forms_sweep(store, tmp_path,  # noqa: F811
                                                                                    monkeypatch):
    from textual.widgets import TabbedContent

    from test_lm_eval_tasks import fake_index

    from workbench.execute import eval_queue

    fake_index(monkeypatch)  # the evaluation form checks the task names: not against lm-eval's real index
    started = []  # its runs are queued, never started here (no scheduler process)
    monkeypatch.setattr(eval_queue, "start", lambda st, ids, *a: started.append(ids))
    path = Path(__file__).resolve().parents[2] / "profiles" / "zero-shot-table3.toml"
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["lstm"])
        await load(pilot, form, path)
        assert app.query_one(TabbedContent).active == "eval"  # opened in the evaluation form
        await pilot.press("ctrl+r")  # the evaluation form's launch: its evaluation runs
        await settle(pilot)
        assert not app.scheduler.submitted and all(r.spec["kind"] == "eval" for r in store.runs())
        await pilot.press("f2")
        await pilot.press("ctrl+r")  # on the sweep form: its own sweep
        await settle(pilot)
        assert len(app.scheduler.submitted) == 1
