"""What the runs table does with the runs marked (``space``): kill or resume them all
after one confirmation naming how many (with nothing marked, the run under the cursor, which
the app confirms), compare them. A mixin of :class:`~workbench.tui.runs_table.RunsTable`
(its bindings are the table's): it uses the table's ``marked``, ``all_runs``, ``_runs``,
``_cells`` and ``current_run_id``.
"""
from __future__ import annotations

from rich.text import Text
from textual import work

from workbench.store import TERMINAL, Run, Store
from workbench.tui.dialogs import ConfirmScreen
from workbench.tui.messages import CompareRuns, KillRequested, ResumeRequested
from workbench.tui.run_cells import MARK

RESUMABLE = TERMINAL - {"finished"}


class MarkedRunActions:
    """Kill, resume and compare the marked runs (see the module docstring)."""

    def _marked_runs(self) -> list[Run]:
        by_id = {r.id: r for r in self.all_runs}
        return [by_id[i] for i in sorted(self.marked) if i in by_id]

    def _marked_or_cursor(self, request: type[KillRequested | ResumeRequested]) -> list[Run] | None:
        """The marked runs; with nothing marked, None after posting ``request`` for the run
        under the cursor (the app asks about that one run itself)."""
        if self.marked:
            return self._marked_runs()
        rid = self.current_run_id
        if rid is not None:
            self.post_message(request(rid))
        return None

    @staticmethod
    def _ids(runs: list[Run], limit: int = 12) -> str:
        ids = [str(r.id) for r in runs]
        return ", ".join(ids[:limit]) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")

    def _hidden_note(self, runs: list[Run]) -> str:
        hidden = sum(r.id not in self._runs for r in runs)
        return f" ({hidden} of them hidden by the filter)" if hidden else ""

    def action_kill_run(self) -> None:
        """The marked runs, after one confirmation naming how many; nothing marked: the run
        under the cursor (the app confirms)."""
        marked = self._marked_or_cursor(KillRequested)
        if marked is None:
            return
        live = [r for r in marked if r.state not in TERMINAL]
        if not live:
            self.notify(f"none of the {len(marked)} marked runs is pending or running", severity="warning")
            return
        ended = len(marked) - len(live)
        question = (f"Kill {len(live)} marked run{'s' * (len(live) > 1)} (ids {self._ids(live)})"
                    f"{self._hidden_note(live)}?"
                    + (f"\n{ended} more marked run{'s' * (ended > 1)} already ended: left alone." if ended else ""))

        def answer(yes: bool | None) -> None:
            if yes:
                self.kill_runs([r.id for r in live])

        self.app.push_screen(ConfirmScreen(Text(question)), answer)

    def action_resume_run(self) -> None:
        """The marked runs that can resume (killed, crashed, preempted, failed), after one
        confirmation naming how many; nothing marked: the run under the cursor."""
        marked = self._marked_or_cursor(ResumeRequested)
        if marked is None:
            return
        can = [r for r in marked if r.state in RESUMABLE]
        if not can:
            self.notify(f"none of the {len(marked)} marked runs can resume (only killed, crashed, "
                        "preempted or failed runs do)", severity="warning")
            return
        other = len(marked) - len(can)
        question = (f"Resume {len(can)} marked run{'s' * (len(can) > 1)} (ids {self._ids(can)}) from "
                    f"their checkpoints{self._hidden_note(can)}?"
                    + (f"\n{other} more marked run{'s' * (other > 1)} pending, running or finished: "
                       "left alone." if other else ""))

        def answer(yes: bool | None) -> None:
            if yes:
                self.resume_runs([r.id for r in can])

        self.app.push_screen(ConfirmScreen(Text(question)), answer)

    # the kills and resumes run in a thread with their own store connection (a kill may
    # wait seconds for its worker; a resume may start a scheduler): the app's store root
    # and scheduler, as its own one-run kill uses
    def _store(self) -> Store:
        return Store(self.app.store.root)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def kill_runs(self, ids: list[int]) -> None:
        store = self._store()
        killed, failed = [], []
        try:
            for rid in ids:
                try:
                    (killed if self.app.scheduler.kill(store, rid) else failed).append(rid)
                except Exception as e:  # shown; the other kills go on
                    failed.append(rid)
                    self.app.call_from_thread(self.notify, f"kill of run {rid} failed: {e}",
                                              severity="error", markup=False)
        finally:
            store.close()
        text = f"killed {len(killed)} run{'s' * (len(killed) != 1)}"
        if failed:
            text += f"; {len(failed)} not running (nothing killed): {', '.join(map(str, failed))}"
        self.app.call_from_thread(self.notify, text, severity="warning" if failed else "information",
                                  markup=False)
        self.app.call_from_thread(self._after_action)

    @work(thread=True, group="runs-action", exit_on_error=False)
    def resume_runs(self, ids: list[int]) -> None:
        from workbench.execute import resume

        store = self._store()
        try:
            done, errors = resume.resume_runs(store, ids)
        except Exception as e:
            done, errors = [], [f"resume failed: {e}"]
        finally:
            store.close()
        for text in errors[:5]:
            self.app.call_from_thread(self.notify, text, severity="warning", markup=False)
        if len(errors) > 5:
            self.app.call_from_thread(self.notify, f"... and {len(errors) - 5} more runs could not resume",
                                      severity="warning")
        if done:
            self.app.call_from_thread(self.notify, f"{len(done)} run{'s' * (len(done) > 1)} resume from "
                                      f"their checkpoints", markup=False)
        self.app.call_from_thread(self._after_action)

    def _after_action(self) -> None:
        poll = getattr(self.app, "poll_runs", None)
        if poll is not None:
            poll()

    # ------------------------------------------------------------------ marks, compare
    def _set_mark(self, run_id: int, on: bool) -> None:
        (self.marked.add if on else self.marked.discard)(run_id)
        cells = self._cells.get(run_id)
        if cells is not None:
            cells["mark"] = MARK if on else ""
            self._keys.pop(run_id, None)
            self.update_cell(str(run_id), "mark", cells["mark"])

    def action_toggle_mark(self) -> None:
        """Mark or unmark the run under the cursor, then move down (the footer says so):
        repeated presses mark a list."""
        rid = self.current_run_id
        if rid is None:
            return
        self._set_mark(rid, rid not in self.marked)
        if self.cursor_row < self.row_count - 1:
            self.move_cursor(row=self.cursor_row + 1)

    def action_unmark(self) -> None:
        for rid in list(self.marked):
            self._set_mark(rid, False)

    def action_compare(self) -> None:
        if not self.marked:
            self.notify("mark runs with space first (or p: the whole profile of this run)",
                        severity="warning")
            return
        ids = sorted(self.marked)
        self.post_message(CompareRuns(ids, "runs " + ", ".join(map(str, ids))))

    def action_compare_profile(self) -> None:
        rid = self.current_run_id
        if rid is None or rid not in self._runs:
            return
        profile = self._runs[rid].profile
        ids = sorted(r.id for r in self.all_runs if r.profile == profile)
        self.post_message(CompareRuns(ids, f"profile {profile}"))
