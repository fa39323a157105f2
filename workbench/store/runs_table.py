"""The runs table's rows: pending runs added, runs read back (by profile, state, id), and the
fields set beside a run's state (its log file, its info) (:class:`RunsTable`, a part of
:class:`workbench.store.sqlite.Store`)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

from workbench.store.connection import StoreConnection
from workbench.store.run import Run


class RunsTable(StoreConnection):
    def log_path(self, run_id: int) -> Path:
        return self.root / "logs" / f"run-{run_id}.log"

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

    def set_log_path(self, run_id: int, path: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE runs SET log_path=? WHERE id=?", (path, run_id))

    def set_info(self, run_id: int, info: dict) -> None:
        with self.tx() as c:
            row = c.execute("SELECT info FROM runs WHERE id=?", (run_id,)).fetchone()
            merged = {**(json.loads(row[0]) if row and row[0] else {}), **info}
            c.execute("UPDATE runs SET info=? WHERE id=?", (json.dumps(merged, default=str), run_id))
