"""The writer interface a worker records its run through: :class:`RunWriter`.

Two implement it: :class:`workbench.store.Store` (a worker on the store's host writes the
SQLite store) and :class:`workbench.store.runfile.RunFile` (a Slurm job on another node
appends the same calls as JSON lines to its run file, which the submit host ingests). The
worker (workbench/train/worker.py) is written against this protocol, so it runs unchanged
on either; tests/workbench/store/test_writer.py checks that both keep its signatures.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Protocol, runtime_checkable

from workbench.store.run import Run


@runtime_checkable
class RunWriter(Protocol):
    """What a worker calls on its store. ``root``: the folder its checkpoints go under
    (``checkpoints/<id>/``: the store's folder, or the Slurm jobs' shared folder)."""

    root: Path

    @property
    def readonly(self) -> bool:
        """True when nothing can be recorded (the worker then says why and stops)."""

    def get(self, run_id: int) -> Run | None:
        """The run as the worker starts it (spec, info with any resume marker)."""

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        """Refresh the heartbeat and any of progress/step/total_steps/epoch/last_*/backend/device."""

    def set_info(self, run_id: int, info: dict) -> None:
        """Merge ``info`` into the run's info."""

    def add_metrics(self, run_id: int, rows: Iterable[tuple]) -> None:
        """Metric rows (step, epoch, split, name, value)."""

    def add_system(self, run_id: int, sample: dict) -> None:
        """One system sample (GPU/CPU utilisation and memory)."""

    def set_results(self, run_id: int, values: dict[str, float | None], eval_set: str = "") -> None:
        """Final results of one eval set ('' = the test set)."""

    def trim_after(self, run_id: int, step: int) -> int:
        """Drop the rows an interrupted attempt logged after ``step`` (a resume)."""

    def finish(self, run_id: int, state: str, error: str | None = None) -> bool:
        """End the run (finished, failed, killed, preempted, crashed); False when it had ended."""

    def release_reserve(self) -> bool:
        """Free the space held back to record a full disk."""
