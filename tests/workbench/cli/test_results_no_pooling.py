"""Like with like (issue 41 item 1): no results surface averages runs that differ in more
than the seed. Four state-tracking tasks launched into one profile ``sweep`` once showed
as one row per model, ``mean ± std over 12 run(s)``; two tokenizers of ``lm`` likewise.

Tables (``export``, the Results tab) add the differing key as a row key and say so in one
line; score and report, whose layout is fixed, refuse naming the key; the compare view
and the figures draw one line per configuration."""
from __future__ import annotations

import json

import pytest
from textual.widgets import DataTable, Static

from test_results_layer import add
from test_tui import make_app, settle
from workbench import cli
from workbench.results import aggregate as agg
from workbench.results import curves as cv
from workbench.results import export, plot, report, score
from workbench.spec import profile as prof
from workbench.store import Store
from workbench.tui.compare_view import CompareScreen
from workbench.tui.results_view import ResultsView

TASKS = {"parity": (0.51, 0.49, 0.50), "modular_arithmetic": (0.12, 0.15, 0.13),
         "cycle_navigation": (0.98, 0.99, 1.0), "permutation_composition": (0.30, 0.28, 0.33)}
PARAMS = {"parity": {}, "modular_arithmetic": {"task.modulus": 5}, "cycle_navigation": {"task.cycle_len": 5},
          "permutation_composition": {"task.n": 3}}


def add_to(store: Store, profile: str, model: str, seed: int, results: dict, **fields) -> int:
    """One finished run of ``profile`` (run fields as a sweep's: model, task, seq_len, seed,
    d_model, n_layers, task_setting and the ``fields`` given) with ``results``."""
    f = {"model": model, "task": "mqar", "seq_len": 40, "seed": seed, "d_model": 16, "n_layers": 2,
         "task_setting": "baseline", **fields}
    spec = {"profile": profile, "model": model, "label": model, "task": f["task"], "seq_len": f["seq_len"],
            "seed": seed, "fields": f, "grid": {}}
    rid = store.add_runs([spec])[0]
    for es, vals in results.items():
        store.set_results(rid, vals, eval_set=es)
    assert store.finish(rid, "finished")
    return rid


@pytest.fixture
def four_tasks(tmp_path) -> Store:
    """gated_deltanet on four tasks at seq_len 40, seeds 0-2, all under one profile name."""
    store = Store(tmp_path / "st")
    for task, accs in TASKS.items():
        for seed, a in enumerate(accs):
            add_to(store, "sweep", "gated_deltanet", seed, {"": {"accuracy": a}}, task=task, **PARAMS[task])
    return store


def tokenizers(store: Store) -> list[int]:
    """lm under one profile name with task.tokenizer bytes (loss ~1.2) and bpe (~3.4)."""
    ids = []
    for tok, base in (("bytes", 1.2), ("bpe", 3.4)):
        for seed in (0, 1):
            ids.append(add(store, "mamba", seed, {"": {"loss": base + seed / 10, "accuracy": 0.3}},
                           seq_len=32, task="lm", **{"task.tokenizer": tok}))
    return ids


# --------------------------------------------------------------------------- the rule
def test_pooled_keys_names_what_varies_and_split_keys_adds_the_fewest(four_tasks):
    recs = agg.records(four_tasks, "sweep")
    diff = agg.pooled_keys(recs, ["model", "seq_len"])
    assert list(diff)[0] == "task" and set(diff["task"]) == set(TASKS)
    assert {"task.modulus", "task.cycle_len", "task.n"} <= set(diff)  # each task's own parameters
    # once task is a key, each task's parameters are constant within a cell: one key added
    assert agg.split_keys(recs, ["model", "seq_len"]) == ["task"]
    assert agg.pooled_keys(recs, ["model", "seq_len", "task"]) == {}
    assert agg.split_note(["task"]) .startswith("task varies within cells: added as a row key")
    # the seed, run ids, eval sets and metrics never count
    assert not {"seed", "run_id", "profile", "eval_set", "accuracy"} & set(diff)
    with pytest.raises(agg.PoolingError, match=r"runs of model=gated_deltanet, seq_len=40 differ in 'task' "
                                               r"\(cycle_navigation, modular_arithmetic, parity, "
                                               r"permutation_composition\)"):
        agg.refuse_pooling(recs, ["model", "seq_len"], "x")


