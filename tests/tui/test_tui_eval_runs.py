"""Pilot tests of evaluation runs (``kind = "eval"``, lm-eval numbers per task: acc, acc_norm,
perplexity with standard errors) in the TUI: the Results tab opens on lm-eval's accuracy
with one column per task (a task without the metric, and the run-level eval set, left
out), and the run view shows each task's numbers with their standard errors and says why
it has no curves."""
from __future__ import annotations

import os

from textual.widgets import DataTable, Static

from test_tui import SIZE, make_app, settle, store  # noqa: F401
from workbench.spec.eval_spec import eval_spec
from workbench.store import Store
from workbench.tui.plots import MetricPlot
from workbench.tui.results_view import ResultsView
from workbench.tui.run_view import RunScreen

# Mamba-130M and Pythia-160M as in the Mamba paper's Table 3 (a subset; stderrs made up)
NUMBERS = {"mamba-130m": {"lambada_openai": {"acc": 0.4419, "perplexity": 16.07},
                          "hellaswag": {"acc": 0.3521, "acc_norm": 0.3524}},
           "pythia-160m": {"lambada_openai": {"acc": 0.3294, "perplexity": 38.10},
                           "hellaswag": {"acc": 0.2847, "acc_norm": 0.3034}}}


def eval_runs(store: Store) -> list[int]:
    specs = [eval_spec(f"org/{label}", list(NUMBERS[label]), profile="zs", label=label) for label in NUMBERS]
    ids = store.add_runs(specs)
    for rid, label in zip(ids, NUMBERS):
        store.mark_started(rid, os.getpid(), "cpu", None)
        for task, m in NUMBERS[label].items():
            store.set_results(rid, {**m, **{f"{k}_stderr": 0.01 for k in m}, "samples": 100.0}, eval_set=task)
        store.set_results(rid, {"wall_s": 12.0, "params": 1.3e8}, eval_set="")
        store.finish(rid, "finished")
    return ids


def plain(renderable) -> str:
    """What a rich renderable (the run view's table of an evaluation) shows, as text."""
    from rich.console import Console

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(renderable)
    return console.export_text()


def columns(view: ResultsView) -> list[str]:
    return [str(c.label) for c in view.query_one("#results-table", DataTable).columns.values()][1:]


async def test_results_tab_opens_evaluations_on_acc_by_task(store, tmp_path):  # noqa: F811
    eval_runs(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        assert view.current() == ("zs", "acc", "model", "eval_set")
        assert columns(view) == ["eval_set=hellaswag", "eval_set=lambada_openai"]  # no empty "(default)"
        table = view.query_one("#results-table", DataTable)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)[1:]] for i in range(2)}
        # each with lm-eval's standard error beside it (issue 42 item 7)
        assert rows == {"mamba-130m": ["0.352 ± 0.010", "0.442 ± 0.010"],
                        "pythia-160m": ["0.285 ± 0.010", "0.329 ± 0.010"]}
        while view.current()[1] != "perplexity":
            await pilot.press("m")
        await settle(pilot)
        assert columns(view) == ["eval_set=lambada_openai"]  # hellaswag has no perplexity
        caption = str(view.query_one("#results-caption", Static).render())
        assert "± lm-eval's standard error" in caption and "std over" not in caption, caption


async def test_run_view_of_an_evaluation_shows_each_task_with_its_stderr(store, tmp_path):  # noqa: F811
    rid = eval_runs(store)[0]
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(RunScreen(store, rid, app.store_lock))
        await settle(pilot)
        screen = app.screen
        # the tasks' numbers take the (empty) curves' place; the side keeps the run's own figures
        table = plain(screen.query_one("#eval-table", Static).content)
        assert "0.442 ± 0.010" in table and "16.07 ± 0.01" in table and "acc_norm" in table, table
        assert "acc_stderr" not in table  # beside its metric, not a line of its own
        assert not any(p.display for p in screen.query(MetricPlot))
        side = str(screen.query_one("#run-results", Static).render())
        assert "130,000,000" in side and "1.3e+08" not in side, side
        config = str(screen.query_one("#run-config", Static).render())
        assert "tasks: ['lambada_openai', 'hellaswag']" in config or "lambada_openai" in config.split("eval:")[1]
        assert "seq_len" not in config
