"""Pilot tests of the compare view (marks in the runs table -> overlaid curves grouped over
seeds, live) and the results tab (the export table, best cells, written files)."""
from __future__ import annotations

import os

import pytest
from textual.widgets import DataTable, Static

from test_curves import sweep
from test_tui import SIZE, make_app, poll, poll_view, settle
from workbench.results import export
from workbench.spec.run_spec import spec_key
from workbench.store import Store
from workbench.tui.compare_view import CompareScreen
from workbench.tui.plots import CurvePlot
from workbench.tui.results_view import ResultsView
from workbench.tui.runs_table import RunsTable


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


def log_loss(store: Store, rid: int, values: list[float], start: int = 0) -> None:
    store.add_metrics(rid, [(start + i, (start + i) / 10, "train", "loss", v)
                            for i, v in enumerate(values)])


def seed_sweep(store: Store) -> list[int]:
    """lstm seeds 0, 1 and transformer seeds 0, 1 with loss curves; the lstm also has
    eval accuracy."""
    ids = sweep(store)
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
    log_loss(store, ids[0], [4.0, 3.0, 2.0])
    log_loss(store, ids[1], [2.0, 1.0, 0.0])
    log_loss(store, ids[2], [5.0, 5.0, 5.0])
    log_loss(store, ids[3], [5.0, 5.0, 5.0])
    store.add_metrics(ids[0], [(2, 0.2, "eval", "accuracy", 0.5)])
    store.add_metrics(ids[1], [(2, 0.2, "eval", "accuracy", 0.7)])
    return ids


async def test_mark_and_compare_groups_seeds_live(store, tmp_path):
    ids = seed_sweep(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await poll(pilot)
        table = app.query_one(RunsTable)
        await pilot.press("c")  # nothing marked: a warning, no view
        await settle(pilot)
        assert not isinstance(app.screen, CompareScreen)
        await pilot.press("space", "space", "space")  # marks rows 1-3, the cursor moves down
        assert table.marked == set(ids[:3])
        assert [str(c) for c in table.get_column("mark")] == ["●", "●", "●", ""]
        await pilot.press("up", "space")  # unmark the third again
        assert table.marked == set(ids[:2]) | set()
        table.move_cursor(row=2)
        await pilot.press("space")
        await pilot.press("c")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen) and screen.run_ids == ids[:3]
        await poll_view(pilot, screen)
        loss = screen.query_one("#compare-loss", CurvePlot)
        lstm, tf = loss.curves
        assert lstm.label == "lstm (2 seeds)" and lstm.run_ids == ids[:2]
        assert lstm.mean == [3.0, 2.0, 1.0] and lstm.lo[0] == pytest.approx(3.0 - 2 ** 0.5)
        assert tf.label == "transformer seed 0" and tf.mean == [5.0, 5.0, 5.0]
        acc = screen.query_one("#compare-acc", CurvePlot)
        assert [c.mean for c in acc.curves] == [[pytest.approx(0.6)]]
        assert acc.colours[0] == loss.colours[0] != loss.colours[1]  # one colour per group
        legend = screen.query_one("#compare-legend", DataTable)
        assert [str(c) for c in legend.get_column("group")] == ["lstm (2 seeds)", "transformer seed 0"]

        # live: a new row of one seed extends the group's curve (where only it has data)
        draws = loss.draws
        await poll_view(pilot, screen)
        assert loss.draws == draws  # nothing new: no redraw
        log_loss(store, ids[0], [1.5], start=3)
        await poll_view(pilot, screen)
        assert loss.draws == draws + 1
        assert loss.curves[0].x[-1] == 3 and loss.curves[0].mean[-1] == 1.5 and loss.curves[0].n[-1] == 1

        # x axis, band, grouping
        await pilot.press("x")
        assert loss.xlabel == "epoch" and loss.curves[0].x[:3] == [0.0, 0.1, 0.2]
        await pilot.press("x")
        assert loss.xlabel == "wall time (s)"
        await pilot.press("x", "x", "x", "b")  # (training tokens, FLOPs) back to steps; band min..max
        assert loss.curves[0].lo[:3] == [2.0, 1.0, 0.0] and loss.curves[0].hi[:3] == [4.0, 3.0, 2.0]
        await pilot.press("g")
        assert [c.label for c in loss.curves] == ["lstm seed 0", "lstm seed 1", "transformer seed 0"]
        await pilot.press("l")  # no run logged eval loss: l offers only what was logged
        assert screen.loss_metric == ("train", "loss") and loss.curves
        assert any("only train loss" in str(n.message) for n in app._notifications)
        await pilot.press("escape")
        assert isinstance(app.screen.query_one(RunsTable), RunsTable)


async def test_compare_a_whole_profile(store, tmp_path):
    ids = seed_sweep(store)
    sweep(store, models=("lstm",), seeds=(0,))  # same name, more runs: all of them compared
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await poll(pilot)
        await pilot.press("p")
        await settle(pilot)
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.run_ids == ids + [ids[-1] + 1]
        assert "profile cmp" in app.screen.what


def finish(store: Store, rid: int, **values) -> None:
    sets = values.pop("sets", {})
    store.set_results(rid, values)
    for name, acc in sets.items():
        store.set_results(rid, {"accuracy": acc}, eval_set=name)
    store.finish(rid, "finished")


