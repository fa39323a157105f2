"""The Slurm executor: one batch job per run, submitted with plain ``sbatch``.

Why ``sbatch`` and not submitit or job arrays: a job per run gives each run its own job id,
so ``kill`` cancels exactly that run, ``scontrol requeue`` restarts exactly that run and the
TUI shows each run's own Slurm state; the batch script is a readable file in the job folder
that a cluster user can inspect or resubmit by hand; and the worker entry point stays the
same command line, with nothing pickled across Python environments.

:class:`SlurmExecutor` is this executor behind :class:`workbench.execute.executor.Executor`.
Two steps, apart so that reading never submits:

- :func:`sync`, the read side, called by every poll of the TUI and of ``run``/``runs``:
  each Slurm run's events file is ingested into the store (:mod:`workbench.store.runfile`),
  then the jobs' states are read with ``squeue`` (and ``scontrol show job`` for jobs that
  have left the queue; accounting, hence ``sacct``, is not assumed) and mapped onto run
  states when the worker itself did not say how it ended. It runs no ``sbatch``.
- :func:`submit_pending`, called only where work is launched (``run``, ``resume``, the
  sweep form: :meth:`SlurmExecutor.submit`): a pending Slurm run without a live job (new,
  resumed, or requeued by ``resume``) gets its snapshot written and a job submitted; the
  job id goes into the run's info.

State mapping (the worker's own record wins when there is one):
PENDING/REQUEUED/CONFIGURING -> pending (the reason shown), RUNNING/COMPLETING -> running,
PREEMPTED -> preempted, TIMEOUT -> preempted ("time limit", the checkpoint kept),
NODE_FAIL/BOOT_FAIL/OUT_OF_MEMORY/FAILED -> crashed, CANCELLED -> killed, COMPLETED
without the worker's final record -> crashed.
"""
from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from workbench.execute.executor import Executor, ExecutorError
from workbench.store import Run, Store, runfile
from workbench.store.layout import EXECUTOR_KEY, checkpoint_path, executor_name

if TYPE_CHECKING:
    from workbench.spec.slurm_settings import SlurmSettings


def __getattr__(name: str):
    # SlurmSettings moved to workbench.spec.slurm_settings: pydantic is imported only by
    # what validates settings, not by every command that reads the store (`runs`, polls)
    if name == "SlurmSettings":
        from workbench.spec.slurm_settings import SlurmSettings

        return SlurmSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
# how a Slurm end state shows on a run the worker left unfinished: (state, what it means)
ENDED = {
    "PREEMPTED": ("preempted", "preempted by Slurm"),
    "TIMEOUT": ("preempted", "TIMEOUT: the job reached its time limit"),
    "NODE_FAIL": ("crashed", "NODE_FAIL: the node running the job failed"),
    "BOOT_FAIL": ("crashed", "BOOT_FAIL: the node could not boot"),
    "OUT_OF_MEMORY": ("crashed", "OUT_OF_MEMORY: the job exceeded its memory"),
    "FAILED": ("crashed", "FAILED: the job exited with an error"),
    "DEADLINE": ("crashed", "DEADLINE: the job missed its deadline"),
    "CANCELLED": ("killed", "CANCELLED by Slurm or scancel"),
    "COMPLETED": ("crashed", "the job completed without the worker's final record"),
}
QUERY_EVERY_S = 3.0


class SlurmError(ExecutorError):
    """A Slurm command failed; the message has its output."""


@dataclass
class JobState:
    state: str
    reason: str = ""
    node: str = ""

    def text(self) -> str:
        why = f" ({self.reason})" if self.reason and self.reason not in ("None", "(null)") else ""
        return self.state + why


