"""How a run ends early: :class:`RunFailed` (an error that becomes the run's error text)
and :class:`Stopped` (SIGTERM or SIGUSR1, through the :class:`StopFlag` handler)."""
from __future__ import annotations

import signal


class RunFailed(Exception):
    """The run cannot go on; the message becomes the run's error."""


class Stopped(BaseException):
    """SIGTERM or SIGUSR1 arrived: stop (after saving a checkpoint where there is state)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopFlag:
    """The SIGTERM/SIGUSR1 handler. While ``defer`` is set (inside the training loop) a
    signal only records itself and the loop stops after the step it is in, so the
    checkpoint holds a whole step; elsewhere it raises :class:`Stopped` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum: int | None = None
        self.defer = False

    def handler(self, signum, frame) -> None:
        self.signum = signum
        if not self.defer:
            raise Stopped(signum)

    def raise_if_set(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)
