"""The store: SQLite (WAL), the single source of truth for runs and their measurements.

Location: ``--store DIR`` > ``$SSM_WORKBENCH_STORE`` > ``$XDG_DATA_HOME/ssm-workbench``
(``~/.local/share/ssm-workbench``). The directory holds ``store.sqlite`` and ``logs/``.

Writers: the scheduler creates runs and marks them started; each worker is the only writer
of its own run's rows after that (short transactions, a heartbeat every few seconds).
Readers (TUI, CLI, export) call :meth:`Store.reap` to turn runs whose worker is gone into
``crashed``.

States: pending -> running -> finished | failed | crashed | killed | preempted. ``preempted``:
the worker got SIGTERM or SIGUSR1 from anyone but ``kill`` (a cluster's preemption or time
limit) and saved a checkpoint if it could. Runs that did not finish can be put back to
``pending`` (:meth:`Store.requeue`, from ``ssm-workbench resume`` or a replayed profile).
"""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

STATES = ("pending", "running", "finished", "failed", "crashed", "killed", "preempted")
TERMINAL = frozenset({"finished", "failed", "crashed", "killed", "preempted"})
UNFINISHED = ("failed", "crashed", "killed", "preempted")  # ended without results: may be requeued
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 30.0  # a running run silent this long is crashed

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    profile TEXT NOT NULL,
    idx INTEGER NOT NULL DEFAULT 0,
    model TEXT NOT NULL,
    label TEXT NOT NULL,
    task TEXT NOT NULL,
    seq_len INTEGER,
    seed INTEGER NOT NULL,
    spec TEXT NOT NULL,
    fields TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    device TEXT,
    slot TEXT,
    host TEXT,
    pid INTEGER,
    pid_start REAL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    heartbeat REAL,
    progress REAL NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER,
    epoch INTEGER,
    last_loss REAL,
    last_accuracy REAL,
    backend TEXT,
    error TEXT,
    info TEXT,
    log_path TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE INDEX IF NOT EXISTS runs_profile ON runs(profile);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    step INTEGER NOT NULL,
    epoch REAL,
    split TEXT NOT NULL,          -- 'train' or 'eval'
    name TEXT NOT NULL,           -- 'loss', 'accuracy', 'sequence_accuracy', 'lr', ...
    value REAL,
    t REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics(run_id, split, name, step);
CREATE TABLE IF NOT EXISTS system (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    cpu_percent REAL,
    rss_mb REAL,
    gpu_util REAL,
    gpu_mem_used_mb REAL,
    gpu_mem_total_mb REAL,
    gpu_name TEXT,
    gpu_proc_mem_mb REAL                 -- this run's own GPU memory (NVML, per process)
);
CREATE INDEX IF NOT EXISTS system_run ON system(run_id, t);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    eval_set TEXT NOT NULL DEFAULT '',   -- '' = the default eval set; e.g. 'len=1024'
    name TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, eval_set, name)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""
SCHEMA_VERSION = "1"


