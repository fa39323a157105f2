"""A run's state changes: pending -> running (here or on another node), heartbeats, the end
in a terminal state, a ``crashed`` verdict taken back by its own worker or by its final
results, and back to ``pending`` (:class:`Transitions`, a part of
:class:`workbench.store.sqlite.Store`). Each change is checked against the state it leaves,
in the transaction that makes it."""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from typing import Any

from workbench.store.connection import StoreConnection
from workbench.store.run import FINAL_RESULT, TERMINAL, UNFINISHED


class Transitions(StoreConnection):
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


_FINAL_SQL = f"SELECT 1 FROM results WHERE run_id=? AND eval_set='' AND name='{FINAL_RESULT}'"


def _own(row: sqlite3.Row, pid: int | None, host: str | None) -> bool:
    """Is the caller (``pid`` on ``host``, default this process) the run's recorded worker?
    While the caller runs no other process has its pid on its host, so the pair names it;
    a requeue clears the run's pid, so an earlier attempt's worker never matches."""
    return (row["pid"] is not None and row["pid"] == (pid if pid is not None else os.getpid())
            and (row["host"] or "") == (host or socket.gethostname()))


def _revival(row: sqlite3.Row, now: float) -> dict:
    return {"t": now, "was": row["state"], "verdict": (row["error"] or "").split("\n")[0]}