# --------------------------------------------------------------------------- export
def test_export_four_tasks_under_one_profile_are_four_rows(four_tasks, capsys):
    assert cli.main(["--store", str(four_tasks.root), "export", "--profile", "sweep", "--metric", "accuracy",
                     "--rows", "model", "--cols", "seq_len"]) == 0
    got = capsys.readouterr()
    assert "task varies within cells: added as a row key" in got.err
    lines = got.out.splitlines()
    assert lines[0] == "| model/task \\ seq_len | seq_len=40 |"
    assert "| model=gated_deltanet, task=parity | 0.500 ± 0.010 |" in lines
    assert "| model=gated_deltanet, task=cycle_navigation | 0.990 ± 0.010 |" in lines
    assert "over 3 run(s) per cell" in got.out and "12 run(s)" not in got.out
    # JSON and CSV carry the task as a field of each record / line
    assert cli.main(["--store", str(four_tasks.root), "export", "--profile", "sweep", "--metric", "accuracy",
                     "--format", "json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert sorted(x["task"] for x in js) == sorted(TASKS) and {x["accuracy"]["n"] for x in js} == {3}
    text = export.render(agg.records(four_tasks), "accuracy", ["model"], ["seq_len"], "csv")
    assert text.splitlines()[0].startswith("model,task,seq_len,metric")


def test_export_two_tokenizers_are_two_rows_and_best_is_within_a_tokenizer(tmp_path, capsys):
    store = Store(tmp_path / "st")
    tokenizers(store)
    add(store, "lstm", 0, {"": {"loss": 2.5}}, seq_len=32, task="lm", **{"task.tokenizer": "bytes"})
    add(store, "lstm", 1, {"": {"loss": 2.6}}, seq_len=32, task="lm", **{"task.tokenizer": "bytes"})
    assert cli.main(["--store", str(store.root), "export", "--metric", "loss"]) == 0
    got = capsys.readouterr()
    assert "task.tokenizer varies within cells: added as a row key" in got.err
    assert "| model=mamba, task.tokenizer=bpe | 3.450 ± 0.071 |" in got.out
    # the best loss of the column is the bytes mamba (1.25); the bpe row is compared only
    # with other bpe rows (none), so it is not marked, nor beaten by a bytes row
    assert "| model=mamba, task.tokenizer=bytes | **1.250 ± 0.071** |" in got.out
    assert "| model=lstm, task.tokenizer=bytes | 2.550 ± 0.071 |" in got.out


def test_best_over_chooses_per_task_not_across_tasks(tmp_path):
    """A learning-rate grid over two tasks: the lr is chosen for each task (the over key
    may vary, it is chosen among), never one lr for the pooled pair."""
    store = Store(tmp_path / "st")
    # parity prefers lr 0.1, cycle navigation lr 0.01 (validation = test here)
    for task, best in (("parity", 0.1), ("cycle_navigation", 0.01)):
        for lr in (0.1, 0.01):
            for seed in (0, 1):
                a = (0.9 if lr == best else 0.4) + seed / 100
                add(store, "lstm", seed, {"": {"accuracy": a}, "valid": {"accuracy": a}}, task=task,
                    **{"train.lr": lr})
    b = export.build(agg.records(store), ["accuracy"], ["model"], ["seq_len"], best_over=["train.lr"])
    assert b["added"] == ["task"]
    assert sorted((c["task"], c["chosen"]["train.lr"]) for c in b["choices"]) == \
        [("cycle_navigation", 0.01), ("parity", 0.1)]
    cells = b["tables"][0]["table"]["cells"]
    assert {k: round(v["mean"], 3) for k, v in cells.items()} == {
        (("lstm", "cycle_navigation"), (64,)): 0.905, (("lstm", "parity"), (64,)): 0.905}


# --------------------------------------------------------------------------- Results tab
async def test_results_tab_shows_each_task_apart(four_tasks, tmp_path):
    app = make_app(four_tasks, tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        view = app.query_one(ResultsView)
        await pilot.press("f3")
        await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)[1:]]
                for i in range(table.row_count)}
        assert rows == {"model=gated_deltanet, task=cycle_navigation": ["0.990 ± 0.010"],
                        "model=gated_deltanet, task=modular_arithmetic": ["0.133 ± 0.015"],
                        "model=gated_deltanet, task=parity": ["0.500 ± 0.010"],
                        "model=gated_deltanet, task=permutation_composition": ["0.303 ± 0.025"]}
        caption = str(view.query_one("#results-caption", Static).render())
        assert "task varies within cells: added as a row key" in caption
        assert "over 3 run(s) per cell" in caption


