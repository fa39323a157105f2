"""A run's measurements: metrics (step, epoch, split, name, value), system samples and
results per eval set, written and read (:class:`Measurements`, a part of
:class:`workbench.store.sqlite.Store`). A value that is not finite is stored as NULL."""
from __future__ import annotations

import sqlite3
import time
from typing import Any, Iterable

from workbench.store.connection import StoreConnection


class Measurements(StoreConnection):
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


def _finite(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None
