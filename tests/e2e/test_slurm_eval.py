"""Evaluations as Slurm jobs, against the real one-node cluster of tests/slurm_cluster.py
(skipped, with the reason, where Slurm is not installed): an lm run trained by a Slurm job
keeps its weights in the shared folder, and an evaluation profile with ``executor =
"slurm"`` evaluates it and a Hugging Face folder, each in its own sbatch job whose worker
opens no store (run:N comes in the job's snapshot); the numbers land in the store as eval
sets, and ``run FILE`` again evaluates nothing twice."""
from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import tiny_lm_corpus, tiny_lm_profile_text

pytest.importorskip("transformers", reason="the tiny checkpoint needs transformers (extra 'pretrained')")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm"),
              pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")]


SLURM = 'executor = "slurm"\n[slurm]\ngpus_per_run = 0\ncpus_per_run = 1'

EVAL = """schema_version = 2
name = "slurm-eval"
executor = "slurm"
[slurm]
gpus_per_run = 0
cpus_per_run = 1
[eval]
models = [{{ label = "neox", model = "{neox}" }}, {{ label = "mine", model = "run:{run}" }}]
tasks = ["tiny_mc", "tiny_lambada"]
include = ["{tasks}"]
batch_size = 2
bootstrap_iters = 10
device = "cpu"
"""


def test_an_eval_profile_runs_as_slurm_jobs_on_a_slurm_trained_lm_and_a_folder(slurm_env, tmp_path, monkeypatch,
                                                                                capsys):
    from test_lm_eval import TEXT, write_neox, write_tasks
    from workbench.cli import main
    from workbench.store import Store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT * 2)
    # a folder named tasks/ in the working folder, where the job starts: it must not shadow
    # the workbench's tasks package in the job's Python
    tasks = write_tasks(tmp_path / "tasks", tmp_path / "datasets-cache")
    neox = write_neox(tmp_path / "neox")
    st = str(tmp_path / "st")
    (tmp_path / "lm.toml").write_text(tiny_lm_profile_text(corpus, "slurm-lm", head=SLURM))
    assert main(["--store", st, "run", str(tmp_path / "lm.toml"), "--quiet"]) == 0, capsys.readouterr()
    store = Store(st)
    (trained,) = store.runs(profile="slurm-lm")
    assert trained.info["executor"] == "slurm" and trained.info["weights"]["path"].startswith(str(tmp_path / "st"))
    capsys.readouterr()

    f = tmp_path / "eval.toml"
    f.write_text(EVAL.format(neox=neox, run=trained.id, tasks=tasks))
    assert main(["--store", st, "run", str(f), "--quiet"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "tiny_mc" in out and "export --profile slurm-eval" in out
    runs = {r.label: r for r in store.runs(profile="slurm-eval")}
    assert set(runs) == {"neox", "mine"}
    for r in runs.values():
        assert r.state == "finished", r.error
        assert r.info["executor"] == "slurm" and r.info["slurm_job_id"].isdigit()
        res = store.results([r.id])[r.id]
        assert 0 <= res["tiny_mc"]["acc"] <= 1 and res["tiny_lambada"]["perplexity"] > 1
        assert r.info["eval_done"] == ["tiny_mc", "tiny_lambada"]
    assert len({r.info["slurm_job_id"] for r in runs.values()}) == 2  # a job per model
    # run:N reached the job in its snapshot: the job read no store
    snap = json.loads((tmp_path / "st" / "slurm" / f"run-{runs['mine'].id}" / "run.json").read_text())
    assert snap["info"]["eval_source"]["run_id"] == trained.id
    assert runs["mine"].info["eval_model"]["kind"] == "workbench-run"
    # the same numbers as this process computes for the folder
    assert main(["--store", str(tmp_path / "local"), "eval", str(neox), "--tasks", "tiny_mc", "--include",
                 str(tasks), "--batch-size", "2", "--bootstrap-iters", "10", "--device", "cpu", "--inline",
                 "--quiet"]) == 0
    local = Store(tmp_path / "local")
    (lr,) = local.runs()
    assert local.results([lr.id])[lr.id]["tiny_mc"]["acc"] == store.results([runs["neox"].id])[runs["neox"].id][
        "tiny_mc"]["acc"]
    capsys.readouterr()
    # replayed: found finished, nothing submitted again
    assert main(["--store", st, "run", str(f), "--quiet"]) == 0
    assert capsys.readouterr().out.count("evaluated on these tasks already") == 2
    assert len(store.runs(profile="slurm-eval")) == 2
