"""The sweep form's part of issue 32 (the first hour, again), each as a test that fails when
it comes back: the form opens on its model list (typing filters, space picks, ? is help); a
length error is read whole at 80x24; a shipped profile keeps its needs through the form; a
loaded profile paints no half-built form; each task starts where it learns on a CPU. The rest
of the TUI's part: test_first_hour_runs.py."""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
import tomli_w
from textual.widgets import Input, Static

from helpers import drawn_words, open_form, record_frames, until
from test_tui import make_app, settle, type_into
from workbench.spec import profile as profiles
from workbench.store import Store
from workbench.tui.dialogs import PathScreen
from workbench.tui.help_screen import HelpScreen
from workbench.tui.model_picker import ModelPicker
from workbench.tui.sweep_form import SweepForm


PROFILES = Path(__file__).resolve().parents[2] / "profiles"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


# ---------------------------------------------------------------------------- item 5
async def test_f2_opens_on_the_model_list_where_typing_filters_and_space_picks(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        picker = form.query_one("#models", ModelPicker)
        lst = picker.query_one("#models-list")
        assert app.focused is lst
        await pilot.press(*"mamba")
        await pilot.pause()
        assert picker.filter_input.value == "mamba"
        assert app.focused is lst  # the focus stayed: space picks, not a space in the filter
        assert form.query_one("#name", Input).value == "sweep"  # the profile is not renamed
        await pilot.press("space")
        await pilot.pause()
        assert picker.picked == ["mamba"] and picker.filter_input.value == "mamba"
        # after a pick the next letters start a new filter; backspace erases one
        await pilot.press(*"lstmx", "backspace")
        await pilot.pause()
        assert picker.filter_input.value == "lstm" and app.focused is lst
        await pilot.press("space")
        await pilot.pause()
        assert picker.picked == ["lstm", "mamba"]
        await pilot.press("q")  # a letter of a filter here, not quit
        await pilot.pause()
        assert app.is_running and picker.filter_input.value == "q"
        await pilot.press("escape", "question_mark")  # ? from the list is the help
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert form.query_one("#name", Input).value == "sweep"


# ---------------------------------------------------------------------------- item 8
async def test_a_length_error_is_read_whole_at_80x24_beside_the_problems_box(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["lstm"])
        await type_into(pilot, "#seq_lens", "64, 12")
        await pilot.press("ctrl+r")  # the problems box opens below the form; focus: the lengths
        await pilot.pause(0.2)
        err, status = form.query_one("#err-seq_lens", Static), form.query_one("#form-status", Static)
        msg = " ".join(str(err.render()).split())
        assert msg.startswith("sequence lengths: 12 does not fit") and msg.endswith("positions must fit)")
        assert err.region.height >= 3  # wrapped at 80 columns, not cut
        assert drawn_words(app, err) == msg  # every line of it on screen, none under the box
        assert status.display and drawn_words(app, status).count("12 does not fit") == 1
        # the form's last lines scroll into view above the box, not under it
        form.query_one("#form-columns").scroll_end(animate=False)
        await pilot.pause(0.2)
        hint = form.query(".hint").last()
        assert "setup=[...]" in drawn_words(app, hint)


async def load_and_save(pilot, form, src: Path, dest: Path) -> str:
    """ctrl+o ``src``, ctrl+s to ``dest`` through the path dialogs; the status after the load."""
    app = pilot.app
    await pilot.press("ctrl+o")
    await pilot.pause()
    app.screen.query_one("#path", Input).value = str(src)
    await pilot.press("enter")
    await settle(pilot)
    loaded = str(form.query_one("#form-status", Static).render())
    await pilot.press("ctrl+s")
    await pilot.pause()
    assert isinstance(app.screen, PathScreen), str(form.query_one("#form-status", Static).render())
    app.screen.query_one("#path", Input).value = str(dest)
    await pilot.press("enter")
    await pilot.pause()
    return loaded


async def test_a_shipped_profile_keeps_its_needs_and_runs_through_the_form(store, tmp_path, monkeypatch):
    """Loaded (its data absent, as on a fresh clone) and saved from the form: the [[needs]]
    tables stay, the runs are the same; a launch refuses it with the fetch commands. A length
    given as task.seq_len (as mqar-grid-reduced's) stays that length."""
    monkeypatch.chdir(tmp_path)  # the profiles' data paths are relative: absent here
    own_length = tmp_path / "own-length.toml"
    own_length.write_text(tomli_w.dumps({
        "schema_version": 2, "name": "own-length", "sweep": {"models": ["lstm"], "seeds": [0]},
        "task": {"name": "mqar", "seq_len": 48, "vocab_size": 64, "num_kv_pairs": 4},
        "model": {"d_model": 8, "n_layers": 1}, "train": {"steps": 4, "batch_size": 4}}))
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        for src in (PROFILES / "imdb-hybrid-frozen.toml", own_length):
            dest = tmp_path / "saved" / src.name
            absent = []
            try:
                shipped = profiles.load(src)
            except profiles.DataAbsent as e:
                shipped, absent = e.profile, e.needs
            loaded = await load_and_save(pilot, form, src, dest)
            back = profiles.load(dest, check_registries=False)
            assert back.needs == shipped.needs and len(back.needs) == (3 if absent else 0)
            assert profiles.expand(back) == profiles.expand(shipped), src.stem
            if absent:
                assert "needs data that is absent" in loaded and all(n.fetch in loaded for n in absent)
                await pilot.press("ctrl+r")
                await pilot.pause()
                status = str(form.query_one("#form-status", Static).render())
                assert "Cannot use this profile" in status and all(n.fetch in status for n in absent)
                assert app.scheduler.submitted == []


async def test_a_length_error_typed_on_the_last_line_scrolls_into_view_at_80x24(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot)
        await type_into(pilot, "#seq_lens", "64")
        cols, seq = form.query_one("#form-columns"), form.query_one("#seq_lens", Input)
        # the lengths on the form's last visible line, as after scrolling with the mouse
        cols.scroll_to(y=cols.scroll_y + seq.region.y - (cols.region.bottom - 1), animate=False)
        await pilot.pause(0.2)
        assert seq.region.y == cols.region.bottom - 1
        await pilot.press("backspace", "backspace", *"12")
        await pilot.pause(0.2)
        err = form.query_one("#err-seq_lens", Static)
        assert drawn_words(app, err) == " ".join(str(err.render()).split())
        assert drawn_words(app, err).endswith("positions must fit)")


# ---------------------------------------------------------------------------- item 6
async def test_loading_a_profile_paints_no_mixed_form(store, tmp_path, monkeypatch):
    prof = profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": "loaded", "task": {"name": "mqar", "vocab_size": 64, "num_kv_pairs": 4},
        "sweep": {"models": ["lstm"], "seq_lens": [32, 48], "seeds": [0]},
        "train": {"steps": 40, "batch_size": 8, "device": "cpu"},
    }))
    real_show_task = SweepForm._show_task

    async def slow_show_task(self, name, values=None):
        # a loaded machine: the parameter inputs take a while to mount
        await real_show_task(self, name, values)
        await asyncio.sleep(0.3)

    monkeypatch.setattr(SweepForm, "_show_task", slow_show_task)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)

        def state(app) -> tuple:
            params = tuple(w.id for w in form.query("#task-params Input"))
            desc = str(form.query_one("#task-desc", Static).render())[:20]
            return (form.query_one("#task").value, desc, params, form.query_one("#seq_lens", Input).value,
                    form.query_one("#name", Input).value, str(form.query_one("#run-count", Static).render()))

        old = state(app)
        frames = record_frames(app, state)
        await form.fill(prof)
        await pilot.pause(0.5)
        new = state(app)
        assert new[0] == "mqar" and new[3] == "32, 48" and new[4] == "loaded" and "param-vocab_size" in new[2]
        assert "2 runs" in new[5]
        mixed = [f for f in frames if f not in (old, new)]
        assert frames and not mixed, mixed[:2]


