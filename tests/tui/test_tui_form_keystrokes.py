"""The sweep form keeps every keystroke and shows where the focus is (issue 42 items 3, 4).

Keystrokes: the form fills some fields itself, from a change or a background result that
was started earlier (form_fields.put). The background work is slowed on purpose here (it
waits on an event the test sets), keys are typed at full speed, and each field must hold
exactly what was typed: before the fix, the late result wrote the form's value into a
field the user had just cleared, and the keys typed after it were appended to it.

Focus: at 80x24 the focused field is on screen after any number of Tabs, no focus stop is
invisible, and a field's problem shows as soon as the field is left.
"""
from __future__ import annotations

import threading

from textual.widgets import Input, Select, Static

from helpers import until, workers_done
from test_tui import FakeScheduler, make_app, settle, store  # noqa: F401
from workbench.tui import form_live
from workbench.tui.model_picker import ModelPicker
from workbench.tui.sweep_form import SweepForm

NARROW = (80, 24)


async def open_form(pilot) -> SweepForm:
    await pilot.press("f2")
    await settle(pilot)
    return pilot.app.query_one(SweepForm)


def value(form: SweepForm, fid: str) -> str:
    return form.query_one(f"#{fid}", Input).value


async def test_a_late_step_count_never_overwrites_a_cleared_and_retyped_field(store, tmp_path, monkeypatch):
    """A token budget's steps are counted in a thread; while the count is held back, the
    user clears "evaluate every" and, once the late count has come in, types their own."""
    gate = threading.Event()
    started = threading.Event()
    real = form_live.budget_steps_text

    def slow(specs):
        started.set()
        gate.wait(10)  # a loaded machine: the answer comes late
        return real(specs)

    monkeypatch.setattr(form_live, "budget_steps_text", slow)
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["transformer"])
        form.query_one("#budget_kind", Select).value = "tokens"
        await settle(pilot)
        form.query_one("#budget", Input).focus()
        started.clear()  # a count of the earlier settings may have started already: wait for this one's
        await pilot.press("ctrl+u", *"50000")
        for _ in range(200):  # the count of "50000" tokens is under way, held back
            if started.is_set():
                break
            await pilot.pause(0.05)
        assert started.is_set()
        form.query_one("#eval_every", Input).focus()
        await pilot.press("ctrl+u")  # cleared: the late count must not fill it
        gate.set()
        await settle(pilot)
        await pilot.press(*"7")
        await settle(pilot)
        assert value(form, "budget") == "50000"
        assert value(form, "eval_every") == "7"


def type_now(field: Input, text: str) -> None:
    """Clear ``field`` and type ``text`` into it as its key handler does, before the form
    handles any message (the form lags behind the keys, as under load)."""
    field.action_delete_left_all()
    field.action_end()
    for ch in text:
        field.insert_text_at_cursor(ch)


async def test_changes_handled_late_never_overwrite_a_field_cleared_since(store, tmp_path):
    """The budget is retyped and a task picked; before the form handles either change the
    user clears "evaluate every" and the name; the late handlers (evaluate every follows
    the budget and the task; the name follows the task) must leave both cleared fields
    alone, so what is typed next is all they hold."""
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot)
        task = form.query_one("#task", Select)
        task.value = "mqar"  # its handler runs after the keys below
        type_now(form.query_one("#budget", Input), "50000")
        type_now(form.query_one("#eval_every", Input), "")
        type_now(form.query_one("#name", Input), "")
        await settle(pilot)
        await pilot.pause(0.5)  # every timer the changes started has fired
        await settle(pilot)
        for fid, text in (("eval_every", "7"), ("name", "lm-tok")):
            field = form.query_one(f"#{fid}", Input)
            field.action_end()
            for ch in text:
                field.insert_text_at_cursor(ch)
        await settle(pilot)
        assert str(task.value) == "mqar"
        assert [value(form, f) for f in ("budget", "eval_every", "name")] == ["50000", "7", "lm-tok"]


async def test_a_task_switch_keeps_what_was_typed_into_a_parameter_it_also_has(store, tmp_path):
    """The task's parameter inputs are built anew at a switch; a value typed into a
    parameter both tasks have, after the switch was made and before it was handled, is
    kept in the new input."""
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot)
        task = form.query_one("#task", Select)
        assert form.query("#param-vocab_size")
        task.value = "mqar"  # both have vocab_size
        type_now(form.query_one("#param-vocab_size", Input), "77")
        await until(pilot, lambda: form._params_task == "mqar", timeout=60)
        await settle(pilot)
        assert value(form, "param-vocab_size") == "77"


