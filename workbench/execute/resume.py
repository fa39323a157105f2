"""``ssm-workbench resume ID...``: continue runs from their last checkpoint.
(``resume --pending``: start the store's scheduler again for its pending runs, after it
died: :func:`workbench.execute.scheduler.resume_pending`.)

A run that ended without finishing (killed, crashed, preempted, failed) and has a
checkpoint (workbench/train/checkpoint.py) is put back to ``pending`` with a resume marker in its
info; its executor starts its worker the usual way (one detached scheduler per store,
:func:`scheduler.spawn`, or a new Slurm job), and the worker, seeing the marker, loads the checkpoint, drops
the metrics the interrupted attempt logged after the checkpoint's step and continues.

:func:`requeue` is the one way back to ``pending``: the command, a replayed profile
(:func:`workbench.execute.launch.submit`) and, later, a cluster requeue call it.

A checkpoint is verified (:func:`checkpoint.verify`: header, sha256 of every byte, run id,
spec key) before the run is requeued or anything is printed: a damaged, cut or foreign
file is refused with its reason, and the run stays as it was. ``resume --restart ID``
is the way on: it discards the checkpoint and trains the (unfinished) run from step 0.
A replayed profile does not restart over a bad checkpoint on its own either: it refuses
that run (``Submission.refused``, which ``run`` prints with the same advice), because a
silent restart would throw away the training the checkpoint may hold (a copy from a
backup, a disk that comes back) and the user should decide that.
"""
from __future__ import annotations

import socket
import sys
import time

from workbench.execute.dispatch import by_executor, files_root
from workbench.store import UNFINISHED, Store, pid_alive
from workbench.store.progress import command


class ResumeError(Exception):
    """The run cannot be resumed; the message says why."""


def requeue(store: Store, run_id: int, require_checkpoint: bool = True, restart: bool = False) -> str:
    """Put an unfinished run back to ``pending``. Returns ``"resumed"`` when it will continue
    from its checkpoint (verified first), or ``"restarted"`` when it starts over with its
    measurements cleared: with ``restart`` (its checkpoint, good or bad, is discarded), or
    with ``require_checkpoint`` False and no checkpoint. Raises ResumeError otherwise, also
    for a checkpoint that fails verification, whatever ``require_checkpoint`` says."""
    from workbench.train import checkpoint  # imports torch: not at the CLI's start-up

    r = store.get(run_id)
    if r is None:
        raise ResumeError(f"no run {run_id}")
    if r.state not in UNFINISHED:
        hint = "; nothing to resume" if r.state == "finished" else ""
        raise ResumeError(f"run {run_id} is {r.state}{hint}")
    if store.has_final_results(run_id):
        # its worker measured everything, then its end was lost: a resume or a restart
        # would replace finished results, which are never deleted
        if store.recognise_finished(run_id):
            raise ResumeError(f"run {run_id} was crashed but holds all its final results: "
                              f"it is marked finished now; nothing to resume")
        raise ResumeError(f"run {run_id} is {r.state} but holds all its final results "
                          f"(`{command(store.root)} show {run_id}`); nothing to resume, and they are not deleted")
    if r.pid and r.host == socket.gethostname() and pid_alive(r.pid, r.pid_start):
        # e.g. just killed and still writing its checkpoint: two workers must never share a run
        raise ResumeError(f"run {run_id}: its worker (pid {r.pid}) has not exited yet; try again shortly")
    if r.spec.get("kind") == "eval" and not restart:
        # an evaluation keeps each task's results as it ends: it goes on at the next task
        if not store.requeue(run_id, {"eval": "next task", "requested": time.time()}):
            raise ResumeError(f"run {run_id} changed state meanwhile")
        return "resumed"
    root = files_root(store, r)  # a Slurm run's: the shared folder its jobs write to
    path = checkpoint.path_for(root, run_id)
    if path.is_file() and not restart:
        try:
            head = checkpoint.verify(path, run_id, r.spec)
        except checkpoint.CheckpointError as e:
            raise ResumeError(f"run {run_id}: cannot resume: {e}; `{command(store.root)} resume --restart {run_id}` "
                              f"discards it and trains the run from step 0") from None
        step = head.step if head.step is not None else (r.info.get("checkpoint") or {}).get("step")
        marker = {"checkpoint": str(path), "step": step, "requested": time.time(), "check": head.note}
        if not store.requeue(run_id, marker):
            raise ResumeError(f"run {run_id} changed state meanwhile")
        return "resumed"
    if require_checkpoint and not restart:
        raise ResumeError(f"run {run_id} ({r.state}) has no checkpoint to resume from "
                          f"(expected {path}); `{command(store.root)} resume --restart {run_id}` (or replaying its "
                          f"profile) trains it from step 0")
    checkpoint.remove(root, run_id)
    if not store.requeue(run_id, None):
        raise ResumeError(f"run {run_id} changed state meanwhile")
    return "restarted"


