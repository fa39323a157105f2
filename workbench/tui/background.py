"""Store reads and file writing off the UI thread, shared by the views.

Over SSH a UI that blocks on SQLite or on matplotlib feels broken, so every view reads the
store in a thread worker and applies the result on the UI thread; at most one read per
view is in flight (a second would fetch the same rows again, and reads queued behind a
slow one only add lag).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from textual.app import App

from workbench.store import Store


class PollsStore:
    """Mixin for a Textual widget, screen or the app: :meth:`poll` runs :meth:`read` in a thread
    worker and then :meth:`apply` with its result on the UI thread (skipped when the read
    failed or the view is gone; the worker logs the error)."""

    _busy = False

    def read(self) -> Any:  # in the worker thread
        raise NotImplementedError

    def apply(self, got: Any) -> None:  # on the UI thread
        raise NotImplementedError

    def poll(self) -> None:
        if not self._busy:
            self._busy = True
            self.run_worker(self._read_in_thread, thread=True,
                            group=f"{type(self).__name__}-poll", exit_on_error=False)

    def _read_in_thread(self) -> None:
        got = None
        try:
            got = self.read()
        finally:
            self.app.call_from_thread(self._got, got)

    def _got(self, got: Any) -> None:
        self._busy = False
        # a view may have gone meanwhile; the app itself (App.is_mounted is a method) never does
        if got is not None and (isinstance(self, App) or self.is_mounted):
            self.apply(got)


def write_in_thread(node: Any, store_root: Path, make: Callable[[Store], list[Path]],
                    what: str) -> None:
    """Run ``make(store)`` (it writes files and returns their paths) in a thread worker
    with its own store connection - figures take seconds - and tell the user what was
    written or why not."""
    def job() -> None:
        store = Store(store_root)
        try:
            written = make(store)
        except Exception as e:  # shown, never a crash of the UI
            node.app.call_from_thread(node.notify, f"{what} failed: {e}", severity="error",
                                      markup=False)
            return
        finally:
            store.close()
        folders = sorted({str(p.parent) for p in written})
        node.app.call_from_thread(
            node.notify, f"wrote {len(written)} files ({what}) in {', '.join(folders) or '-'}: "
            + ", ".join(p.name for p in written), markup=False, timeout=8)

    node.notify(f"writing {what}...", markup=False)
    node.run_worker(job, thread=True, group=f"{type(node).__name__}-write", exit_on_error=False)
