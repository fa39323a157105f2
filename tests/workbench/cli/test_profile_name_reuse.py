"""A profile name never silently holds two different sweeps (issue 41 item 1): four
state-tracking tasks launched from the form under its default name ``sweep`` were averaged
as seeds. The rule (workbench/spec/sweep_identity.py), the form's fresh names and its
question before launching into another sweep's name, and headless ``run``'s warning."""
from __future__ import annotations

import tomli_w
from textual.widgets import Input, Select, Static

from test_tui import FakeScheduler, SIZE, make_app, settle, store  # noqa: F401
from helpers import until
from workbench.spec import profile as profiles
from workbench.spec import sweep_identity as si
from workbench.store import Store
from workbench.tui.dialogs import NameClashScreen
from workbench.tui.model_picker import ModelPicker
from workbench.tui.sweep_form import SweepForm


def prof(task: str = "parity", name: str = "sweep", models=("lstm",), seeds=(0,), seq_lens=(16,),
         grid: dict | None = None, train: dict | None = None, **params) -> profiles.Profile:
    sweep = {"models": list(models), "seq_lens": list(seq_lens), "seeds": list(seeds)}
    if grid:
        sweep["grid"] = grid
    return profiles.loads(tomli_w.dumps({
        "schema_version": 2, "name": name, "task": {"name": task, **params}, "sweep": sweep,
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu", **(train or {})},
    }))


def specs(p: profiles.Profile) -> list[dict]:
    return [s.to_dict() for s in profiles.expand(p)]


# ---------------------------------------------------------------------------- the rule
def test_same_sweep_may_grow_by_models_seeds_lengths_and_grid_values():
    held = specs(prof(grid={"train.lr": [1e-3]}))
    grown = prof(models=("lstm", "transformer"), seeds=(0, 1, 2), seq_lens=(16, 24),
                 grid={"train.lr": [1e-3, 3e-4]})
    assert si.differences(specs(grown), held) == []
    assert si.differences(held[:1], held) == []  # a part of it: a replay
    # writing out a task parameter at its registry default is no change
    assert si.differences(specs(prof(min_len=3)), specs(prof())) == []


def test_another_task_setting_or_grid_axis_is_another_sweep_and_named():
    held = specs(prof("parity"))
    assert si.differences(specs(prof("cycle_navigation")), held) == ["task cycle_navigation vs parity"]
    assert si.differences(specs(prof(min_len=5)), held) == ["task.min_len 5 vs 3"]
    assert si.differences(specs(prof(train={"lr": 3e-4})), held) == ["train.lr 0.0003 vs 0.001"]
    assert si.differences(specs(prof(grid={"train.weight_decay": [0.0, 0.1]})), held) == [
        "grid train.weight_decay vs (none)"]
    # nothing held: no difference
    assert si.differences(held, []) == []


def test_fresh_names_skip_other_sweeps_and_reuse_the_same_one():
    held = {"parity": specs(prof("parity")), "parity-2": specs(prof("parity", min_len=5))}

    def under(name):
        return held.get(name, [])

    assert si.fresh_name("parity", specs(prof("parity")), under) == "parity"  # the same sweep: replay
    assert si.fresh_name("parity", specs(prof("parity", min_len=5)), under) == "parity-2"
    assert si.fresh_name("parity", specs(prof("parity", min_len=6)), under) == "parity-3"
    assert si.fresh_name("cycle_navigation", specs(prof("cycle_navigation")), under) == "cycle_navigation"
    assert si.fresh_name("parity", specs(prof("parity")), under, avoid=["parity"]) == "parity-3"
    assert si.name_base("a b/c") == "a-b-c"


# ---------------------------------------------------------------------------- the form
async def set_task(pilot, form: SweepForm, task: str) -> None:
    form.query_one("#task", Select).value = task
    await until(pilot, lambda: form._params_task == task)
    await settle(pilot)


async def ready_form(pilot) -> SweepForm:
    await pilot.press("f2")
    await pilot.pause()
    form = pilot.app.query_one(SweepForm)
    form.query_one("#models", ModelPicker).set_picked(["lstm"])
    return form


async def launch(pilot, form: SweepForm, task: str | None = None) -> None:
    if task is not None:
        await set_task(pilot, form, task)
    form.query_one("#seq_lens", Input).value = "16"
    form.query_one("#budget", Input).value = "4"
    await settle(pilot)
    await pilot.press("ctrl+r")
    await settle(pilot)
    await pilot.press("f2")  # a launch shows the runs tab: back to the form
    await settle(pilot)


