"""Pilot tests of the TUI: form -> validate -> save/load -> launch -> runs table -> run view
-> kill. Most use a fake scheduler that only inserts the runs (fast); one launches the real
scheduler and a real worker on a tiny profile."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import tasks
from helpers import until, workers_done
from textual.widget import Widget
from textual.widgets import DataTable, Input, Select, Static, Switch

from workbench.spec import profile as profiles
from workbench.store import Store
from workbench.tui.app import WorkbenchApp
from workbench.tui.compare_view import CompareScreen
from workbench.tui.dialogs import ConfirmScreen, PathScreen
from workbench.tui.model_picker import ModelPicker
from workbench.tui.plots import MetricPlot
from workbench.tui.run_view import RunScreen
from workbench.tui.runs_table import RunsTable
from workbench.tui.sweep_form import SweepForm
from workbench.tui.system_panel import SystemPanel

SIZE = (160, 48)
TASK = "mad_selective_copying"


class FakeScheduler:
    """Inserts the sweep's runs like launch.submit does, but starts no process."""

    def __init__(self) -> None:
        self.submitted: list[profiles.Profile] = []
        self.killed: list[int] = []

    def submit(self, store: Store, profile, jobs=None) -> list[int]:
        self.submitted.append(profile)
        return store.add_runs(s.to_dict() for s in profiles.expand(profile))

    def kill(self, store: Store, run_id: int) -> bool:
        self.killed.append(run_id)
        return store.finish(run_id, "killed", "killed by user")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def make_app(store: Store, tmp_path: Path, scheduler=None) -> WorkbenchApp:
    return WorkbenchApp(store=store, profiles_dir=tmp_path / "profiles",
                        scheduler=scheduler if scheduler is not None else FakeScheduler())


def tiny_profile(name: str = "tiny", models=("lstm", "transformer"), seq_lens=(16, 32)) -> profiles.Profile:
    import tomli_w

    return profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": name,
        "task": {"name": TASK, "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": list(models), "seq_lens": list(seq_lens), "seeds": [0]},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "log_every": 1, "eval_every": 2, "device": "cpu"},
    }))


async def settle(pilot) -> None:
    await workers_done(pilot.app)
    await pilot.pause()


async def type_into(pilot, selector: str, text: str) -> None:
    """Focus an input, clear it and type ``text`` key by key, as a user would."""
    inp = pilot.app.screen.query_one(selector, Input)
    inp.focus()
    inp.value = ""
    await pilot.pause()
    await pilot.press(*text)


async def poll(pilot) -> None:
    """A store read that starts after this call (a poll already in flight may have read
    before the test changed the store, and a new one is skipped while it runs)."""
    await settle(pilot)
    pilot.app.poll_runs()
    await settle(pilot)


async def poll_view(pilot, screen: RunScreen) -> None:
    await settle(pilot)
    screen.poll()
    await settle(pilot)


async def fill_form(pilot, p) -> SweepForm:
    """The sweep form filled from profile ``p`` and settled; returns it (mounted first if its
    tab was never shown, and left hidden then)."""
    await pilot.app.mount_tab("sweep")
    form = pilot.app.query_one(SweepForm)
    await form.fill(p)
    await settle(pilot)
    return form


async def open_compare(pilot) -> CompareScreen:
    """``p`` on the runs table: the compare screen of the cursor's run's profile, shown and
    polled once; returns it."""
    await pilot.press("p")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, CompareScreen)
    screen.poll()
    await settle(pilot)
    return screen


def err_text(form: SweepForm, fid: str) -> str:
    return str(form.query_one(f"#err-{fid}", Static).render())


