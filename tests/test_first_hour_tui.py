"""The TUI's part of issue 32 (the first hour, again), each as a test that fails when it
comes back: a length sweep's runs read apart at 80x24 (the sweep's varying axes kept, no
ellipsis in key columns, accuracies printed alike); the sweep form opens on its model list
(typing filters, space picks, ? is help) and the footers hold their important keys; a loaded
profile and a launched sweep paint no half-built screens; the compare view's empty epoch
plot, notifications, the Results caption during a sweep and `r`'s confirmation."""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
import tomli_w
from textual.widgets import Input, Static

from helpers import drawn_words, open_form, screen_lines
from test_curves import sweep
from test_tui import FakeScheduler, make_app, poll, settle, type_into
from workbench.spec import profile as profiles
from workbench.store import Store
from workbench.tui.compare_view import CompareScreen
from workbench.tui.dialogs import ConfirmScreen, PathScreen
from workbench.tui.help_screen import HelpScreen
from workbench.tui.model_picker import ModelPicker
from workbench.tui.plots import CurvePlot
from workbench.tui.results_view import ResultsView
from workbench.tui.run_cells import layout
from workbench.tui.runs_table import RunsTable
from workbench.tui.sweep_form import SweepForm


PROFILES = Path(__file__).resolve().parents[1] / "profiles"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def table_lines(app) -> tuple[str, list[str], list[tuple[str, int]]]:
    """The runs table's header line and row lines as drawn on the screen, and its columns
    (key, drawn width) as the table holds them."""
    table = app.query_one(RunsTable)
    r = table.region
    lines = [line[r.x:r.right] for line in screen_lines(app)[r.y:r.bottom]]
    header = next(line for line in lines if re.search(r"\bid\b", line))
    rows = [line for line in lines if re.match(r"\s*\S?\s*\d+\s", line) and line is not header]
    cols = [(str(c.key.value), c.get_render_width(table)) for c in table.ordered_columns]
    return header, rows, cols


KEY_COLUMNS = ("id", "model", "seq_len", "state", "accuracy")


def cells(cols: list[tuple[str, int]], line: str) -> dict[str, str]:
    """A drawn line cut into its cells by the columns' widths."""
    out, x = {}, 0
    for key, width in cols:
        out[key] = line[x:x + width].strip()
        x += width
    return out


def no_ellipsis_in_key_columns(cols, rows: list[str]) -> None:
    for line in rows:
        cut = {k: v for k, v in cells(cols, line).items() if k in KEY_COLUMNS and "…" in v}
        assert not cut, f"cut key columns {cut}:\n" + "\n".join(rows)


def finish(store: Store, rid: int, accuracy: float, loss: float = 0.5) -> None:
    store.mark_started(rid, os.getpid(), "cpu", None)
    store.heartbeat(rid, progress=1.0, last_accuracy=accuracy, last_loss=loss)
    store.finish(rid, "finished")


def grid_sweep(store: Store) -> list[int]:
    """One model, an lr grid of two values x two lengths: only grid point and length vary."""
    prof = profiles.loads(tomli_w.dumps({
        "schema_version": 2, "name": "a-grid-sweep-with-a-long-name",
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["transformer"], "seq_lens": [16, 32], "seeds": [0],
                  "grid": {"train.lr": [1e-4, 3e-3]}},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu"},
    }))
    return store.add_runs(s.to_dict() for s in profiles.expand(prof))


# ---------------------------------------------------------------------------- item 4
def test_layout_keeps_the_varying_axes_before_loss_and_time():
    natural = {"id": 2, "profile": 14, "model": 11, "task": 21, "seq_len": 2, "grid": 0, "seed": 1,
               "device": 3}
    # a length sweep of two models at 80 columns (78 inside the scroll bar)
    cols = layout(78, natural, {"model", "seq_len", "loss", "elapsed", "device"}, {"grid"})
    assert {"model", "seq_len", "state", "progress", "accuracy"} <= set(cols)
    assert cols["model"] == 11  # a key column: whole, never truncated
    # the seeds and the grid point vary too: they come before loss and time
    cols = layout(78, natural | {"grid": 8}, {"model", "seq_len", "seed", "grid", "loss", "elapsed"})
    assert {"model", "seq_len", "seed", "grid"} <= set(cols) and "elapsed" not in cols
    # a truncatable column leaves room for the key columns after it
    cols = layout(78, natural | {"grid": 30}, {"grid", "seq_len", "model"})
    assert cols["seq_len"] == 7 and cols["model"] == 11 and 10 <= cols["grid"] < 30


