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


def latest_values(store: Store, run_ids: Sequence[int], split: str, name: str) -> dict[int, float | None]:
    """Each run's value of metric (split, name) at its largest step, else its result of that
    name on eval set "" (what a finished run reports without a logged evaluation); runs with
    neither are absent. Read in blocks of 500 ids (SQLite's limit on bound parameters)."""
    ids = list(run_ids)
    got: dict[int, float | None] = {}
    for i in range(0, len(ids), 500):
        block = ids[i:i + 500]
        got.update((r[0], r[1]) for r in store.conn.execute(
            f"SELECT run_id, value FROM metrics AS m WHERE split=? AND name=? "
            f"AND run_id IN ({_marks(len(block))}) AND step=(SELECT MAX(step) FROM metrics "
            f"WHERE run_id=m.run_id AND split=? AND name=?)", [split, name, *block, split, name]))
        missing = [rid for rid in block if got.get(rid) is None]
        if missing:
            got.update((r[0], r[1]) for r in store.conn.execute(
                f"SELECT run_id, value FROM results WHERE eval_set='' AND name=? "
                f"AND run_id IN ({_marks(len(missing))})", [name, *missing]))
    return got


def newest_profile(store: Store) -> str | None:
    """The profile of the run added last, or None when the store holds no run."""
    row = store.conn.execute("SELECT profile FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    return row[0] if row else None
