"""Read-only queries over a :class:`~workbench.store.Store` that the layers above need and
the Store's own methods do not cover: metric rows of many runs at once (learning curves,
read incrementally by a live view), which metrics runs logged (why a figure is empty), and
the newest profile (the Results tab's first pick). SQL lives in the store (issue 23):
results/ and tui/ call these rather than ``store.conn.execute``.

Each function takes the Store and returns plain rows or values; none writes.
"""
from __future__ import annotations

import sqlite3
from typing import Iterable, Sequence

from workbench.store.sqlite import Store


def _marks(n: int) -> str:
    return ",".join("?" * n)


def metric_rows(store: Store, run_ids: Sequence[int], metrics: Iterable[tuple[str, str]],
                after_rowid: int = 0) -> list[sqlite3.Row]:
    """The metric rows (rowid, run_id, step, epoch, t, split, name, value) of these runs
    whose (split, name) is one of ``metrics``, after a rowid, in insertion order: rowids
    only grow, so a live view reads just what came since its last read."""
    ids, wanted = list(run_ids), [f"{sp}/{n}" for sp, n in metrics]
    if not ids or not wanted:
        return []
    return store.conn.execute(
        f"SELECT rowid, run_id, step, epoch, t, split, name, value FROM metrics "
        f"WHERE rowid>? AND run_id IN ({_marks(len(ids))}) "
        f"AND split || '/' || name IN ({_marks(len(wanted))}) ORDER BY rowid",
        [after_rowid, *ids, *wanted]).fetchall()


def has_metric_values(store: Store, run_ids: Sequence[int], split: str, name: str) -> bool:
    """Whether any of these runs logged a value (not NULL: non-finite values are stored as
    NULL) of metric (split, name)."""
    ids = list(run_ids)
    if not ids:
        return False
    row = store.conn.execute(
        f"SELECT 1 FROM metrics WHERE split=? AND name=? AND value IS NOT NULL "
        f"AND run_id IN ({_marks(len(ids))}) LIMIT 1", [split, name, *ids]).fetchone()
    return row is not None


def logged_metrics(store: Store, run_ids: Sequence[int]) -> list[str]:
    """The metrics these runs logged, as 'split.name', sorted."""
    ids = list(run_ids)
    if not ids:
        return []
    return [r[0] for r in store.conn.execute(
        f"SELECT DISTINCT split || '.' || name FROM metrics WHERE run_id IN ({_marks(len(ids))}) "
        "ORDER BY 1", ids)]


def newest_profile(store: Store) -> str | None:
    """The profile of the run added last, or None when the store holds no run."""
    row = store.conn.execute("SELECT profile FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    return row[0] if row else None
