"""How a run state looks in a terminal: one rich style per state (:data:`STATE_STYLES`),
used by the CLI's tables (rich markup, ``[bold green]finished[/]``) and by the TUI (a
``Text`` style), so a state has the same colour in ``ssm-workbench runs`` and in the runs
table. Style strings only (rich's syntax): nothing here imports rich.
"""
from __future__ import annotations

from workbench.store.run import STATES

# Terminal states are bold so they stand out in a long table.
STATE_STYLES: dict[str, str] = {
    "pending": "dim",
    "running": "bold yellow",
    "finished": "bold green",
    "failed": "bold red",
    "crashed": "bold magenta",
    "killed": "red",
    "preempted": "bold cyan",  # SIGTERM/SIGUSR1 (preemption, time limit): `resume` continues it
}
assert tuple(STATE_STYLES) == STATES, "a style for every state, in STATES order"


def state_style(state: str) -> str:
    """The style of ``state`` ('' for a state this version does not know)."""
    return STATE_STYLES.get(state, "")
