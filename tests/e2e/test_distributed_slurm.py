"""A run on two devices through the Slurm executor, against the real one-node cluster of
tests/slurm_cluster.py (skipped where Slurm is not installed): the job's ``srun`` starts
two worker tasks, each reads its rank from Slurm's variables, rank 0 alone writes the run
file, and the curve equals the same run's on one process here."""
from __future__ import annotations

import os
import time

import pytest
import tomli_w

from workbench.execute import launch, slurm
from workbench.spec import profile as profiles
from workbench.spec.expand import expand
from workbench.store import Store
from workbench.train import worker

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def two_device_profile(executor: str):
    return profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": "slurm-ddp", "executor": executor,
        "slurm": {"gpus_per_run": 0, "cpus_per_run": 1, "nodes": 1},
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["transformer"], "seq_lens": [10], "seeds": [0]},
        "model": {"d_model": 16, "n_layers": 1},
        "train": {"steps": 8, "batch_size": 8, "lr": 3e-3, "log_every": 1, "eval_every": 4,
                  "device": "cpu", "devices": 2},
    }))


def test_srun_starts_the_ranks_and_rank_0_alone_writes(slurm_env, tmp_path):
    store = Store(tmp_path / "store")
    [rid] = launch.submit(store, two_device_profile("slurm"))
    script = open(os.path.join(store.get(rid).info["slurm_dir"], "job.sh")).read()
    assert "--ntasks-per-node=2" in script and "exec srun " in script
    deadline = time.time() + 240
    while time.time() < deadline:
        slurm.sync(store, min_interval_s=0)
        r = store.get(rid)
        if r.finished and r.info.get("slurm_state", "").startswith("COMPLETED"):
            break
        time.sleep(0.5)
    r = store.get(rid)
    assert r.state == "finished", (r.state, r.error, r.info.get("slurm_state"))
    assert r.info["ranks"] == {"world": 2, "launcher": "srun", "backend": "gloo",
                              "sharding": "ddp"}
    got = [(m["step"], m["value"]) for m in store.metrics(rid, "train", "loss")]
    assert [s for s, _ in got] == list(range(1, 9))  # each step's row once: one writer

    # the same run as one process on this machine
    local = Store(tmp_path / "local")
    spec = expand(two_device_profile("local"))[0].to_dict()
    spec["train"].pop("devices")
    (lid,) = local.add_runs([spec])
    assert local.mark_started(lid, os.getpid(), "cpu", "cpu0")
    worker.run(str(local.root), lid)
    one = [v for _, v in ((m["step"], m["value"]) for m in local.metrics(lid, "train", "loss"))]
    assert [v for _, v in got] == pytest.approx(one, rel=1e-5, abs=1e-6)
