"""Sweeps of hundreds of runs: a profile's progress and ETA (workbench/store/progress.py), the
runs table's profile filter and progress lines, ``runs``' summary lines, and the sweep
form's grid axes written to ``[sweep.grid]``."""
from __future__ import annotations

import os
import socket
import time

import psutil
import pytest
from textual.widgets import Input, Static

from helpers import paste_into
from test_tui import SIZE, FakeScheduler, make_app, poll, settle, store, type_into  # noqa: F401
from test_tui_sweep_form import open_form, run_count, text
from workbench import cli
from workbench.cli import runs as cli_runs
from workbench.store import progress
from workbench.spec import profile as profiles
from workbench.store import Run
from workbench.tui.runs_table import RunsTable

NOW = 1_700_000_000.0


def mk(rid: int, state: str, started: float | None = None, ended: float | None = None,
       prog: float = 0.0, profile: str = "p") -> Run:
    return Run(id=rid, profile=profile, idx=rid, model="lstm", label="lstm", task="t", seq_len=8,
               seed=0, spec={}, fields={}, state=state, device=None, slot=None, host=None, pid=None,
               pid_start=None, created=NOW, started=started, ended=ended, heartbeat=None,
               progress=prog, step=0, total_steps=None, epoch=None, last_loss=None,
               last_accuracy=None, backend=None, error=None, info={}, log_path=None)


def fin(rid: int, wall: float, **kw) -> Run:
    return mk(rid, "finished", NOW - 1000, NOW - 1000 + wall, 1.0, **kw)


def run(rid: int, prog: float, started: float = NOW - 10, **kw) -> Run:
    return mk(rid, "running", started, None, prog, **kw)


# ---------------------------------------------------------------------------- ETA
def test_eta_is_the_work_left_over_the_running_slots():
    # run time 150 s (mean of 100 and 200); 2 running half done, 6 pending:
    # (6 x 150 + 2 x 75) / 2 slots
    runs = [fin(1, 100), fin(2, 200), run(3, 0.5), run(4, 0.5)] + [mk(i, "pending") for i in range(5, 11)]
    assert progress.run_time(runs, NOW) == 150
    assert progress.eta(runs, NOW) == (525, 150)
    # a failed run has ended, but it is not done (issue 32) and not in the run time
    runs.append(mk(11, "failed", NOW - 50, NOW - 49))
    assert progress.eta(runs, NOW) == (525, 150)
    [p] = progress.by_profile(runs, NOW)
    assert (p.total, p.done, p.finished, p.failed, p.running, p.pending) == (11, 2, 2, 1, 2, 6)
    assert p.text() == "p: 2/11 done, 1 failed, 2 running, 6 pending, ETA 8m 45s (run 2m 30s x 2 slots)"


def test_eta_never_below_the_longest_remainder_or_a_whole_pending_run():
    # two running, one just started: the slots cannot share its 100 s
    assert progress.eta([fin(1, 100), run(2, 0.0), run(3, 0.9)], NOW)[0] == 100
    # more slots than runs left: the pending one still takes a whole run after it starts
    assert progress.eta([fin(1, 100)] + [run(i, 0.9) for i in range(2, 6)] + [mk(6, "pending")], NOW)[0] == 100


def test_eta_before_any_run_finished_and_when_nothing_moves():
    # no finished run: elapsed / progress of the running ones (past 5 %)
    runs = [run(1, 0.5, started=NOW - 60), run(2, 0.01, started=NOW - 1), mk(3, "pending")]
    assert progress.run_time(runs, NOW) == 120
    assert progress.eta(runs, NOW) == (max((120 + 60 + 120 * 0.99) / 2, 120), 120)
    assert progress.eta([run(1, 0.01), mk(2, "pending")], NOW) == (None, None)  # not measured yet
    assert progress.eta([fin(1, 100), mk(2, "pending")], NOW) == (None, 100)  # none running
    assert progress.eta([fin(1, 100)], NOW) == (0.0, 100)
    assert "ETA – (none running)" in progress.by_profile([fin(1, 100), mk(2, "pending")], NOW)[0].text()
    assert progress.by_profile([fin(1, 100)], NOW)[0].text() == "p: 1/1 done"


def test_duration():
    assert [progress.duration(s) for s in (None, 45, 200, 4320, 3 * 86400 + 7200)] == \
        ["–", "45s", "3m 20s", "1h 12m", "3d 2h"]