async def test_the_default_name_becomes_each_tasks_own(store, tmp_path):  # noqa: F811
    """Four launches from the fresh form (the issue's case): each task under its own name;
    the same sweep again replays under its name; changed settings get a name of their own."""
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form = await ready_form(pilot)
        assert form.query_one("#name", Input).value == "sweep"
        for task in ("parity", "cycle_navigation", "modular_arithmetic"):
            await set_task(pilot, form, task)
            assert form.query_one("#name", Input).value == task  # proposed as the task is picked
            await launch(pilot, form)
            assert not isinstance(app.screen, NameClashScreen)
            assert sched.submitted[-1].name == task
            assert form.query_one("#name", Input).value == task  # the form shows the name it used
        assert sorted(store.profiles()) == ["cycle_navigation", "modular_arithmetic", "parity"]
        assert {r.task for r in store.runs(profile="parity")} == {"parity"}
        await launch(pilot, form, "parity")  # the same sweep: its own name again (a replay)
        assert sched.submitted[-1].name == "parity"
        form.query_one("#lr", Input).value = "0.0003"
        await launch(pilot, form)
        assert sched.submitted[-1].name == "parity-2"
        assert {r.spec["train"]["lr"] for r in store.runs(profile="parity-2")} == {0.0003}


async def test_a_typed_name_holding_another_sweep_asks_first(store, tmp_path):  # noqa: F811
    sched = FakeScheduler()
    store.add_runs(specs(prof("parity", name="states")))
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form = await ready_form(pilot)
        form.query_one("#name", Input).value = "states"
        await set_task(pilot, form, "cycle_navigation")
        await launch(pilot, form)
        # asked, naming the difference; nothing launched yet
        assert isinstance(app.screen, NameClashScreen) and not sched.submitted
        shown = str(app.screen.query_one("#clash-text", Static).render())
        assert "task cycle_navigation vs parity" in shown and "'states' already holds 1 run(s)" in shown
        assert "'cycle_navigation' (a fresh name)" in str(app.screen.query_one("#clash-choices", Static).render())
        await pilot.press("escape")  # cancel: nothing launched
        await settle(pilot)
        assert not sched.submitted and "not launched" in str(form.query_one("#form-status", Static).render())

        await pilot.press("ctrl+r")
        await settle(pilot)
        await pilot.press("enter")  # the default: the fresh name
        await settle(pilot)
        assert [p.name for p in sched.submitted] == ["cycle_navigation"]
        assert {r.task for r in store.runs(profile="states")} == {"parity"}

        await pilot.press("f2")
        await settle(pilot)
        form.query_one("#name", Input).value = "states"
        await settle(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert isinstance(app.screen, NameClashScreen)
        await pilot.press("s")  # into the same profile, as asked
        await settle(pilot)
        assert sched.submitted[-1].name == "states"
        assert {r.task for r in store.runs(profile="states")} == {"parity", "cycle_navigation"}


async def test_a_loaded_profile_replays_under_its_name_without_asking(store, tmp_path):  # noqa: F811
    sched = FakeScheduler()
    p = prof("parity", name="mine")
    store.add_runs(specs(p))
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        await form.fill(p)
        await settle(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert not isinstance(app.screen, NameClashScreen)
        assert [x.name for x in sched.submitted] == ["mine"]


# ---------------------------------------------------------------------------- headless run
def test_headless_run_warns_in_one_line_and_a_replay_does_not(tmp_path, monkeypatch, capsys):
    from workbench import cli
    from workbench.execute import launch

    st = Store(tmp_path / "store")
    held = st.add_runs(specs(prof("parity")))
    for i in held:
        st.finish(i, "finished")
    submitted = []

    def fake_submit(store, profile, **kw):  # the held runs, finished: nothing to wait for
        submitted.append(profile.name)
        out = launch.Submission()
        out.extend(held)
        out.skipped = list(held)
        return out

    monkeypatch.setattr(launch, "submit", fake_submit)
    other = tmp_path / "other.toml"
    profiles.save(prof("cycle_navigation"), other)
    assert cli.main(["--store", str(tmp_path / "store"), "run", str(other), "--quiet"]) == 0
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if "warning" in x]
    assert "profile 'sweep'" in line and "task cycle_navigation vs parity" in line
    assert "--set name=cycle_navigation" in line
    assert submitted == ["sweep"]  # a warning, not a refusal: what is queued is submit's

    same = tmp_path / "same.toml"
    profiles.save(prof("parity", models=("lstm",), seeds=(0, 1)), same)  # grown by a seed: the same sweep
    assert cli.main(["--store", str(tmp_path / "store"), "run", str(same), "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err
