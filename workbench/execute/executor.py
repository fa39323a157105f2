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
knows which runs it may reap). Everything else asks
:func:`workbench.execute.dispatch.executor_for`, which imports the two: this module is
the interface they implement and imports neither.

Reads never submit: the polls (``runs``, ``run``'s progress, every TUI tick) call
:func:`workbench.execute.dispatch.sync`; only the commands that launch work (``run``,
``resume``, the sweep form's launch, all through :func:`workbench.execute.launch.submit` or
:func:`workbench.execute.resume.resume_runs`) call :meth:`Executor.submit`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from workbench.store.layout import executor_name

if TYPE_CHECKING:
    from workbench.store import Run, Store


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
