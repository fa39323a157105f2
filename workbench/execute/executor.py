"""The executor boundary: where a run executes, behind one interface.

An :class:`Executor` gets pending runs run (:meth:`~Executor.submit`), cancels one
(:meth:`~Executor.cancel`), says where one is placed (:meth:`~Executor.describe`), brings
the store up to date with what it knows (:meth:`~Executor.sync`, the read side: it never
starts anything) and says where a run's checkpoints and run files lie
(:meth:`~Executor.files_root`). Two exist:

- ``local``: :class:`workbench.execute.scheduler.LocalExecutor`, the detached scheduler of
  this machine (a worker process per run; its liveness is the store's :meth:`Store.reap`);
- ``slurm``: :class:`workbench.execute.slurm.SlurmExecutor`, an ``sbatch`` job per run
  reporting through a run file on the shared filesystem.

Which one runs a run is recorded in its info (``executor``, absent = local; read by
:func:`workbench.store.layout.executor_name`, so the store, which sits below this layer,
knows which runs it may reap). Everything else asks :func:`executor_for`.

Reads never submit: the polls (``runs``, ``run``'s progress, every TUI tick) call
:func:`sync`; only the commands that launch work (``run``, ``resume``, the sweep form's
launch, all through :func:`workbench.execute.scheduler.submit` or
:func:`workbench.execute.resume.resume_runs`) call :meth:`Executor.submit`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from workbench.store.layout import LOCAL, executor_name

if TYPE_CHECKING:
    from workbench.store import Run, Store

NAMES = ("local", "slurm")


class ExecutorError(RuntimeError):
    """An executor's command failed (e.g. ``sbatch``); the message has its output."""


class Executor(ABC):
    """Where runs execute. ``name`` is what a run's info and a profile's ``executor`` say."""

    name: str

    def owns(self, run: Run) -> bool:
        """Is ``run`` executed here?"""
        return executor_name(run) == self.name

    def adopt(self, store: Store, run_ids: Iterable[int], profile=None) -> None:
        """Record in these (pending) runs' info that this executor runs them, with the
        profile's settings for it. Local runs need no record (absent = local)."""

    @abstractmethod
    def submit(self, store: Store, run_ids: list[int], jobs: int | None = None,
               runs_per_gpu: int | None = None) -> None:
        """Make sure the pending runs of this executor get run (``run_ids``: those just
        queued or requeued). The one step that starts work."""

    @abstractmethod
    def cancel(self, store: Store, run_id: int, grace_s: float = 5.0) -> bool:
        """Kill a pending or running run; False if it had already ended."""

    def describe(self, run: Run) -> str | None:
        """Where the run is placed, beyond its device column (e.g. 'slurm 1234 PENDING
        (Priority)'), or None."""
        return None

    def sync(self, store: Store, runs: list | None = None) -> list[int]:
        """The read side: bring the store up to date with what this executor knows of its
        runs; returns the ids of the live runs it looked after. Never starts anything.
        ``runs``: the store's runs as the caller just read them (light rows will do)."""
        return []

    def files_root(self, store: Store, run: Run) -> Path:
        """The folder holding the run's checkpoint (``checkpoints/<id>/``) and run files."""
        return store.root


_EXECUTORS: dict[str, Executor] = {}


def executor_named(name: str | None) -> Executor:
    """The executor called ``name`` (None: local). A ValueError names an unknown one."""
    name = name or LOCAL
    if name not in NAMES:
        raise ValueError(f"executor: unknown value {name!r}; expected one of {', '.join(NAMES)}")
    if name not in _EXECUTORS:
        # imported here: scheduler and slurm import this module for the base class
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
    Raises :class:`ExecutorError` when an executor's query failed."""
    live: list[int] = []
    for name in NAMES:
        live += executor_named(name).sync(store, runs)
    return live