# ---------------------------------------------------------------------------- a store with two profiles
def two_profiles(store) -> tuple[list[int], list[int]]:
    """Profile a: one finished (100 s), one running half done (this process, alive), one
    pending; profile b: two pending."""
    spec = {"model": "lstm", "label": "lstm", "task": "t", "seq_len": 8, "fields": {}}
    a = store.add_runs([{**spec, "profile": "a", "seed": i} for i in range(3)])
    b = store.add_runs([{**spec, "profile": "b", "seed": i} for i in range(2)])
    now = time.time()
    c = store.conn
    c.execute("UPDATE runs SET state='finished', started=?, ended=?, progress=1.0 WHERE id=?",
              (now - 500, now - 400, a[0]))
    c.execute("UPDATE runs SET state='running', started=?, heartbeat=?, progress=0.5, pid=?, pid_start=?,"
              " host=?, device='cpu' WHERE id=?",
              (now - 50, now + 3600, os.getpid(), psutil.Process().create_time(), socket.gethostname(), a[1]))
    c.commit()
    return a, b


A_LINE = "a: 1/3 done, 1 running, 1 pending, ETA 2m 30s (run 1m 40s x 1 slot)"
B_LINE = "b: 0/2 done, 2 pending, ETA – (none running)"


def test_runs_prints_each_profiles_progress(store, capsys):
    two_profiles(store)
    assert cli.main(["--store", str(store.root), "runs"]) == 0
    out = capsys.readouterr().out
    assert A_LINE in out and B_LINE in out
    # --state shows some runs; the progress still counts all of the profile's
    assert cli.main(["--store", str(store.root), "runs", "--profile", "a", "--state", "pending"]) == 0
    out = capsys.readouterr().out
    assert A_LINE in out and "b:" not in out and " running " not in out