# --------------------------------------------------------------------------- form
async def test_form_fill_save_and_reload(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        await type_into(pilot, "#name", "mysweep")
        # models: first two entries toggled with space
        sel = app.query_one("#models", ModelPicker)
        sel.focus()
        await pilot.press("space", "down", "space")
        picked = sel.picked
        assert len(picked) == 2
        task = app.query_one("#task", Select)
        task.value = TASK
        await pilot.pause()
        await type_into(pilot, "#seq_lens", "40, 64")
        await type_into(pilot, "#lr", "0.003")
        for fid, text in [("#param-vocab_size", "12"), ("#seeds", "1,2"), ("#betas", "0.8, 0.95"),
                          ("#weight_decay", "0.1"), ("#warmup_steps", "5"), ("#budget", "50"),
                          ("#patience", "3")]:
            app.query_one(fid, Input).value = text
        app.query_one("#schedule", Select).value = "constant"
        app.query_one("#es_metric", Select).value = "loss"
        sw = app.query_one("#amp", Switch)
        sw.focus()
        await pilot.press("enter")  # toggles the switch
        assert sw.value is True

        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, PathScreen)
        await pilot.press("enter")  # accept the default profiles/<name>.toml
        await pilot.pause()
        path = tmp_path / "profiles" / "mysweep.toml"
        assert path.exists(), str(form.query_one("#form-status", Static).render())

        p = profiles.load(path)
        assert p.name == "mysweep"
        assert [m if isinstance(m, str) else m.name for m in p.sweep.models] == picked
        assert p.task.name == TASK and p.task.params() == {"vocab_size": 12}  # defaults stay implicit
        assert "seq_len" not in p.task.params()
        assert p.sweep.seq_lens == [40, 64] and p.sweep.seeds == [1, 2]
        t = p.train
        assert (t.lr, t.betas, t.weight_decay, t.warmup_steps) == (0.003, (0.8, 0.95), 0.1, 5)
        assert (t.steps, t.epochs, t.schedule, t.amp) == (50, None, "constant", True)
        assert (t.early_stopping.metric, t.early_stopping.patience) == ("loss", 3)

        # load it back into a reset form: every field shows what was saved
        app.query_one("#lr", Input).value = "0.5"
        sel.set_picked([])
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, PathScreen)
        app.screen.query_one("#path", Input).value = str(path)
        await pilot.press("enter")
        await settle(pilot)
        assert app.query_one("#lr", Input).value == "0.003"
        assert sel.picked == picked
        assert app.query_one("#param-vocab_size", Input).value == "12"
        assert form.build_profile() == p


async def test_load_then_build_keeps_what_the_form_cannot_show(store, tmp_path):
    """Per-model labels/options, shared init options, min_lr_ratio, early-stopping target and
    published numbers survive load -> save."""
    src = tmp_path / "labels.toml"
    src.write_text(
        'schema_version = 1\nname = "labels"\n[task]\nname = "mad_selective_copying"\n'
        '[sweep]\nmodels = [{name = "transformer", label = "tf-rope", pos = "rope"},'
        ' {name = "transformer", label = "tf-abs"}, "lstm"]\nseq_lens = [40]\n'
        '[model]\ninit_scheme = "hf"\ninit_std = 0.05\n'
        '[model.options.lstm]\nnorm = "layer"\n'
        '[train]\nepochs = 2\nmin_lr_ratio = 0.1\n[train.early_stopping]\ntarget = 0.9\n'
        '[[published]]\nmodel = "tf-rope"\nvalue = 0.5\nepoch = 2\n')
    p = profiles.load(src)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await app.mount_tab("sweep")  # (the form is mounted when first shown; here it stays hidden)
        form = app.query_one(SweepForm)
        await form.fill(p)
        assert app.query_one("#model_options", Input).value == 'lstm.norm="layer"'
        assert form.build_profile() == p


async def test_load_bad_profile_shows_error(store, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\nname = "bad"\n[task]\nname = "mad_selective_copying"\n'
                   '[sweep]\nmodels = ["lstm"]\n[train]\nsteps = 3\nlrr = 0.1\n')
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2", "ctrl+o")
        await pilot.pause()
        app.screen.query_one("#path", Input).value = str(bad)
        await pilot.press("enter")
        await settle(pilot)
        status = str(app.query_one("#form-status", Static).render())
        assert "unknown key 'train.lrr'" in status and "line 9" in status