def resume_runs(store: Store, run_ids, jobs: int | None = None,
                runs_per_gpu: int | None = None, restart: bool = False,
                devices: int | None = None, sharding: str | None = None) -> tuple[list[int], list[str]]:
    """Requeue each run from its checkpoint (``restart``: from step 0, its checkpoint
    discarded) and hand the requeued ones to their executors (a local scheduler, a Slurm
    job each); returns (requeued ids, error messages). ``devices``: train on that many
    ranks from here on (recorded in the run's info, where the scheduler and the worker
    read it; a checkpoint resumes on any number of ranks). ``sharding``: "ddp" or "fsdp"
    from here on (the run's info; a checkpoint holds whole state dicts either way)."""
    store.reap()  # a 'running' run whose worker is gone is crashed, hence resumable
    done, errors = [], []
    for rid in run_ids:
        if devices:
            r = store.get(rid)
            bs = ((r.spec.get("train") or {}).get("batch_size") if r else None) or 0
            if r is not None and r.state in UNFINISHED and bs % devices:
                errors.append(f"run {rid}: batch_size = {bs} is not divisible by --devices {devices}: "
                              f"the global batch is split evenly between the ranks")
                continue
            if r is not None and r.state in UNFINISHED:  # before it is pending: a scheduler may take it at once
                store.set_info(rid, {"devices": devices})
        if sharding:
            r = store.get(rid)
            if r is not None and r.state in UNFINISHED:
                store.set_info(rid, {"sharding": sharding})
        try:
            requeue(store, rid, require_checkpoint=True, restart=restart)
        except ResumeError as e:
            errors.append(str(e))
            continue
        done.append(rid)
    for executor, ids in by_executor(store.runs(ids=done)).items():
        executor.submit(store, ids, jobs, runs_per_gpu)  # its worker resumes from the checkpoint
    return done, errors


def add_parser(sub) -> None:
    p = sub.add_parser("resume", help="continue unfinished runs (killed, crashed, preempted, failed) "
                                      "from their last checkpoint")
    p.add_argument("ids", type=int, nargs="*")
    p.add_argument("--pending", action="store_true",
                   help="start the store's scheduler again for its pending runs (after it was "
                        "killed or died: `runs` says so)")
    p.add_argument("--restart", action="store_true",
                   help="train the runs from step 0 instead, discarding their checkpoints (e.g. a "
                        "damaged one); only unfinished runs, finished results are never touched")
    p.add_argument("--devices", type=int, metavar="N",
                   help="go on as N data-parallel ranks (train.devices; a checkpoint resumes on any "
                        "number, to the same curve within float round-off)")
    p.add_argument("--sharding", choices=("ddp", "fsdp"),
                   help="go on with the ranks holding the whole model (ddp) or 1/N of it (fsdp; "
                        "train.sharding): checkpoints hold whole state dicts either way")
    p.add_argument("--jobs", type=int, help="concurrent CPU runs, if a scheduler has to be started")
    p.add_argument("--runs-per-gpu", type=int, metavar="N",
                   help="concurrent runs per visible GPU, if a scheduler has to be started")
    p.set_defaults(fn=cmd_resume)


def cmd_resume(args) -> int:
    """Exit 0 when every run was requeued, 2 when any could not be (each says why)."""
    if not args.ids and not getattr(args, "pending", False):
        print("name the runs to resume (ids), or --pending to start the scheduler for the pending ones",
              file=sys.stderr)
        return 2
    store = Store(args.store) if getattr(args, "store", None) else Store()
    if getattr(args, "pending", False):
        from workbench.execute import scheduler

        code, line = scheduler.resume_pending(store, getattr(args, "jobs", None),
                                              getattr(args, "runs_per_gpu", None))
        print(line, file=sys.stderr if code else sys.stdout)
        if code or not args.ids:
            return code
    restart = bool(getattr(args, "restart", False))
    devices = getattr(args, "devices", None)
    if devices is not None and devices < 1:
        print(f"--devices {devices}: give 1 or more", file=sys.stderr)
        return 2
    done, errors = resume_runs(store, args.ids, getattr(args, "jobs", None),
                               getattr(args, "runs_per_gpu", None), restart=restart, devices=devices,
                               sharding=getattr(args, "sharding", None))
    for rid in done:
        marker = store.get(rid).info.get("resume") or {}
        if restart:
            print(f"run {rid}: restarts from step 0 (its checkpoint and measurements discarded)")
            continue
        if "eval" in marker:  # an evaluation keeps each finished task: no checkpoint to speak of
            done_tasks = len(store.get(rid).info.get("eval_done") or [])
            print(f"run {rid}: goes on at its next task ({done_tasks} done before)")
            continue
        step, check = marker.get("step"), marker.get("check")
        print(f"run {rid}: resumes from its checkpoint" + (f" at step {step}" if step is not None else "")
              + (f" ({check})" if check and check != "sha256 verified" else ""))
    for e in errors:
        print(e, file=sys.stderr)
    if done:
        print(f"watch with `{command(store.root)} runs` or the TUI")
    return 2 if errors else 0
