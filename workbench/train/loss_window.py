"""The train loss's open log window, kept on the device (the Trainer's :class:`LossTracker`).

A training step adds its loss without waiting for the device; the window is read once per
log point (:meth:`LossTracker.flush`) or before an evaluation (:meth:`LossTracker.check`),
and saved with a checkpoint (:meth:`LossTracker.state`) so a resumed run logs the same
mean at its next log point. A run on several ranks uses the subclass in
workbench/train/rank_state.py, which sums the ranks' windows at each read.
"""
from __future__ import annotations

import torch

from workbench.train.stop import RunFailed


class LossTracker:
    """Train loss kept on the device: a running sum for the log window and the first step
    whose loss was not finite (0: none yet, set with ``torch.where``, so no host sync).
    Read once per log point (:meth:`flush`) or before an evaluation (:meth:`check`)."""

    def __init__(self, device: torch.device):
        z = lambda: torch.zeros((), dtype=torch.float64, device=device)  # noqa: E731
        self.sum, self.bad_step, self.bad_value = z(), z(), z()
        self.count = 0

    def add(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().double()
        self.sum += loss
        first = (self.bad_step == 0) & ~torch.isfinite(loss)
        self.bad_step = torch.where(first, float(step), self.bad_step)
        self.bad_value = torch.where(first, loss, self.bad_value)
        self.count += 1

    @staticmethod
    def _fail(bad_step: float, bad_value: float) -> None:
        if bad_step:
            raise RunFailed(f"loss became {bad_value} at step {int(bad_step)}")

    def check(self) -> None:
        """Fail the run if any loss so far was not finite (one host read)."""
        if self.bad_step.item():
            self._fail(self.bad_step.item(), self.bad_value.item())

    def flush(self) -> float:
        """Check, then return the mean loss since the last flush and start a new window."""
        total, bad_step, bad_value = torch.stack([self.sum, self.bad_step, self.bad_value]).tolist()
        self._fail(bad_step, bad_value)
        mean = total / max(1, self.count)
        self.sum.zero_()
        self.count = 0
        return mean

    def state(self) -> dict[str, float | int]:
        """The open log window for a checkpoint (one host read), so a resumed run logs the
        same mean at the next log point."""
        total, bad_step, bad_value = torch.stack([self.sum, self.bad_step, self.bad_value]).tolist()
        return {"sum": total, "count": self.count, "bad_step": bad_step, "bad_value": bad_value}

    def load(self, st: dict[str, float | int]) -> None:
        for name in ("sum", "bad_step", "bad_value"):
            getattr(self, name).fill_(st[name])
        self.count = int(st["count"])