# --------------------------------------------------------------------------- commands
def _run(cmd: list[str], check: bool = True) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: is this a Slurm login node (slurm-client installed)?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(cmd[:2])} did not answer in 60 s") from None
    if check and p.returncode != 0:
        raise SlurmError(f"{' '.join(cmd[:2])} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def shared_dir(store: Store, settings: SlurmSettings) -> Path:
    return Path(settings.shared_dir).expanduser() if settings.shared_dir else store.root


def job_script(run_id: int, settings: SlurmSettings, folder: Path, shared: Path, name: str,
               devices: int = 1) -> str:
    """The batch script of one run. A run on several devices (``devices`` ranks) asks for
    ``nodes`` nodes with ``devices / nodes`` tasks each and starts the ranks with ``srun``;
    each task is a worker that reads its rank from Slurm's variables
    (workbench/train/distributed.py) and finds rank 0 at ``MASTER_ADDR``, the job's first
    node, on a port derived from the job id."""
    ranks = devices > 1
    sb = [f"--job-name={name}", f"--output={folder}/slurm-%j.out", "--open-mode=append"]
    if ranks:
        per_node = devices // settings.nodes
        gpn = settings.gpus_per_node if settings.gpus_per_node is not None else (
            per_node if settings.gpus_per_run else 0)
        sb += [f"--nodes={settings.nodes}", f"--ntasks-per-node={per_node}",
               f"--cpus-per-task={settings.cpus_per_run}"]
        if gpn:
            sb.append(f"--gpus-per-node={gpn}")
    else:
        sb += ["--ntasks=1", f"--cpus-per-task={settings.cpus_per_run}"]
        if settings.gpus_per_run:
            sb.append(f"--gpus={settings.gpus_per_run}")
    for flag, value in (("partition", settings.partition), ("account", settings.account),
                        ("qos", settings.qos), ("time", settings.time), ("mem", settings.mem)):
        if value:
            sb.append(f"--{flag}={value}")
    sb.append("--requeue" if settings.requeue else "--no-requeue")
    if settings.signal_s and settings.time:
        sb.append(f"--signal=B:USR1@{settings.signal_s}")  # B: to the batch shell = the worker
    sb += settings.extra
    python = settings.python or sys.executable
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(f)}" for f in sb),
             "# written by ssm-workbench; the worker writes its rows to events.jsonl beside this file",
             "set -e", *settings.setup,
             f"cd {shlex.quote(os.getcwd())}",
             "export PYTHONUNBUFFERED=1",
             # this Python imports this copy of the project, as the local scheduler's workers
             # do: `python -m` puts the working folder first on the path, and a folder of the
             # user's named tasks/ or models/ (lm-eval task YAMLs) would shadow the packages
             *([f"export PYTHONPATH={shlex.quote(_project_root())}${{PYTHONPATH:+:$PYTHONPATH}}"]
               if not settings.python else []),
             *(["export SSMWB_REQUEUE_AT_TIME_LIMIT=1"] if settings.requeue and settings.requeue_at_time_limit
               and settings.signal_s and settings.time else []),
             *(_rank_lines() if ranks else []),
             # exec: the worker (or srun, which passes signals on to every rank) is the batch
             # shell, so Slurm's signals reach it directly
             f"exec {'srun ' if ranks else ''}{shlex.quote(python)} -u -m workbench.train.worker "
             f"--run-file {shlex.quote(str(shared))} --run-id {run_id}"]
    return "\n".join(lines) + "\n"


def _project_root() -> str:
    """The folder above workbench/ (the repository root of this copy)."""
    return str(Path(__file__).resolve().parents[2])


def _rank_lines() -> list[str]:
    """Where rank 0 listens: the job's first node, a port from the job id (two jobs on one
    node get different ports)."""
    return ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))"]


