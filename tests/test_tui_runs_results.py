"""Pilot tests of the runs table (grid values and task settings, sort, filter, acting on the
marked runs, narrow terminals) and of the Results tab's grid selection (best over chosen
grid keys, selected on validation or test, Welch winners as in export)."""
from __future__ import annotations

import pytest
from textual.widgets import DataTable, Select, Static

from test_results_layer import add
from test_tui import FakeScheduler, make_app, settle
from workbench import export
from workbench.results import aggregate as agg
from workbench.store import Store
from workbench.tui.results_view import NONE, ResultsView, over_options

SIZE = (160, 48)


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


def text(widget: Static) -> str:
    return str(widget.render())


def cells(table: DataTable) -> dict[str, list[str]]:
    return {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)[1:]]
            for i in range(table.row_count)}


# --------------------------------------------------------------------------- Results tab
def grid_runs(store: Store) -> None:
    """lstm and mamba over train.lr in {0.1, 0.01} x train.weight_decay {0.0}, seeds 0-2. The
    validation set prefers lr 0.01 for both, the test set lr 0.1 for the lstm; at lr 0.01 the
    lstm (0.71) beats the mamba (0.50) beyond the seed noise."""
    test = {("lstm", 0.1): (0.95, 0.93, 0.94), ("lstm", 0.01): (0.70, 0.72, 0.71),
            ("mamba", 0.1): (0.40, 0.42, 0.41), ("mamba", 0.01): (0.50, 0.52, 0.48)}
    valid = {0.1: 0.60, 0.01: 0.80}
    for (model, lr), accs in test.items():
        for seed, acc in enumerate(accs):
            add(store, model, seed, {"": {"accuracy": acc}, "valid": {"accuracy": valid[lr] + seed / 100}},
                **{"train.lr": lr, "train.weight_decay": 0.0})


def test_over_options_all_keys_first_then_smaller_sets_then_none():
    assert over_options([]) == [NONE]
    assert over_options(["a", "b"]) == ["a, b", "a", "b", NONE]
    six = over_options(list("abcdef"))  # beyond 4 keys: all, all but one, each alone, none
    assert six[0] == "a, b, c, d, e, f" and len(six) == 1 + 6 + 6 + 1


async def test_results_tab_best_over_and_select_on(store, tmp_path):
    grid_runs(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        view.out_dir = tmp_path / "out"
        await pilot.press("f3")
        await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        caption = view.query_one("#results-caption", Static)
        # default: the best over every grid key of the profile, selected on validation
        assert view.options["over"] == over_options(["train.lr", "train.weight_decay"])
        assert view.selection() == (["train.lr", "train.weight_decay"], "validation")
        assert "best over train.lr, train.weight_decay, selected on validation" in text(caption)
        assert cells(table) == {"lstm": ["0.710 ± 0.010"], "mamba": ["0.500 ± 0.020"]}  # lr 0.01's test numbers
        # the winners rule of export: lstm beats mamba beyond the seed noise
        assert table.get_row_at(0)[1].style == "bold green" and table.get_row_at(1)[1].style == ""
        # the chosen grid point of the cell under the cursor
        table.focus()
        table.move_cursor(row=0, column=1)
        await pilot.pause()
        line = text(view.query_one("#results-cell", Static))
        assert "train.lr=0.01" in line and "best of 2 grid point(s) by validation accuracy" in line

        await pilot.press("v")  # selected on test: the anchors' practice, labelled so
        await settle(pilot)
        assert view.selection()[1] == "test"
        assert "selected on test" in text(caption)
        assert cells(table)["lstm"] == ["0.940 ± 0.010"]
        await pilot.press("w")  # the written table has the same selection and verdict
        await settle(pilot)
        written = sorted((tmp_path / "out").glob("*.md"))
        assert len(written) == 1 and "best-over-train.lr-train.weight_decay-on-test" in written[0].name
        recs = agg.records(store, "p")
        assert written[0].read_text() == export.render(
            recs, "accuracy", ["model"], ["seq_len"], "md", best_over=["train.lr", "train.weight_decay"],
            select_on="test")
        assert "selected on test" in written[0].read_text()

        while view._value("over") != NONE:  # b cycles the keys: ..., then none
            await pilot.press("b")
        await settle(pilot)
        assert "no best-over: every run of a cell counts" in text(caption)
        assert cells(table)["lstm"] == ["0.825 ± 0.126"]  # all six lstm runs
        await pilot.press("b")  # back to all keys
        await settle(pilot)
        assert view.selection()[0] == ["train.lr", "train.weight_decay"]

        # rows by a grid key: that key is the table's rows, not selected over
        view.query_one("#results-rows", Select).value = "train.lr"
        await settle(pilot)
        assert view.selection()[0] == ["train.weight_decay"]
        assert sorted(cells(table)) == ["0.01", "0.1"]


async def test_results_tab_without_validation_results_says_so(store, tmp_path):
    for lr in (0.1, 0.01):
        for seed in (0, 1):
            add(store, "lstm", seed, {"": {"accuracy": 0.5 + lr + seed / 100}}, **{"train.lr": lr})
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        await pilot.press("f3")
        await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        # never a silent fall-back to the test set or to every run
        assert table.row_count == 0 and "no validation results" in text(view.query_one("#results-caption", Static))
        await pilot.press("v")
        await settle(pilot)
        assert cells(table) == {"lstm": ["0.605 ± 0.007"]}  # lr 0.1, chosen on test
