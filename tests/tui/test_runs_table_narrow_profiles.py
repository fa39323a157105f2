"""The runs table of a store with several profiles at 80x24 keeps the column that tells two
runs of one profile apart (issue 42 item 4): three lm profiles with a tokenizer grid and
two evaluation runs made the model, task, seq_len, grid and profile all vary, the room went
to model, seq_len and profile (with a seed column, 0 on every row, in what was left), and
the grid point, the only difference between two runs of a profile, was left out. Now an
axis that tells apart no rows the axes before it do not (task and seq_len here: the
evaluation runs already differ in model) ranks as one that is the same on every row, and a
grid of one key shows its values under a header that names the key (``tokenizer``:
``bytes``, ``bpe/512``)."""
from __future__ import annotations

import os

from test_run_view_sample_key import stored_eval
from test_tui import make_app, poll, settle, store  # noqa: F401
from test_tui_lm_perplexity_first import lm_profile

from workbench.spec import profile as profiles
from workbench.tui.run_cells import layout, redundant_axes
from workbench.tui.runs_table import RunsTable

GRIDS = ({"task.tokenizer": "bytes"}, {"task.tokenizer": "bpe", "task.vocab_size": 512})


def tokenizer_profiles(store, tmp_path) -> list[int]:  # noqa: F811
    """Three profiles of two finished lm runs each, told apart only by their tokenizer."""
    base = next(iter(profiles.expand(lm_profile(tmp_path)))).to_dict()
    specs = [dict(base, profile=name, grid=grid) for name in ("lm-tok", "lm-load", "lm-tok3") for grid in GRIDS]
    ids = store.add_runs(specs)
    for i, rid in enumerate(ids):
        store.mark_started(rid, os.getpid(), "cpu", None)
        store.set_results(rid, {"bits_per_byte": 4.0 - i / 10, "loss": 2.0})
        store.finish(rid, "finished")
    return ids


def test_axes_that_tell_no_more_rows_apart_are_redundant_and_the_grid_then_fits():
    rows = [{"model": "transformer", "seq_len": "64", "task": "lm", "grid": g, "seed": "0", "profile": p}
            for p in ("lm-tok", "lm-load", "lm-tok3") for g in ("bytes", "bpe/512")]
    rows += [{"model": f"run:{i}", "seq_len": "", "task": "lm-eval", "grid": "", "seed": "0", "profile": "eval"}
             for i in (1, 2)]
    varies = {"model", "seq_len", "task", "grid", "profile"}
    assert redundant_axes(rows, varies) == {"seq_len", "task"}
    assert redundant_axes(rows[:6], {"grid", "profile"}) == set()   # each tells rows apart
    assert redundant_axes([], varies) == set()
    natural = {"id": 2, "profile": 7, "model": 11, "task": 7, "seq_len": 2, "grid": 9, "seed": 1,
               "loss": 5, "elapsed": 0, "device": 3}
    shown = layout(78, natural, varies - redundant_axes(rows, varies), {"elapsed"})
    assert {"grid", "profile", "model"} <= set(shown) and "seed" not in shown, shown


async def test_two_runs_of_one_profile_read_apart_at_80x24_beside_evaluation_runs(store, tmp_path):  # noqa: F811
    tokenizer_profiles(store, tmp_path)
    stored_eval(store)
    stored_eval(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await poll(pilot)
        table = app.query_one(RunsTable)
        assert "grid" in table.columns and "profile" in table.columns, list(table.columns)
        assert "seed" not in table.columns, list(table.columns)
        assert str(table.columns["grid"].label) == "tokenizer"
        grid = [table.get_cell(str(rid), "grid").plain for rid in range(1, 7)]
        assert grid == ["bytes", "bpe/512"] * 3