def submit_job(store: Store, run_id: int, settings: SlurmSettings) -> str:
    """Write the run's snapshot and batch script, ``sbatch`` it; returns the job id."""
    shared = shared_dir(store, settings)
    folder = runfile.job_dir(shared, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    run = store.get(run_id)
    # a resubmitted run starts a new events file section: the reader's offset must match
    events = folder / runfile.EVENTS
    store.set_info(run_id, {"runfile_offset": events.stat().st_size if events.exists() else 0})
    runfile.write_snapshot(store, run_id, folder)
    script = folder / "job.sh"
    from workbench.spec.run_spec import run_devices

    script.write_text(job_script(run_id, settings, folder, shared, f"ssmwb-{run.profile}-{run_id}"[:60],
                                 run_devices(run.spec, run.info)))
    out = _run(["sbatch", "--parsable", str(script)])
    job = out.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch printed {out!r}, not a job id")
    jobs = run.info.get("slurm_jobs", []) + [job]
    store.set_info(run_id, {"slurm_job_id": job, "slurm_jobs": jobs, "slurm_state": "PENDING",
                            "slurm_dir": str(folder), "slurm_shared": str(shared)})
    store.set_log_path(run_id, str(folder / f"slurm-{job}.out"))
    return job


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Slurm's view of these jobs: squeue for queued/running ones, scontrol for jobs that
    have ended but are still remembered (MinJobAge); jobs Slurm forgot are missing."""
    out: dict[str, JobState] = {}
    if not job_ids:
        return out
    text = _run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"], check=False)
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in job_ids:
            out[parts[0]] = JobState(parts[1], parts[2], parts[3])
    for job in job_ids:
        if job not in out:
            info = _run(["scontrol", "show", "job", "-o", job], check=False)
            fields = dict(re.findall(r"(\w+)=(\S*)", info))
            if fields.get("JobState"):
                out[job] = JobState(fields["JobState"], fields.get("Reason", ""), fields.get("NodeList", ""))
    return out


def cancel(store: Store, run_id: int) -> bool:
    """``kill`` of a Slurm run: mark it killed and scancel its job."""
    run = store.get(run_id)
    if run is None:
        raise KeyError(f"no run {run_id}")
    ok = store.finish(run_id, "killed", "killed by user (scancel)")
    job = run.info.get("slurm_job_id")
    if job:
        _run(["scancel", job], check=False)
        store.set_info(run_id, {"slurm_state": "CANCELLED"})
    return ok


def is_slurm(run) -> bool:
    """Kept for callers not yet asking :func:`workbench.execute.dispatch.executor_for`."""
    return executor_name(run) == "slurm"


# --------------------------------------------------------------------------- reading: sync
def sync(store: Store, min_interval_s: float = QUERY_EVERY_S, runs: list | None = None) -> dict[str, list[int]]:
    """The read side (see the module docstring): ingest run files and map job states; it
    never submits (:func:`submit_pending` does). Returns {"live": ids of the Slurm runs it
    looked after, "updated": ids}. Does nothing (and runs no command) when the store has no
    live Slurm runs or is read-only. ``runs``: the store's runs as the caller just read them
    (the TUI's poll reads them anyway), to spare a second read. Slurm is asked at most every
    ``min_interval_s`` seconds per store (a TUI polls at 2 Hz; squeue at that rate would
    burden a shared controller); run files are read on every call.

    Several processes may sync one store (a TUI and ``run``): a lock file serialises them
    and :func:`submit_pending`, so no event is applied twice and no run submitted twice."""
    done: dict[str, list[int]] = {"live": [], "updated": []}
    if store.readonly:  # ingesting and job states write; a read-only store is shown as is
        return done
    runs = [r for r in (store.runs() if runs is None else runs) if is_slurm(r)]
    # finished runs too while their job is still active (the worker is done, Slurm not yet)
    live = [r for r in runs if not r.finished or (r.info.get("slurm_state") or "").split(" ")[0] in ACTIVE]
    if not live:
        return done
    done["live"] = [r.id for r in live]
    with _locked(store):
        for r in live:
            folder = r.info.get("slurm_dir")
            if folder and runfile.ingest(store, r.id, Path(folder)):
                done["updated"].append(r.id)
        key = str(store.root)
        if time.time() - _last_query.get(key, 0.0) < min_interval_s:
            return done
        _last_query[key] = time.time()
        runs = store.runs(ids=done["live"])
        states = job_states([r.info["slurm_job_id"] for r in runs if r.info.get("slurm_job_id")])
        for r in runs:
            job = r.info.get("slurm_job_id")
            js = states.get(job) if job else None
            if js is not None and _map_state(store, r, job, js):
                done["updated"].append(r.id)
    return done


_last_query: dict[str, float] = {}


@contextmanager
def _locked(store: Store):
    with open(store.root / "slurm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _map_state(store: Store, r: Run, job: str, js: JobState) -> bool:
    """Bring run ``r`` in line with its job's state ``js``; True when its Slurm state changed."""
    if r.state == "pending" and js.state not in ACTIVE:
        return False  # an earlier attempt's job: the run waits for submit_pending
    changed = js.text() != r.info.get("slurm_state")
    if changed:
        store.set_info(r.id, {"slurm_state": js.text(), "slurm_node": js.node})
    if js.state in ACTIVE:
        if js.state == "RUNNING" and r.state == "pending":
            store.mark_started_remote(r.id, js.node, None, None)
        elif js.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD") and r.state in ("running", "preempted", "crashed"):
            # Slurm requeued the job (scontrol requeue, preemption, a failed node): the
            # run waits in the queue again and goes on from its checkpoint if it has one
            if r.state == "running":
                store.finish(r.id, "preempted", f"Slurm job {job} was requeued")
            ck = checkpoint_path(files_root(store, r), r.id)
            store.requeue(r.id, {"checkpoint": str(ck), "by": "slurm"} if ck.is_file() else None)
        return changed
    # the job has ended: read what the worker wrote last, then say how it ended
    if r.info.get("slurm_dir"):
        runfile.ingest(store, r.id, Path(r.info["slurm_dir"]))
    r = store.get(r.id)
    if r.finished and js.state in ENDED and js.state != "COMPLETED":
        # the worker recorded its own end (e.g. SIGTERM at the time limit: preempted with
        # a checkpoint); say what Slurm did beside it
        store.set_info(r.id, {"slurm_end": f"Slurm job {job}: {ENDED[js.state][1]}"})
    if not r.finished and js.state in ENDED:
        state, why = ENDED[js.state]
        ck = (r.info or {}).get("checkpoint")
        if ck:
            from workbench.store.progress import command

            why += f"; checkpoint at step {ck.get('step')} kept (`{command(store.root)} resume {r.id}`)"
        store.finish(r.id, state, f"Slurm job {job}: {why}")
    return changed


# --------------------------------------------------------------------------- launching: submit_pending
def submit_pending(store: Store) -> list[int]:
    """Submit a job for each pending Slurm run that has no live one (new, resumed, requeued
    by ``resume``); returns their ids. A run whose ``sbatch`` fails is marked failed with
    its output. Only the places that launch work call this (:meth:`SlurmExecutor.submit`)."""
    if store.readonly:
        return []
    if not any(is_slurm(r) for r in store.runs(states=["pending"])):
        return []
    submitted: list[int] = []
    with _locked(store):  # read again under the lock: another process may have submitted them
        runs = [r for r in store.runs(states=["pending"]) if is_slurm(r)]
        states = job_states([r.info["slurm_job_id"] for r in runs if r.info.get("slurm_job_id")])
        for r in runs:
            js = states.get(r.info.get("slurm_job_id") or "")
            if js is not None and js.state in ACTIVE:
                continue  # queued already (or requeued by Slurm itself)
            from workbench.spec.slurm_settings import SlurmSettings

            try:
                submit_job(store, r.id, SlurmSettings(**r.info.get("slurm", {})))
            except SlurmError as e:
                store.finish(r.id, "failed", f"sbatch: {e}")
            submitted.append(r.id)
    return submitted


def mark_for_slurm(store: Store, run_ids: list[int], settings: SlurmSettings) -> None:
    """Hand these (pending) runs to the Slurm executor; :func:`submit_pending` submits them."""
    for rid in run_ids:
        store.set_info(rid, {EXECUTOR_KEY: "slurm", "slurm": settings.model_dump(exclude_defaults=True)})


def files_root(store: Store, run: Run) -> Path:
    """A Slurm run keeps its checkpoint in the shared folder its jobs write to."""
    return Path((run.info or {}).get("slurm_shared") or store.root)


def describe(run) -> str:
    """'slurm 1234 PENDING (Priority)' for the runs table and ``runs``."""
    info: dict[str, Any] = run.info or {}
    return " ".join(filter(None, ["slurm", info.get("slurm_job_id"), info.get("slurm_state")]))


class SlurmExecutor(Executor):
    """An ``sbatch`` job per run (see the module docstring)."""

    name = "slurm"

    def adopt(self, store: Store, run_ids, profile=None) -> None:
        settings = getattr(profile, "slurm", None)
        if settings is None:
            from workbench.spec.slurm_settings import SlurmSettings

            settings = SlurmSettings()
        mark_for_slurm(store, list(run_ids), settings)

    def submit(self, store: Store, run_ids: list[int], jobs: int | None = None,
               runs_per_gpu: int | None = None) -> None:
        submit_pending(store)  # every pending Slurm run of the store, these among them

    def cancel(self, store: Store, run_id: int, grace_s: float = 5.0) -> bool:
        return cancel(store, run_id)

    def describe(self, run) -> str | None:
        return describe(run)

    def sync(self, store: Store, runs: list | None = None) -> list[int]:
        return sync(store, runs=runs)["live"]

    def files_root(self, store: Store, run: Run) -> Path:
        return files_root(store, run)
