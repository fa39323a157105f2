"""Liveness: running runs whose worker is gone marked ``crashed``, live but silent workers
noted ``stalled`` (:class:`Reaper`, a part of :class:`workbench.store.sqlite.Store`; it
reads the runs and ends them through :class:`RunsTable` and :class:`Transitions`)."""
from __future__ import annotations

import json
import socket
import time

from workbench.store.faults import _tidying
from workbench.store.layout import LOCAL, executor_name
from workbench.store.run import Run, heartbeat_timeout, pid_alive, tail_log
from workbench.store.runs_table import RunsTable
from workbench.store.transitions import Transitions


class Reaper(RunsTable, Transitions):
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
                continue  # another node's worker: its executor's job state says (workbench.execute.dispatch.sync)
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
