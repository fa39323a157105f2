"""A run as the store holds it: its states, the :class:`Run` row, heartbeat timing and
process checks; where the store lives by default. No SQLite here, no pydantic, no torch.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATES = ("pending", "running", "finished", "failed", "crashed", "killed", "preempted")
TERMINAL = frozenset({"finished", "failed", "crashed", "killed", "preempted"})
UNFINISHED = ("failed", "crashed", "killed", "preempted")  # ended without results: may be requeued
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 30.0  # default: a running run silent this long is stalled (or crashed)
HEARTBEAT_TIMEOUT_ENV = "SSM_WORKBENCH_HEARTBEAT_TIMEOUT"
# The worker writes its summary (this name among it, under eval set '') as its last
# measurement before it records its end: a run holding it has all its final results,
# whatever its state says, and nothing may delete them.
FINAL_RESULT = "wall_s"


def default_store_dir() -> Path:
    env = os.environ.get("SSM_WORKBENCH_STORE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ssm-workbench"


_warned_timeout: set[str] = set()


def heartbeat_timeout() -> float:
    """Seconds of heartbeat silence after which a running run is stalled (its process on
    this host still exists) or crashed (it cannot be checked): ``$SSM_WORKBENCH_HEARTBEAT_TIMEOUT``,
    read at each reap so tests and slow machines can change it, else HEARTBEAT_TIMEOUT_S."""
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    if not raw:
        return HEARTBEAT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        if raw not in _warned_timeout:  # once per value, not at every poll
            _warned_timeout.add(raw)
            print(f"{HEARTBEAT_TIMEOUT_ENV}={raw!r} is not a positive number of seconds; "
                  f"using {HEARTBEAT_TIMEOUT_S:.0f}", file=sys.stderr)
        return HEARTBEAT_TIMEOUT_S
    return value


@dataclass
class Run:
    """A row of ``runs`` with JSON columns decoded."""

    id: int
    profile: str
    idx: int
    model: str
    label: str
    task: str
    seq_len: int | None
    seed: int
    spec: dict
    fields: dict
    state: str
    device: str | None
    slot: str | None
    host: str | None
    pid: int | None
    pid_start: float | None
    created: float
    started: float | None
    ended: float | None
    heartbeat: float | None
    progress: float
    step: int
    total_steps: int | None
    epoch: int | None
    last_loss: float | None
    last_accuracy: float | None
    backend: str | None
    error: str | None
    info: dict
    log_path: str | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Run":
        d = dict(row)
        for k in ("spec", "fields", "info"):
            d[k] = json.loads(d[k]) if d.get(k) else {}
        return cls(**d)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def elapsed(self) -> float | None:
        """Seconds run so far: this attempt's, plus every earlier attempt's when the run was
        resumed from a checkpoint (``info["prior_elapsed"]``, kept by :meth:`Store.requeue`)."""
        prior = float((self.info or {}).get("prior_elapsed") or 0.0)
        if self.started is None:
            return prior or None
        return prior + (self.ended or time.time()) - self.started

    @property
    def worker(self) -> str | None:
        """'pid 1234 on host' for the run's (last) worker process, or None before it started."""
        if self.pid is None and not self.host:
            return None
        return f"pid {self.pid if self.pid is not None else '?'} on {self.host or '?'}"

    def stall_note(self, now: float | None = None) -> str | None:
        """'no heartbeat for 42 s, process alive (stopped)' for a running run that
        :meth:`Store.reap` found silent past the timeout while its worker's process still
        exists (a paused VM, a SIGSTOP, a long pause): it is not declared crashed; None
        otherwise."""
        note = (self.info or {}).get("stalled")
        if self.state != "running" or not note or self.heartbeat is None:
            return None
        status = note.get("status")
        how = f"({status})" if status and status not in ("running", "sleeping", "disk-sleep") else "(stopped?)"
        return f"no heartbeat for {(now or time.time()) - self.heartbeat:.0f} s, process alive {how}"


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if given, started at ``create_time``."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(p.create_time() - create_time) > 1.0:
            return False  # the pid was reused by another process
        return True
    except psutil.Error:
        return False


def tail_log(path: str | None, lines: int = 8) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 8192))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])
