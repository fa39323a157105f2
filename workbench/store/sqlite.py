"""The store: SQLite (WAL), the single source of truth for runs and their measurements.

Location: ``--store DIR`` > ``$SSM_WORKBENCH_STORE`` > ``$XDG_DATA_HOME/ssm-workbench``
(``~/.local/share/ssm-workbench``). The directory holds ``store.sqlite`` and ``logs/``,
``store.lock`` (taken while the database is created or upgraded) and ``disk-reserve`` (space
freed to record a full disk). A store that cannot be written opens read-only (:class:`Store`).

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

import errno
import fcntl
import json
import os
import socket
import sqlite3
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from workbench.store.faults import (StoreError, StoreFull, StoreReadOnly, _cannot_write, _tidying, ensure_reserve,
                                    is_disk_full, release_reserve)
from workbench.store.layout import LOCAL, executor_name
from workbench.store.run import (FINAL_RESULT, TERMINAL, UNFINISHED, Run, default_store_dir, heartbeat_timeout,
                                 pid_alive, tail_log)
from workbench.store.schema import SCHEMA, SCHEMA_VERSION, TABLES

LOCK_FILE = "store.lock"       # serialises creating and upgrading the database (Store._open_writable)


def _check_writable(path: Path) -> None:
    """Raise OSError (EROFS, EACCES) when ``path`` cannot be opened for writing. Without
    opening it: closing any descriptor of the database file drops every POSIX lock this
    process holds on it, those of its open SQLite connections too. Another process then
    takes itself for the last connection and deletes the -wal and -shm files under them,
    and they read a stale snapshot from then on (a second Store of the same folder in one
    process, e.g. `resume` called where the store is already open, left a run "pending" to
    its first Store for good; SQLite's "How To Corrupt", section 2.2)."""
    if os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        return
    try:
        read_only_fs = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    code = errno.EROFS if read_only_fs else errno.EACCES
    raise OSError(code, os.strerror(code), str(path))


class Store:
    """The store in folder ``root``. It opens read-only when it cannot be written there (a
    read-only mount, no permission, a full disk): reads work, :meth:`reap` does nothing and
    writes raise :class:`StoreReadOnly` (:class:`StoreFull` for a full disk) naming the folder
    and why. ``readonly=True`` opens read-only on purpose. A path that cannot be a folder,
    or a folder holding no store that cannot be created, is a :class:`StoreError`."""

    def __init__(self, root: str | Path | None = None, *, readonly: bool = False):
        self.root = Path(root).expanduser() if root else default_store_dir()
        self.path = self.root / "store.sqlite"
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._uri: str | None = None  # read-only: what every connection opens (mode=ro or immutable=1)
        self.readonly_reason: str | None = "opened read-only" if readonly else None
        self.disk_full: StoreFull | None = None  # set when a best-effort write (reap) met a full disk
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is a file, not a folder; give --store (or "
                             f"$SSM_WORKBENCH_STORE) a folder, or a path where one can be created")
        if not readonly:
            try:
                self._open_writable()
            except (OSError, sqlite3.Error, StoreReadOnly) as e:
                why = _cannot_write(e)
                if why is None:
                    self.close()
                    if isinstance(e, sqlite3.DatabaseError):
                        raise StoreError(f"store {self.root}: cannot open {self.path.name}: {e}") from None
                    raise
                self.close()
                if not self.path.is_file():
                    raise StoreError(f"cannot create a store in {self.root}: {why}") from None
                self.readonly_reason = why
        if self.readonly_reason:
            self._open_readonly()

    @property
    def readonly(self) -> bool:
        return self.readonly_reason is not None

    # -- opening ------------------------------------------------------------------
    def _open_writable(self) -> None:
        """Create or upgrade the store under a lock file, so processes opening a new store at
        the same moment take turns (SQLite's switch to WAL needs the database to itself and
        does not wait on a busy one). Opening a complete store writes nothing, so it works
        on a full disk; a store that cannot be written fails here, before anything is read."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(f"store {self.root} cannot be a folder: part of that path is a file; "
                             f"give --store (or $SSM_WORKBENCH_STORE) a folder") from None
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.path.exists():
                # SQLite opens a database file it may not write read-only without a word (and
                # even takes its write lock): ask the file system first (EROFS, EACCES)
                _check_writable(self.path)
            c = self.conn
            if self._needs_setup(c):
                if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    c.execute("PRAGMA journal_mode=WAL")
                c.executescript(SCHEMA)  # idempotent; executescript manages its own transaction
                with self.tx() as c:
                    c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
                    # columns added after a store was first created (older stores are upgraded in place)
                    have = {r[1] for r in c.execute("PRAGMA table_info(system)")}
                    if "gpu_proc_mem_mb" not in have:
                        c.execute("ALTER TABLE system ADD COLUMN gpu_proc_mem_mb REAL")
            ensure_reserve(self.root)

    @staticmethod
    def _needs_setup(c: sqlite3.Connection) -> bool:
        """Anything to create or upgrade (read without writing)."""
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not set(TABLES) <= tables:
            return True
        if c.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is None:
            return True
        if "gpu_proc_mem_mb" not in {r[1] for r in c.execute("PRAGMA table_info(system)")}:
            return True
        return c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"

    def _open_readonly(self) -> None:
        """Read without writing anything. ``mode=ro`` first; SQLite reads a WAL database
        read-only only where its -shm file exists or can be made, so a store whose last
        writer closed cleanly on a read-only mount needs ``immutable=1`` (then changes still
        in a -wal file there, from a writer that died, are not seen; the reason says so)."""
        if not self.path.is_file():
            raise StoreError(f"no store in {self.root} ({self.readonly_reason})")
        where = urllib.parse.quote(str(self.path.absolute()))
        last: Exception | None = None
        for uri in (f"file:{where}?mode=ro", f"file:{where}?immutable=1"):
            self._uri = uri
            try:
                c = self.conn
                tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            except sqlite3.Error as e:
                last = e
                self.close()
                continue
            if "runs" not in tables:
                self.close()
                raise StoreError(f"{self.path} is not an ssm-workbench store (no runs table)")
            wal = self.path.with_name(self.path.name + "-wal")
            if uri.endswith("immutable=1") and wal.is_file() and wal.stat().st_size:
                self.readonly_reason += f"; its {wal.name} file could not be read, so its latest changes are not shown"
            return
        self._uri = None
        raise StoreError(f"cannot read the store {self.path}: {last} ({self.readonly_reason})")

    def _refusal(self) -> StoreError:
        if self.readonly_reason == "disk full":
            return StoreFull(f"store {self.root}: disk full; free some space there (unfinished runs "
                             f"can be resumed then: {_command(self.root)} resume ID)")
        return StoreReadOnly(f"store {self.root} is read-only ({self.readonly_reason}): it can be "
                             f"read (runs, show, export) but not changed; copy the folder somewhere "
                             f"writable to run or resume there")

    def _write_error(self, e: sqlite3.Error) -> StoreError | None:
        """A failed write in words: a full disk or a store that cannot be written."""
        if is_disk_full(e):
            return StoreFull(f"store {self.root}: disk full ({e}); free some space there (unfinished "
                             f"runs can be resumed then: {_command(self.root)} resume ID)")
        why = _cannot_write(e)
        if why is not None:
            return StoreReadOnly(f"store {self.root} cannot be written ({why})")
        return None

    def release_reserve(self) -> bool:
        """Free the space held back in the store folder (:func:`ensure_reserve`), for the
        few writes that record a full disk; the next writable open holds it again."""
        return release_reserve(self.root)

    # -- connection ---------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        # a connection must not cross fork(); reopen in a child process
        if self._conn is None or self._pid != os.getpid():
            self._conn, self._pid = self._connect(), os.getpid()
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        """A new connection (the journal mode is WAL from creation on: it is kept in the
        database file, and switching it here would race with other processes opening)."""
        if self._uri:
            c = sqlite3.connect(self._uri, uri=True, timeout=30.0, isolation_level=None,
                                check_same_thread=False)
        else:
            c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA synchronous=NORMAL")
        c.row_factory = sqlite3.Row
        c.execute("PRAGMA busy_timeout=30000")
        return c

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction (BEGIN IMMEDIATE takes the write lock up front).
        Inside another one it joins it, so several writes can commit together (the
        ingestion of a run file applies a batch of events and its offset as one).
        A read-only store refuses (:class:`StoreReadOnly`); a full disk raises
        :class:`StoreFull`, with the transaction rolled back."""
        if self.readonly_reason:
            raise self._refusal()
        c = self.conn
        if c.in_transaction:
            yield c
            return
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL does)
                    try:
                        c.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
        except sqlite3.Error as e:
            err = self._write_error(e)
            if err is None:
                raise
            raise err from e

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

    def heartbeat(self, run_id: int, *, pid: int | None = None, host: str | None = None,
                  **fields: Any) -> None:
        """Worker: refresh the heartbeat and any of progress/step/epoch/last_* columns.

        The caller is the process ``pid`` on ``host`` (default: this process). If that is the
        run's own worker and the run was declared ``crashed`` meanwhile (a heartbeat verdict
        made while the worker was paused and its process could not be checked), the worker is
        evidently alive: the run is ``running`` again and the verdict kept in info
        ``revived``. A ``stalled`` note (see :meth:`reap`) is cleared."""
        allowed = {"progress", "step", "total_steps", "epoch", "last_loss", "last_accuracy", "backend", "device"}
        bad = set(fields) - allowed
        if bad:
            raise KeyError(f"heartbeat cannot set {sorted(bad)}")
        now = time.time()
        sets = [f"{k}=?" for k in fields] + ["heartbeat=?"]
        args: list[Any] = [*fields.values(), now]
        with self.tx() as c:
            # a beat can come every step: decode the info only when it changes
            row = c.execute("SELECT state, pid, host, error, info, (json_valid(info) AND"
                            " json_extract(info, '$.stalled') IS NOT NULL) AS stalled FROM runs WHERE id=?",
                            (run_id,)).fetchone()
            if row is None:
                return
            revive = row["state"] == "crashed" and _own(row, pid, host)
            if revive or row["stalled"]:
                info = json.loads(row["info"]) if row["info"] else {}
                info.pop("stalled", None)
                if revive:
                    sets += ["state='running'", "ended=NULL", "error=NULL"]
                    info["revived"] = info.get("revived", []) + [_revival(row, now)]
                sets.append("info=?")
                args.append(json.dumps(info, default=str))
            c.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id=?", (*args, run_id))

    def set_info(self, run_id: int, info: dict) -> None:
        with self.tx() as c:
            row = c.execute("SELECT info FROM runs WHERE id=?", (run_id,)).fetchone()
            merged = {**(json.loads(row[0]) if row and row[0] else {}), **info}
            c.execute("UPDATE runs SET info=? WHERE id=?", (json.dumps(merged, default=str), run_id))

    def finish(self, run_id: int, state: str, error: str | None = None, *,
               pid: int | None = None, host: str | None = None) -> bool:
        """Move a running (or pending) run to a terminal state; never overwrite one, with one
        exception: a ``crashed`` verdict is provisional when the caller, the process ``pid`` on
        ``host`` (default: this process), is the run's own worker: a worker that was paused
        past the heartbeat timeout and woke up records its true end (the verdict goes to info
        ``revived``).

        Returns False when the run was not moved: it had ended (e.g. killed meanwhile) or
        another worker owns it now. A worker must then keep what it would have removed.
        """
        if state not in TERMINAL:
            raise ValueError(f"{state!r} is not a terminal state")
        now = time.time()
        with self.tx() as c:
            row = c.execute("SELECT state, pid, host, error, info FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                return False
            revive = row["state"] == "crashed" and _own(row, pid, host)
            if row["state"] not in ("pending", "running") and not revive:
                return False
            info = json.loads(row["info"]) if row["info"] else {}
            stalled = info.pop("stalled", None)
            if revive:
                info["revived"] = info.get("revived", []) + [_revival(row, now)]
            new_info = json.dumps(info, default=str) if (revive or stalled is not None) else row["info"]
            c.execute(
                "UPDATE runs SET state=?, error=?, ended=?, progress=CASE WHEN ?='finished' THEN 1.0"
                " ELSE progress END, info=? WHERE id=?",
                (state, error, now, state, new_info, run_id),
            )
            return True

    def has_final_results(self, run_id: int) -> bool:
        """True when the run's worker recorded its summary (FINAL_RESULT): its measurements
        are complete even if its end was not recorded (crashed by a verdict, killed at the
        last moment). Such results are never deleted."""
        return self.conn.execute(_FINAL_SQL, (run_id,)).fetchone() is not None

    def recognise_finished(self, run_id: int) -> bool:
        """A ``crashed`` run that holds its final results is ``finished`` (its worker wrote
        every measurement, then its end was lost: a verdict while it was paused, a crash
        while it recorded its end). The verdict stays in info ``recognised``. Returns True
        when the run was moved."""
        now = time.time()
        with self.tx() as c:
            row = c.execute("SELECT error, info FROM runs WHERE id=? AND state='crashed'", (run_id,)).fetchone()
            if row is None or c.execute(_FINAL_SQL, (run_id,)).fetchone() is None:
                return False
            info = json.loads(row["info"]) if row["info"] else {}
            info["recognised"] = {"t": now, "was": "crashed", "verdict": (row["error"] or "").split("\n")[0],
                                  "why": "all its final results were recorded"}
            info.pop("stalled", None)
            c.execute("UPDATE runs SET state='finished', progress=1.0, error=NULL, info=? WHERE id=?",
                      (json.dumps(info, default=str), run_id))
            return True

    def requeue(self, run_id: int, resume: dict | None) -> bool:
        """An ended, unfinished run back to ``pending`` (the scheduler starts it again).

        ``resume``: the marker the worker reads to load the run's checkpoint (kept in the
        info as ``resume``); None starts it from scratch, so its measurements so far are
        deleted. Returns False when the run is not in an UNFINISHED state, or when it holds
        its final results (:meth:`has_final_results`): a finished run's measurements are never
        deleted, whatever its state says."""
        states = ",".join("?" * len(UNFINISHED))
        with self.tx() as c:
            row = c.execute(f"SELECT info, started, ended, heartbeat FROM runs WHERE id=? AND "
                            f"state IN ({states})", (run_id, *UNFINISHED)).fetchone()
            if row is None or c.execute(_FINAL_SQL, (run_id,)).fetchone() is not None:
                return False
            info = {**(json.loads(row[0]) if row[0] else {}), "resume": resume}
            # a resumed run's clock goes on from where it stopped (the attempt's end, else
            # its last heartbeat); a restart from scratch starts it at zero again
            started, ended = row[1], row[2] or row[3]
            attempt = max(0.0, ended - started) if started and ended else 0.0
            info["prior_elapsed"] = (float(info.get("prior_elapsed") or 0.0) + attempt
                                     if resume is not None else 0.0)
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
        number of metric rows deleted. A run that holds its final results loses nothing
        (0): :meth:`requeue` never resumes one, and a stray attempt overwrites rather than
        deletes."""
        with self.tx() as c:
            if c.execute(_FINAL_SQL, (run_id,)).fetchone() is not None:
                return 0
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
    @_tidying
    def reap(self, now: float | None = None) -> list[int]:
        """Mark running runs whose worker is gone as crashed; returns their ids.

        Heartbeat silence alone (past :func:`heartbeat_timeout`) is no proof of death: a
        worker on this host whose process still exists (pid and start time) is only noted
        ``stalled`` in its info (:meth:`Run.stall_note`: a SIGSTOP, a suspended machine, a
        long pause) and stays running. Only a worker that cannot be checked from here
        (another host) is declared crashed on silence, provisionally: its next heartbeat or
        its finish brings the run back (:meth:`heartbeat`, :meth:`finish`)."""
        now = now or time.time()
        host = socket.gethostname()
        timeout = heartbeat_timeout()
        crashed = []
        for r in self.runs(states=["running"]):
            if executor_name(r) != LOCAL:
                continue  # another node's worker: its executor's job state says (workbench.execute.executor.sync)
            reason = None
            silent = r.heartbeat is not None and now - r.heartbeat > timeout
            if r.host == host and r.pid:
                if not pid_alive(r.pid, r.pid_start):
                    reason = "worker process exited without finishing"
                elif silent and not (r.info or {}).get("stalled"):
                    self._note_stalled(r, now)
            elif silent:
                reason = (f"no heartbeat for {now - r.heartbeat:.0f} s (its worker, "
                          f"{r.worker or 'unknown'}, cannot be checked from {host}; it may still "
                          f"report and finish the run)")
            if reason:
                tail = tail_log(r.log_path)
                msg = reason + (f"; last log lines:\n{tail}" if tail else "")
                if self.finish(r.id, "crashed", msg):
                    crashed.append(r.id)
        return crashed


    def _note_stalled(self, r: Run, now: float) -> None:
        """Record (once, until the next heartbeat clears it) that a live worker went silent."""
        import psutil

        try:
            status = psutil.Process(r.pid).status()
        except psutil.Error:
            status = None
        note = {"since": r.heartbeat, "noted": now, "pid": r.pid, "status": status}
        with self.tx() as c:
            row = c.execute("SELECT info FROM runs WHERE id=? AND state='running' AND heartbeat=?",
                            (r.id, r.heartbeat)).fetchone()
            if row is None:
                return  # it beat or ended meanwhile
            info = {**(json.loads(row[0]) if row[0] else {}), "stalled": note}
            c.execute("UPDATE runs SET info=? WHERE id=?", (json.dumps(info, default=str), r.id))


_FINAL_SQL = f"SELECT 1 FROM results WHERE run_id=? AND eval_set='' AND name='{FINAL_RESULT}'"


def _command(root: Path) -> str:
    """The workbench's command for this store as the user types it (progress.command:
    ./run.sh when run.sh started it; imported here, as progress reads stores itself)."""
    from workbench.store.progress import command

    return command(root)


def _own(row: sqlite3.Row, pid: int | None, host: str | None) -> bool:
    """Is the caller (``pid`` on ``host``, default this process) the run's recorded worker?
    While the caller runs no other process has its pid on its host, so the pair names it;
    a requeue clears the run's pid, so an earlier attempt's worker never matches."""
    return (row["pid"] is not None and row["pid"] == (pid if pid is not None else os.getpid())
            and (row["host"] or "") == (host or socket.gethostname()))


def _revival(row: sqlite3.Row, now: float) -> dict:
    return {"t": now, "was": row["state"], "verdict": (row["error"] or "").split("\n")[0]}


def _finite(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None
