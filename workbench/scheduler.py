"""The local scheduler: launches one detached worker process per pending run.

Slots: one per visible GPU when CUDA is there (each worker pinned with
``CUDA_VISIBLE_DEVICES``), otherwise ``cpu`` slots, one unless ``--jobs N``. Pending runs
wait for a free slot (oldest first). The scheduler itself runs detached
(``python -m workbench.scheduler --store DIR``) so that quitting the TUI or losing the SSH
connection stops nothing; it exits once nothing is pending or running. A file lock makes
sure only one scheduler per store hands out slots; a second one waits for the lock and then
picks up whatever is still pending.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workbench.store import Store, pid_alive, tail_log

POLL_S = 0.5


def detect_slots(jobs: int | None = None) -> list[tuple[str, str | None]]:
    """[(device, slot)]: ("cuda", "0"), ("cuda", "1") ... or ("cpu", "cpu0") ..."""
    gpus = _visible_gpus()
    if gpus:
        slots = [("cuda", g) for g in gpus]
        if jobs:  # several runs per GPU when asked
            slots = [slots[i % len(slots)] for i in range(max(jobs, 1))]
        return slots
    return [("cpu", f"cpu{i}") for i in range(max(1, jobs or 1))]


def _visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    from workbench import sysmon

    return [str(i) for i in range(sysmon.gpu_count())]


def worker_env(device: str, slot: str | None, n_cpu_jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # live log lines, not at exit
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(slot)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU slot must not grab a GPU
        if n_cpu_jobs > 1:  # share the cores between concurrent CPU runs
            threads = max(1, (os.cpu_count() or 1) // n_cpu_jobs)
            env.setdefault("OMP_NUM_THREADS", str(threads))
    # the worker imports the project from wherever this copy lives
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Scheduler:
    def __init__(self, store: Store, jobs: int | None = None):
        self.store = store
        self.slots = detect_slots(jobs)
        self.children: dict[int, subprocess.Popen] = {}  # run_id -> worker we started

    def busy_slots(self) -> set[str]:
        return {r.slot for r in self.store.runs(states=["running"]) if r.slot}

    def launch(self, run_id: int, device: str, slot: str) -> None:
        log = open(self.store.log_path(run_id), "ab")
        cmd = [sys.executable, "-u", "-m", "workbench.worker", "--store", str(self.store.root),
               "--run-id", str(run_id)]
        n_cpu = sum(1 for d, _ in self.slots if d == "cpu")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=worker_env(device, slot, n_cpu), start_new_session=True,
                             cwd=os.getcwd())
        log.close()
        if not self.store.mark_started(run_id, p.pid, device, slot):
            # killed while we were starting it
            _terminate_group(p.pid)
            p.wait()
            return
        self.children[run_id] = p

    def poll_children(self) -> None:
        for run_id, p in list(self.children.items()):
            code = p.poll()
            if code is None:
                continue
            del self.children[run_id]
            r = self.store.get(run_id)
            if r and r.state == "running":  # exited without saying how it ended
                tail = tail_log(r.log_path)
                self.store.finish(run_id, "crashed",
                                  f"worker exited with code {code} without finishing" +
                                  (f"; last log lines:\n{tail}" if tail else ""))

    def tick(self) -> bool:
        """One round: reap, fill free slots. True while anything is pending or running."""
        self.poll_children()
        self.store.reap()
        busy = self.busy_slots()
        pending = self.store.runs(states=["pending"])
        for device, slot in self.slots:
            if not pending:
                break
            if slot in busy:
                continue
            run = pending.pop(0)
            self.launch(run.id, device, slot)
            busy.add(slot)
        running = self.store.runs(states=["running"])
        return bool(pending or running or self.children)

    def run_until_idle(self) -> None:
        while self.tick():
            time.sleep(POLL_S)


def _lock(store: Store):
    f = open(store.root / "scheduler.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)  # blocks while another scheduler is active
    return f


def spawn(store: Store, jobs: int | None = None) -> subprocess.Popen:
    """Start a detached scheduler process for ``store``."""
    cmd = [sys.executable, "-u", "-m", "workbench.scheduler", "--store", str(store.root)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    log = open(store.root / "logs" / "scheduler.log", "ab")
    env = worker_env("cpu", None, 1)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env=env, cwd=os.getcwd())
    log.close()
    return p


def submit(store: Store, profile, jobs: int | None = None) -> list[int]:
    """Queue every run of ``profile``'s sweep and make sure a scheduler serves them."""
    from workbench.profile import expand

    ids = store.add_runs(spec.to_dict() for spec in expand(profile))
    spawn(store, jobs)
    return ids


def _terminate_group(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(pid, sig)  # the worker leads its own session/group
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill(store: Store, run_id: int, grace_s: float = 5.0) -> bool:
    """Kill a pending or running run. Returns False if it had already ended."""
    r = store.get(run_id)
    if r is None:
        raise KeyError(f"no run {run_id}")
    if not store.finish(run_id, "killed", "killed by user"):
        return False
    if r.pid and r.state == "running":
        _terminate_group(r.pid)
        deadline = time.time() + grace_s
        while time.time() < deadline and pid_alive(r.pid, r.pid_start):
            time.sleep(0.1)
        if pid_alive(r.pid, r.pid_start):
            _terminate_group(r.pid, signal.SIGKILL)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.scheduler")
    ap.add_argument("--store", required=True)
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    store = Store(a.store)
    lock = _lock(store)
    try:
        Scheduler(store, a.jobs).run_until_idle()
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
