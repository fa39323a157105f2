"""What a demanding user hits in the TUI's first hour (issue 22), each as a test that fails
when it comes back: the sweep form on one screen at 120x40 and usable at 80x24, evaluation
defaults with units, plain messages next to their field (cleared when corrected), lengths
checked against the task, what a relaunch queued, the model filter's cursor, the compare
view's wording and metric keys, flat axes, stale system samples, failed runs' charts, the
``?`` help screen, the command palette, and where files are written."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Select, Static

from helpers import open_form
from test_curves import sweep
from test_tui import FakeScheduler, fill_form, make_app, open_compare, poll, settle, tiny_profile, type_into
from workbench.store import Store
from workbench.tui import paths
from workbench.tui.app import WorkbenchApp, launch_summary
from workbench.tui.compare_view import title_text
from workbench.tui.dialogs import PathScreen
from workbench.tui.help_screen import TITLES, HelpScreen, own_bindings
from workbench.tui.model_picker import ModelPicker
from workbench.tui.plots import CurvePlot, MetricPlot, flat_range
from workbench.tui.run_view import RunScreen
from workbench.tui.sweep_form import RECHECK_S, default_eval_every
from workbench.tui.system_panel import age_note

PYDANTIC_WORDS = ("Input should", "Field required", "List should", "after validation", "String should")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def text(widget) -> str:
    return str(widget.render())


def notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def inside(widget, box) -> bool:
    """``widget`` is drawn wholly inside ``box``'s region (on screen, not scrolled away)."""
    r, b = widget.region, box.region
    return r.height > 0 and r.y >= b.y and r.bottom <= b.bottom and r.x >= b.x and r.right <= b.right


