"""The TUI's part of issue 32 (the first hour, again) outside the sweep form, each as a test
that fails when it comes back: a length sweep's runs read apart at 80x24 (the sweep's varying
axes kept, no ellipsis in key columns, accuracies printed alike) and a launched sweep's table
drawn aligned in every frame; the footers hold their important keys; the compare view's empty
epoch plot, notifications, the status lines, the Results caption during a sweep and `r`'s
confirmation. The sweep form's part: test_first_hour_form.py."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import tomli_w
from textual.widgets import Static

from helpers import record_frames, screen_lines
from test_curves import sweep
from test_tui import FakeScheduler, make_app, open_compare, poll, settle
from workbench.spec import profile as profiles
from workbench.store import Store
from workbench.tui.dialogs import ConfirmScreen
from workbench.tui.plots import CurvePlot
from workbench.tui.results_view import ResultsView
from workbench.tui.run_cells import layout
from workbench.tui.runs_table import RunsTable
from workbench.tui.sweep_form import SweepForm


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
        # (eval acc; a grid of one key is headed by it: lr)
        want = {"model", "seq_len", "acc", "state"} | ({"seed"} if kind == "lengths" else {"lr"})
        assert want <= set(header.split()), header
        # every row reads differently once its id is left out: the varying axes are shown
        rest = [re.sub(r"^\s*\d+", "", line).strip() for line in rows]
        assert len(set(rest)) == len(rows), "\n".join(rows)
        no_ellipsis_in_key_columns(cols, rows)
        assert "1.000" in rows[0] and "0.997" in rows[1] and "0.094" in rows[2]  # three decimals each


# ---------------------------------------------------------------------------- item 6
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
            for name in ("seq_len", "eval acc"):
                assert name in header, header
                end = header.index(name) + len(name)
                for line in rows:
                    last = line[end - 1:end]
                    assert line[end:end + 1].strip() == "" and (last.isdigit() or name == "eval acc" and last == " "), \
                        f"{name} misaligned:\n{header}\n{line}"
            no_ellipsis_in_key_columns(cols, rows)
            for line in rows:  # the whole model name, the whole length
                row = cells(cols, line)
                assert row["model"] in ("lstm", "transformer") and row["seq_len"] in ("16", "24", "32"), \
                    "\n".join([header, *rows])


# ---------------------------------------------------------------------------- item 5
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
        screen = await open_compare(pilot)
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
