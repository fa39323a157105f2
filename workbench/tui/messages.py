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


class CompareRuns(Message):
    """Show the compare view of ``run_ids``; ``title`` says what they are (a profile, or
    'runs 3, 5, 8')."""

    def __init__(self, run_ids: list[int], title: str = "") -> None:
        super().__init__()
        self.run_ids, self.title = run_ids, title


class ResumeRequested(Message):
    """The user asked to resume ``run_id`` from its checkpoint."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
