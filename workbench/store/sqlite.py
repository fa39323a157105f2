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

The Store is made of parts, one job each: :mod:`.connection` (opening, connections,
transactions, refusals; :mod:`.migrate` creates or upgrades the database), :mod:`.runs_table`
(run rows), :mod:`.transitions` (state changes), :mod:`.measurements` (metrics, system
samples, results) and :mod:`.reaper` (liveness).
"""

from __future__ import annotations

from workbench.store.connection import LOCK_FILE  # noqa: F401 (a public name: workbench.store)
from workbench.store.measurements import Measurements
from workbench.store.reaper import Reaper
from workbench.store.runs_table import RunsTable
from workbench.store.transitions import Transitions


class Store(Reaper, RunsTable, Transitions, Measurements):
    """The store in folder ``root``. It opens read-only when it cannot be written there (a
    read-only mount, no permission, a full disk): reads work, :meth:`reap` does nothing and
    writes raise :class:`StoreReadOnly` (:class:`StoreFull` for a full disk) naming the folder
    and why. ``readonly=True`` opens read-only on purpose. A path that cannot be a folder,
    or a folder holding no store that cannot be created, is a :class:`StoreError`."""