@pytest.mark.parametrize("kind", ["lengths", "grid"])
async def test_a_sweeps_runs_read_apart_at_80x24(store, tmp_path, kind):
    if kind == "lengths":  # 2 models x 2 lengths x 2 seeds, a long profile name
        ids = sweep(store, models=("lstm", "transformer"), seeds=(0, 1), seq_lens=(16, 32))
        store.conn.execute("UPDATE runs SET profile='a-length-sweep-with-a-long-name'")
        store.conn.commit()
    else:
        ids = grid_sweep(store)
    for i, rid in enumerate(ids):
        finish(store, rid, [1.0, 0.99712, 0.09375, 0.5][i % 4], loss=2.0 - i / 10)
    # as runs end: each its own time (loss and time vary too, but tell no run's settings)
    store.conn.execute("UPDATE runs SET started = ended - 30 - 7 * id")
    store.conn.commit()
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await poll(pilot)
        await pilot.pause()
        header, rows, cols = table_lines(app)
        assert len(rows) == len(ids)
        want = {"model", "seq_len", "accuracy", "state"} | ({"seed"} if kind == "lengths" else {"grid"})
        assert want <= set(header.split()), header
        # every row reads differently once its id is left out: the varying axes are shown
        rest = [re.sub(r"^\s*\d+", "", line).strip() for line in rows]
        assert len(set(rest)) == len(rows), "\n".join(rows)
        no_ellipsis_in_key_columns(cols, rows)
        assert "1.000" in rows[0] and "0.997" in rows[1] and "0.094" in rows[2]  # three decimals each


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


def footer_line(app) -> str:
    return screen_lines(app)[-1]