async def test_names_typed_and_picked_in_the_model_list_at_full_speed(store, tmp_path):
    """Two models typed and picked in the list (letters filter, space picks) with every key
    sent at once: both are picked, and the second filter starts anew after the first
    pick instead of running the two names together."""
    from textual import events

    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot)
        picker = form.query_one("#models", ModelPicker)
        picker.focus()
        await settle(pilot)
        keys = [*"gated_deltaproduct", "space", *"forgetting_transformer", "space"]
        for k in keys:  # all queued before any is handled
            name = {"_": "underscore", "space": "space"}.get(k, k)
            app._driver.send_message(events.Key(name, " " if k == "space" else k))
        await pilot.pause(0.5)
        await settle(pilot)
        assert picker.filter_input.value == "forgetting_transformer"
        assert set(picker.picked) == {"gated_deltaproduct", "forgetting_transformer"}


def inside(widget, box) -> bool:
    r, b = widget.region, box.region
    return r.height > 0 and r.width > 0 and r.y >= b.y and r.bottom <= b.bottom and r.x >= b.x and r.right <= b.right


async def test_tab_at_80x24_always_lands_on_a_field_in_view(store, tmp_path):
    """Forty Tabs through the form at 80x24: every focus stop inside the form is a field
    (no container or hidden widget takes the focus unseen) and lies in the scrolled pane's
    visible area."""
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=NARROW) as pilot:
        form = await open_form(pilot)
        pane = form.query_one("#form-columns")
        seen = []
        for _ in range(40):
            await pilot.press("tab")
            await pilot.pause()
            w = app.focused
            if w is None or form not in w.ancestors:
                continue  # the app's tab bar
            seen.append(w.id)
            assert w.display and w.visible, f"{w.id} takes the focus unseen"
            assert inside(w, pane), f"{w.id} ({w.region}) is focused off-screen ({pane.region})"
        assert "budget" in seen and "eval_every" in seen and "slurm" in seen
        assert len(seen) == len(set(seen)) or seen.count(seen[0]) == 2  # one pass (wrapping once)


async def test_a_bad_value_says_so_when_its_field_is_left(store, tmp_path):
    """A value the schema refuses shows its message under the field as soon as the focus
    leaves it, before any save; corrected and left again, the message goes."""
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=NARROW) as pilot:
        form = await open_form(pilot)
        field = form.query_one("#batch_size", Input)
        field.focus()
        await pilot.pause()
        await pilot.press("ctrl+u", *"abc", "tab")
        await settle(pilot)
        err = form.query_one("#err-batch_size", Static)
        assert err.display and "batch size" in str(err.render())
        assert not form.query_one("#form-status", Static).display  # no save was asked for
        field.focus()
        await pilot.pause()
        await pilot.press("ctrl+u", *"16", "tab")
        await settle(pilot)
        assert not err.display


async def test_a_run_without_a_gpu_says_so_in_one_line():
    """The system panel of a CPU run: CPU, process memory and that there is no GPU on one
    line (five lines before, above the run's results at 80x24)."""
    from textual.app import App

    from workbench.tui.system_panel import SystemPanel

    class Host(App):
        def compose(self):
            yield SystemPanel(id="sys")

    app = Host()
    async with app.run_test(size=NARROW) as pilot:
        panel = app.query_one(SystemPanel)
        panel.nvml_note = "no NVIDIA GPU found (NVML: driver not loaded)"
        panel.show([{"t": None, "cpu_percent": 150.0, "rss_mb": 321.0, "gpu_util": None,
                     "gpu_mem_used_mb": None, "gpu_mem_total_mb": None, "gpu_name": None}])
        await pilot.pause()
        shown = str(panel.query_one("#sys-text", Static).render())
        assert shown.strip().count("\n") == 0, shown
        assert "CPU 150%" in shown and "321 MiB" in shown and "No NVIDIA GPU" in shown