def test_runs_lists_thousands_as_plain_columns(store, capsys, monkeypatch):
    monkeypatch.setattr(cli_runs, "BOXED_MAX", 2)  # the plain layout, without making 300 runs
    a, b = two_profiles(store)
    assert cli.main(["--store", str(store.root), "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = cli_runs.headers_shown(store.runs())   # loss and acc as train_loss, eval_acc
    assert lines[0].split() == [shown.get(h, h) for h in cli_runs.RUNS_HEADERS] and "┃" not in "".join(lines)
    assert "train_loss" in lines[0].split()
    rows = [line.split() for line in lines[1:6]]
    assert [int(r[0]) for r in rows] == a + b
    assert [r[1] for r in rows] == ["a", "a", "a", "b", "b"]
    assert [r[6] for r in rows] == ["finished", "running", "pending", "pending", "pending"]
    assert lines[6:8] == [A_LINE, B_LINE]


# ---------------------------------------------------------------------------- the TUI's runs table
def summary(app) -> str:
    return text(app.query_one("#runs-summary", Static))


async def test_runs_table_shows_progress_and_filters_to_a_profile(store, tmp_path):
    a, b = two_profiles(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        assert table.row_count == 5
        assert A_LINE in summary(app) and B_LINE in summary(app)
        # the key is in the footer
        from textual.widgets._footer import FooterKey

        def key_shown():
            return any(k.key == "f" and "profile" in k.description for k in app.query(FooterKey))

        # the footer redraws its keys a refresh after the bindings change: on a loaded
        # machine (a full suite run) that can come after settle(); wait for it, bounded
        for _ in range(100):
            if key_shown():
                break
            await pilot.pause(0.05)
        assert key_shown()
        table.move_cursor(row=3)  # a run of profile b
        await pilot.press("f")
        await pilot.pause()
        assert table.profile_filter == "b"
        assert sorted(int(k.value) for k in table.rows) == b
        assert table.current_run_id == b[0]  # the cursor stays on its run
        s = summary(app)
        assert "profile b only" in s and B_LINE in s and "a:" not in s and s.startswith("2 runs")
        await poll(pilot)  # a poll keeps the filter (one that starts now, not the next 0.5 s tick)
        assert sorted(int(k.value) for k in table.rows) == b
        await pilot.press("p")  # compare: the profile of the cursor's run
        await pilot.pause()
        assert app.screen.__class__.__name__ == "CompareScreen"
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("f")  # all runs again
        await pilot.pause()
        assert table.profile_filter is None and table.row_count == 5
        assert table.current_run_id == b[0]
        assert A_LINE in summary(app) and "only" not in summary(app)


# ---------------------------------------------------------------------------- the sweep form's grid
async def test_grid_axes_count_runs_and_save_sweep_grid(store, tmp_path):
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        picker.set_picked(["lstm", "transformer"])
        await pilot.pause()
        assert run_count(form) == "will launch 2 runs = 2 models x 1 length x 1 seed"
        await type_into(pilot, "#grid_lr", "1e-4, 5e-4, 1e-3")
        assert run_count(form) == "will launch 6 runs = 2 models x 1 length x 1 seed x 3 grid points"
        await type_into(pilot, "#grid_wd", "0, 0.1")
        assert run_count(form) == "will launch 12 runs = 2 models x 1 length x 1 seed x 6 grid points"
        await paste_into(pilot, "#grid_axes", "model.d_model = 8, 16; train.warmup_steps = 0, 1")  # (typed: seconds)
        assert run_count(form) == "will launch 48 runs = 2 models x 1 length x 1 seed x 24 grid points"
        # a line that is not key = values, and a key that has its own input
        await type_into(pilot, "#grid_axes", "d_model 8")
        assert "cannot count" in run_count(form) and "dotted key" in run_count(form)
        await type_into(pilot, "#grid_axes", "train.lr = 1")
        assert "train.lr has its own input (grid lr)" in run_count(form)
        await paste_into(pilot, "#grid_axes", "model.d_model = 8, 16")
        assert run_count(form).startswith("will launch 24 runs")

        await pilot.press("ctrl+s")
        await pilot.pause()
        assert text(form.query_one("#form-status", Static)) == ""
        path = tmp_path / "profiles" / "grid.toml"
        app.screen.query_one("#path", Input).value = str(path)
        await pilot.press("enter")
        await settle(pilot)
        saved = path.read_text()
        assert "[sweep.grid]" in saved and "schema_version = 2" in saved
        prof = profiles.load(path)
        assert prof.sweep.grid == {"train.lr": [1e-4, 5e-4, 1e-3], "train.weight_decay": [0, 0.1],
                                   "model.d_model": [8, 16]}
        specs = profiles.expand(prof)
        assert len(specs) == 24
        assert {(s.grid["train.lr"], s.grid["model.d_model"]) for s in specs} == \
            {(lr, d) for lr in (1e-4, 5e-4, 1e-3) for d in (8, 16)}

        # loading it back fills the inputs; a value the schema refuses is shown at its input
        await type_into(pilot, "#grid_lr", "")
        await type_into(pilot, "#grid_axes", "")
        await form.fill(prof)
        await settle(pilot)
        assert form.query_one("#grid_lr", Input).value == "0.0001, 0.0005, 0.001"
        assert form.query_one("#grid_wd", Input).value == "0, 0.1"
        assert form.query_one("#grid_axes", Input).value == "model.d_model = 8, 16"
        assert run_count(form).startswith("will launch 24 runs")
        await type_into(pilot, "#grid_wd", "0, -1")
        assert form.build_profile() is None
        assert "weight_decay" in text(form.query_one("#err-grid_wd", Static))


@pytest.mark.parametrize("bad", ["foo", "key = ", "a b.c = 1", "x.y = 1; x.y = 2"])
def test_parse_grid_axes_refuses_in_one_line(bad):
    from workbench.tui.form_fields import parse_grid_axes

    with pytest.raises(ValueError) as e:
        parse_grid_axes(bad)
    assert "\n" not in str(e.value)


def test_parse_grid_axes():
    from workbench.tui.form_fields import parse_grid_axes

    assert parse_grid_axes('model.options.mamba.d_state = 8, 16; "train.schedule" = cosine, constant') == \
        {"model.options.mamba.d_state": [8, 16], "train.schedule": ["cosine", "constant"]}


def test_row_key_changes_with_what_the_row_shows():
    from workbench.tui.run_cells import row_key

    a = fin(1, 100)
    assert row_key(a, False) == row_key(fin(1, 100), False)
    for changed in (dict(last_accuracy=0.5), dict(state="failed"), dict(ended=a.ended + 1),
                    dict(label="x"), dict(progress=0.5), dict(device="cuda")):
        assert row_key(a, False) != row_key(Run(**{**a.__dict__, **changed}), False), changed
    assert row_key(a, False) != row_key(a, True)  # the mark
    assert row_key(run(2, 0.5), False) is None  # elapsed moves with the clock
