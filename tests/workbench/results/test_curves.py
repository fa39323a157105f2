"""Curves over seeds (workbench/results/curves.py): grouping, legend labels, alignment of runs
that logged at different x values, the mean and its bands, and the three x axes."""
from __future__ import annotations

import statistics

import pytest

from workbench.results import curves as cv
from workbench.spec import profile as profiles
from workbench.store import Store


def sweep(store: Store, models=("lstm", "transformer"), seeds=(0, 1), seq_lens=(16,)) -> list[int]:
    import tomli_w

    prof = profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": "cmp",
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": list(models), "seq_lens": list(seq_lens), "seeds": list(seeds)},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu"},
    }))
    return store.add_runs(s.to_dict() for s in profiles.expand(prof))


def test_group_runs_and_labels(tmp_path):
    store = Store(tmp_path)
    ids = sweep(store, seq_lens=(16, 32))  # 2 models x 2 lengths x 2 seeds
    runs = store.runs(ids=ids)
    groups = cv.group_runs(runs)
    assert [[r.id for r in rs] for rs in groups.values()] == [ids[i:i + 2] for i in range(0, 8, 2)]
    labels = list(cv.group_labels(groups).values())
    assert labels == ["lstm L=16 (2 seeds)", "lstm L=32 (2 seeds)",
                      "transformer L=16 (2 seeds)", "transformer L=32 (2 seeds)"]
    single = cv.group_runs(runs[:2], by_seed=False)
    assert list(cv.group_labels(single).values()) == ["lstm seed 0", "lstm seed 1"]


def test_mean_and_bands_of_aligned_runs():
    a = cv.Points([0, 1, 2], [1.0, 2.0, 3.0])
    b = cv.Points([0, 1, 2], [3.0, 2.0, 7.0])
    std = cv.combine("g", [1, 2], [a, b], "std")
    assert std.x == [0, 1, 2] and std.mean == [2.0, 2.0, 5.0] and std.n == [2, 2, 2]
    s0 = statistics.stdev([1.0, 3.0])
    assert std.lo[0] == pytest.approx(2.0 - s0) and std.hi[0] == pytest.approx(2.0 + s0)
    assert std.lo[1] == std.hi[1] == 2.0  # equal values: no spread
    mm = cv.combine("g", [1, 2], [a, b], "minmax")
    assert mm.lo == [1.0, 2.0, 3.0] and mm.hi == [3.0, 2.0, 7.0]
    none = cv.combine("g", [1, 2], [a, b], "none")
    assert none.lo == none.mean == none.hi
    with pytest.raises(ValueError, match="unknown band"):
        cv.combine("g", [1], [a], "iqr")


def test_runs_logged_at_different_x_are_interpolated_not_extrapolated():
    long = cv.Points([0, 10, 20], [0.0, 1.0, 2.0])
    short = cv.Points([5, 10], [10.0, 20.0])  # a live run that has not got as far
    c = cv.combine("g", [1, 2], [long, short], "minmax")
    assert c.x == [0, 5, 10, 20]
    assert c.mean == [0.0, pytest.approx((0.5 + 10.0) / 2), 10.5, 2.0]
    assert c.n == [1, 2, 2, 1]  # only the long run at 0 and 20
    assert cv.interpolate(long, [15, 25, -1]) == [1.5, None, None]


def test_grid_budget_keeps_both_ends():
    p = cv.Points(list(range(1001)), [float(i) for i in range(1001)])
    grid = cv.common_grid([p], budget=100)
    assert len(grid) <= 101 and grid[0] == 0 and grid[-1] == 1000


def test_axes_from_store_rows(tmp_path):
    store = Store(tmp_path)
    ids = sweep(store, models=("lstm",))
    for rid in ids:
        store.mark_started(rid, 1, "cpu", None)
    store.add_metrics(ids[0], [(10, 0.5, "train", "loss", 2.0), (20, 1.0, "train", "loss", 1.0),
                               (20, 1.0, "eval", "accuracy", 0.5)])
    store.add_metrics(ids[1], [(10, 0.5, "train", "loss", 4.0), (20, None, "train", "loss", 3.0),
                               (30, 1.5, "train", "loss", None)])  # NaN -> NULL: skipped
    runs = store.runs(ids=ids)
    [step] = cv.curves(store, runs, "train", "loss", "step")
    assert step.x == [10, 20] and step.mean == [3.0, 2.0] and step.run_ids == ids
    [epoch] = cv.curves(store, runs, "train", "loss", "epoch")
    assert epoch.x == [0.5, 1.0] and epoch.n == [2, 1]  # run 2's step 20 has no epoch
    wall = cv.points(cv.read_rows(store, ids), runs, "train", "loss", "wall")
    started = {r.id: r.started for r in runs}
    t0 = store.conn.execute("SELECT t FROM metrics WHERE run_id=? LIMIT 1", (ids[0],)).fetchone()[0]
    assert wall[ids[0]].x[0] == pytest.approx(t0 - started[ids[0]])
    # the accuracy curve has only the run that logged it
    [acc] = cv.curves(store, runs, "eval", "accuracy")
    assert acc.run_ids == ids and acc.n == [1]
    # incremental reads: nothing after the last rowid, the new row after a new write
    rows = cv.read_rows(store, ids)
    assert cv.read_rows(store, ids, rows[-1]["rowid"]) == []
    store.add_metrics(ids[1], [(40, 2.0, "train", "loss", 0.5)])
    [new] = cv.read_rows(store, ids, rows[-1]["rowid"])
    assert (new["run_id"], new["step"], new["value"]) == (ids[1], 40, 0.5)
    with pytest.raises(ValueError, match="unknown x axis"):
        cv.curves(store, runs, "train", "loss", "bogus")  # (tokens and flops are axes since issue 33)