BAD_VALUES = [  # (input, bad value, where the message must appear, a good value)
    ("#lr", "-1", "lr", "0.001"),
    ("#lr", "abc", "lr", "0.001"),
    ("#seq_lens", "12,x", "seq_lens", "48"),  # 16 tokens to copy need seq_len >= 33
    ("#betas", "0.9, 1.5", "betas", "0.9, 0.99"),
    ("#budget", "0", "budget", "10"),
]


async def test_validation_blocks_save_and_launch(store, tmp_path):
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        app.query_one("#models", ModelPicker).set_picked(["lstm"])
        for field, value, where, good in BAD_VALUES:
            await type_into(pilot, field, value)
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not isinstance(app.screen, PathScreen), field  # nothing to save
            assert err_text(form, where), f"no message next to {where} for {value!r}"
            assert "Cannot use this profile" in str(form.query_one("#form-status", Static).render())
            await pilot.press("ctrl+r")
            await settle(pilot)
            assert sched.submitted == [] and store.runs() == []
            assert not (tmp_path / "profiles").exists()
            # fixing the value clears the message and makes the profile valid
            app.query_one(field, Input).value = good
            assert form.build_profile() is not None, field
            assert err_text(form, where) == ""


async def test_empty_model_selection_and_task_param_errors(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        app.query_one("#task", Select).value = TASK
        await until(pilot, lambda: form._params_task == TASK, timeout=60)   # its inputs mounted
        app.query_one("#param-vocab_size", Input).value = "many"
        assert form.build_profile() is None
        assert "at least 1" in err_text(form, "models")
        assert "integer" in err_text(form, "param-vocab_size")


async def test_task_switch_and_model_options(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        app.query_one("#models", ModelPicker).set_picked(["transformer"])
        app.query_one("#task", Select).value = "mqar"
        await until(pilot, lambda: form.query("#param-num_kv_pairs"))
        await settle(pilot)
        assert form.query("#param-num_kv_pairs") and not form.query("#param-num_tokens_to_copy")
        assert not form.query("#param-seq_len")  # comes from the sequence lengths
        assert "MQAR" in str(form.query_one("#task-desc", Static).render()) or \
            str(form.query_one("#task-desc", Static).render()) == tasks.describe("mqar")
        app.query_one("#param-num_kv_pairs", Input).value = "4"
        app.query_one("#model_options", Input).value = 'transformer.pos=rope, transformer.n_heads=2'
        p = form.build_profile()
        assert p is not None and p.task.name == "mqar" and p.task.params()["num_kv_pairs"] == 4
        assert p.model.options == {"transformer": {"pos": "rope", "n_heads": 2}}
        app.query_one("#model_options", Input).value = "transformer.nope=1"
        assert form.build_profile() is None and "nope" in err_text(form, "model_options")
        app.query_one("#model_options", Input).value = "garbage"
        assert form.build_profile() is None and "model.option=value" in err_text(form, "model_options")


# --------------------------------------------------------------------------- runs table
async def test_launch_fills_runs_table_in_place(store, tmp_path):
    old = store.add_runs(s.to_dict() for s in profiles.expand(tiny_profile("earlier")))
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        app.query_one("#models", ModelPicker).set_picked(["lstm", "transformer"])
        app.query_one("#name", Input).value = "launchme"
        app.query_one("#seq_lens", Input).value = "40,48"
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert [p.name for p in sched.submitted] == ["launchme"]
        await poll(pilot)
        table = app.query_one(RunsTable)
        assert app.screen.focused is table  # launch switched to the runs tab
        ids = [r.id for r in store.runs() if r.id not in old]
        assert table.row_count == 8 and len(ids) == 4
        assert table.current_run_id == ids[0]  # the cursor sits on the first new run
        assert [str(c) for c in table.get_column("state")] == ["pending"] * 8
        assert [str(c) for c in table.get_column("profile")] == ["earlier"] * 4 + ["launchme"] * 4

        # progress of a run: the row changes in place, the cursor stays where the user put it
        await pilot.press("down", "down")
        assert table.cursor_row == 6
        store.mark_started(ids[1], os.getpid(), "cpu", "cpu0")
        store.heartbeat(ids[1], progress=0.5, step=2, total_steps=4, last_loss=1.5, last_accuracy=0.25)
        store.finish(ids[2], "failed", "boom")
        await poll(pilot)
        assert table.row_count == 8 and table.cursor_row == 6
        row = dict(zip([c.key.value for c in table.columns.values()], table.get_row(str(ids[1]))))
        assert str(row["state"]) == "running" and str(row["progress"]) == "50%"
        assert str(row["loss"]) == "1.5" and str(row["accuracy"]) == "0.250" and str(row["device"]) == "cpu"
        assert str(table.get_cell(str(ids[2]), "state")) == "failed"
        assert "1 running" in str(app.query_one("#runs-summary", Static).render())


async def test_progress_repaints_only_changed_rows(store, tmp_path, monkeypatch):
    """A heartbeat changes a few cells: only that row is repainted, not the whole table
    (over SSH each full repaint is ~14 KB at 160x48)."""
    ids = store.add_runs(s.to_dict() for s in profiles.expand(tiny_profile()))
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        calls: list[tuple] = []
        orig = Widget.refresh

        def spy(self, *regions, **kwargs):  # what reaches Textual, after RunsTable's filter
            if self is table:
                calls.append((regions, kwargs))
            return orig(self, *regions, **kwargs)

        monkeypatch.setattr(Widget, "refresh", spy)
        store.heartbeat(ids[2], progress=0.25, last_loss=2.0)
        await poll(pilot)
        assert str(table.get_cell(str(ids[2]), "progress")) == "25%"
        bare = [c for c in calls if not c[0] and not c[1]]
        regions = [r for c in calls for r in c[0]]
        assert not bare, "the whole table was repainted"
        assert regions and all(r.height == 1 for r in regions)


async def test_reopening_shows_history(store, tmp_path):
    store.add_runs(s.to_dict() for s in profiles.expand(tiny_profile()))
    for rid in (1, 2):
        store.finish(rid, "finished")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        assert [str(c) for c in table.get_column("state")] == ["finished", "finished", "pending", "pending"]


# --------------------------------------------------------------------------- run view
def seed_run(store: Store, pid: int | None = None) -> int:
    [rid] = store.add_runs([profiles.expand(tiny_profile(models=("lstm",), seq_lens=(16,)))[0].to_dict()])
    store.mark_started(rid, pid or os.getpid(), "cpu", "cpu0")
    store.add_metrics(rid, [(s, None, "train", "loss", 2.0 - 0.1 * s) for s in range(5)]
                      + [(4, None, "eval", "loss", 1.7), (4, None, "eval", "accuracy", 0.3)])
    store.add_system(rid, {"cpu_percent": 150.0, "rss_mb": 321.0})
    return rid


async def test_run_view_streams_metrics_and_system(store, tmp_path):
    rid = seed_run(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.run_id == rid
        loss = screen.query_one("#loss-plot", MetricPlot)
        acc = screen.query_one("#acc-plot", MetricPlot)
        assert loss.series["train loss"][1] == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])
        assert loss.series["eval loss"] == ([4], [1.7]) and acc.series["eval acc"] == ([4], [0.3])
        system = str(screen.query_one("#sys-text", Static).render())
        assert "CPU 150%" in system and "321 MiB" in system and "No NVIDIA GPU" in system
        assert "lstm" in str(screen.query_one("#run-config", Static).render())

        # no new rows: polls do not redraw; new rows: one redraw, data appended
        draws = loss.draws
        await poll_view(pilot, screen)
        assert loss.draws == draws
        store.add_metrics(rid, [(5, None, "train", "loss", 1.5)])
        store.add_system(rid, {"gpu_util": 87.0, "gpu_mem_used_mb": 1024.0,
                               "gpu_mem_total_mb": 81920.0, "gpu_name": "NVIDIA H100"})
        await poll_view(pilot, screen)
        assert loss.draws == draws + 1 and loss.series["train loss"][0][-1] == 5
        assert acc.draws == draws  # nothing new for accuracy
        system = str(screen.query_one("#sys-text", Static).render())
        assert "GPU memory 1,024 / 81,920 MiB" in system and "GPU utilisation 87%" in system

        # the run fails: the error and results appear
        store.set_results(rid, {"accuracy": 0.31})
        store.finish(rid, "failed", "RuntimeError: shapes do not match")
        await poll_view(pilot, screen)
        err = screen.query_one("#run-error", Static)
        assert err.display and "shapes do not match" in str(err.render())
        assert "0.31" in str(screen.query_one("#run-results", Static).render())
        await pilot.press("escape")
        assert isinstance(app.screen.query_one(RunsTable), DataTable)


def test_thin_keeps_ends_and_budget():
    from workbench.tui.plots import thin

    v = list(range(1001))
    t = thin(v, 200)
    assert len(t) <= 202 and t[0] == 0 and t[-1] == 1000 and t == sorted(set(t))
    assert thin([1.0, 2.0], 200) == [1.0, 2.0]


# --------------------------------------------------------------------------- kill
@pytest.mark.parametrize("from_view", [False, True])
async def test_kill_with_confirmation(store, tmp_path, from_view):
    rid = seed_run(store)
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        if from_view:
            await pilot.press("enter")
            await settle(pilot)
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # declined: nothing happens
        await settle(pilot)
        assert sched.killed == [] and store.get(rid).state == "running"
        await pilot.press("k")
        await pilot.pause()
        await pilot.press("y")
        await settle(pilot)
        assert sched.killed == [rid] and store.get(rid).state == "killed"
        if not from_view:
            await poll(pilot)
            assert str(app.query_one(RunsTable).get_cell(str(rid), "state")) == "killed"


async def test_quit_leaves_runs_alone(store, tmp_path):
    rid = seed_run(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("f2")
        app.query_one("#models", ModelPicker).focus()  # the list, where letters are no input
        await pilot.press("q")  # in the form a stray q must not quit (ctrl+q does)
        await pilot.pause()
        assert app.is_running
        await pilot.press("f1", "q")
        await pilot.pause()
        assert not app.is_running
    assert store.get(rid).state == "running"


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
async def test_real_scheduler_runs_a_tiny_sweep(store, tmp_path):
    """Launch through the real scheduler: detached worker processes train and finish."""
    pytest.importorskip("workbench.execute.scheduler")
    app = WorkbenchApp(store=store, profiles_dir=tmp_path / "profiles")
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, tiny_profile("e2e", models=("lstm",), seq_lens=(16,)))
        assert form.is_mounted
        await pilot.press("f2", "ctrl+r")
        await settle(pilot)
        deadline = time.time() + 120
        while time.time() < deadline:
            await poll(pilot)
            runs = store.runs()
            if runs and all(r.finished for r in runs):
                break
            await pilot.pause(0.5)
        [run] = store.runs()
        assert run.state == "finished", run.error
        await poll(pilot)  # the run may have ended between the last poll and the check
        table = app.query_one(RunsTable)
        assert str(table.get_cell(str(run.id), "state")) == "finished"
        assert str(table.get_cell(str(run.id), "progress")) == "100%"
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen.query_one("#loss-plot", MetricPlot).series.get("train loss")
        # the worker samples once a second, so a run this short may have no sample at all
        shown = str(app.screen.query_one(SystemPanel).query_one("#sys-text", Static).render())
        assert ("no system samples" in shown) == (not store.system(run.id))