# --------------------------------------------------------------------------- compare, figures
async def test_compare_view_draws_each_task_apart(four_tasks, tmp_path):
    ids = [r.id for r in four_tasks.runs(profile="sweep")]
    for rid in ids:
        four_tasks.add_metrics(rid, [(i, i / 10, "train", "loss", 2.0 - i / 10) for i in range(3)])
    groups = cv.group_runs(four_tasks.runs(ids=ids))
    assert len(groups) == 4 and all(len(rs) == 3 for rs in groups.values())
    app = make_app(four_tasks, tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        app.push_screen(CompareScreen(four_tasks, ids))
        await settle(pilot)
        await pilot.pause(0.3)
        legend = app.screen.query_one("#compare-legend", DataTable)
        labels = sorted(str(legend.get_row_at(i)[1]) for i in range(legend.row_count))
        assert labels == [f"gated_deltanet task={t} (3 seeds)" for t in sorted(TASKS)]


def test_length_figure_draws_each_task_apart(four_tasks):
    for task in TASKS:  # a second length, so a figure against length applies
        add_to(four_tasks, "sweep", "gated_deltanet", 0, {"": {"accuracy": 0.5}}, seq_len=80, task=task,
               **PARAMS[task])
    ax = plot.vs_length_figure(four_tasks, "sweep", "accuracy").axes[0]
    labels = sorted(c.get_label() for c in ax.containers)
    assert labels == [f"gated_deltanet task={t}" for t in sorted(TASKS)]
    assert "lines apart by task" in ax.get_title()


# --------------------------------------------------------------------------- score, report
def test_score_refuses_two_tokenizers_under_one_setting(tmp_path):
    store = Store(tmp_path / "st")
    tokenizers(store)
    expected = [r.fields for r in store.runs() if r.fields["task.tokenizer"] == "bytes"]
    # the profile file names the bytes sweep, the store's profile also holds bpe runs
    with pytest.raises(score.ScoreError, match=r"differ in 'task.tokenizer' \(bpe, bytes\)"):
        score.compute(store, "p", expected, over=[])
    with pytest.raises(score.ScoreError, match="task.tokenizer"):  # from the store's runs alone
        score.compute(store, "p", None, over=[])


REPORT = """
schema_version = 1
name = "rep"
description = "report test"
[task]
name = "induction_heads"
vocab_size = 8
eval_lens = [16, 32]
num_train_examples = 64
[sweep]
models = ["lstm"]
seq_lens = [16]
seeds = [0, 1]
[train]
epochs = 2
[[published]]
model = "lstm"
value = 0.9
"""


def test_report_refuses_two_sweeps_under_one_name(tmp_path, capsys):
    path = tmp_path / "rep.toml"
    path.write_text(REPORT)
    p = prof.load(path)
    store = Store(tmp_path / "store")
    specs = [s.to_dict() for s in prof.expand(p)]
    # the same profile name, launched again with another vocabulary (another sweep)
    other = json.loads(json.dumps(specs))
    for s in other:
        s["fields"]["task.vocab_size"] = 16
    for rid in store.add_runs(specs + other):
        store.set_results(rid, {"accuracy": 0.9}, "")
        store.finish(rid, "finished")
    with pytest.raises(prof.ProfileError, match=r"report of 'rep': runs of model=lstm, seq_len=16 differ in "
                                                 r"'task.vocab_size' \(8, 16\)"):
        report.render(store, [str(path)])
    assert cli.main(["--store", str(store.root), "report", str(path)]) == 2
    assert "differ in 'task.vocab_size'" in capsys.readouterr().err
    # one sweep alone reports as before
    store2 = Store(tmp_path / "store2")
    for rid in store2.add_runs(specs):
        store2.set_results(rid, {"accuracy": 0.9}, "")
        store2.finish(rid, "finished")
    assert "0.900 ± 0.000 (n=2)" in report.render(store2, [str(path)])


def test_a_list_valued_grid_key_is_added_and_selected_over():
    """A grid value may be a list (a hybrid's layer pattern): added as a row key it groups
    (no 'unhashable type'), and best_over over it keeps the chosen point's runs."""
    recs = [{"model": "h", "seq_len": 8, "seed": s, "model.pattern": p, "accuracy": a, "eval_set": es,
             "run_id": i, "__metrics__": ["accuracy"], "__grid__": ("model.pattern",)}
            for i, (s, p, a) in enumerate([(0, ["m", "a"], 0.9), (1, ["m", "a"], 0.8),
                                           (0, ["a", "a"], 0.5), (1, ["a", "a"], 0.6)])
            for es in ("", "valid")]
    b = export.build(recs, ["accuracy"], ["model"], ["seq_len"])
    assert b["added"] == ["model.pattern"] and len(b["tables"][0]["table"]["rows"]) == 2
    b = export.build(recs, ["accuracy"], ["model"], ["seq_len"], best_over=["model.pattern"])
    assert b["added"] == [] and {r["run_id"] for r in b["records"]} == {0, 1}  # the best pattern's runs
    assert b["choices"][0]["chosen"] == {"model.pattern": ("m", "a")}