# ---------------------------------------------------------------------------- item 7
async def test_the_form_starts_each_task_where_it_learns_on_a_cpu(store, tmp_path):
    from textual.widgets import Select

    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["transformer"])

        def value(fid: str) -> str:
            return form.query_one(f"#{fid}", Input).value

        async def task(name: str) -> None:
            form.query_one("#task", Select).value = name
            # the task's handler awaits its parameter inputs' rebuild (a while on a loaded
            # machine), then fills the task's training settings
            await until(pilot, lambda: form._params_task == name, timeout=60)
            for _ in range(2):
                await settle(pilot)

        assert (value("budget"), value("lr"), value("seq_lens")) == ("200", "0.001", "64")
        await task("mqar")  # not the paper's vocabulary 8192 and 16 pairs: at chance on a CPU
        assert (value("param-vocab_size"), value("param-num_kv_pairs")) == ("128", "4")
        assert (value("budget"), value("lr"), value("model_options")) == ("600", "0.003", "transformer.n_heads=1")
        assert value("eval_every") == "30"  # follows the budget
        prof = form.build_profile(focus=False)
        assert prof is not None and prof.task.params()["vocab_size"] == 128 and prof.train.steps == 600
        assert not form.query_one("#task-note", Static).display
        await task("mad_compression")  # back to the generic budget; this one says it will not learn
        assert (value("budget"), value("lr"), value("model_options")) == ("200", "0.001", "")
        note = form.query_one("#task-note", Static)
        assert note.display and "CPU" in str(note.render())
        await task("sequential_image")  # a task with its own length: no length to refuse
        assert value("seq_lens") == "" and form.build_profile(focus=False) is not None
        await task("mqar")
        assert value("seq_lens") == "64"
        # what the user typed stays when the task changes
        form.query_one("#lr", Input).value = "0.0005"
        await task("induction_heads")
        assert value("lr") == "0.0005" and value("budget") == "600" and value("param-eval_lens") == "64, 256"
        # a loaded profile's settings are its own: they stay too
        await form.fill(profiles.loads(tomli_w.dumps({
            "schema_version": 1, "name": "mine", "task": {"name": "copying"},
            "sweep": {"models": ["lstm"], "seq_lens": [32], "seeds": [0]}, "train": {"steps": 50, "lr": 0.002}})))
        await settle(pilot)
        await task("mqar")
        assert (value("budget"), value("lr"), value("seq_lens")) == ("50", "0.002", "32")