async def test_results_tab_table_best_cells_and_files(store, tmp_path):
    ids = sweep(store, seq_lens=(16, 32))  # lstm/transformer x L16/L32 x seeds 0/1
    accs = [0.5, 0.7, 0.9, 0.9, 0.6, 0.6, 0.2, 0.22]
    for rid, a in zip(ids, accs):
        store.mark_started(rid, os.getpid(), "cpu", None)
        finish(store, rid, accuracy=a, step_time_ms=10.0 if rid in ids[:4] else 5.0)
    app = make_app(store, tmp_path)
    app.figures_dir = tmp_path / "out"
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        view.out_dir = tmp_path / "out"
        await pilot.press("f3")
        await settle(pilot)
        assert view.current() == ("cmp", "accuracy", "model", "seq_len")
        table = view.query_one("#results-table", DataTable)
        cells = {(str(table.get_row_at(i)[0]), j): table.get_row_at(i)[j + 1]
                 for i in range(table.row_count) for j in range(2)}
        assert str(cells[("lstm", 0)]) == "0.600 ± 0.141" and str(cells[("transformer", 1)]) == "0.210 ± 0.014"
        # best of each column by the Welch rule (workbench.results.aggregate.winners): lstm at
        # L=32 (0.9 vs 0.21, beyond the seed noise); at L=16 0.6 ± 0.141 and 0.6 ± 0: a tie
        assert cells[("lstm", 1)].style == "bold green" and cells[("transformer", 1)].style == ""
        assert cells[("lstm", 0)].style == cells[("transformer", 0)].style == "bold green"  # a tie
        # a lower-is-better metric: the transformer's 5 ms is the best
        while view.current()[1] != "step_time_ms":
            await pilot.press("m")
        await settle(pilot)
        best = [str(table.get_row_at(i)[0]) for i in range(table.row_count)
                if table.get_row_at(i)[1].style == "bold green"]
        assert best == ["transformer"]
        await pilot.press("w")
        await settle(pilot)
        md = tmp_path / "out" / "cmp" / "cmp-step_time_ms-by-model-seq_len.md"  # the profile's folder
        recs = export.records(store, "cmp")
        assert md.read_text() == export.render(recs, "step_time_ms", ["model"], ["seq_len"], "md")
        assert md.with_suffix(".tex").read_text().startswith("\\begin{table}")
        assert md.with_suffix(".csv").exists()
        await pilot.press("r")  # rows by the next field; never the same as the columns
        assert view.current()[2] != view.current()[3]


async def test_results_tab_shows_eval_sets_as_columns_and_follows_the_store(store, tmp_path):
    ids = sweep(store, models=("lstm",), seeds=(0,))
    store.mark_started(ids[0], os.getpid(), "cpu", None)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        assert "no finished runs" in str(view.query_one("#results-caption", Static).render())
        finish(store, ids[0], accuracy=0.9, sets={"len=64": 0.8, "len=256": 0.4})
        view.refresh_data()
        await settle(pilot)
        assert view.current()[3] == "eval_set"
        table = view.query_one("#results-table", DataTable)
        assert [str(c.label) for c in table.columns.values()][1:] == ["len=64", "len=256", "(default)"]
        assert [str(c) for c in table.get_row_at(0)][1:] == ["0.800", "0.400", "0.900"]
        await pilot.press("f1")  # hidden: it no longer reads the store
        view._busy = False
        view.refresh_data()
        assert not view._busy


async def test_results_tab_validation_set_alone_keeps_the_length_columns(store, tmp_path):
    # every run has eval set "valid" (selection); it is no reason to lay columns out by eval set
    ids = sweep(store, models=("lstm", "transformer"), seeds=(0,))
    for rid, acc in zip(ids, (0.9, 0.6)):
        store.mark_started(rid, os.getpid(), "cpu", None)
        finish(store, rid, accuracy=acc, sets={"valid": acc - 0.1})
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        assert view.current()[3] == "seq_len"
        table = view.query_one("#results-table", DataTable)
        assert [str(table.get_row_at(i)[1]) for i in range(table.row_count)] == ["0.900", "0.600"]
        # one run per cell: no cell is marked best (the Welch rule needs n >= 2)
        assert all(table.get_row_at(i)[1].style == "" for i in range(table.row_count))


async def test_resume_key_requeues_a_run_with_a_checkpoint(store, tmp_path, monkeypatch):
    from workbench.train import checkpoint
    from workbench.execute import scheduler

    spawned = []
    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: spawned.append(a))
    a, b = sweep(store, models=("lstm",), seeds=(0, 1))
    for rid in (a, b):
        store.mark_started(rid, 4_194_000, "cpu", None)  # a pid no process has: the worker is gone
        store.finish(rid, "preempted", "preempted (SIGTERM)")
    path = checkpoint.path_for(store.root, a)
    # requeue verifies the file's header, checksum, run id and spec key, not its training state
    checkpoint.save({"format": checkpoint.FORMAT, "run_id": a, "step": 3,
                     "spec_key": spec_key(store.get(a).spec)}, path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await poll(pilot)
        await pilot.press("r")  # run a: has a checkpoint; r asks first (the README's one confirmation)
        await settle(pilot)
        assert store.get(a).state == "preempted" and not spawned  # nothing before the answer
        await pilot.press("y")
        await settle(pilot)
        assert store.get(a).state == "pending" and store.get(a).info["resume"]["checkpoint"] == str(path)
        assert len(spawned) == 1
        await pilot.press("down", "r", "y")  # run b: none
        await settle(pilot)
        assert store.get(b).state == "preempted" and len(spawned) == 1


async def test_runs_table_shows_slurm_job_and_state(store, tmp_path):
    [rid] = sweep(store, models=("lstm",), seeds=(0,))
    store.set_info(rid, {"executor": "slurm", "slurm_job_id": "42", "slurm_state": "TIMEOUT (TimeLimit)"})
    store.finish(rid, "preempted", "Slurm job 42: TIMEOUT")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await poll(pilot)
        table = app.query_one(RunsTable)
        assert [str(c) for c in table.get_column("device")] == ["slurm 42 TIMEOUT (TimeLimit)"]
        assert [str(c) for c in table.get_column("state")] == ["preempted"]
