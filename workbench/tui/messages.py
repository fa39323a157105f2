"""Messages the widgets and screens post for the app to act on (they bubble to the App)."""
from __future__ import annotations

from textual.message import Message


class OpenRun(Message):
    """Show the run view of ``run_id``."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id


class KillRequested(Message):
    """The user asked to kill ``run_id`` (the app confirms first)."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
