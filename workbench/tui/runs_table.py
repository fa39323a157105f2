"""The runs table: one row per run in the store, updated in place as the store changes."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from workbench.store import Run
from workbench.tui.messages import KillRequested, OpenRun
from workbench.tui.formatting import duration, number, percent, state_text

# (column key, header); the key doubles as the DataTable column key for update_cell.
COLUMNS = [
    ("id", "id"), ("profile", "profile"), ("model", "model"), ("task", "task"),
    ("seq_len", "seq_len"), ("seed", "seed"), ("state", "state"), ("progress", "progress"),
    ("loss", "loss"), ("accuracy", "accuracy"), ("elapsed", "elapsed"), ("device", "device"),
]


def row_cells(run: Run) -> dict[str, Any]:
    """The table cells of one run, by column key."""
    return {
        "id": Text(str(run.id), justify="right"),
        "profile": run.profile,
        "model": run.label,
        "task": run.task,
        "seq_len": "" if run.seq_len is None else str(run.seq_len),
        "seed": str(run.seed),
        "state": state_text(run.state),
        "progress": Text(percent(run.progress), justify="right"),
        "loss": Text(number(run.last_loss), justify="right"),
        "accuracy": Text(number(run.last_accuracy, 3), justify="right"),
        "elapsed": Text(duration(run.elapsed), justify="right"),
        "device": run.device or "",
    }


class RunsTable(DataTable):
    """DataTable of runs keyed by run id; :meth:`update_runs` changes only cells that moved.

    Rebuilding the table on every poll would flicker and lose the cursor, so rows are
    added once and afterwards only their changed cells are rewritten.
    """

    BINDINGS = [
        Binding("enter", "open_run", "Open run"),
        Binding("k", "kill_run", "Kill run"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[int, dict[str, Any]] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def update_runs(self, runs: list[Run]) -> None:
        seen = set()
        for run in runs:
            seen.add(run.id)
            cells = row_cells(run)
            old = self._cells.get(run.id)
            if old is None:
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=str(run.id))
            else:
                for k, value in cells.items():
                    if old[k] != value:
                        self.update_cell(str(run.id), k, value, update_width=True)
            self._cells[run.id] = cells
        for gone in set(self._cells) - seen:
            self.remove_row(str(gone))
            del self._cells[gone]

    @property
    def current_run_id(self) -> int | None:
        if self.row_count == 0:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None

    def action_open_run(self) -> None:
        rid = self.current_run_id
        if rid is not None:
            self.post_message(OpenRun(rid))

    def action_kill_run(self) -> None:
        rid = self.current_run_id
        if rid is not None:
            self.post_message(KillRequested(rid))
