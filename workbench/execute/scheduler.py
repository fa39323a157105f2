"""The local scheduler: launches one detached worker process per pending run
(:class:`LocalExecutor`, the ``local`` :class:`~workbench.execute.executor.Executor`).

Slots: ``runs_per_gpu`` (default 1) per visible GPU when CUDA is there: with G GPUs there
are G*N slots and slot i is pinned to GPU i // N with ``CUDA_VISIBLE_DEVICES`` (the run's
``slot`` column records that GPU's id); otherwise ``cpu`` slots, one unless ``--jobs N``
(``runs_per_gpu`` has no effect without a GPU). Pending runs wait for a free slot (oldest
first) and go to the least busy GPU. A run on several devices (``train.devices = N``,
workbench/train/distributed.py) reserves N slots of distinct ids at once (N GPUs, or N
CPU slots; its ``slot`` column lists them, "0,1"); it waits, holding back the runs queued
after it, until that many are free. A CPU run asking for more slots than the scheduler
has runs alone once every slot is free (its ranks are processes sharing the cores); a
GPU run asking for more GPUs than are visible fails at once in one line. The scheduler itself runs detached
(``python -m workbench.execute.scheduler --store DIR``) so that quitting the TUI or losing the SSH
connection stops nothing; it exits once nothing is pending or running. A file lock makes
sure only one scheduler per store hands out slots; a second one waits for the lock and then
picks up whatever is still pending.

A scheduler that dies (SIGKILL, the OOM killer, a crash) would strand the pending runs:
nothing else starts them. So :func:`spawn` records the process it starts in the store
folder (``scheduler.json``: pid, start time, host, slots), the scheduler removes that record
only when it exits normally, and readers tell a dead one from a live one with
:func:`workbench.store.progress.scheduler_state` (the record and the lock). The process that
spawned a scheduler is the one waiting on it (``run``'s progress loop, the TUI that
launched a sweep): :func:`revive` starts it again there; anyone else is told
``ssm-workbench resume --pending`` (:func:`resume_pending`).

Runs get here through :func:`workbench.execute.launch.submit` (a profile's sweep, replayed
idempotently) and :func:`workbench.execute.resume.resume_runs`, which hand them to
:class:`LocalExecutor`; resumed runs are ordinary pending runs here, the worker does the
resuming. This module imports neither: it knows only the executor interface.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from workbench.execute.executor import Executor
from workbench.spec.run_spec import run_devices
from workbench.store import Store, StoreError, pid_alive, tail_log
from workbench.store.layout import LOCAL, executor_name
from workbench.store.progress import SCHEDULER_FILE, SCHEDULER_LOCK, read_scheduler_record, scheduler_state

POLL_S = 0.5


def detect_slots(jobs: int | None = None, runs_per_gpu: int | None = None) -> list[tuple[str, str | None]]:
    """[(device, slot)]: with G visible GPUs, G * runs_per_gpu entries, entry i = ("cuda",
    id of GPU i // runs_per_gpu), e.g. ("cuda", "0"), ("cuda", "0"), ("cuda", "1") ...;
    a GPU id appears once per run it may hold. Without a GPU ("cpu", "cpu0") ..., ``jobs``
    of them (default 1)."""
    gpus = _visible_gpus()
    if gpus:
        n = max(1, runs_per_gpu or 1)
        return [("cuda", gpus[i // n]) for i in range(len(gpus) * n)]
    return [("cpu", f"cpu{i}") for i in range(max(1, jobs or 1))]


def resolve_runs_per_gpu(flag: int | None, profile=None) -> int:
    """Runs sharing one GPU: the command-line flag, else the profile's ``runs_per_gpu``, else 1."""
    if flag:
        return int(flag)
    return int(getattr(profile, "runs_per_gpu", None) or 1)


def _visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    from workbench.train import sysmon

    return [str(i) for i in range(sysmon.gpu_count())]


def visible_gpus() -> list[str]:
    """The ids of the GPUs this machine's scheduler would hand out (CUDA_VISIBLE_DEVICES,
    else every GPU NVML sees); [] without one."""
    return _visible_gpus()


def devices_refusal(n: int, gpus: list[str], key: str = "train.devices") -> str | None:
    """Why a run on ``n`` devices can never start on a machine with ``gpus`` (more GPUs
    than there are: one rank per GPU), or None. Without a GPU its ranks are CPU processes
    (see the module doc). Used by :meth:`Scheduler.refuse` and by the TUI's form, which says
    it before a launch."""
    if gpus and n > len(gpus):
        return (f"{key} = {n}, but this machine shows {len(gpus)} GPU(s) "
                f"({', '.join(gpus)}): one rank per GPU")
    return None


def worker_env(device: str, slot: str | None, n_cpu_jobs: int, ranks: int = 1) -> dict[str, str]:
    """The worker's environment: its GPU(s) (``slot``: "0" or "0,1"), or, on CPU, its share
    of the cores (``ranks`` processes of one run share them like concurrent runs)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # live log lines, not at exit
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(slot)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU slot must not grab a GPU
        if max(n_cpu_jobs, ranks) > 1:  # share the cores between concurrent CPU runs / ranks
            threads = max(1, (os.cpu_count() or 1) // max(n_cpu_jobs, ranks))
            env.setdefault("OMP_NUM_THREADS", str(threads))
        # OpenMP threads that spin while waiting for a sibling the OS has descheduled make a
        # step on a busy machine many times slower; sleeping ones cost a wake-up. Measured on
        # the 2-core box of issue 32 at load 7-9 (d_model 32, 2 layers, batch 8, L 20, two
        # threads): a Transformer step 271 ms spinning, 15 ms passive; Mamba 173 vs 28 ms.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # the worker imports the project from wherever this copy lives (the repository root,
    # the folder above workbench/)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Scheduler:
    def __init__(self, store: Store, jobs: int | None = None, runs_per_gpu: int | None = None):
        self.store = store
        self.slots = detect_slots(jobs, runs_per_gpu)
        # how many runs each slot id (a GPU id, or cpuK) may hold at once
        self.capacity: Counter[str] = Counter(s for _, s in self.slots if s)
        self.children: dict[int, subprocess.Popen] = {}  # run_id -> worker we started

    def busy_slots(self) -> Counter[str]:
        """Running runs per slot id (a run on several devices counts on each of them)."""
        return Counter(s for r in self.store.runs(states=["running"]) if r.slot for s in r.slot.split(","))

    def free_slots(self, busy: Counter[str], n: int) -> tuple[str, list[str]] | None:
        """(device, n slot ids) with the most room (first listed on ties), or None while
        fewer than n are free. A CPU run wanting more slots than there are gets them all
        once none is busy (see the module doc)."""
        rooms = []
        for i, (device, slot) in enumerate(dict.fromkeys(self.slots)):
            left = self.capacity[slot] - busy[slot]
            if left > 0:
                rooms.append((-left, i, device, slot))
        rooms.sort()
        if len(rooms) >= n:
            return rooms[0][2], [slot for *_, slot in rooms[:n]]
        ids = list(dict.fromkeys(s for _, s in self.slots))
        if n > len(ids) and self.slots[0][0] == "cpu" and not any(busy.values()):
            return "cpu", ids
        return None

    def refuse(self, run) -> str | None:
        """Why ``run`` can never start here (more GPUs than visible), or None."""
        gpus = list(dict.fromkeys(s for d, s in self.slots if d == "cuda"))
        key = "eval.devices" if run.spec.get("kind") == "eval" else "train.devices"
        return devices_refusal(run_devices(run.spec, run.info), gpus, key)

    def free_slot(self, busy: Counter[str]) -> tuple[str, str] | None:
        """The (device, slot) with the most room left (first listed on ties), or None."""
        best, room = None, 0
        for device, slot in dict.fromkeys(self.slots):  # each slot id once, in order
            left = self.capacity[slot] - busy[slot]
            if left > room:
                best, room = (device, slot), left
        return best

    def launch(self, run_id: int, device: str, slot: str, ranks: int = 1) -> None:
        """Start run ``run_id``'s worker on ``slot`` (its ids joined by commas when the run
        has several ranks: the worker starts the others, workbench/train/distributed.py)."""
        log = open(self.store.log_path(run_id), "ab")
        cmd = [sys.executable, "-u", "-m", "workbench.train.worker", "--store", str(self.store.root),
               "--run-id", str(run_id)]
        n_cpu = sum(1 for d, _ in self.slots if d == "cpu")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=worker_env(device, slot, n_cpu, ranks), start_new_session=True,
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
        # other executors' runs (Slurm) are submitted by their executor, not started here
        pending = [r for r in self.store.runs(states=["pending"]) if executor_name(r) == LOCAL]
        while pending:
            run = pending[0]
            n = run_devices(run.spec, run.info)
            if n > 1:
                why = self.refuse(run)
                if why:
                    pending.pop(0)
                    self.store.finish(run.id, "failed", why)
                    continue
                got = self.free_slots(busy, n)
                if got is None:
                    break  # it waits for n slots; later runs wait behind it (none is starved)
                device, slots = got
                pending.pop(0)
                self.launch(run.id, device, ",".join(slots), n)
                busy.update(slots)
                continue
            free = self.free_slot(busy)
            if free is None:
                break
            device, slot = free
            run = pending.pop(0)
            self.launch(run.id, device, slot)
            busy[slot] += 1
        running = [r for r in self.store.runs(states=["running"]) if executor_name(r) == LOCAL]
        return bool(pending or running or self.children)

    def run_until_idle(self) -> None:
        while self.tick():
            time.sleep(POLL_S)


def _lock(store: Store):
    f = open(store.root / SCHEDULER_LOCK, "w")
    fcntl.flock(f, fcntl.LOCK_EX)  # blocks while another scheduler is active
    return f


def _record(store: Store, pid: int, jobs: int | None, runs_per_gpu: int | None) -> None:
    """Write the store's scheduler record (module doc) for process ``pid``; best effort
    (a full disk: the scheduler still runs, only a death of it goes unnoticed)."""
    import json
    import socket

    import psutil

    try:
        start = psutil.Process(pid).create_time()
    except psutil.Error:
        start = None
    rec = {"pid": pid, "pid_start": start, "host": socket.gethostname(), "jobs": jobs,
           "runs_per_gpu": runs_per_gpu, "started": time.time()}
    path = store.root / SCHEDULER_FILE
    tmp = path.with_name(f".{SCHEDULER_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, path)  # whole or not at all: a reader never sees half a record
    except OSError:
        tmp.unlink(missing_ok=True)


def _unrecord(store: Store) -> None:
    """Remove the record on a normal exit, if it is still this process's (a scheduler
    spawned meanwhile, waiting for the lock, has put its own there)."""
    if read_scheduler_record(store.root).get("pid") == os.getpid():
        (store.root / SCHEDULER_FILE).unlink(missing_ok=True)


# store folders (resolved) this process spawned a scheduler for -> times it restarted one:
# this process is the one waiting on those runs (run's progress loop, the TUI that launched)
_SPAWNED: dict[str, int] = {}
MAX_RESTARTS = 3  # a scheduler that dies again at once (a broken environment) is not respawned forever


def spawn(store: Store, jobs: int | None = None, runs_per_gpu: int | None = None) -> subprocess.Popen:
    """Start a detached scheduler process for ``store`` and record it (module doc)."""
    cmd = [sys.executable, "-u", "-m", "workbench.execute.scheduler", "--store", str(store.root)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    if runs_per_gpu:
        cmd += ["--runs-per-gpu", str(runs_per_gpu)]
    log = open(store.root / "logs" / "scheduler.log", "ab")
    env = worker_env("cpu", None, 1)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env=env, cwd=os.getcwd())
    log.close()
    # recorded here, not only by the child once it runs: a reader in the second it takes to
    # start must not take its pending runs for stranded
    _record(store, p.pid, jobs, runs_per_gpu)
    _SPAWNED.setdefault(str(store.root.resolve()), 0)
    return p


def _pending_local(store: Store) -> int:
    return sum(1 for r in store.runs(states=["pending"]) if executor_name(r) == LOCAL)


class Revival(str):
    """What :func:`revive` did, as a line to show; ``restarted`` False: it gave up."""

    restarted: bool = True


def revive(store: Store) -> Revival | None:
    """Start the store's scheduler again when it died with local runs still pending, if
    this process is the one waiting on them (it spawned one for this store). None when
    nothing was to be done: another process is told by the readers instead
    (:func:`workbench.store.progress.stranded_note`). Cheap when all is well (a small file and
    a lock probe; the runs are only counted once the scheduler is found gone), so the
    polls call it every time. After :data:`MAX_RESTARTS` it gives up (``restarted`` False,
    said once; the readers' note stays)."""
    root = str(store.root.resolve())
    if root not in _SPAWNED:
        return None
    st = scheduler_state(store.root)
    if st.state != "gone":
        return None
    n = _pending_local(store)
    if not n:
        return None
    log = store.root / "logs" / "scheduler.log"
    if _SPAWNED[root] > MAX_RESTARTS:
        return None  # given up, and said so once
    if _SPAWNED[root] == MAX_RESTARTS:
        _SPAWNED[root] += 1
        out = Revival(f"the scheduler (pid {st.pid}) died again, {MAX_RESTARTS} restarts already: "
                      f"{n} pending run(s) wait; see {log}")
        out.restarted = False
        return out
    _SPAWNED[root] += 1
    p = spawn(store, st.jobs, st.runs_per_gpu)
    return Revival(f"the scheduler (pid {st.pid}) had died with {n} run(s) pending: "
                   f"started it again (pid {p.pid}; its log: {log})")


def resume_pending(store: Store, jobs: int | None = None, runs_per_gpu: int | None = None) -> tuple[int, str]:
    """``ssm-workbench resume --pending``: make sure a scheduler serves the store's pending
    local runs (one whose scheduler died, or was never started). (exit code, line to print)."""
    n = _pending_local(store)
    if not n:
        return 0, f"no pending runs in {store.root}: nothing to start"
    st = scheduler_state(store.root)
    if st.state == "running":
        return 0, (f"a scheduler serves {store.root}" + (f" (pid {st.pid})" if st.pid else "") +
                   f": its {n} pending run(s) start as slots free")
    if st.state == "elsewhere":
        return 2, (f"the scheduler of {store.root} was started on {st.host} (pid {st.pid}), which "
                   f"cannot be checked from here: run `resume --pending` there")
    p = spawn(store, jobs or st.jobs, runs_per_gpu or st.runs_per_gpu)
    was = f"its scheduler (pid {st.pid}) had died" if st.state == "gone" else "no scheduler was running"
    return 0, f"{was}: started one (pid {p.pid}) for {n} pending run(s)"


def _terminate_group(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(pid, sig)  # the worker leads its own session/group
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalExecutor(Executor):
    """This machine: the detached scheduler above starts a worker process per pending run;
    the store's :meth:`~workbench.store.Store.reap` checks their pids (its read side)."""

    name = LOCAL

    def submit(self, store: Store, run_ids: list[int], jobs: int | None = None,
               runs_per_gpu: int | None = None) -> None:
        if run_ids:
            spawn(store, jobs, runs_per_gpu)

    def cancel(self, store: Store, run_id: int, grace_s: float = 5.0) -> bool:
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
    ap = argparse.ArgumentParser(prog="python -m workbench.execute.scheduler")
    ap.add_argument("--store", required=True)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--runs-per-gpu", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        store = Store(a.store)
        lock = _lock(store)
        try:
            # this process serves now (a scheduler started by hand, or one that waited for
            # the lock while a record of another was written)
            _record(store, os.getpid(), a.jobs, a.runs_per_gpu)
            Scheduler(store, a.jobs, a.runs_per_gpu).run_until_idle()
            _unrecord(store)  # only a normal exit: a death leaves the record for readers to see
        finally:
            lock.close()
    except StoreError as e:  # a full or read-only store: one line in scheduler.log, not a traceback
        print(f"scheduler: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
