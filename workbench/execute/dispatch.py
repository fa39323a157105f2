"""Which executor runs a run, and the calls every executor answers: the executors by name
(:func:`executor_named`) and by run (:func:`executor_for`, from its info; absent = local),
runs grouped by executor (:func:`by_executor`), and, passed to each run's executor, where it
is placed (:func:`describe`), where its files lie (:func:`files_root`) and the read side
(:func:`sync`). The interface the executors implement is :mod:`workbench.execute.executor`;
the two are :class:`workbench.execute.scheduler.LocalExecutor` and
:class:`workbench.execute.slurm.SlurmExecutor`, which import that interface, never this
module.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.store.layout import LOCAL, executor_name

if TYPE_CHECKING:
    from workbench.execute.executor import Executor
    from workbench.store import Run, Store

NAMES = ("local", "slurm")

_EXECUTORS: dict[str, Executor] = {}


def executor_named(name: str | None) -> Executor:
    """The executor called ``name`` (None: local). A ValueError names an unknown one."""
    name = name or LOCAL
    if name not in NAMES:
        raise ValueError(f"executor: unknown value {name!r}; expected one of {', '.join(NAMES)}")
    if name not in _EXECUTORS:
        # imported on first use: the CLI and the TUI import this module at start-up
        if name == "slurm":
            from workbench.execute.slurm import SlurmExecutor as cls
        else:
            from workbench.execute.scheduler import LocalExecutor as cls
        _EXECUTORS[name] = cls()
    return _EXECUTORS[name]


def executor_for(run: Run) -> Executor:
    """The executor that runs ``run`` (from its info)."""
    return executor_named(executor_name(run))


def by_executor(runs: Iterable[Run]) -> dict[Executor, list[int]]:
    """The runs' ids grouped by their executor, in the order first seen."""
    out: dict[Executor, list[int]] = {}
    for r in runs:
        out.setdefault(executor_for(r), []).append(r.id)
    return out


def describe(run: Run) -> str | None:
    """Where ``run`` is placed beyond its device column (Slurm: job id and state), or None:
    for the runs table (workbench/tui/runs_table.py) and ``runs``."""
    return executor_for(run).describe(run)


def files_root(store: Store, run: Run) -> Path:
    """The folder holding ``run``'s checkpoint: the store's, or a Slurm run's shared folder."""
    return executor_for(run).files_root(store, run)


def sync(store: Store, runs: list | None = None) -> list[int]:
    """The read side of every executor (see :meth:`Executor.sync`): ingest what remote
    workers wrote and map their job states; submits nothing. Returns the ids of the live
    runs looked after (empty: nothing changed, the caller's rows are current).
    Raises :class:`~workbench.execute.executor.ExecutorError` when an executor's query failed."""
    live: list[int] = []
    for name in NAMES:
        live += executor_named(name).sync(store, runs)
    return live