def default_store_dir() -> Path:
    env = os.environ.get("SSM_WORKBENCH_STORE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ssm-workbench"


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
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started


class Store:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root else default_store_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        self.path = self.root / "store.sqlite"
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self.conn.executescript(SCHEMA)  # idempotent; executescript manages its own transaction
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            # columns added after a store was first created (older stores are upgraded in place)
            have = {r[1] for r in c.execute("PRAGMA table_info(system)")}
            if "gpu_proc_mem_mb" not in have:
                c.execute("ALTER TABLE system ADD COLUMN gpu_proc_mem_mb REAL")

    # -- connection ---------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        # a connection must not cross fork(); reopen in a child process
        if self._conn is None or self._pid != os.getpid():
            c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            c.row_factory = sqlite3.Row
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            c.execute("PRAGMA busy_timeout=30000")
            self._conn, self._pid = c, os.getpid()
        return self._conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction (BEGIN IMMEDIATE takes the write lock up front).
        Inside another one it joins it, so several writes can commit together (the
        ingestion of a run file applies a batch of events and its offset as one)."""
        c = self.conn
        if c.in_transaction:
            yield c
            return
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def log_path(self, run_id: int) -> Path:
        return self.root / "logs" / f"run-{run_id}.log"

    # -- runs ---------------------------------------------------------------------
    def add_runs(self, specs: Iterable[dict]) -> list[int]:
        """Insert pending runs (one per RunSpec dict); returns their ids."""
        now = time.time()
        ids = []
        with self.tx() as c:
            for s in specs:
                cur = c.execute(
                    "INSERT INTO runs (profile, idx, model, label, task, seq_len, seed, spec, fields,"
                    " state, created) VALUES (?,?,?,?,?,?,?,?,?, 'pending', ?)",
                    (s["profile"], s.get("index", 0), s["model"], s["label"], s["task"],
                     s.get("seq_len"), s["seed"], json.dumps(s), json.dumps(s.get("fields", {})), now),
                )
                ids.append(int(cur.lastrowid))
            for i in ids:
                c.execute("UPDATE runs SET log_path=? WHERE id=?", (str(self.log_path(i)), i))
        return ids

    def get(self, run_id: int) -> Run | None:
        row = self.conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return Run.from_row(row) if row else None

    def runs(self, profile: str | None = None, states: Iterable[str] | None = None,
             ids: Iterable[int] | None = None) -> list[Run]:
        q, args = "SELECT * FROM runs WHERE 1=1", []
        if profile:
            q += " AND profile=?"
            args.append(profile)
        if states:
            states = list(states)
            q += f" AND state IN ({','.join('?' * len(states))})"
            args += states
        if ids is not None:
            ids = list(ids)
            q += f" AND id IN ({','.join('?' * len(ids)) or 'NULL'})"
            args += ids
        return [Run.from_row(r) for r in self.conn.execute(q + " ORDER BY id", args)]

    def profiles(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT profile FROM runs ORDER BY profile")]

    def mark_started(self, run_id: int, pid: int, device: str, slot: str | None) -> bool:
        """Scheduler: pending -> running. False if the run is no longer pending."""
        import psutil

        try:
            pid_start = psutil.Process(pid).create_time()
        except psutil.Error:
            pid_start = None
        now = time.time()
        with self.tx() as c:
            cur = c.execute(
                "UPDATE runs SET state='running', pid=?, pid_start=?, host=?, device=?, slot=?,"
                " started=?, heartbeat=? WHERE id=? AND state='pending'",
                (pid, pid_start, socket.gethostname(), device, slot, now, now, run_id),
            )
            return cur.rowcount == 1

    def mark_started_remote(self, run_id: int, host: str | None, pid: int | None,
                            started: float | None) -> bool:
        """A worker on another node (a Slurm job) started, or started again after a
        requeue: pending/preempted/crashed -> running. Its pid is not checked from here."""
        now = time.time()
        with self.tx() as c:
            cur = c.execute(
                "UPDATE runs SET state='running', pid=?, pid_start=NULL, host=?, device=COALESCE(device,"
                " 'slurm'), started=COALESCE(started, ?), ended=NULL, error=NULL, heartbeat=? WHERE id=?"
                " AND state IN ('pending','preempted','crashed')",
                (pid, host, started or now, now, run_id))
            return cur.rowcount == 1

    def set_log_path(self, run_id: int, path: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE runs SET log_path=? WHERE id=?", (path, run_id))

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        """Worker: refresh the heartbeat and any of progress/step/epoch/last_* columns."""
        allowed = {"progress", "step", "total_steps", "epoch", "last_loss", "last_accuracy", "backend", "device"}
        bad = set(fields) - allowed
        if bad:
            raise KeyError(f"heartbeat cannot set {sorted(bad)}")
        sets = ", ".join([f"{k}=?" for k in fields] + ["heartbeat=?"])
        with self.tx() as c:
            c.execute(f"UPDATE runs SET {sets} WHERE id=?", (*fields.values(), time.time(), run_id))

    def set_info(self, run_id: int, info: dict) -> None:
        with self.tx() as c:
            row = c.execute("SELECT info FROM runs WHERE id=?", (run_id,)).fetchone()
            merged = {**(json.loads(row[0]) if row and row[0] else {}), **info}
            c.execute("UPDATE runs SET info=? WHERE id=?", (json.dumps(merged, default=str), run_id))

    def finish(self, run_id: int, state: str, error: str | None = None) -> bool:
        """Move a running (or pending) run to a terminal state; never overwrite one.

        Returns False when the run was already terminal (e.g. killed meanwhile).
        """
        if state not in TERMINAL:
            raise ValueError(f"{state!r} is not a terminal state")
        with self.tx() as c:
            cur = c.execute(
                "UPDATE runs SET state=?, error=?, ended=?, progress=CASE WHEN ?='finished' THEN 1.0"
                " ELSE progress END WHERE id=? AND state IN ('pending','running')",
                (state, error, time.time(), state, run_id),
            )
            return cur.rowcount == 1

    def requeue(self, run_id: int, resume: dict | None) -> bool:
        """An ended, unfinished run back to ``pending`` (the scheduler starts it again).

        ``resume``: the marker the worker reads to load the run's checkpoint (kept in the
        info as ``resume``); None starts it from scratch, so its measurements so far are
        deleted. Returns False when the run is not in an UNFINISHED state."""
        states = ",".join("?" * len(UNFINISHED))
        with self.tx() as c:
            row = c.execute(f"SELECT info FROM runs WHERE id=? AND state IN ({states})",
                            (run_id, *UNFINISHED)).fetchone()
            if row is None:
                return False
            info = {**(json.loads(row[0]) if row[0] else {}), "resume": resume}
            c.execute(
                "UPDATE runs SET state='pending', pid=NULL, pid_start=NULL, host=NULL, slot=NULL,"
                " started=NULL, ended=NULL, heartbeat=NULL, error=NULL, info=? WHERE id=?",
                (json.dumps(info, default=str), run_id),
            )
            if resume is None:
                for table in ("metrics", "results", "system"):
                    c.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
                c.execute("UPDATE runs SET progress=0, step=0, epoch=NULL, last_loss=NULL,"
                          " last_accuracy=NULL WHERE id=?", (run_id,))
        return True

    def trim_after(self, run_id: int, step: int) -> int:
        """Drop what a resumed run will compute again: metrics logged after ``step`` (by the
        attempt that was interrupted after its checkpoint) and any results. Returns the
        number of metric rows deleted."""
        with self.tx() as c:
            n = c.execute("DELETE FROM metrics WHERE run_id=? AND step>?", (run_id, step)).rowcount
            c.execute("DELETE FROM results WHERE run_id=?", (run_id,))
        return n

    # -- measurements ---------------------------------------------------------------
    def add_metrics(self, run_id: int, rows: Iterable[tuple[int, float | None, str, str, float]],
                    t: float | None = None) -> None:
        """rows: (step, epoch, split, name, value); ``t``: when they were measured (a run
        file's rows are ingested later than that), default now."""
        now = t or time.time()
        with self.tx() as c:
            c.executemany(
                "INSERT INTO metrics (run_id, step, epoch, split, name, value, t) VALUES (?,?,?,?,?,?,?)",
                [(run_id, s, e, sp, n, _finite(v), now) for s, e, sp, n, v in rows],
            )

    def metrics(self, run_id: int, split: str | None = None, name: str | None = None,
                after_rowid: int = 0) -> list[sqlite3.Row]:
        q, args = "SELECT rowid, * FROM metrics WHERE run_id=? AND rowid>?", [run_id, after_rowid]
        if split:
            q += " AND split=?"
            args.append(split)
        if name:
            q += " AND name=?"
            args.append(name)
        return self.conn.execute(q + " ORDER BY rowid", args).fetchall()

    def add_system(self, run_id: int, sample: dict, t: float | None = None) -> None:
        cols = ("cpu_percent", "rss_mb", "gpu_util", "gpu_mem_used_mb", "gpu_mem_total_mb", "gpu_name",
                "gpu_proc_mem_mb")
        with self.tx() as c:
            c.execute(
                f"INSERT INTO system (run_id, t, {', '.join(cols)}) VALUES (?, ?, {', '.join('?' * len(cols))})",
                (run_id, t or time.time(), *(sample.get(k) for k in cols)),
            )

    def system(self, run_id: int, last: int | None = None) -> list[sqlite3.Row]:
        if last:
            rows = self.conn.execute(
                "SELECT * FROM system WHERE run_id=? ORDER BY t DESC LIMIT ?", (run_id, last)).fetchall()
            return rows[::-1]
        return self.conn.execute("SELECT * FROM system WHERE run_id=? ORDER BY t", (run_id,)).fetchall()

    def set_results(self, run_id: int, values: dict[str, float | None], eval_set: str = "") -> None:
        with self.tx() as c:
            c.executemany(
                "INSERT OR REPLACE INTO results (run_id, eval_set, name, value) VALUES (?,?,?,?)",
                [(run_id, eval_set, k, _finite(v)) for k, v in values.items()],
            )

    def results(self, run_ids: Iterable[int] | None = None) -> dict[int, dict[str, dict[str, float | None]]]:
        """{run_id: {eval_set: {name: value}}}."""
        q, args = "SELECT run_id, eval_set, name, value FROM results", []
        if run_ids is not None:
            ids = list(run_ids)
            q += f" WHERE run_id IN ({','.join('?' * len(ids)) or 'NULL'})"
            args = ids
        out: dict[int, dict[str, dict[str, float | None]]] = {}
        for rid, es, name, value in self.conn.execute(q, args):
            out.setdefault(rid, {}).setdefault(es, {})[name] = value
        return out

    # -- liveness -----------------------------------------------------------------
    def reap(self, now: float | None = None) -> list[int]:
        """Mark running runs whose worker is gone as crashed; returns their ids."""
        now = now or time.time()
        host = socket.gethostname()
        crashed = []
        for r in self.runs(states=["running"]):
            if (r.info or {}).get("executor") == "slurm":
                continue  # another node's worker: Slurm's job state says (workbench.slurm.sync)
            reason = None
            if r.host == host and r.pid and not pid_alive(r.pid, r.pid_start):
                reason = "worker process exited without finishing"
            elif r.heartbeat is not None and now - r.heartbeat > HEARTBEAT_TIMEOUT_S:
                reason = f"no heartbeat for {now - r.heartbeat:.0f} s"
            if reason:
                tail = tail_log(r.log_path)
                msg = reason + (f"; last log lines:\n{tail}" if tail else "")
                if self.finish(r.id, "crashed", msg):
                    crashed.append(r.id)
        return crashed


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


def _finite(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None