async def test_a_tasks_default_budget_sets_evaluate_every_itself(store, tmp_path):
    """The task's budget sets "evaluate every" as it is filled in, not only through the
    budget field's Changed event (which a loaded machine handles late, or a batch of
    changes may hold back): MQAR's 600 steps give 30 (about 20 evaluations a run)."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        assert form.query_one("#eval_every", Input).value == "10"  # the generic 200 steps
        with form.prevent(Input.Changed):  # the Changed handlers do not run
            form._apply_task_training("mqar")
        assert form.query_one("#budget", Input).value == "600"
        assert form.query_one("#eval_every", Input).value == "30"


def chance(task_name: str, params: dict, seq_len: int | None) -> float:
    """The accuracy of always answering the test set's most common target: what a model
    that learned nothing of the inputs can reach."""
    import numpy as np
    import tasks
    from tasks.metrics import IGNORE

    if seq_len is not None and "seq_len" in tasks.parameters(task_name):
        params = {**params, "seq_len": seq_len}
    test = tasks.build(task_name, **params).eval_sets(0)[""]
    y = np.asarray(test.targets).ravel()
    y = y[y != IGNORE]
    return float(np.unique(y, return_counts=True)[1].max() / len(y))


def learns(acc: float | None, base: float) -> bool:
    """Well above chance: at least twice the chance accuracy and 0.15 over it."""
    return acc is not None and acc >= max(2 * base, base + 0.15)


@pytest.mark.slow
async def test_every_tasks_form_defaults_learn_on_a_cpu_or_the_form_says_not(tmp_path):
    """Each task as the form starts it (parameters, lengths, budget, learning rate, size),
    with a Transformer: trained here on the CPU, it ends well above chance, or the form
    says under the task that it will not (or asks for data it needs). Evaluated once, at
    the end (evaluations change nothing in training; 20 of them cost more than it)."""
    import tasks
    from textual.widgets import Select

    from workbench.train import worker

    store = Store(tmp_path / "store")
    app = make_app(store, tmp_path)
    made: dict[str, profiles.Profile] = {}
    says: dict[str, str] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["transformer"])
        for name in tasks.names():
            form.query_one("#task", Select).value = name
            await until(pilot, lambda: form._params_task == name, timeout=60)
            await settle(pilot)
            prof = form.build_profile(focus=False)
            note = str(form.query_one("#task-note", Static).render()).strip()
            status = str(form.query_one("#form-status", Static).render())
            if prof is None:
                says[name] = status
            else:
                made[name] = prof
                if note:
                    says[name] = note
    # tasks that need data the form cannot default: it says what they need
    for name in ("char_lm", "text_classification"):
        assert name not in made and re.search(r"required|needs", says[name]), (name, says.get(name))
    failures = []
    for name, prof in made.items():
        if name in says:  # the form says it will not learn here: nothing to check by training
            assert "CPU" in says[name], (name, says[name])
            continue
        prof = prof.model_copy(update={"train": prof.train.model_copy(update={"eval_every": prof.train.steps})})
        (spec,) = [s.to_dict() for s in profiles.expand(prof)]
        run_store = Store(tmp_path / name)
        (rid,) = run_store.add_runs([spec])
        run_store.mark_started(rid, os.getpid(), "cpu", None)
        worker.run(str(run_store.root), rid)
        run = run_store.get(rid)
        base = chance(name, prof.task.params(), prof.sweep.seq_lens[0] if prof.sweep.seq_lens else None)
        if run.state != "finished" or not learns(run.last_accuracy, base):
            failures.append(f"{name}: {run.state} {run.error or ''} accuracy {run.last_accuracy} "
                            f"after {prof.train.steps} steps, chance {base:.3f}")
        run_store.close()
    assert not failures, "\n".join(failures)