# ---------------------------------------------------------------------------- one screen
async def test_form_shows_models_task_and_lengths_at_120x40_and_its_errors(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        await pilot.pause()
        screen = app.screen
        assert screen.has_class("-wide")
        right = form.query_one("#form-right")
        for sel in ("#task", "#seq_lens", "#seeds", "#run-count", "#budget", "#eval_every"):
            assert inside(form.query_one(sel), right), f"{sel} is below the fold at 120x40"
        assert right.scroll_y == 0
        left = form.query_one("#form-left")
        lst = form.query_one("#models-list")
        assert inside(lst, left) and lst.region.height >= 20  # most of the registry in view
        assert form.query_one("#models-list").region.x < right.region.x  # side by side

        # a failed save: the status box and the message next to the field are in view
        await pilot.press("ctrl+s")
        await pilot.pause()
        status = form.query_one("#form-status", Static)
        assert status.display and "Cannot use this profile" in text(status)
        assert inside(status, screen) and status.region.bottom <= 40 - 1  # above the footer
        err = form.query_one("#err-models", Static)
        assert err.display and "model" in text(err) and inside(err, left)


async def test_form_is_one_scrolling_column_at_80x24(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot)
        assert app.screen.has_class("-narrow")
        columns = form.query_one("#form-columns")
        app.query_one("#models", ModelPicker).set_picked(["lstm"])
        await type_into(pilot, "#seq_lens", "12")
        await pilot.press("ctrl+r")  # refused: the focus (and the view) go to the lengths
        await settle(pilot)
        seq = form.query_one("#seq_lens", Input)
        assert app.focused is seq and inside(seq, columns)
        status = form.query_one("#form-status", Static)
        assert status.display and inside(status, app.screen) and "sequence lengths" in text(status)


# ---------------------------------------------------------------------------- defaults, units
def test_default_eval_every_is_a_fraction_of_the_budget():
    assert default_eval_every("steps", "200") == "10"  # 20 evaluations
    assert default_eval_every("steps", "1000") == "50"
    assert default_eval_every("steps", "5") == "1"
    assert default_eval_every("epochs", "10") == "1"  # at most one a epoch
    assert default_eval_every("steps", "abc") is None


async def test_eval_every_follows_the_budget_until_edited_and_shows_its_unit(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        ev = form.query_one("#eval_every", Input)
        unit = form.query_one("#unit-eval_every", Static)
        assert ev.value == "10" and text(unit) == "steps, 20 evals"
        await type_into(pilot, "#budget", "1000")
        assert ev.value == "50" and text(unit) == "steps, 20 evals"
        form.query_one("#budget_kind", Select).value = "epochs"
        await type_into(pilot, "#budget", "4")
        await pilot.pause()
        assert ev.value == "1" and text(unit).startswith("epochs")
        form.query_one("#budget_kind", Select).value = "steps"
        await type_into(pilot, "#budget", "400")
        await type_into(pilot, "#eval_every", "7")  # the user's own value stays
        await type_into(pilot, "#budget", "800")
        assert ev.value == "7" and text(unit) == "steps, 114 evals"
        app.query_one("#models", ModelPicker).set_picked(["lstm"])
        await type_into(pilot, "#seq_lens", "40")
        prof = form.build_profile()
        assert prof is not None and (prof.train.steps, prof.train.eval_every) == (800, 7)

        # a loaded profile keeps its own value, even one that is not the budget's default
        p = tiny_profile()
        await form.fill(p.model_copy(update={"train": p.train.model_copy(update={"steps": 1000, "eval_every": 3})}))
        await settle(pilot)
        assert ev.value == "3" and form.query_one("#budget", Input).value == "1000"


# ---------------------------------------------------------------------------- messages
MESSAGES = [  # (the field, a bad value, where its message goes, what the message says)
    (None, None, "models", "models: pick at least 1 model"),
    ("#betas", "-1", "betas", "AdamW betas: value 2 is missing (e.g. 0.9, 0.999)"),
    ("#lr", "abc", "lr", "learning rate: 'abc' is not a number"),
    ("#lr", "-1", "lr", "learning rate must be greater than 0; -1 is not"),
    ("#batch_size", "1.5", "batch_size", "batch size: '1.5' is not a whole number"),
    ("#seeds", "", "seeds", "seeds: give at least 1 value"),
    ("#name", "", "name", "name: must not be empty"),
]


async def test_messages_are_sentences_naming_the_field(store, tmp_path):
    """Each bad value of MESSAGES in turn, in one form (its field's value put back before
    the next; no model picked for the first): the sentence under the field and in the
    status box, no pydantic words."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        for field, value, fid, says in MESSAGES:
            good = None
            if field is not None:
                app.query_one("#models", ModelPicker).set_picked(["lstm"])
                inp = form.query_one(field, Input)
                good, inp.value = inp.value, value
            await pilot.pause()
            assert form.build_profile() is None, f"{field}={value!r} was accepted"
            await pilot.pause()
            err = text(form.query_one(f"#err-{fid}", Static))
            status = text(form.query_one("#form-status", Static))
            assert says in err and says in status, (field, value, err, status)
            assert not any(w in status for w in PYDANTIC_WORDS), status
            if good is not None:
                inp.value = good


async def test_a_message_goes_when_its_value_is_corrected(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        app.query_one("#models", ModelPicker).set_picked(["lstm"])
        await type_into(pilot, "#lr", "abc")
        await pilot.press("ctrl+s")
        await pilot.pause()
        err = form.query_one("#err-lr", Static)
        assert "'abc'" in text(err) and err.display
        await type_into(pilot, "#lr", "0.01")  # typed, not saved: the message goes once typing pauses
        await pilot.pause(RECHECK_S + 0.3)
        assert text(err) == "" and not err.display
        assert not form.query_one("#form-status", Static).display
        assert not isinstance(app.screen, PathScreen)


async def test_a_length_too_short_for_the_task_is_said_once_on_the_lengths(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot)
        app.query_one("#models", ModelPicker).set_picked(["lstm", "transformer"])
        await type_into(pilot, "#seeds", "0, 1")
        await type_into(pilot, "#seq_lens", "64, 12")
        count = text(form.query_one("#run-count", Static))
        assert "will launch" not in count  # no count while a length does not fit
        err = text(form.query_one("#err-seq_lens", Static))
        assert "12 does not fit task mad_selective_copying" in err and "33" in err  # said as typed
        await pilot.press("ctrl+s")
        await pilot.pause()
        status = text(form.query_one("#form-status", Static))
        assert status.count("12 does not fit") == 1 and "line" not in status
        assert text(form.query_one("#err-task", Static)) == ""
        # fewer tokens to copy make 12 long enough: the task's parameters count too
        await type_into(pilot, "#param-num_tokens_to_copy", "4")
        await pilot.pause(RECHECK_S + 0.3)
        assert text(form.query_one("#run-count", Static)).startswith("will launch 8 runs")
        assert text(form.query_one("#err-seq_lens", Static)) == ""


def test_launch_summary_says_what_was_queued_and_what_existed():
    from workbench.execute.launch import Submission

    sub = Submission()
    sub.skipped, sub.attached = [1, 2, 3], [4]
    sub.extend([1, 2, 3, 4])
    text_ = launch_summary("s", sub)
    assert text_.startswith("sweep s: 0 runs queued; 4 already in the store: 3 finished (skipped), "
                            "1 pending or running")
    sub = Submission()
    sub.queued, sub.skipped = [7, 8, 9, 11], [1]
    assert launch_summary("s", sub) == ("sweep s: 4 runs queued (ids 7..9, 11); 1 already in the store: "
                                        "1 finished (skipped)")
    assert launch_summary("s", [5, 6]) == "sweep s: 2 runs queued (ids 5..6)"  # a plain list


async def test_relaunching_a_profile_queues_none_and_says_so(store, tmp_path, monkeypatch):
    from workbench.execute import launch, scheduler

    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: None)  # no worker processes
    app = make_app(store, tmp_path, scheduler=launch)
    # every message said, kept here: a toast lasts 8 s, and on a loaded machine the second
    # launch can take longer than that, so the first one's toast may be gone by the end
    said, real_notify = [], app.notify
    app.notify = lambda message, *a, **k: (said.append(str(message)), real_notify(message, *a, **k))[1]
    async with app.run_test(size=(120, 40)) as pilot:
        form = await fill_form(pilot, tiny_profile())
        for _ in range(2):
            await pilot.press("f2")
            form.action_launch()
            await settle(pilot)
        assert len(store.runs()) == 4
        assert any(n.startswith("sweep tiny: 4 runs queued (ids 1..4)") for n in said)
        last = [n for n in said if n.startswith("sweep tiny:")][-1]
        assert last.startswith("sweep tiny: 0 runs queued; 4 already in the store: 4 pending or running"), last


# ---------------------------------------------------------------------------- model picker
async def test_filter_puts_the_cursor_on_the_best_match_and_list_typing_filters(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_form(pilot)
        picker = app.query_one("#models", ModelPicker)
        lst = picker.query_one("#models-list")
        await type_into(pilot, "#models-filter", "mamba")
        await pilot.pause()
        assert lst.highlighted_option.value == "mamba"  # not the first hybrid that mentions it
        await type_into(pilot, "#models-filter", "s4d")
        await pilot.pause()
        assert lst.highlighted_option.value.startswith("s4d")
        # letters typed in the list go on in the filter, the focus staying in the list
        await type_into(pilot, "#models-filter", "")
        lst.focus()
        await pilot.press("l", "s", "t", "m")
        await pilot.pause()
        assert picker.filter_input.value == "lstm" and app.focused is lst
        assert picker.shown == ["lstm"] and lst.highlighted_option.value == "lstm"
        await pilot.press("space")  # space picks the best match right after the filter
        assert picker.picked == ["lstm"]
        assert app.focused is lst
        await pilot.press("t", "r", "a", "n", "s")  # a new filter, not 'lstmtrans'
        await pilot.pause()
        assert picker.filter_input.value == "trans" and lst.highlighted_option is not None
        assert picker.best_match("trans") == "transformer"


# ---------------------------------------------------------------------------- compare view
def test_compare_title_wording():
    one = str(title_text("runs 1, 2", 2, 1, "step", "std", True))
    assert "2 runs in 1 group " in one and "mean ± std over seeds" in one
    each = str(title_text("runs 1, 2", 2, 2, "step", "std", False))
    assert "a line each" in each and "no band" in each and "±" not in each


def seeded(store: Store) -> list[int]:
    ids = sweep(store)  # lstm and transformer, seeds 0 and 1
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
        store.add_metrics(rid, [(s, s / 10, "train", "loss", 0.0) for s in range(3)])
        store.add_metrics(rid, [(2, 0.2, "eval", "accuracy", 0.0)])
    return ids


async def test_compare_offers_only_logged_metrics_and_flat_axes_start_at_zero(store, tmp_path):
    ids = seeded(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        screen = await open_compare(pilot)
        assert "in 2 groups" in text(screen.query_one("#compare-title", Static))
        await pilot.press("a")  # no train accuracy, no sequence accuracy: nothing else to offer
        await pilot.pause()
        assert screen.acc_metric == ("eval", "accuracy")
        assert any("only eval accuracy" in n for n in notes(app))
        store.add_metrics(ids[0], [(2, 0.2, "train", "accuracy", 0.5)])
        screen.poll()
        await settle(pilot)
        await pilot.press("a")
        assert screen.acc_metric == ("train", "accuracy")
        # all-zero train loss: 0 at the bottom of a 0..1 axis, not a -1..1 range around it
        plot = screen.query_one("#compare-loss", CurvePlot)
        assert "-1" not in str(plot.render()) and "-0.5" not in str(plot.render())
        await pilot.press("g")
        await pilot.pause()
        assert "no band" in text(screen.query_one("#compare-title", Static))


def test_flat_range():
    assert flat_range([0.0, 0.0]) == (0.0, 1.0)
    assert flat_range([2.0, 2.0]) == (0.0, 4.0)
    assert flat_range([-1.0, None, -1.0]) == (-2.0, 0.0)
    assert flat_range([0.0, 1.0]) is None and flat_range([]) is None


async def test_compare_legend_is_not_cut_at_80x24(store, tmp_path):
    seeded(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await poll(pilot)
        await open_compare(pilot)
        legend = app.screen.query_one("#compare-legend", DataTable)
        await pilot.pause()
        assert inside(legend, app.screen)
        # every column fits: nothing of the group names is scrolled off to the right
        assert legend.virtual_size.width <= legend.region.width
        labels = [str(legend.get_row_at(i)[1]) for i in range(legend.row_count)]
        assert labels == ["lstm (2 seeds)", "transformer (2 seeds)"]


# ---------------------------------------------------------------------------- run view
def test_age_note():
    now = 1000.0
    assert age_note(now - 2, "running", now) is None
    assert "45s ago" in age_note(now - 45, "running", now)
    note = age_note(now - 185, "killed", now)
    assert "3m05s ago" in note and "killed" in note and "nothing is measured now" in note


async def test_a_failed_runs_charts_and_a_stopped_runs_system_panel_say_so(store, tmp_path):
    ids = sweep(store, models=("lstm",), seeds=(0,))
    rid = ids[0]
    store.mark_started(rid, os.getpid(), "cpu", None)
    store.conn.execute("INSERT INTO system (run_id, t, cpu_percent, rss_mb) VALUES (?,?,?,?)",
                       (rid, time.time() - 600, 50.0, 300.0))
    store.conn.commit()
    store.finish(rid, "failed", "boom")
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(RunScreen(store, rid))
        await settle(pilot)
        screen = app.screen
        screen.poll()
        await settle(pilot)
        for plot in screen.query(MetricPlot):
            assert plot.empty_text.startswith("run failed before logging any"), plot.empty_text
            assert "waiting" not in str(plot.render())
        sys_text = text(screen.query_one("#sys-text", Static))
        assert re.search(r"last sample 10m\d\ds ago: the run is failed", sys_text), sys_text


# ---------------------------------------------------------------------------- help, palette
def help_text(app) -> str:
    return text(app.screen.query_one("#help-text", Static))


HELP_CASES = [  # (the keys that reach a screen, whose keys its help lists, whose it leaves out)
    ((), ["RunsTable"], ["SweepForm", "CompareScreen"]),
    (("f2",), ["SweepForm", "ModelPicker"], ["RunsTable"]),
    (("f1", "p"), ["CompareScreen"], ["SweepForm", "RunsTable"]),
]


async def test_help_lists_every_key_of_the_screen(store, tmp_path):
    """``?`` on the runs table, on the sweep form's model list and on the compare view (one
    app, reached in turn): every key of the app and of what is on screen, none of the rest."""
    import workbench.tui.compare_view as compare_view
    import workbench.tui.model_picker as model_picker
    import workbench.tui.runs_table as runs_table
    import workbench.tui.sweep_form as sweep_form

    classes = {"RunsTable": runs_table.RunsTable, "SweepForm": sweep_form.SweepForm,
               "ModelPicker": model_picker.ModelPicker, "CompareScreen": compare_view.CompareScreen}
    seeded(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        for where, shows, hides in HELP_CASES:
            await pilot.press(*where)
            await settle(pilot)
            if where == ("f2",):  # (in a text field ? is a character: from the model list it is help)
                app.query_one("#models", ModelPicker).focus()
                await pilot.pause()
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen), where
            got = help_text(app)
            for cls in [WorkbenchApp] + [classes[n] for n in shows]:
                for b in own_bindings(cls):  # generated from BINDINGS: a new key shows by itself
                    # (in the footer's short words, or the tooltip's longer ones)
                    assert (b.tooltip or b.description or b.action.replace("_", " ")) in got, (where, cls.__name__, b)
            for name in hides:  # keys of what is not on this screen (another tab, another view)
                assert TITLES[name] not in got, (where, name)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen), where


async def run_command(pilot, words: str) -> None:
    """ctrl+p, ``words`` typed into the command palette, and enter on what it found."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*words)
    await pilot.pause(0.5)
    await settle(pilot)
    await pilot.press("enter")
    await settle(pilot)


async def test_command_palette_has_the_apps_commands(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await run_command(pilot, "new sweep")
        assert app.query_one("TabbedContent").active == "sweep"
        await run_command(pilot, "open profile")
        assert isinstance(app.screen, PathScreen)


# ---------------------------------------------------------------------------- files
def test_output_folders_are_absolute_and_per_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = paths.output_root("store")
    assert root == (tmp_path / "store" / "figures").resolve() and root.is_absolute()
    assert paths.output_root("store", "~/figs") == Path("~/figs").expanduser().resolve()
    assert paths.profile_dir(root, "my sweep") == root / "my-sweep"
    assert paths.runs_dir(root, ["a", "a"]) == root / "a" and paths.runs_dir(root, ["a", "b"]) == root / "compare"


@pytest.mark.parametrize("out", [None, "out"])
async def test_compare_figures_go_to_the_profile_folder_with_the_full_path(store, tmp_path, monkeypatch, out):
    from workbench.results import plot

    written = []

    def fake_plot_curves(store_, runs, out_dir, **kw):  # no matplotlib in this test
        p = Path(out_dir) / f"curves-{kw['metric'][1]}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("png")
        written.append(p)
        return [p]

    monkeypatch.setattr(plot, "plot_curves", fake_plot_curves)
    monkeypatch.chdir(tmp_path)
    seeded(store)
    app = WorkbenchApp(store=store, profiles_dir=tmp_path / "profiles", scheduler=FakeScheduler(),
                       figures_dir=out)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        await open_compare(pilot)
        await pilot.press("f")
        await settle(pilot)
    folder = (tmp_path / "out" if out else store.root / "figures").resolve() / "cmp"
    assert written and all(p.parent == folder for p in written)
    assert any(str(folder) in n for n in notes(app))  # the message gives the full path


async def test_the_save_dialog_remembers_the_last_path(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await fill_form(pilot, tiny_profile("first"))
        await pilot.press("f2", "ctrl+s")
        await pilot.pause()
        box = app.screen.query_one("#path", Input)
        assert box.value == str((tmp_path / "profiles" / "first.toml").resolve())  # absolute
        box.value = str(elsewhere / "first.toml")
        await pilot.press("enter")
        await settle(pilot)
        assert (elsewhere / "first.toml").exists()
        await type_into(pilot, "#name", "second")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen.query_one("#path", Input).value == str(elsewhere / "second.toml")
        await pilot.press("escape")
    again = make_app(store, tmp_path)  # and after a restart (kept in the store folder)
    async with again.run_test(size=(120, 40)) as pilot:
        await fill_form(pilot, tiny_profile("third"))
        await pilot.press("f2", "ctrl+s")
        await pilot.pause()
        assert again.screen.query_one("#path", Input).value == str(elsewhere / "third.toml")


def test_ssm_workbench_tui_takes_out(tmp_path, monkeypatch):
    """`ssm-workbench tui --out DIR` puts the TUI's figures and tables under DIR (as
    `python -m workbench.tui.app --out` does); without it, under the store's figures/."""
    from workbench import cli
    from workbench.tui import app as app_module

    built = []

    class FakeApp:
        def __init__(self, **kw):
            built.append(kw)

        def run(self):
            pass

    monkeypatch.setattr(app_module, "WorkbenchApp", FakeApp)
    store = tmp_path / "st"
    assert cli.main(["--store", str(store), "tui", "--out", str(tmp_path / "figs")]) == 0
    assert built[-1]["figures_dir"] == str(tmp_path / "figs")
    assert cli.main(["--store", str(store), "tui"]) == 0
    assert built[-1]["figures_dir"] is None
    assert cli.main(["--store", str(store)]) == 0          # no command: the TUI as well
    assert built[-1]["figures_dir"] is None
