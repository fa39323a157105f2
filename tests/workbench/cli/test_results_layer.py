"""The results layer (workbench/results): catalogue, mean/std/n/95% CI over seeds, best over
grid keys selected on validation or test, the Welch winner rule, and `export` on top of it
(several metrics, JSON, CSV as one table, LaTeX, rows by a grid key)."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest

from workbench import cli
from workbench.results import export
from workbench.results import aggregate as agg
from workbench.results import catalogue, stats
from workbench.store import Store


def add(store: Store, model: str, seed: int, results: dict[str, dict], **fields) -> int:
    """One finished run with ``results`` {eval_set: {metric: value}} and extra run fields."""
    f = {"model": model, "task": "mqar", "seq_len": fields.pop("seq_len", 64), "seed": seed,
         "d_model": 16, "n_layers": 2, "task_setting": "baseline", **fields}
    spec = {"profile": "p", "model": model, "label": model, "task": "mqar", "seq_len": f["seq_len"],
            "seed": seed, "fields": f, "grid": {k: v for k, v in fields.items() if "." in k}}
    rid = store.add_runs([spec])[0]
    for es, vals in results.items():
        store.set_results(rid, vals, eval_set=es)
    assert store.finish(rid, "finished")
    return rid


# ------------------------------------------------------------------ numbers
def test_summarize_mean_std_n_ci_on_known_data(tmp_path):
    s = agg.summarize([0.7, 0.8, 0.9, None, float("nan")])
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.8) and s["std"] == pytest.approx(0.1)
    # t(0.975, df=2) = 4.302653 (any t-table): half-width 4.302653 * 0.1 / sqrt(3)
    assert s["ci95"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    one = agg.summarize([0.5])
    assert one == {"mean": 0.5, "std": None, "n": 1, "ci95": None}
    # the same numbers through the store and a table cell
    store = Store(tmp_path / "st")
    for seed, a in enumerate((0.7, 0.8, 0.9)):
        add(store, "lstm", seed, {"": {"accuracy": a}})
    cell = agg.table(agg.records(store), "accuracy", ["model"], ["seq_len"])["cells"][(("lstm",), (64,))]
    assert cell["n"] == 3 and cell["std"] == pytest.approx(0.1) and cell["ci95"] == pytest.approx(s["ci95"])


def test_t_distribution_without_scipy_matches_tables(monkeypatch):
    monkeypatch.setattr(stats, "_scipy_stats", lambda: None)
    stats.t_quantile.cache_clear()
    try:
        assert stats.t_quantile(0.975, 1) == pytest.approx(12.706205, rel=1e-6)
        assert stats.t_quantile(0.975, 4) == pytest.approx(2.776445, rel=1e-6)
        assert stats.t_quantile(0.975, 30) == pytest.approx(2.042272, rel=1e-6)
        assert stats.t_sf2(2.0, 10) == pytest.approx(0.0733880, rel=1e-5)
        # Welch with unequal variances: t = 1.5 / sqrt(0.5^2/3 + 1^2/3), df = 2.94...
        p = stats.welch_p(2.0, 0.5, 3, 0.5, 1.0, 3)
        t = 1.5 / math.sqrt(0.25 / 3 + 1 / 3)
        v1, v2 = 0.25 / 3, 1 / 3
        df = (v1 + v2) ** 2 / (v1 ** 2 / 2 + v2 ** 2 / 2)
        assert p == pytest.approx(stats._betainc(df / 2, 0.5, df / (df + t * t)), rel=1e-9)
        assert 0.05 < p < 0.2
    finally:
        stats.t_quantile.cache_clear()


def test_catalogue_is_the_source_of_export_names():
    assert export.METRICS["step_time_ms"].endswith("(ms)") and export.BETTER["loss"] == "min"
    assert catalogue.better("accuracy") == "max" and catalogue.better("params") is None
    assert "peak_mem_mb" in export.RUN_LEVEL and catalogue.is_count("eval_sequences")
    assert set(export.BETTER) <= set(export.METRICS)


# ------------------------------------------------------------------ Welch winners
def _cells(**groups):
    return {k: agg.summarize(v) for k, v in groups.items()}


def test_welch_rule_clear_winner_tie_and_single_runs():
    clear = _cells(a=[0.90, 0.91, 0.92], b=[0.50, 0.52, 0.51])
    assert agg.winners(clear, "accuracy") == {"a"}
    # the lower-is-better direction
    assert agg.winners(clear, "loss") == {"b"}
    noisy = _cells(a=[0.80, 0.90], b=[0.82, 0.86])  # 0.85 vs 0.84: within seed noise
    assert agg.winners(noisy, "accuracy") == {"a", "b"}
    # a single run, however good, is never marked and does not beat anyone
    with_one = _cells(a=[0.99], b=[0.80, 0.82], c=[0.50, 0.51])
    assert agg.winners(with_one, "accuracy") == {"b"}
    # a column with fewer than two cells of n >= 2 has no winner
    assert agg.winners(_cells(a=[0.99], b=[0.80, 0.82]), "accuracy") == set()
    # a metric without a direction has no best
    assert agg.winners(clear, "params") == set()


def test_markdown_bolds_only_the_significant_best(tmp_path):
    store = Store(tmp_path / "st")
    for seed, (a, b) in enumerate(((0.90, 0.50), (0.92, 0.52), (0.91, 0.51))):
        add(store, "lstm", seed, {"": {"accuracy": a}}, seq_len=64)
        add(store, "mamba", seed, {"": {"accuracy": b}}, seq_len=64)
    for seed, (a, b) in enumerate(((0.80, 0.82), (0.90, 0.86))):
        add(store, "lstm", seed, {"": {"accuracy": a}}, seq_len=128)
        add(store, "mamba", seed, {"": {"accuracy": b}}, seq_len=128)
    md = export.render(agg.records(store), "accuracy", ["model"], ["seq_len"], "md")
    lines = {l.split(" | ")[0]: l for l in md.splitlines() if l.startswith("| lstm") or l.startswith("| mamba")}
    assert "**0.910 ± 0.010**" in lines["| lstm"] and "**" not in lines["| mamba"].split(" | ")[1]
    assert "**0.850 ± 0.071**" in lines["| lstm"] and "**0.840 ± 0.028**" in lines["| mamba"]
    assert "Welch" in md


# ------------------------------------------------------------------ best over grid keys
@pytest.fixture()
def grid_store(tmp_path):
    """lstm over train.lr in {0.1, 0.01}, seeds 0-1: validation prefers 0.01, test prefers 0.1."""
    store = Store(tmp_path / "st")
    acc = {0.1: {"valid": (0.60, 0.62), "": (0.95, 0.93)}, 0.01: {"valid": (0.80, 0.78), "": (0.70, 0.72)}}
    for lr, sets in acc.items():
        for seed in (0, 1):
            add(store, "lstm", seed, {es: {"accuracy": v[seed], "step_time_ms": 10.0 + lr} if es == ""
                                      else {"accuracy": v[seed]} for es, v in sets.items()},
                **{"train.lr": lr})
    return store


def test_best_over_selects_on_validation_and_reports_test(grid_store):
    recs = agg.records(grid_store)
    kept, choices = agg.best_over(recs, ["train.lr"], "accuracy", ["model", "seq_len"])
    assert [c["chosen"] for c in choices] == [{"train.lr": 0.01}] and choices[0]["select_on"] == "validation"
    assert {r["train.lr"] for r in kept} == {0.01}
    md = export.render(recs, "accuracy", ["model"], ["seq_len"], "md", best_over=["train.lr"])
    assert "| lstm | 0.710 ± 0.014 |" in md  # the test numbers of lr=0.01 (test's best is 0.940)
    assert "selected on validation" in md and "selected on test" not in md


def test_best_over_selected_on_test_is_labelled_in_every_format(grid_store):
    recs = agg.records(grid_store)
    kept, choices = agg.best_over(recs, ["train.lr"], "accuracy", ["model"], select_on="test")
    assert choices[0]["chosen"] == {"train.lr": 0.1}
    md = export.render(recs, "accuracy", ["model"], ["seq_len"], "md", best_over=["train.lr"], select_on="test")
    assert "| lstm | 0.940 ± 0.014 |" in md and "selected on test" in md
    tex = export.render(recs, "accuracy", ["model"], ["seq_len"], "latex", best_over=["train.lr"],
                        select_on="test")
    assert "selected on test" in tex
    rows = list(csv.DictReader(io.StringIO(export.render(
        recs, "accuracy", ["model"], ["seq_len"], "csv", best_over=["train.lr"], select_on="test"))))
    assert rows[0]["train.lr"] == "0.1" and rows[0]["mean"] == "0.94" and rows[0]["seq_len"] == "64"
    assert rows[0]["selected_on"] == "test" and rows[0]["select_metric"] == "accuracy"
    js = json.loads(export.render(recs, "accuracy", ["model"], ["seq_len"], "json", best_over=["train.lr"],
                                  select_on="test"))
    assert js[0]["selected"]["on"] == "test" and js[0]["selected"]["chosen"] == {"train.lr": 0.1}
    assert js[0]["accuracy"]["mean"] == pytest.approx(0.94) and js[0]["run_ids"] == sorted(
        r["run_id"] for r in kept if r["eval_set"] == "")


def test_best_over_without_validation_results_is_an_error(tmp_path, capsys):
    store = Store(tmp_path / "st")
    for lr in (0.1, 0.01):
        add(store, "lstm", 0, {"": {"accuracy": 0.5 + lr}}, **{"train.lr": lr})
    with pytest.raises(agg.SelectionError, match="no validation results"):
        agg.best_over(agg.records(store), ["train.lr"], "accuracy", ["model"])
    code = cli.main(["--store", str(store.root), "export", "--best-over", "train.lr"])
    err = capsys.readouterr().err
    assert code == 2 and "no validation results" in err and "--select-on test" in err
    assert cli.main(["--store", str(store.root), "export", "--best-over", "train.lr", "--select-on", "test"]) == 0
    assert "selected on test" in capsys.readouterr().out
    assert cli.main(["--store", str(store.root), "export", "--best-over", "train.lrr", "--select-on", "test"]) == 2
    assert "no run has field 'train.lrr'" in capsys.readouterr().err


# ------------------------------------------------------------------ export formats
@pytest.fixture()
def two_models(tmp_path):
    store = Store(tmp_path / "st")
    for model, base in (("lstm", 0.8), ("mamba", 0.6)):
        for seed in (0, 1):
            for L in (64, 128):
                add(store, model, seed, {"": {"accuracy": base + 0.02 * seed, "step_time_ms": 5.0 + seed,
                                              "peak_mem_mb": 100.0 + L, "params": 1000.0,
                                              "eval_sequences": 256.0}}, seq_len=L,
                    **{"train.lr": 0.1 if model == "lstm" else 0.01})  # one lr per model
    add(store, "gru", 0, {"": {"accuracy": 0.99, "params": 500.0}}, seq_len=64)  # a single run
    return store


def test_export_several_metrics_and_json_with_all_of_them(two_models, capsys):
    root = str(two_models.root)
    assert cli.main(["--store", root, "export", "--metric", "accuracy,step_time_ms", "--metric",
                     "peak_mem_mb"]) == 0
    md = capsys.readouterr().out
    assert [l.split(":")[0] for l in md.splitlines() if l.split(":")[0] in export.METRICS] == \
        ["accuracy", "step_time_ms", "peak_mem_mb"]
    assert md.count("| model \\ seq_len |") == 3
    assert cli.main(["--store", root, "export", "--metric", "accuracy,step_time_ms", "--metric",
                     "peak_mem_mb", "--format", "json"]) == 0
    js = json.loads(capsys.readouterr().out)
    lstm = next(x for x in js if x["model"] == "lstm" and x["seq_len"] == 128)
    assert set(lstm) == {"model", "seq_len", "accuracy", "step_time_ms", "peak_mem_mb", "run_ids"}
    assert lstm["peak_mem_mb"] == {"mean": 228.0, "std": 0.0, "n": 2, "ci95": 0.0}
    assert lstm["step_time_ms"]["mean"] == 5.5
    assert cli.main(["--store", root, "export", "--metric", "acuracy"]) == 2
    assert "unknown metric 'acuracy'" in capsys.readouterr().err


def test_csv_is_long_format_with_mean_std_n_and_winner(two_models):
    text = export.render(agg.records(two_models), ["accuracy", "params"], ["model"], ["seq_len"], "csv")
    lines = list(csv.reader(io.StringIO(text)))
    assert lines[0] == ["model", "seq_len", "metric", "mean", "std", "n", "ci95", "winner"]
    assert all(len(line) == len(lines[0]) for line in lines)  # one table, no blank or stacked parts
    rows = {(r["metric"], r["model"], r["seq_len"]): r for r in csv.DictReader(io.StringIO(text))}
    lstm = rows["accuracy", "lstm", "64"]
    assert float(lstm["mean"]) == pytest.approx(0.81) and float(lstm["std"]) == pytest.approx(0.01414, rel=1e-3)
    assert lstm["n"] == "2" and float(lstm["ci95"]) == pytest.approx(0.127, rel=1e-2)
    assert rows["params", "lstm", "128"]["mean"] == "1000"
    gru = rows["accuracy", "gru", "64"]
    assert gru["n"] == "1" and gru["std"] == "" and gru["ci95"] == ""  # one run: no spread
    assert ("accuracy", "gru", "128") not in rows  # no runs: no line
    # the winner column is the markdown's verdict: lstm beats mamba beyond the noise, the
    # single gru run (0.99) is never a winner, params has no better direction
    md = export.render(agg.records(two_models), "accuracy", ["model"], ["seq_len"], "md")
    bold = {(l.split(" | ")[0][2:], L) for l in md.splitlines() if l.startswith("| ")
            for L, cell in zip(("64", "128"), l.split(" | ")[1:]) if cell.startswith("**")}
    won = {(r["model"], r["seq_len"]) for r in rows.values() if r["metric"] == "accuracy" and r["winner"] == "true"}
    assert won == bold == {("lstm", "64"), ("lstm", "128")}
    assert {r["winner"] for r in rows.values() if r["metric"] == "params"} == {"false"}


def test_csv_winner_marks_every_tied_cell(tmp_path):
    store = Store(tmp_path / "st")
    for seed, (a, b, c) in enumerate(((0.80, 0.82, 0.50), (0.90, 0.86, 0.52), (0.85, 0.84, 0.51))):
        for model, v in (("lstm", a), ("mamba", b), ("gru", c)):
            add(store, model, seed, {"": {"accuracy": v}})
    rows = list(csv.DictReader(io.StringIO(export.render(agg.records(store), "accuracy", ["model"],
                                                         ["seq_len"], "csv"))))
    assert {r["model"]: r["winner"] for r in rows} == {"gru": "false", "lstm": "true", "mamba": "true"}


def test_latex_corner_counts_and_single_runs(two_models):
    recs = agg.records(two_models)
    tex = export.render(recs, "accuracy", ["model"], ["seq_len"], "latex")
    header = next(l for l in tex.splitlines() if l.startswith("model"))
    assert header.startswith("model \\textbackslash{} seq\\_len & ") and "\\ seq" not in header
    assert "\\textbf{0.810 $\\pm$ 0.014}" in tex  # lstm beats mamba beyond the noise
    md = export.render(recs, ["params", "eval_sequences", "accuracy"], ["model"], ["seq_len"], "md")
    assert "| lstm | 1000 | 1000 |" in md and "| lstm | 256 | 256 |" in md
    assert "1000.000" not in md and "± 0.000" not in md.split("accuracy:")[0]
    assert "| gru | 0.990 (n=1) | – |" in md and "**0.990" not in md  # one run: never bold


def test_rows_by_a_dotted_grid_key_and_task_setting(two_models, capsys):
    assert cli.main(["--store", str(two_models.root), "export", "--rows", "train.lr", "--cols",
                     "task_setting", "--metric", "step_time_ms"]) == 0
    got = capsys.readouterr()
    out = got.out
    # a cell of one lr holds one model's runs at two lengths: seq_len becomes a row key
    # (issue 41: a cell averages over seeds only), said on stderr
    assert "seq_len varies within cells: added as a row key" in got.err
    assert out.splitlines()[0] == "| train.lr/seq_len \\ task_setting | task_setting=baseline |"
    assert "| train.lr=0.01, seq_len=64 | **5.500 ± 0.707** |" in out  # ties with lr 0.1 at 64
    assert "| train.lr=0.1, seq_len=128 | **5.500 ± 0.707** |" in out
    assert "train.lr=None" in out.splitlines()[-3]  # the gru run has no train.lr: its own row, last


def test_report_eval_set_table_leaves_out_the_validation_set(tmp_path):
    from workbench.results import report

    store = Store(tmp_path / "st")
    ids = [add(store, "lstm", seed, {"": {"accuracy": 0.9}, "len=16": {"accuracy": 0.8},
                                     "len=32": {"accuracy": 0.5}, "valid": {"accuracy": 0.7}})
           for seed in (0, 1)]
    runs = {("lstm", 64): store.runs()}
    lines = report.eval_set_table(runs, store.results(ids), 3)
    assert lines[0] == "| model | seed | len=16 | len=32 |"


def test_grid_keys_are_the_runs_grid_not_every_dotted_field(tmp_path):
    store = Store(tmp_path / "st")
    add(store, "lstm", 0, {"": {"accuracy": 0.5}}, **{"train.lr": 0.1, "model.d_model": 8})
    rid = add(store, "lstm", 1, {"": {"accuracy": 0.5}}, **{"train.weight_decay": 0.1})
    store.conn.execute("UPDATE runs SET fields=json_set(fields, '$.\"task.vocab_size\"', 8) WHERE id=?", (rid,))
    store.conn.commit()
    recs = agg.records(store)
    assert "task.vocab_size" in recs[1] and "task.vocab_size" in agg.fields_of(recs)
    assert agg.grid_keys(recs) == ["train.lr", "model.d_model", "train.weight_decay"]
    assert "__grid__" not in agg.fields_of(recs)


@pytest.mark.parametrize("metric, values, stops_at", [
    ("accuracy", [0.5, 0.6, 0.55, 0.58], 4),  # no rise above 0.6 in 2 evaluations
    ("loss", [2.0, 1.0, 1.5, 1.2], 4),  # no fall below 1.0 in 2 evaluations
    ("loss", [2.0, 1.8, 1.6, 1.4], None),  # falling: it goes on
])
def test_early_stopping_reads_the_direction_from_the_catalogue(metric, values, stops_at):
    from types import SimpleNamespace

    from tasks.metrics import AccuracyCounts
    from workbench.spec.schema import EarlyStopping
    from workbench.train.trainer import Trainer

    t = SimpleNamespace(cfg=SimpleNamespace(early_stopping=EarlyStopping(metric=metric, patience=2)),
                        best=None, bad_evals=0)
    stopped = None
    for i, v in enumerate(values, 1):
        c = AccuracyCounts(token_correct=round(v * 100), token_total=100, loss_sum=v * 100) \
            if metric == "accuracy" else AccuracyCounts(token_correct=0, token_total=100, loss_sum=v * 100)
        if Trainer._early_stop(t, c) and stopped is None:
            stopped = i
    assert stopped == stops_at