def test_a_narrow_runs_table_keeps_the_grid_point_over_a_full_task_setting():
    """At 80 columns, a task setting and a grid point both vary between the rows and the
    seed does not: the task is cut to leave the grid point room (it tells the runs apart)
    and the seed column, 0 on every row, is not shown."""
    from workbench.tui.run_cells import layout

    natural = {"id": 2, "model": 11, "task": 22, "grid": 30, "profile": 12, "seq_len": 4, "seed": 1,
               "loss": 6, "elapsed": 6, "device": 4}
    shown = layout(78, natural, {"task", "grid"}, set())
    assert "grid" in shown and "task" in shown and "seed" not in shown
    assert sum(w + 2 for w in shown.values()) <= 78


async def test_erasing_keys_and_letters_typed_at_once_apply_in_order(store, tmp_path):
    """ctrl+u, backspace and letters sent at once (a fast typist on a loaded machine):
    the field ends as if each key was applied in turn. Textual ran the Input's erasing
    bindings only after the letters typed behind them: 'ctrl+u 5 0 0 0 0' left the field
    empty, as 'bpe' typed right after clearing the tokenizer was lost."""
    from textual import events

    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=NARROW) as pilot:
        form = await open_form(pilot)
        budget = form.query_one("#budget", Input)
        budget.focus()
        await settle(pilot)
        budget.action_end()
        keys = [("ctrl+u", "\x15"), *[(c, c) for c in "50001"], ("backspace", "\x08"), ("0", "0")]
        for key, ch in keys:  # all queued before any is handled
            app._driver.send_message(events.Key(key, ch))
        await pilot.pause(0.5)
        await settle(pilot)
        assert budget.value == "50000"


async def test_keys_typed_right_after_a_tab_go_to_the_next_field(store, tmp_path):
    """'tab ctrl+u 7' sent at once from "grad clip": the 7 lands in "evaluate every" (the
    Tab moves the focus as it arrives) and grad clip keeps its value."""
    from textual import events

    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=NARROW) as pilot:
        form = await open_form(pilot)
        clip = form.query_one("#grad_clip", Input)
        before = clip.value
        clip.focus()
        await settle(pilot)
        for key, ch in [("tab", "\t"), ("ctrl+u", "\x15"), ("7", "7"), ("shift+tab", None),
                        ("end", None), ("backspace", "\x08"), ("5", "5")]:
            app._driver.send_message(events.Key(key, ch))
        await pilot.pause(0.5)
        await settle(pilot)
        assert value(form, "eval_every") == "7"
        assert clip.value == before[:-1] + "5"


async def test_the_focus_is_in_view_after_a_burst_of_tabs(store, tmp_path):
    """Thirteen Tabs sent at once from the budget at 80x24 (after typing into it): the
    field that ends with the focus is in the scrolled pane's visible area."""
    from textual import events

    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=NARROW) as pilot:
        form = await open_form(pilot)
        pane = form.query_one("#form-columns")
        budget = form.query_one("#budget", Input)
        budget.focus()
        await settle(pilot)
        keys = [("ctrl+u", "\x15"), *[(c, c) for c in "50000"]] + [("tab", "\t")] * 13
        for key, ch in keys:
            app._driver.send_message(events.Key(key, ch))
        await pilot.pause(0.5)
        await settle(pilot)
        w = app.focused
        assert w.id == "grid_lr" and budget.value == "50000"
        assert inside(w, pane), f"{w.id} ({w.region}) is focused off-screen ({pane.region})"


async def test_a_count_started_after_a_field_was_cleared_leaves_it_cleared(store, tmp_path):
    """The budget is typed, then "evaluate every" cleared, both before the form handles
    either (a loaded machine): the budget's count starts after the clear, yet it follows the
    budget's edit, which came first, so it must not refill the cleared field."""
    app = make_app(store, tmp_path, FakeScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot)
        form.query_one("#models", ModelPicker).set_picked(["transformer"])
        form.query_one("#budget_kind", Select).value = "tokens"
        await settle(pilot)
        await until(pilot, lambda: form._budget_timer is None and form._budget_steps, timeout=60)
        type_now(form.query_one("#budget", Input), "50000")
        type_now(form.query_one("#eval_every", Input), "")
        await until(pilot, lambda: form._budget_timer is not None, timeout=60)   # the count is due
        await until(pilot, lambda: form._budget_timer is None, timeout=60)
        await workers_done(app)
        await settle(pilot)
        assert "steps a run" in str(form.query_one("#budget-steps", Static).render())
        assert value(form, "budget") == "50000"
        assert value(form, "eval_every") == ""
