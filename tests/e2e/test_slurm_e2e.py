"""The Slurm executor end to end, against the real one-node cluster of
tests/slurm_cluster.py (skipped, with the reason, where Slurm is not installed): a profile
submitted through sbatch finishes and exports; a running job requeued with ``scontrol
requeue`` resumes from its checkpoint; ``kill`` scancels; a job past its time limit shows
as TIMEOUT with its checkpoint kept; the store never sees a row twice."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
import tomli_w

from workbench.results import export
from workbench.execute import launch, slurm
from workbench.spec import profile as profiles
from workbench.store import Store

# slow: real sbatch jobs, minutes; xdist_group: one worker runs every Slurm test, one at a
# time, on the session's one cluster (tests/conftest.py's slurm_cluster)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def slurm_profile(name: str, steps: int, seeds=(0,), checkpoint_every: int = 0, **settings):
    return profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": name, "executor": "slurm",
        "slurm": {"gpus_per_run": 0, "cpus_per_run": 1, **settings},
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["lstm"], "seq_lens": [16], "seeds": list(seeds)},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": steps, "batch_size": 4, "log_every": 1, "eval_every": max(1, steps // 4),
                  "device": "cpu", "checkpoint_every": checkpoint_every},
    }))


def wait(store: Store, ids, until, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        slurm.sync(store, min_interval_s=0)
        runs = store.runs(ids=ids)
        if until(runs):
            return runs
        time.sleep(0.5)
    states = [(r.id, r.state, r.info.get("slurm_state"), r.error) for r in store.runs(ids=ids)]
    raise AssertionError(f"timed out waiting for {what}: {states}")


def test_a_profile_runs_through_sbatch_and_exports(slurm_env, tmp_path):
    store = Store(tmp_path / "store")
    ids = list(launch.submit(store, slurm_profile("slurm-e2e", steps=6, seeds=(0, 1))))
    runs = store.runs(ids=ids)
    assert all(r.info["executor"] == "slurm" and r.info["slurm_job_id"].isdigit() for r in runs)
    assert len({r.info["slurm_job_id"] for r in runs}) == 2  # a job per run
    runs = wait(store, ids, lambda rs: all(r.finished and r.info["slurm_state"] == "COMPLETED" for r in rs),
                120, "both runs to finish and their jobs to complete")
    assert [r.state for r in runs] == ["finished", "finished"], [r.error for r in runs]
    recs = [r for r in export.records(store, "slurm-e2e") if r["eval_set"] == ""]  # the test set ('valid' too)
    assert len(recs) == 2 and all(0 <= r["accuracy"] <= 1 for r in recs)
    for r in runs:
        steps = [m["step"] for m in store.metrics(r.id, "train", "loss")]
        assert steps == sorted(set(steps)) and steps[-1] == 6  # every row once
        assert "[worker]" in open(r.log_path).read() or os.path.getsize(r.log_path) > 0
        assert r.device == "cpu" and r.host  # what the job reported from its node
    # replaying the profile submits nothing: it is all there
    again = launch.submit(store, slurm_profile("slurm-e2e", steps=6, seeds=(0, 1)))
    assert sorted(again.skipped) == sorted(ids) and not again.queued


def test_requeued_job_resumes_from_its_checkpoint(slurm_env, tmp_path):
    store = Store(tmp_path / "store")
    [rid] = launch.submit(store, slurm_profile("slurm-requeue", steps=2000, checkpoint_every=200))
    wait(store, [rid], lambda rs: (rs[0].info.get("checkpoint") or {}).get("step", 0) >= 200, 120,
         "a checkpoint")
    job = store.get(rid).info["slurm_job_id"]
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    wait(store, [rid], lambda rs: rs[0].state in ("pending", "preempted") or
         rs[0].info.get("slurm_attempt", 0) >= 1, 60, "the requeue to show")
    seen = set()

    def ended(rs):
        seen.add(rs[0].state)
        return rs[0].finished and rs[0].state != "preempted"  # preempted: waiting to run again

    runs = wait(store, [rid], ended, 300, "the requeued run to finish")
    r = runs[0]
    assert r.state == "finished", r.error
    assert r.info["slurm_job_id"] == job and r.info["slurm_attempt"] >= 1  # the same job, again
    assert "pending" in seen  # while Slurm held the requeued job, the run showed as queued
    [resumed] = r.info["resumed"]
    assert resumed["step"] >= 200
    steps = [m["step"] for m in store.metrics(rid, "train", "loss")]
    assert steps == list(range(1, 2001))  # the interrupted attempt's later rows were dropped


def test_kill_scancels_the_job(slurm_env, tmp_path):
    store = Store(tmp_path / "store")
    [rid] = launch.submit(store, slurm_profile("slurm-kill", steps=100000))
    wait(store, [rid], lambda rs: rs[0].state == "running", 60, "the job to run")
    assert launch.kill(store, rid)
    runs = wait(store, [rid], lambda rs: rs[0].info.get("slurm_state", "").startswith("CANCELLED"),
                60, "CANCELLED")
    assert runs[0].state == "killed"


@pytest.mark.slow
def test_time_limit_shows_timeout_and_keeps_the_checkpoint(slurm_env, tmp_path):
    store = Store(tmp_path / "store")
    prof = slurm_profile("slurm-timeout", steps=10_000_000, checkpoint_every=100, time="1", signal_s=0)
    [rid] = launch.submit(store, prof)
    runs = wait(store, [rid], lambda rs: rs[0].finished and "TIMEOUT" in rs[0].info.get("slurm_state", ""),
                200, "TIMEOUT")
    r = runs[0]
    assert r.state == "preempted"
    ck = r.info["checkpoint"]
    assert ck["step"] >= 100 and os.path.exists(ck["path"])


@pytest.mark.slow
def test_time_limit_warning_checkpoints_and_requeues(slurm_env, tmp_path):
    """With a time limit, Slurm's SIGUSR1 (signal_s before the limit) makes the worker save
    a checkpoint and requeue its own job; the next attempt goes on from it and finishes."""
    store = Store(tmp_path / "store")
    # each attempt is warned 16-26 s in (1-minute limit, 40 s warning: Slurm checks about
    # every 30 s); 12000 steps take about 70 s on a 2-core machine: several attempts
    prof = slurm_profile("slurm-usr1", steps=12000, checkpoint_every=200, time="1", signal_s=40)
    [rid] = launch.submit(store, prof)
    states: list[str] = []

    def done(rs):
        if not states or states[-1] != rs[0].state:
            states.append(rs[0].state)
        return rs[0].state in ("finished", "failed", "crashed", "killed")

    r = wait(store, [rid], done, 400, "the run to finish across attempts")[0]
    assert r.state == "finished", r.error
    assert r.info["slurm_attempt"] >= 1 and r.info["resumed"]
    # between attempts the run was shown stopped (preempted) or queued again, then ran on
    later = states[states.index("running") + 1:]
    assert any(s in ("preempted", "pending") for s in later) and "running" in later, states
    steps = [m["step"] for m in store.metrics(rid, "train", "loss")]
    assert steps == list(range(1, 12001))
