"""`ssm-workbench score`: the MAD score as mad-lab computes it (per setting the best of the
lr x wd grid, per task the mean over settings, the MAD score the mean over tasks), the
selection split, missing settings, and the MQAR accuracy-vs-width figure."""
from __future__ import annotations

import json

import pytest

from workbench import cli
from workbench.results import score
from workbench.store import Store

LRS, WDS = (1e-3, 1e-4), (0.0, 0.1)


def add(store: Store, model: str, task: str, setting: str | None, seed: int, test: float | None,
        valid: float | None = None, state: str = "finished", profile: str = "p", seq_len: int = 64,
        **grid) -> int:
    """One run: test accuracy ``test`` (eval set ""), validation ``valid`` (eval set "valid",
    default the same); ``setting`` None is a schema 1 run (no task_setting field)."""
    f = {"model": model, "task": task, "seq_len": seq_len, "seed": seed, "d_model": 16, "n_layers": 2, **grid}
    if setting is not None:
        f["task_setting"] = setting
    spec = {"profile": profile, "model": model, "label": model, "task": task, "seq_len": seq_len,
            "seed": seed, "fields": f, "grid": dict(grid), "task_setting": setting}
    rid = store.add_runs([spec])[0]
    if state == "finished":
        store.set_results(rid, {"accuracy": test}, eval_set="")
        store.set_results(rid, {"accuracy": test if valid is None else valid}, eval_set="valid")
        assert store.finish(rid, "finished")
    return rid


# test accuracy of each grid point (lr, wd) in LRS x WDS order; seed 0 adds 0.01, seed 1
# subtracts it, so the mean over the two seeds is the number written here.
GRID = {
    "a": {"t1": {"baseline": (0.9, 0.5, 0.3, 0.4), "n=8": (0.2, 0.3, 0.7, 0.1)},
          "t2": {"baseline": (0.6, 0.5, 0.4, 0.3), "n=8": (0.1, 0.2, 0.3, 0.8)}},
    "b": {"t1": {"baseline": (0.1, 0.2, 0.3, 0.4), "n=8": (0.5, 0.6, 0.2, 0.1)},
          "t2": {"baseline": (0.95, 0.05, 0.05, 0.05), "n=8": (0.05, 0.05, 0.05, 0.25)}},
}
# by hand: per setting the best point, per task the mean of the two settings' bests
#   a: t1 = (0.9 + 0.7)/2 = 0.8, t2 = (0.6 + 0.8)/2 = 0.7, MAD = 0.75
#   b: t1 = (0.4 + 0.6)/2 = 0.5, t2 = (0.95 + 0.25)/2 = 0.6, MAD = 0.55
# one grid point per task instead (best mean over the task's settings), a's t1 would be
# max(0.55, 0.4, 0.5, 0.25) = 0.55, not 0.8.
HAND = {"a": {"t1": 0.8, "t2": 0.7, "mad": 0.75}, "b": {"t1": 0.5, "t2": 0.6, "mad": 0.55}}


def grid_store(tmp_path) -> Store:
    store = Store(tmp_path / "st")
    for m, tasks in GRID.items():
        for t, settings in tasks.items():
            for s, accs in settings.items():
                points = [(lr, wd) for lr in LRS for wd in WDS]
                for (lr, wd), acc in zip(points, accs):
                    for seed, d in ((0, 0.01), (1, -0.01)):
                        add(store, m, t, s, seed, acc + d, **{"train.lr": lr, "train.weight_decay": wd})
    return store