async def test_footers_hold_their_important_keys_at_120_columns(store, tmp_path):
    sweep(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        await pilot.pause()
        line = footer_line(app)
        for key in ("? Keys", "space Mark", "k Kill", "r Resume", "c Compare", "f This profile",
                    "/ Filter", "s Sort", "q Quit"):
            assert key in line, (key, line)
        assert line.index("? Keys") < line.index("space")  # ? first: it stays at 80 columns
        await pilot.press("f2")
        await pilot.pause()
        line = footer_line(app)
        for key in ("? Keys", "esc Clear filter", "^s Save", "^o Load", "^r Launch", "^q Quit"):
            assert key in line, (key, line)
        await pilot.press("f3")
        await pilot.pause()
        line = footer_line(app)
        for key in ("? Keys", "m Metric", "w Write", "f Figures", "q Quit"):
            assert key in line, (key, line)
        # the keys the footer leaves out are still in ?'s list, in long words
        await pilot.press("f1", "question_mark")
        await pilot.pause()
        text = str(app.screen.query_one("#help-text", Static).render())
        for words in ("Compare every run of this run's profile", "Reverse the sort order", "New sweep"):
            assert words in text


async def test_footer_shows_the_help_key_at_80_columns(store, tmp_path):
    sweep(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await poll(pilot)
        assert footer_line(app).lstrip().startswith("? Keys")


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
def record_frames(app, what) -> list:
    """``what(app)`` at every frame the app paints (a frame held by a batch is not painted)."""
    frames: list = []
    real = app._display

    def display(screen, renderable):
        if renderable is not None and not app._batch_count:
            frames.append(what(app))
        return real(screen, renderable)

    app._display = display
    return frames


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


async def test_runs_table_is_drawn_aligned_in_every_frame_after_a_launch(store, tmp_path):
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=(80, 24)) as pilot:
        def drawn(app):
            try:
                return table_lines(app) if app.query_one("#runs").display else None
            except StopIteration:  # no header drawn yet
                return None

        frames = record_frames(app, drawn)
        prof = profiles.loads(tomli_w.dumps({
            "schema_version": 1, "name": "launched",
            "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                     "num_train_examples": 64, "num_test_examples": 16},
            "sweep": {"models": ["lstm", "transformer"], "seq_lens": [16, 24, 32], "seeds": [0]},
            "model": {"d_model": 8, "n_layers": 1},
            "train": {"steps": 4, "batch_size": 4, "device": "cpu"},
        }))
        app.post_message(SweepForm.Launch(prof))
        await poll(pilot)
        ids = sorted(r.id for r in store.runs())
        store.mark_started(ids[0], os.getpid(), "cpu", None)  # the first starts, then logs
        await poll(pilot)
        store.heartbeat(ids[0], progress=0.5, last_loss=2.25, last_accuracy=0.25)
        await poll(pilot)
        finish(store, ids[0], 0.5)
        store.mark_started(ids[1], os.getpid(), "cpu", None)
        await poll(pilot)
        shown = [f for f in frames if f and f[1]]
        assert shown
        for header, rows, cols in shown:
            # the seq_len and accuracy cells (right-justified) end where their header ends
            for name in ("seq_len", "accuracy"):
                assert name in header, header
                end = header.index(name) + len(name)
                for line in rows:
                    last = line[end - 1:end]
                    assert line[end:end + 1].strip() == "" and (last.isdigit() or name == "accuracy" and last == " "), \
                        f"{name} misaligned:\n{header}\n{line}"
            no_ellipsis_in_key_columns(cols, rows)
            for line in rows:  # the whole model name, the whole length
                row = cells(cols, line)
                assert row["model"] in ("lstm", "transformer") and row["seq_len"] in ("16", "24", "32"), \
                    "\n".join([header, *rows])


# ---------------------------------------------------------------------------- item 8
async def test_compare_on_an_epoch_axis_says_the_runs_have_no_epochs(store, tmp_path):
    ids = sweep(store, seeds=(0,))
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
        # fresh batches: loss logged by step, with no epoch
        store.add_metrics(rid, [(i, None, "train", "loss", 2.0 - i / 10) for i in range(3)])
        store.finish(rid, "finished")
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        await pilot.press("p")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        screen.poll()
        await settle(pilot)
        await pilot.press("x")  # step -> epoch
        await pilot.pause()
        assert screen.axis == "epoch"
        empty = screen.query_one("#compare-loss", CurvePlot).empty_text
        assert "ended without logging it" not in empty
        assert "logged it" in empty and "no epochs" in empty and "x:" in empty


async def test_notifications_leave_the_status_lines_in_view(store, tmp_path):
    from textual.widgets._toast import Toast

    sweep(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:  # (tests hide them by default)
        await poll(pilot)
        app.notify("a notification with a few words in it, long enough to wrap at 80 columns")
        await pilot.pause(0.3)
        toasts = list(app.screen.query(Toast))
        assert toasts
        summary = app.query_one("#runs-summary").region
        assert all(not t.region.overlaps(summary) for t in toasts), (toasts[0].region, summary)
        await pilot.press("f2", "ctrl+s")  # a failed save: the form's status box at the bottom
        await pilot.pause()
        app.notify("another one")
        await pilot.pause(0.3)
        status = app.query_one("#form-status").region
        assert status.height and all(not t.region.overlaps(status) for t in app.screen.query(Toast))


async def test_the_status_lines_leave_out_a_profile_whose_runs_all_ended(store, tmp_path):
    """A profile whose runs ended, some killed, is not done (2/4) but no longer under way:
    the lines under the runs table show the profiles still running or pending, as ``runs``
    says which (ProfileProgress.under_way)."""
    ended = sweep(store)  # profile cmp: 2 finished, 2 killed
    for rid in ended[:2]:
        finish(store, rid, 0.9)
    for rid in ended[2:]:
        store.finish(rid, "killed", "killed by user")
    grid_sweep(store)  # pending
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        summary = str(app.query_one("#runs-summary", Static).render())
        assert "a-grid-sweep-with-a-long-name: 0/4 done" in summary
        assert "cmp:" not in summary, summary


async def test_results_tab_says_a_sweep_is_under_way(store, tmp_path):
    ids = sweep(store)
    store.mark_started(ids[0], os.getpid(), "cpu", None)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        view.poll()
        await settle(pilot)
        caption = str(view.query_one("#results-caption", Static).render())
        assert "F2 launches" not in caption and "1 running" in caption and "3 pending" in caption
    empty = Store(tmp_path / "empty")
    app = make_app(empty, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        assert "F2 launches a sweep" in str(app.query_one("#results-caption", Static).render())


async def test_r_on_one_run_asks_before_it_resumes(store, tmp_path, monkeypatch):
    from workbench.execute import resume

    ids = sweep(store, seeds=(0,))
    store.mark_started(ids[0], os.getpid(), "cpu", None)
    store.finish(ids[0], "killed", "killed by user")
    resumed = []
    monkeypatch.setattr(resume, "resume_runs", lambda st, rids, *a, **k: (resumed.append(list(rids)) or
                                                                        (list(rids), [])))
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll(pilot)
        app.query_one(RunsTable).move_cursor(row=0)
        await pilot.press("r")  # nothing marked: the run under the cursor
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert f"Resume run {ids[0]}" in str(app.screen.query_one("#question", Static).render())
        await pilot.press("n")
        await settle(pilot)
        assert resumed == []
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("y")
        await settle(pilot)
        assert resumed == [[ids[0]]]
        app.query_one(RunsTable).move_cursor(row=1)  # a finished run: nothing to resume, no question
        store.mark_started(ids[1], os.getpid(), "cpu", None)
        store.finish(ids[1], "finished")
        await poll(pilot)
        await pilot.press("r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


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
            # the task's handler awaits its parameter inputs' rebuild: on a loaded machine
            # one settle may return before it has filled the task's training settings
            for _ in range(3):
                await settle(pilot)
                await pilot.pause(0.05)

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
            await settle(pilot)
            assert form._params_task == name
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
