"""The sweep form's actions on whole profiles, a mixin of
:class:`~workbench.tui.sweep_form.SweepForm`: save (ctrl+s) and load (ctrl+o) through the
path dialog, and launch (ctrl+r) under a profile name that holds no other sweep
(:mod:`workbench.spec.sweep_identity`: a name the form chose follows the task, a typed name
holding another sweep asks first). The form's own fields, checks and messages stay in
sweep_form.py; this mixin reads them through ``build_profile``, ``set_status`` and the
form's messages (``Launch``, ``EvalProfileLoaded``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Input, Static

from workbench.spec import profile as profiles
from workbench.spec.profile import DataAbsent, Profile, ProfileError
from workbench.tui import paths
from workbench.tui.form_checks import estimate_text, launch_extras, run_count_text


class FormLaunch:
    """Save, load and launch (module doc)."""

    # ------------------------------------------------------------------ actions
    def _remember(self, path: Path) -> None:
        self.last_path = Path(path).expanduser().resolve()
        if self.state_dir is not None:
            paths.remember(self.state_dir, profile_path=str(self.last_path))

    def save_default(self, name: str) -> Path:
        """Where the save dialog starts: the folder of the last profile saved or loaded
        (this file itself when it has this name), else the profiles folder; absolute."""
        if self.last_path is not None:
            if self.last_path.stem == name:
                return self.last_path
            return self.last_path.parent / f"{name}.toml"
        return self.profiles_dir.expanduser().resolve() / f"{name}.toml"

    def action_save(self) -> None:
        from workbench.tui.dialogs import PathScreen

        prof = self.build_profile(need_data=False)  # data fetched later still runs it
        if prof is None:
            return

        def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                written = profiles.save(prof, path)
            except OSError as e:
                self.set_status(f"cannot save {path}: {e.strerror}", bad=True)
                return
            self._remember(written)
            self.set_status(f"saved {Path(written).resolve()}")
            self.notify(f"saved {Path(written).resolve()}", markup=False)

        self.app.push_screen(PathScreen("Save profile to", str(self.save_default(prof.name))), done)

    def action_load(self) -> None:
        from workbench.tui.dialogs import PathScreen

        async def done(path: Path | None) -> None:
            if path is None:
                return
            absent = ""
            try:
                try:
                    prof = profiles.load(path)
                except DataAbsent as e:  # valid, and editable: only a launch needs the data
                    prof, absent = e.profile, str(e).split("\n", 1)[1]
                if isinstance(prof, profiles.EvalProfile):  # no sweep to edit: the evaluation form (F4) takes it
                    self.post_message(self.EvalProfileLoaded(Path(path), prof, absent))
                    return
                await self.fill(prof)
            except ProfileError as e:
                self.set_status(str(e), bad=True)
                self.notify(str(e), title="cannot load profile", severity="error", markup=False)
                return
            self._remember(path)
            self.set_status(f"loaded {Path(path).resolve()}" + (
                f"; it needs data that is absent here (fetch it before a launch):\n{absent}" if absent else ""))

        folder = self.last_path.parent if self.last_path is not None else \
            self.profiles_dir.expanduser().resolve()
        self.app.push_screen(PathScreen("Load profile from", str(folder) + "/", browse=folder), done)

    def action_launch(self) -> None:
        prof = self.build_profile(need_data=True)  # the runs read the [[needs]] paths
        if prof is not None:
            text, _ = run_count_text(self._sweep_data(), prof.task.name)
            peak, refusal = estimate_text(prof)
            devices, ok = self.devices_note()  # more GPUs than this machine has: the scheduler's check
            refusal = refusal or (None if ok or prof.executor == "slurm" else devices)
            count = self.query_one("#run-count", Static)
            count.set_class(refusal is not None, "bad")
            count.update(Text(f"{text} · {peak}"))
            if refusal is not None:  # a run that cannot fit is not launched (the CLI has --force)
                self.set_status(refusal, bad=True)
                return
            self._launch_named(prof, text)

    # ------------------------------------------------------------------ the profile name at a launch
    def _held_under(self, name: str) -> list[dict[str, Any]]:
        """The specs of the runs the app's store holds under profile ``name`` ([] without a
        store, or when it cannot be read: the launch itself then says why)."""
        store = getattr(self.app, "store", None)
        if store is None:
            return []
        lock = getattr(self.app, "store_lock", None)
        try:
            if lock is None:
                return [r.spec for r in store.runs(profile=name)]
            with lock:
                return [r.spec for r in store.runs(profile=name)]
        except Exception:
            return []

    def _launch_named(self, prof: Profile, text: str) -> None:
        """Launch ``prof`` under a name that holds no other sweep (issue 41 item 1; the rule
        is :mod:`workbench.spec.sweep_identity`'s). A name the form chose itself (the
        default ``sweep``, or one it proposed before) becomes the task's name, or the first
        of ``task-2``, ``task-3``, ... that is free or holds this same sweep (a replay:
        its finished runs are skipped). A typed or loaded name whose runs in the store are
        another sweep asks first (:class:`~workbench.tui.dialogs.NameClashScreen`): a fresh
        name (the default), that name anyway, or no launch."""
        from workbench.spec import sweep_identity
        from workbench.tui.dialogs import NameClashScreen

        try:
            specs = [s.to_dict() for s in profiles.expand(prof)]
        except ProfileError as e:
            self.set_status(str(e), bad=True)
            return
        if self._auto_name is not None and prof.name == self._auto_name:
            name = sweep_identity.fresh_name(prof.task.name, specs, self._held_under)
            self._go(prof, text, name)
            return
        held = self._held_under(prof.name)
        diffs = sweep_identity.differences(specs, held)
        if not diffs:
            self._go(prof, text, prof.name)
            return
        base = sweep_identity.proposal_base(specs, held, prof.name)
        fresh = sweep_identity.fresh_name(base, specs, self._held_under, avoid=[prof.name])
        self.set_status(f"profile {prof.name!r} holds another sweep: " + sweep_identity.one_line(diffs), bad=True)

        def answered(answer: str | None) -> None:
            if answer == "fresh":
                self._go(prof, text, fresh)
            elif answer == "same":
                self._go(prof, text, prof.name)
            else:
                self.set_status(f"not launched: profile {prof.name!r} holds another sweep "
                                f"({sweep_identity.one_line(diffs)}); give the sweep a name of its own")

        self.app.push_screen(NameClashScreen(prof.name, fresh, diffs, len(held)), answered)

    def _go(self, prof: Profile, text: str, name: str) -> None:
        """Post the launch of ``prof`` under ``name`` (the name field shows it; a name the
        form proposed stays the form's own, so the next sweep gets its own again)."""
        if name != prof.name:
            self._auto_name = name
            self.query_one("#name", Input).value = name
            prof = prof.model_copy(update={"name": name})
        # the app replaces this with the ids once the runs are queued
        extra = launch_extras(prof)
        self.set_status(text.replace("will launch", "launching", 1) + (f"; {extra}" if extra else ""))
        self.post_message(self.Launch(prof))
