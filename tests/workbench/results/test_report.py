"""`ssm-workbench report`: published numbers beside ours, read from the store."""
from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from workbench.spec import profile as prof
from workbench.results import report
from workbench.store import Store

PROFILE = """
schema_version = 1
name = "rep"
description = "report test"
[task]
name = "induction_heads"
vocab_size = 8
eval_lens = [16, 32]
num_train_examples = 64  # a training set: epochs of fresh batches are refused
[sweep]
models = [{ name = "lstm", label = "lstm-a" }, "s6"]
seq_lens = [16]
seeds = [0, 1, 2]
[train]
epochs = 2
[[published]]
model = "lstm-a"
value = 0.9
epoch = 2
source = "a paper, Table 9"
[[published]]
model = "s6"
eval_set = "len=32"
value = 0.5
"""

# (label, seed) -> accuracy after epoch 1 and 2; final per eval set
CURVE = {("lstm-a", 0): (0.2, 0.8), ("lstm-a", 1): (0.3, 0.9), ("lstm-a", 2): (0.4, 1.0),
         ("s6", 0): (0.1, 0.6), ("s6", 1): (0.1, 0.7), ("s6", 2): (0.1, 0.8)}


@pytest.fixture()
def filled(tmp_path):
    path = tmp_path / "rep.toml"
    path.write_text(PROFILE)
    p = prof.load(path)
    store = Store(tmp_path / "store")
    specs = [s.to_dict() for s in prof.expand(p)]
    ids = store.add_runs(specs)
    for run_id, spec in zip(ids, specs):
        a1, a2 = CURVE[(spec["label"], spec["seed"])]
        if spec["label"] == "s6" and spec["seed"] == 2:
            continue  # still pending: must not count
        store.add_metrics(run_id, [(10, 1.0, "eval", "accuracy", a1), (20, 2.0, "eval", "accuracy", a2)])
        store.set_results(run_id, {"accuracy": a2}, "")
        store.set_results(run_id, {"accuracy": a2 / 2}, "len=16")
        store.set_results(run_id, {"accuracy": a2 / 4, "eval_sequences": 7}, "len=32")
        store.set_info(run_id, {"params_total": 1234})
        store.finish(run_id, "finished")
    return store, str(path)


def test_report_sets_ours_beside_published(filled):
    store, path = filled
    text = report.render(store, [path])
    # lstm-a at epoch 2: 0.8, 0.9, 1.0 -> 0.900 ± 0.100 over 3 seeds
    row = next(line for line in text.splitlines() if line.startswith("| lstm-a | accuracy, epoch 2"))
    assert "| 0.900 |" in row and f"0.900 ± {statistics.stdev([0.8, 0.9, 1.0]):.3f} (n=3)" in row
    assert "0: 0.800, 1: 0.900, 2: 1.000" in row and "1,234" in row and "a paper, Table 9" in row
    # s6 final on len=32: 0.6/4, 0.7/4 (seed 2 never finished)
    row = next(line for line in text.splitlines() if line.startswith("| s6 | accuracy len=32, final"))
    assert f"{(0.15 + 0.175) / 2:.3f} ± " in row and "(n=2)" in row
    # learning curve by epoch and the eval-set table
    assert "| ep 1 | ep 2 |" in text
    assert "| lstm-a (L=16) | 0.300 ± 0.100 | 0.900 ± 0.100 |" in text
    assert "| model | seed | len=16 | len=32 |" in text
    assert "| lstm-a | 1 | 0.450 | 0.225 |" in text
    assert "| sequences per set |  | – | 7 |" in text
    assert "5 finished of 6 runs" in text


def test_write_into_keeps_the_hand_written_parts(filled, tmp_path):
    store, path = filled
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n\nhand written\n")
    report.write_into(doc, report.render(store, [path]))
    first = doc.read_text()
    assert first.startswith("# Results\n\nhand written\n") and report.BEGIN in first
    doc.write_text(first + "\n## after\n")
    report.write_into(doc, report.render(store, [path]))
    second = doc.read_text()
    assert second.count(report.BEGIN) == 1 and second.endswith("## after\n")
    assert second.replace("\n## after\n", "").rstrip() == first.rstrip()


def test_published_must_name_a_sweep_label():
    with pytest.raises(prof.ProfileError, match="not a model label"):
        prof.loads(PROFILE.replace('model = "lstm-a"\nvalue', 'model = "gru"\nvalue'))
    with pytest.raises(prof.ProfileError, match="at most one of epoch or step"):
        prof.loads(PROFILE.replace("epoch = 2\n", "epoch = 2\nstep = 3\n"))


def test_cli_report(filled, tmp_path):
    store, path = filled
    out = subprocess.run([sys.executable, "-m", "workbench", "--store", str(store.root), "report", path],
                         capture_output=True, text=True, check=True).stdout
    assert "### rep" in out and "| lstm-a | accuracy, epoch 2 |" in out
    bad = subprocess.run([sys.executable, "-m", "workbench", "--store", str(store.root), "report",
                          str(tmp_path / "missing.toml")], capture_output=True, text=True)
    assert bad.returncode == 2 and "missing.toml" in bad.stderr
