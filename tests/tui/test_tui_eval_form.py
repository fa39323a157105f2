"""Pilot tests of the evaluation form (F4, workbench/tui/eval_form.py): filled as a user
types it, saved as an evaluation profile that the loader reads back equal (and loaded
again into the form), launched into a scratch store through eval --from's own steps (the
runs queued with their tasks, shown in the Runs tab), unknown task names refused under the
field with their closest names (checked in a worker) and no models and a bad limit refused
at their fields; the palette's command and the help's keys. (ctrl+o of an evaluation
profile in the sweep form: test_tui_sweep_form.)

No network: the tasks are a local lm-eval YAML folder (include), lm-eval's own names are a
small fixed set (test_lm_eval_tasks.fake_index), the models are local folders, and the
runs are queued but not started (eval_queue.start recorded, not run)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import paste_into, screen_lines
from test_lm_eval_tasks import fake_index, needs_lm_eval, write_task
from test_tui import SIZE, make_app, settle, store, type_into  # noqa: F401
from textual.widgets import Input, Select, Static, TabbedContent

from workbench.execute import eval_queue
from workbench.spec import profile as profiles
from workbench.tui import eval_form
from workbench.tui.eval_form import EvalForm
from workbench.tui.runs_table import RunsTable

pytestmark = needs_lm_eval
TABLE3 = Path(__file__).resolve().parents[2] / "profiles" / "zero-shot-table3.toml"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """lm-eval's own names as a small fixed set (no 10-50 s index), and runs queued but not
    started (no scheduler process): the calls to eval_queue.start are recorded."""
    fake_index(monkeypatch)
    started: list[tuple] = []
    monkeypatch.setattr(eval_queue, "start", lambda st, ids, executor, slurm, sources:
                        started.append((list(ids), executor)))
    return started


def text(widget) -> str:
    return str(widget.render())


async def open_form(pilot) -> EvalForm:
    await pilot.press("f4")
    await pilot.pause()
    assert pilot.app.query_one(TabbedContent).active == "eval"
    return pilot.app.query_one(EvalForm)


async def checked(pilot, form: EvalForm) -> None:
    """The task-name check once typing paused and its worker answered."""
    await pilot.pause(eval_form.CHECK_S + 0.1)
    await settle(pilot)


async def fill(pilot, form: EvalForm, tmp_path: Path, tasks: str = "my_choice") -> tuple[Path, Path]:
    """Fill the form as a user: two local models (one labelled), the task folder, tasks, a
    limit and a batch size, device cpu."""
    folder = write_task(tmp_path / "my-tasks")
    from test_eval_preflight import fake_checkpoint

    for m in ("m1", "m2"):  # checked as checkpoints (config, weights, tokenizer) when the form is
        fake_checkpoint(tmp_path / m)
    # the long paths pasted (typed key by key they take seconds), the rest typed
    form.query_one("#ev-models", Input).value = f"first={tmp_path / 'm1'}, {tmp_path / 'm2'}"
    form.query_one("#ev-include", Input).value = str(folder)
    await type_into(pilot, "#ev-name", "evtest")
    await type_into(pilot, "#ev-tasks", tasks)
    await type_into(pilot, "#ev-limit", "10")
    await type_into(pilot, "#ev-batch", "4")
    await type_into(pilot, "#ev-devices", "2")
    form.query_one("#ev-device", Select).value = "cpu"
    await checked(pilot, form)
    return folder, tmp_path / "m2"


async def through_dialog(pilot, key: str, path: Path) -> None:
    await pilot.press(key)
    await pilot.pause()
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await settle(pilot)


async def test_filled_saved_and_loaded_back_equal(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        folder, m2 = await fill(pilot, form, tmp_path)
        assert "1 task name known" in text(form.query_one("#ev-tasks-check", Static))
        out = tmp_path / "saved" / "evtest.toml"
        await through_dialog(pilot, "ctrl+s", out)
        assert out.exists(), text(form.query_one("#eval-status", Static))
    prof = profiles.load(out)  # what `ssm-workbench run FILE` reads
    assert isinstance(prof, profiles.EvalProfile) and prof.name == "evtest"
    assert [(m.label, m.model) for m in prof.eval.models] == [("first", str(tmp_path / "m1")), (str(m2), str(m2))]
    assert prof.eval.tasks == ["my_choice"] and prof.eval.include == [str(folder)]
    assert (prof.eval.limit, prof.eval.batch_size, prof.eval.device, prof.eval.devices) == (10, 4, "cpu", 2)
    # loaded into a new form: the same fields, saved again: the same profile
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await through_dialog(pilot, "ctrl+o", out)
        assert form.query_one("#ev-models", Input).value == f"first={tmp_path / 'm1'}, {m2}"
        assert form.query_one("#ev-limit", Input).value == "10"
        assert form.query_one("#ev-devices", Input).value == "2"
        again = tmp_path / "again.toml"
        await through_dialog(pilot, "ctrl+s", again)
    assert profiles.load(again).model_dump() == prof.model_dump()


async def test_palette_help_and_the_table3_profile_round_trip(store, tmp_path):  # noqa: F811
    """The palette opens the form, the help lists its keys; the Table 3 profile loaded and
    saved loads back equal, with what the form has no field for (published numbers)."""
    from test_tui_first_hour import run_command

    from workbench.tui.help_screen import HelpScreen, own_bindings

    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await run_command(pilot, "new evaluation")
        assert app.query_one(TabbedContent).active == "eval" and app.focused.id == "ev-models"
        app.action_help()  # (? in a text field is a character: the palette's "Keys of this screen")
        await pilot.pause()
        got = text(app.screen.query_one("#help-text", Static))
        assert "Evaluation form (F4)" in got and all(b.tooltip in got for b in own_bindings(EvalForm))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        form = app.query_one(EvalForm)
        await through_dialog(pilot, "ctrl+o", TABLE3)  # its hub ids are not cached here: loaded all the same
        assert form.query_one("#ev-tasks", Input).value.startswith("lambada_openai, hellaswag")
        assert "Mamba-130M=state-spaces/mamba-130m-hf" in form.query_one("#ev-models", Input).value
        out = tmp_path / "t3.toml"
        await through_dialog(pilot, "ctrl+s", out)
    try:
        back = profiles.load(out)
    except profiles.DataAbsent as e:
        back = e.profile
    try:
        orig = profiles.load(TABLE3)
    except profiles.DataAbsent as e:
        orig = e.profile
    assert back.model_dump() == orig.model_dump() and len(back.published) == 28  # published numbers kept


async def test_launch_queues_the_eval_runs_with_their_tasks(store, tmp_path, offline):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await fill(pilot, form, tmp_path)
        await pilot.press("ctrl+r")
        await settle(pilot)
        runs = store.runs(profile="evtest")
        assert len(runs) == 2, text(form.query_one("#eval-status", Static))
        assert all(r.spec["kind"] == "eval" and r.spec["eval"]["tasks"] == ["my_choice"] for r in runs)
        assert sorted(r.spec["label"] for r in runs) == sorted(["first", str(tmp_path / "m2")])
        assert all(r.spec["eval"]["limit"] == 10 and r.state == "pending" for r in runs)
        assert offline == [(sorted(r.id for r in runs), "local")]  # handed to this machine's scheduler
        await pilot.pause()
        await settle(pilot)  # (the Runs tab's poll)
        assert app.query_one(TabbedContent).active == "runs"
        table = app.query_one(RunsTable)
        assert {str(r.id) for r in runs} <= set(table.rows)
        # launched again: the same runs, not new ones (as `eval --from` twice)
        await pilot.press("f4")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert len(store.runs(profile="evtest")) == 2


async def test_an_unknown_task_is_refused_at_the_field_with_its_closest_name(store, tmp_path,  # noqa: F811
                                                                              monkeypatch):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await fill(pilot, form, tmp_path, tasks="my_choise")
        err = text(form.query_one("#err-ev-tasks", Static))
        assert "'my_choise' (closest: my_choice)" in err, err
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert store.runs(profile="evtest") == []
        assert "closest: my_choice" in text(form.query_one("#eval-status", Static))
        await type_into(pilot, "#ev-tasks", "my_choice")  # corrected: the message goes
        await checked(pilot, form)
        assert text(form.query_one("#err-ev-tasks", Static)).strip() == ""
        # misspelt again and launched before the form's own check answers: the launch's
        # check (eval --from's) refuses it
        monkeypatch.setattr(eval_form, "CHECK_S", 60)
        await type_into(pilot, "#ev-tasks", "my_choise")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert store.runs(profile="evtest") == []
        assert "'my_choise' (closest: my_choice)" in text(form.query_one("#err-ev-tasks", Static))
        assert text(form.query_one("#eval-status", Static)).startswith("not launched: unknown lm-eval task")


async def test_no_models_and_a_bad_limit_are_refused_at_their_fields(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await type_into(pilot, "#ev-tasks", "lambada_openai")
        await type_into(pilot, "#ev-limit", "ten")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert isinstance(app.screen.query_one(EvalForm), EvalForm)  # no save dialog
        assert "at least one" in text(form.query_one("#err-ev-models", Static))
        assert "'ten' is not a number" in text(form.query_one("#err-ev-limit", Static))
        await type_into(pilot, "#ev-limit", "-1")
        await pilot.pause()
        assert "greater than 0" in text(form.query_one("#err-ev-limit", Static))
        await type_into(pilot, "#ev-devices", "0")
        await pilot.pause()
        assert "greater than or equal to 1" in text(form.query_one("#err-ev-devices", Static))
        assert not store.runs()



async def test_keys_sent_at_once_apply_in_order_and_follow_a_tab(store, tmp_path):
    """'ctrl+u 1 6 tab ctrl+u 3' sent at once into "batch size" (a fast typist on a loaded
    machine, issue 42 item 3): batch size ends 16 and the field after it 3. Textual ran an
    Input's erasing bindings after the letters behind them, and a Screen's Tab after the keys
    typed behind it, so the 3 landed in batch size (FormInput and the form's own Tab)."""
    from textual import events
    from textual.widgets import Input

    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        batch = form.query_one("#ev-batch", Input)
        batch.focus()
        await settle(pilot)
        for key, ch in [("ctrl+u", "\x15"), ("1", "1"), ("6", "6"), ("tab", "\t"),
                        ("ctrl+u", "\x15"), ("3", "3")]:
            app._driver.send_message(events.Key(key, ch))  # all queued before any is handled
        await pilot.pause(0.5)
        await settle(pilot)
        nxt = app.focused
        assert batch.value == "16"
        assert isinstance(nxt, Input) and nxt is not batch and nxt.value == "3"


async def test_output_folder_and_log_samples_saved_loaded_and_launched(store, tmp_path):  # noqa: F811
    """The form's output folder and log samples are `eval --output-path DIR --log-samples`:
    saved into the profile, loaded back into the fields, and in the queued runs' specs."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await fill(pilot, form, tmp_path)
        await paste_into(pilot, "#ev-output", str(tmp_path / "lm-eval-out"))
        form.query_one("#ev-log-samples").value = True
        await settle(pilot)
        out = tmp_path / "with-output.toml"
        await through_dialog(pilot, "ctrl+s", out)
        assert out.exists(), text(form.query_one("#eval-status", Static))
        prof = profiles.load(out)
        assert (prof.eval.output_path, prof.eval.log_samples) == (str(tmp_path / "lm-eval-out"), True)
        await pilot.press("ctrl+r")
        await settle(pilot)
        runs = store.runs(profile="evtest")
        assert len(runs) == 2, text(form.query_one("#eval-status", Static))
        assert all(r.spec["eval"]["output_path"] == str(tmp_path / "lm-eval-out") and r.spec["eval"]["log_samples"]
                   for r in runs)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await through_dialog(pilot, "ctrl+o", out)
        assert form.query_one("#ev-output", Input).value == str(tmp_path / "lm-eval-out")
        assert form.query_one("#ev-log-samples").value is True


async def test_a_bad_output_folder_is_said_when_the_field_is_left(store, tmp_path):  # noqa: F811
    """A file as the output folder (or a folder under a file) shows under the field as soon
    as the field is left, not only at save; log samples without a folder is refused too."""
    (tmp_path / "a-file").write_text("x")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        await paste_into(pilot, "#ev-output", str(tmp_path / "a-file"))
        err = form.query_one("#err-ev-output", Static)
        assert not err.display  # typing: no message yet
        await pilot.press("tab")  # left
        await settle(pilot)
        assert "is a file, not a folder" in text(err) and err.display
        await paste_into(pilot, "#ev-output", str(tmp_path / "a-file" / "out"))
        await pilot.press("tab")
        await settle(pilot)
        assert "no folder can be made under it" in text(err)
        await paste_into(pilot, "#ev-output", str(tmp_path / "new" / "out"))  # can be made: fine
        await pilot.press("tab")
        await settle(pilot)
        assert not err.display
        await type_into(pilot, "#ev-output", "")
        form.query_one("#ev-log-samples").value = True
        await type_into(pilot, "#ev-tasks", "lambada_openai")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert "into the output folder: give one" in text(form.query_one("#err-ev-log-samples", Static))


async def test_hints_are_on_screen_at_80x24(store, tmp_path):  # noqa: F811
    """At 80x24 a field's hint goes under it (beside a 60-column field there was no room:
    the hints were gone; at 120 they were cut); where they all fit whole they stay beside
    the field. Focusing a field far down scrolls its row, hint included, into view. At
    80x24, then resized to 120x40 and to 160x40 (one app: the hints follow a resize)."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_form(pilot)
        await settle(pilot)
        for size in [(80, 24), (120, 40), (160, 40)]:
            if app.size != size:
                app.query_one("#ev-models").focus()  # the form's top in view again
                await pilot.resize_terminal(*size)
                await settle(pilot)
            lines = "\n".join(screen_text(app))
            assert "comma-separated; label=model names one" in lines, (size, lines)
            assert "lm-eval tasks, groups or tags" in lines, size
            app.query_one("#ev-output").focus()
            await settle(pilot)
            lines = screen_text(app)
            row = next(i for i, line in enumerate(lines) if line.startswith("output folder"))
            hint = "lm-eval's results JSON per task here (--output-path)"
            at = next(i for i, line in enumerate(lines) if hint in line)
            assert at == (row + 1 if size[0] < 140 else row), (size, lines)
            assert not any(line.endswith("…") for line in lines[1:]), (size, lines)  # no hint cut (the title may be)


def screen_text(app) -> list[str]:
    """The screen as a user sees it (capture-pane's lines), without trailing spaces."""
    return [line.rstrip() for line in screen_lines(app)]