def run_cli(capsys, store: Store, *args) -> tuple[int, str, str]:
    code = cli.main(["--store", str(store.root), "score", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("select_on", ["test", "validation"])
def test_hand_computed_mad_score_equals_the_command(tmp_path, capsys, select_on):
    store = grid_store(tmp_path)
    code, out, err = run_cli(capsys, store, "p", "--format", "json", "--select-on", select_on)
    assert code == 0, err
    res = json.loads(out)
    assert res["best_over"] == ["train.lr", "train.weight_decay"] and res["seeds"] == [2]
    got = {m["model"]: m for m in res["models"]}
    for m, want in HAND.items():
        assert got[m]["mad_score"] == pytest.approx(want["mad"])
        for t in ("t1", "t2"):
            task = got[m]["tasks"][t]
            assert task["score"] == pytest.approx(want[t]) and task["n"] == task["total"] == 2
    # the chosen point of a's t1 baseline is (1e-3, 0.0); of its n=8 setting (1e-4, 0.0)
    chosen = {s["task_setting"]: s["chosen"] for s in got["a"]["tasks"]["t1"]["settings"]}
    assert chosen == {"baseline": {"train.lr": 1e-3, "train.weight_decay": 0.0},
                      "n=8": {"train.lr": 1e-4, "train.weight_decay": 0.0}}
    # the markdown table: rows model, columns tasks + MAD score
    code, md, _ = run_cli(capsys, store, "p", "--select-on", select_on)
    assert code == 0
    rows = {l.split(" | ")[0].strip("| "): l for l in md.splitlines() if l.startswith("| ")}
    head = "MAD score (selected on test)" if select_on == "test" else "MAD score"
    assert rows["model"] == f"| model | t1 | t2 | {head} |"
    assert rows["a"] == "| a | 0.800 | 0.700 | 0.750 |" and rows["b"] == "| b | 0.500 | 0.600 | 0.550 |"
    assert "mad-lab" in md


def test_best_is_per_setting_and_the_mean_over_settings_then_tasks(tmp_path):
    """t1 has 2 settings (one of 3 seeds, one of 1), t2 one setting: a mean over runs, a
    best over the whole task, or a mean over all settings at once each give another number."""
    store = Store(tmp_path / "st")
    lr = "train.lr"
    # t1 baseline: 3 seeds, best lr 1e-3 at 0.9 (lr 1e-4: 0.1)
    for seed in (0, 1, 2):
        add(store, "a", "t1", "baseline", seed, 0.9, **{lr: 1e-3})
        add(store, "a", "t1", "baseline", seed, 0.1, **{lr: 1e-4})
    # t1 n=8: one seed, best lr 1e-4 at 0.5 (lr 1e-3: 0.3)
    add(store, "a", "t1", "n=8", 0, 0.3, **{lr: 1e-3})
    add(store, "a", "t1", "n=8", 0, 0.5, **{lr: 1e-4})
    # t2: one setting at 0.2 (best)
    add(store, "a", "t2", "baseline", 0, 0.2, **{lr: 1e-3})
    add(store, "a", "t2", "baseline", 0, 0.1, **{lr: 1e-4})
    res = score.compute(store, "p", select_on="test")
    s = res["scores"]["a"]
    # per setting best, mean over settings: t1 = (0.9 + 0.5)/2 = 0.7
    # (mean over the kept runs: (3*0.9 + 0.5)/4 = 0.8; one lr for the task: lr 1e-3 -> 0.6)
    assert s["tasks"]["t1"]["score"] == pytest.approx(0.7)
    assert s["tasks"]["t2"]["score"] == pytest.approx(0.2)
    # mean over tasks: (0.7 + 0.2)/2 = 0.45 (over the three settings at once: 1.6/3 = 0.533)
    assert s["mad_score"] == pytest.approx(0.45)


def test_select_on_validation_and_test_differ_on_crafted_data(tmp_path, capsys):
    store = Store(tmp_path / "st")
    # validation prefers lr 1e-3 (test 0.6); the test set prefers lr 1e-4 (test 0.9)
    for seed in (0, 1):
        add(store, "a", "t1", "baseline", seed, 0.6, valid=0.8, **{"train.lr": 1e-3})
        add(store, "a", "t1", "baseline", seed, 0.9, valid=0.4, **{"train.lr": 1e-4})
    assert score.compute(store, "p", select_on="validation")["scores"]["a"]["mad_score"] == pytest.approx(0.6)
    assert score.compute(store, "p", select_on="test")["scores"]["a"]["mad_score"] == pytest.approx(0.9)
    code, md, _ = run_cli(capsys, store, "p")
    assert code == 0 and "| a | 0.600 | 0.600 |" in md and "selected on validation" in md
    assert "selected on test" not in md.replace("--select-on test", "")
    code, md, _ = run_cli(capsys, store, "p", "--select-on", "test")
    assert code == 0 and "| a | 0.900 | 0.900 |" in md and "MAD score (selected on test)" in md
    code, tex, _ = run_cli(capsys, store, "p", "--select-on", "test", "--format", "latex")
    assert code == 0 and "selected on test" in tex and "\\begin{tabular}" in tex
    code, text, _ = run_cli(capsys, store, "p", "--select-on", "test", "--format", "csv")
    assert code == 0 and text.splitlines()[0] == "model,t1,MAD score (selected on test),settings scored,settings total"
    assert text.splitlines()[1] == "a,0.9,0.9,1,1"


def test_missing_settings_are_reported_not_averaged_over(tmp_path, capsys):
    store = Store(tmp_path / "st")
    for seed in (0, 1):
        add(store, "a", "t1", "baseline", seed, 0.8)
        add(store, "a", "t2", "baseline", seed, 0.4)
    add(store, "a", "t1", "n=8", 0, 0.2)
    add(store, "a", "t1", "n=8", 1, None, state="pending")  # the setting is not finished
    code, out, err = run_cli(capsys, store, "p")
    assert code == 1 and out == ""
    assert "1 setting(s)" in err and "a: t1 n=8, seq_len=64: 1/2 runs finished" in err
    code, out, err = run_cli(capsys, store, "p", "--allow-partial")
    assert code == 0
    # t1 scored over its finished setting only, shown as 1 of 2; the score marked partial
    assert "| a | 0.800 (1/2) | 0.400 | 0.600 (partial) |" in out and "PARTIAL" in out
    res = json.loads(run_cli(capsys, store, "p", "--allow-partial", "--format", "json")[1])
    assert res["models"][0]["complete"] is False and res["missing"][0]["task_setting"] == "n=8"


def test_a_profile_file_names_settings_never_queued(tmp_path, capsys):
    """With the profile file, settings that have no run in the store yet count as missing."""
    prof = tmp_path / "s.toml"
    prof.write_text("""schema_version = 2
name = "p"
[task]
name = "mqar"
vocab_size = 32
num_kv_pairs = 4
num_train_examples = 64
num_test_examples = 16
variants = { num_kv_pairs = [8] }
[sweep]
models = ["lstm"]
seq_lens = [64]
seeds = [0]
[sweep.grid]
"train.lr" = [1e-3]
[model]
d_model = 16
n_layers = 2
[train]
epochs = 1
batch_size = 8
""")
    from workbench.spec import profile as wprof

    specs = wprof.expand(wprof.load(prof, check_registries=False))
    store = Store(tmp_path / "st")
    base = next(s for s in specs if s.task_setting == "baseline")
    rid = store.add_runs([base.to_dict()])[0]
    store.set_results(rid, {"accuracy": 0.5}, eval_set="")
    store.set_results(rid, {"accuracy": 0.5}, eval_set="valid")
    store.finish(rid, "finished")
    code, out, err = run_cli(capsys, store, str(prof))
    assert code == 1 and "lstm: mqar num_kv_pairs=8, seq_len=64: 0/1 runs finished" in err
    # by the store name alone, the one run queued is all there is: complete
    code, out, err = run_cli(capsys, store, "p")
    assert code == 0 and "| lstm | 0.500 | 0.500 |" in out


def test_schema1_runs_are_the_baseline_and_bad_input_is_one_line(tmp_path, capsys):
    store = Store(tmp_path / "st")
    for seed in (0, 1):
        add(store, "a", "t1", None, seed, 0.7)
    code, out, err = run_cli(capsys, store, "p", "--format", "json")
    res = json.loads(out)
    assert code == 0 and res["best_over"] == [] and res["models"][0]["mad_score"] == pytest.approx(0.7)
    assert res["models"][0]["tasks"]["t1"]["settings"][0]["task_setting"] == "baseline"
    # runs of one setting differing in a field that is neither seed nor selected over
    add(store, "a", "t1", None, 0, 0.9, **{"model.d_model": 32})
    code, out, err = run_cli(capsys, store, "p")
    assert code == 2 and "differ in 'model.d_model'" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(capsys, store, "p", "--best-over", "train.momentum")
    assert code == 2 and "train.momentum" in err
    code, out, err = run_cli(capsys, store, "nope")
    assert code == 2 and "no profile 'nope'" in err


def test_mqar_plot_kind_takes_the_max_over_learning_rates_and_writes_png_svg(tmp_path, capsys):
    from workbench.results import plot

    store = Store(tmp_path / "st")
    # accuracy = width/100 + length/1000 at lr 1e-3; lr 1e-4 is 0.5 lower except at
    # (width 64, length 128), where lr 1e-4 is best (+0.05): the maximum is per point
    for m in ("lstm", "mamba"):
        for L in (64, 128):
            for w in (16, 64):
                good = w / 100 + L / 1000 + (0.1 if m == "mamba" else 0.0)
                for seed in (0, 1):
                    add(store, m, "mqar", "baseline", seed, good, seq_len=L,
                        **{"d_model": w, "model.d_model": w, "train.lr": 1e-3})
                    other = good + 0.05 if (w, L) == (64, 128) else good - 0.5
                    add(store, m, "mqar", "baseline", seed, other, seq_len=L,
                        **{"d_model": w, "model.d_model": w, "train.lr": 1e-4})
    fig = plot.mqar_figure(store, "p")
    axes = fig.axes
    assert [a.get_title() for a in axes] == ["length 64", "length 128"]
    lstm = {a.get_title(): list(a.lines[0].get_ydata()) for a in axes}
    assert lstm["length 64"] == pytest.approx([0.16 + 0.064, 0.64 + 0.064])
    assert lstm["length 128"] == pytest.approx([0.16 + 0.128, 0.64 + 0.128 + 0.05])
    assert "max over learning rates (selected on validation)" in fig._suptitle.get_text()
    code = cli.main(["--store", str(store.root), "plot", "p", "--kind", "mqar", "--out", str(tmp_path / "f"),
                     "--select-on", "test"])
    out = capsys.readouterr().out.split()
    assert code == 0 and sorted(p.rsplit("/", 1)[1] for p in out) == [
        "p-mqar-accuracy-vs-width.png", "p-mqar-accuracy-vs-width.svg"]
    assert all((tmp_path / "f" / n).stat().st_size > 1000 for n in ("p-mqar-accuracy-vs-width.png",
                                                                      "p-mqar-accuracy-vs-width.svg"))
    assert "selected on test" in (tmp_path / "f" / "p-mqar-accuracy-vs-width.svg").read_text()


def test_fields_that_follow_a_selected_key_may_vary(tmp_path):
    """d_model follows the grid key model.d_model: selecting over it is allowed; leaving it
    out is refused (the runs of one point would mix two widths)."""
    store = Store(tmp_path / "st")
    for w, acc in ((16, 0.3), (32, 0.7)):
        add(store, "a", "t1", "baseline", 0, acc, **{"d_model": w, "model.d_model": w, "train.lr": 1e-3})
    res = score.compute(store, "p", over=["train.lr", "model.d_model"], select_on="test")
    assert res["scores"]["a"]["mad_score"] == pytest.approx(0.7)
    with pytest.raises(score.ScoreError, match="differ in 'd_model'"):
        score.compute(store, "p", select_on="test")
