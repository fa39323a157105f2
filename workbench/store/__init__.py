"""The store layer: SQLite (WAL), the single source of truth for runs and their
measurements (:mod:`.sqlite`), a Slurm job's run file (:mod:`.runfile`), light run rows
for tables (:mod:`.progress`), read queries for the layers above (:mod:`.queries`: no SQL
outside the store). Imports only :mod:`workbench.spec` below it.

The public names are here, so ``from workbench.store import Store, Run, STATES`` works.
"""

from workbench.store.faults import (RESERVE_BYTES, RESERVE_FILE, StoreError, StoreFull, StoreReadOnly,
                                    ensure_reserve, full_disk_detail, is_disk_full, release_reserve)
from workbench.store.run import (FINAL_RESULT, HEARTBEAT_S, HEARTBEAT_TIMEOUT_ENV, HEARTBEAT_TIMEOUT_S, STATES,
                                 TERMINAL, UNFINISHED, Run, default_store_dir, heartbeat_timeout, pid_alive,
                                 tail_log)
from workbench.store.schema import SCHEMA_VERSION, TABLES
from workbench.store.sqlite import LOCK_FILE, Store
from workbench.store.states import STATE_STYLES, state_style
from workbench.store import queries  # noqa: E402  (after Store: it imports the sqlite module)

__all__ = ["FINAL_RESULT", "HEARTBEAT_S", "HEARTBEAT_TIMEOUT_ENV", "HEARTBEAT_TIMEOUT_S", "LOCK_FILE",
           "RESERVE_BYTES", "RESERVE_FILE", "SCHEMA_VERSION", "STATE_STYLES", "STATES", "TABLES", "TERMINAL",
           "UNFINISHED", "Run", "Store", "StoreError", "StoreFull", "StoreReadOnly", "default_store_dir",
           "ensure_reserve", "full_disk_detail", "heartbeat_timeout", "is_disk_full", "pid_alive", "queries",
           "release_reserve", "state_style", "tail_log"]
