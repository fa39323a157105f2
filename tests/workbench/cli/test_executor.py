"""The executor boundary (workbench/execute/executor.py, dispatch.py) and "reads never submit": the
read paths (`runs`, `run`'s progress, every TUI poll) ingest run files and read job states
but never call ``sbatch``; only launching (``launch.submit``, ``resume``) does.

Slurm's commands are fake scripts on PATH here (each call logged), so these run where
Slurm is not installed; tests/e2e/test_slurm_e2e.py runs the real thing.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import tomli_w

from test_curves import sweep
from workbench import cli
from workbench.execute import launch, resume, scheduler, slurm
from workbench.execute.dispatch import describe, executor_for, executor_named, files_root
from workbench.spec import profile as profiles
from workbench.store import Store

FAKES = {
    # sbatch --parsable: the next job id (201, 202, ...)
    "sbatch": 'n=$(( $(cat "$FAKE_SLURM/next" 2>/dev/null || echo 200) + 1 )); echo $n > "$FAKE_SLURM/next"; echo $n',
    # squeue -h -t all -j IDS -o %i|%T|%r|%N: the lines the test wrote
    "squeue": 'cat "$FAKE_SLURM/squeue.txt" 2>/dev/null; true',
    "scontrol": "true",
    "scancel": "true",
}


class FakeSlurm:
    def __init__(self, folder: Path):
        self.folder = folder

    def calls(self, command: str) -> list[str]:
        log = self.folder / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.split(" ")[0] == command]

    def jobs(self, **states: str) -> None:
        """What squeue reports: job id -> state."""
        (self.folder / "squeue.txt").write_text(
            "".join(f"{job.lstrip('j')}|{state}|None|node1\n" for job, state in states.items()))


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> FakeSlurm:
    folder = tmp_path / "fake-slurm"
    (folder / "bin").mkdir(parents=True)
    for name, body in FAKES.items():
        script = folder / "bin" / name
        script.write_text(textwrap.dedent(f"""\
            #!/bin/bash
            echo "{name} $*" >> "$FAKE_SLURM/calls.log"
            {body}
            """))
        script.chmod(0o755)
    monkeypatch.setenv("FAKE_SLURM", str(folder))
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return FakeSlurm(folder)


def slurm_profile(name: str = "fake", seeds=(0, 1)):
    return profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": name, "executor": "slurm",
        "slurm": {"gpus_per_run": 0, "cpus_per_run": 1},
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["lstm"], "seq_lens": [16], "seeds": list(seeds)},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 2, "batch_size": 4, "device": "cpu"},
    }))


def slurm_store(tmp_path) -> tuple[Store, int, int]:
    """A store with two Slurm runs: ``waiting`` is pending with no job yet (e.g. the process
    that queued it died before submitting), ``queued`` has job 101, which squeue will show."""
    store = Store(tmp_path / "store")
    waiting, queued = sweep(store, models=("lstm",), seeds=(0, 1))
    executor_named("slurm").adopt(store, [waiting, queued])
    store.set_info(queued, {"slurm_job_id": "101", "slurm_jobs": ["101"], "slurm_state": "PENDING"})
    return store, waiting, queued


def test_runs_reads_job_states_and_submits_nothing(fake_slurm, tmp_path, capsys):
    store, waiting, queued = slurm_store(tmp_path)
    fake_slurm.jobs(j101="RUNNING")
    assert cli.main(["--store", str(store.root), "runs"]) == 0
    assert fake_slurm.calls("squeue"), "the read side asks Slurm for job states"
    assert store.get(queued).state == "running"  # ...and maps them
    assert not fake_slurm.calls("sbatch")
    assert store.get(waiting).state == "pending" and not store.get(waiting).info.get("slurm_job_id")
    # the explicit step submits it
    assert slurm.submit_pending(store) == [waiting]
    assert len(fake_slurm.calls("sbatch")) == 1 and store.get(waiting).info["slurm_job_id"] == "201"


async def test_tui_poll_submits_nothing(fake_slurm, tmp_path):
    from test_tui import SIZE, make_app, poll

    store, waiting, queued = slurm_store(tmp_path)
    fake_slurm.jobs(j101="RUNNING")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await poll(pilot)
        await poll(pilot)
    assert store.get(queued).state == "running"  # the poll read Slurm
    assert not fake_slurm.calls("sbatch")
    assert store.get(waiting).state == "pending"


def test_a_requeued_run_waits_for_submit_not_for_a_read(fake_slurm, tmp_path):
    """A run put back to pending (``resume``) still names its ended job: a read leaves it
    pending (neither submits it nor calls it crashed); submitting gives it a new job."""
    store, waiting, queued = slurm_store(tmp_path)
    store.finish(queued, "preempted", "Slurm job 101: TIMEOUT")
    fake_slurm.jobs(j101="TIMEOUT")
    done, errors = resume.resume_runs(store, [queued], restart=True)
    assert done == [queued] and not errors
    assert [c.split()[-1] for c in fake_slurm.calls("sbatch")] == [
        f"{store.root}/slurm/run-{waiting}/job.sh", f"{store.root}/slurm/run-{queued}/job.sh"]
    # the read side maps the job states of these runs and submits nothing more
    fake_slurm.jobs(j101="TIMEOUT", j201="PENDING", j202="RUNNING")
    slurm.sync(store, min_interval_s=0)
    assert len(fake_slurm.calls("sbatch")) == 2
    r = store.get(queued)
    assert r.state == "running" and r.info["slurm_job_id"] == "202" and r.info["slurm_jobs"] == ["101", "202"]
    assert store.get(waiting).state == "pending" and store.get(waiting).info["slurm_state"] == "PENDING"


def test_read_side_leaves_a_pending_run_with_an_ended_job_pending(fake_slurm, tmp_path):
    store, waiting, queued = slurm_store(tmp_path)
    fake_slurm.jobs(j101="COMPLETED")  # the job of an attempt before the run was requeued
    slurm.sync(store, min_interval_s=0)
    assert store.get(queued).state == "pending" and not fake_slurm.calls("sbatch")
    assert slurm.submit_pending(store) == [waiting, queued]


def test_submit_launches_through_the_profiles_executor(fake_slurm, tmp_path, monkeypatch):
    spawned = []
    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: spawned.append(a))
    store = Store(tmp_path / "store")
    ids = launch.submit(store, slurm_profile())
    assert len(fake_slurm.calls("sbatch")) == 2 and not spawned
    assert all(executor_for(r).name == "slurm" and r.info["slurm_job_id"] for r in store.runs(ids=ids))
    local = slurm_profile("here").model_copy(update={"executor": "local"})
    launch.submit(store, local)
    assert len(spawned) == 1 and len(fake_slurm.calls("sbatch")) == 2


def test_kill_goes_through_the_runs_executor(fake_slurm, tmp_path):
    store, waiting, queued = slurm_store(tmp_path)
    [here] = sweep(store, models=("lstm",), seeds=(5,))
    assert launch.kill(store, queued) and store.get(queued).state == "killed"
    assert fake_slurm.calls("scancel") == ["scancel 101"]
    assert launch.kill(store, here) and store.get(here).state == "killed"
    assert len(fake_slurm.calls("scancel")) == 1  # a local run is not Slurm's


def test_executor_lookup_describe_and_files_root(tmp_path):
    store, waiting, queued = slurm_store(tmp_path)
    [here] = sweep(store, models=("lstm",), seeds=(5,))
    assert executor_for(store.get(here)) is executor_named("local") is executor_named(None)
    assert executor_for(store.get(queued)) is executor_named("slurm")
    assert describe(store.get(here)) is None
    assert describe(store.get(queued)) == "slurm 101 PENDING" and describe(store.get(waiting)) == "slurm"
    assert files_root(store, store.get(here)) == store.root
    store.set_info(queued, {"slurm_shared": str(tmp_path / "shared")})
    assert files_root(store, store.get(queued)) == tmp_path / "shared"
    assert files_root(store, store.get(waiting)) == store.root  # not submitted yet
    with pytest.raises(ValueError, match="executor: unknown value 'pbs'"):
        executor_named("pbs")
