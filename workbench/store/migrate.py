"""Creating or upgrading a store's database: the tables of :mod:`.schema`, WAL, the schema
version, and the columns added since a store was first created (older stores are upgraded
in place). Opening a complete store writes nothing (:func:`needs_setup` reads only)."""
from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Callable

from workbench.store.schema import SCHEMA, SCHEMA_VERSION, TABLES


def needs_setup(c: sqlite3.Connection) -> bool:
    """Anything to create or upgrade (read without writing)."""
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not set(TABLES) <= tables:
        return True
    if c.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is None:
        return True
    if "gpu_proc_mem_mb" not in {r[1] for r in c.execute("PRAGMA table_info(system)")}:
        return True
    return c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"


def set_up(c: sqlite3.Connection, tx: Callable[[], AbstractContextManager[sqlite3.Connection]]) -> None:
    """Create what is missing on ``c`` (idempotent); ``tx``: the store's write transaction
    (:meth:`Store.tx`), so a full disk or a store that cannot be written is said as for any
    write."""
    if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        c.execute("PRAGMA journal_mode=WAL")
    c.executescript(SCHEMA)  # idempotent; executescript manages its own transaction
    with tx() as c:
        c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        # columns added after a store was first created (older stores are upgraded in place)
        have = {r[1] for r in c.execute("PRAGMA table_info(system)")}
        if "gpu_proc_mem_mb" not in have:
            c.execute("ALTER TABLE system ADD COLUMN gpu_proc_mem_mb REAL")
