"""Pilot tests of the runs table (grid values and task settings, sort, filter, acting on the
marked runs, narrow terminals) and of the Results tab's grid selection (best over chosen
grid keys, selected on validation or test, Welch winners as in export)."""
from __future__ import annotations

import pytest
from textual.widgets import DataTable, Select, Static

from helpers import paste_into, screen_lines
from test_results_layer import add
from test_tui import FakeScheduler, make_app, settle
from workbench.results import export
from workbench.results import aggregate as agg
from workbench.store import Store
from workbench.tui.results_view import NONE, ResultsView, over_options
from workbench.tui.runs_table import RunsTable

SIZE = (160, 48)


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


def text(widget: Static) -> str:
    return str(widget.render())


def cells(table: DataTable) -> dict[str, list[str]]:
    return {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)[1:]]
            for i in range(table.row_count)}


# --------------------------------------------------------------------------- Results tab
def grid_runs(store: Store) -> None:
    """lstm and mamba over train.lr in {0.1, 0.01} x train.weight_decay {0.0}, seeds 0-2. The
    validation set prefers lr 0.01 for both, the test set lr 0.1 for the lstm; at lr 0.01 the
    lstm (0.71) beats the mamba (0.50) beyond the seed noise."""
    test = {("lstm", 0.1): (0.95, 0.93, 0.94), ("lstm", 0.01): (0.70, 0.72, 0.71),
            ("mamba", 0.1): (0.40, 0.42, 0.41), ("mamba", 0.01): (0.50, 0.52, 0.48)}
    valid = {0.1: 0.60, 0.01: 0.80}
    for (model, lr), accs in test.items():
        for seed, acc in enumerate(accs):
            add(store, model, seed, {"": {"accuracy": acc}, "valid": {"accuracy": valid[lr] + seed / 100}},
                **{"train.lr": lr, "train.weight_decay": 0.0})


def test_over_options_all_keys_first_then_smaller_sets_then_none():
    assert over_options([]) == [NONE]
    assert over_options(["a", "b"]) == ["a, b", "a", "b", NONE]
    six = over_options(list("abcdef"))  # beyond 4 keys: all, all but one, each alone, none
    assert six[0] == "a, b, c, d, e, f" and len(six) == 1 + 6 + 6 + 1


async def test_results_tab_best_over_and_select_on(store, tmp_path):
    grid_runs(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        view.out_dir = tmp_path / "out"
        await pilot.press("f3")
        await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        caption = view.query_one("#results-caption", Static)
        # default: the best over every grid key of the profile, selected on validation
        assert view.options["over"] == over_options(["train.lr", "train.weight_decay"])
        assert view.selection() == (["train.lr", "train.weight_decay"], "validation")
        assert "best over train.lr, train.weight_decay, selected on validation" in text(caption)
        assert cells(table) == {"lstm": ["0.710 ± 0.010"], "mamba": ["0.500 ± 0.020"]}  # lr 0.01's test numbers
        # the winners rule of export: lstm beats mamba beyond the seed noise
        assert table.get_row_at(0)[1].style == "bold green" and table.get_row_at(1)[1].style == ""
        # the chosen grid point of the cell under the cursor
        table.focus()
        table.move_cursor(row=0, column=1)
        await pilot.pause()
        line = text(view.query_one("#results-cell", Static))
        assert "train.lr=0.01" in line and "best of 2 grid point(s) by validation accuracy" in line

        await pilot.press("v")  # selected on test: the anchors' practice, labelled so
        await settle(pilot)
        assert view.selection()[1] == "test"
        assert "selected on test" in text(caption)
        assert cells(table)["lstm"] == ["0.940 ± 0.010"]
        await pilot.press("w")  # the written table has the same selection and verdict
        await settle(pilot)
        written = sorted((tmp_path / "out" / "p").glob("*.md"))  # the profile's folder
        assert len(written) == 1 and "best-over-train.lr-train.weight_decay-on-test" in written[0].name
        recs = agg.records(store, "p")
        assert written[0].read_text() == export.render(
            recs, "accuracy", ["model"], ["seq_len"], "md", best_over=["train.lr", "train.weight_decay"],
            select_on="test")
        assert "selected on test" in written[0].read_text()

        while view._value("over") != NONE:  # b cycles the keys: ..., then none
            await pilot.press("b")
        await settle(pilot)
        assert "no best-over: every run of a cell counts" in text(caption)
        # the two learning rates are not pooled as seeds (issue 41): train.lr becomes a row
        # key, and the caption says so
        assert "train.lr varies within cells: added as a row key" in text(caption)
        assert cells(table)["model=lstm, train.lr=0.01"] == ["0.710 ± 0.010"]
        assert cells(table)["model=lstm, train.lr=0.1"] == ["0.940 ± 0.010"]
        await pilot.press("b")  # back to all keys
        await settle(pilot)
        assert view.selection()[0] == ["train.lr", "train.weight_decay"]

        # rows by a grid key: that key is the table's rows, not selected over
        view.query_one("#results-rows", Select).value = "train.lr"
        await settle(pilot)
        assert view.selection()[0] == ["train.weight_decay"]
        # each cell one model's runs: the model is added as a row key (issue 41)
        assert sorted(cells(table)) == ["train.lr=0.01, model=lstm", "train.lr=0.01, model=mamba",
                                        "train.lr=0.1, model=lstm", "train.lr=0.1, model=mamba"]


async def test_results_tab_w_on_a_full_disk_leaves_no_file_and_says_so(store, tmp_path, monkeypatch):
    """``w`` writes each table whole or not at all (export.write_atomic): a full disk leaves no
    0-byte or half file that looks like a result, and says so in one line (no traceback)."""
    import errno
    from pathlib import Path

    grid_runs(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        view.out_dir = tmp_path / "out"
        await pilot.press("f3")
        await settle(pilot)
        real = Path.write_text

        def full(self, data, *args, **kwargs):  # a few bytes fit, then the disk is full
            real(self, data[:3], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(Path, "write_text", full)
        await pilot.press("w")
        await settle(pilot)
        monkeypatch.undo()
        assert app.is_running
        assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []
        [note] = [n for n in app._notifications if n.severity == "error"]
        assert "disk full" in note.message and "nothing was written" in note.message
        assert "\n" not in note.message and "Traceback" not in note.message
        await pilot.press("w")  # room again: all three formats
        await settle(pilot)
        assert sorted(p.suffix for p in (tmp_path / "out").rglob("*") if p.is_file()) == [".csv", ".md", ".tex"]


async def test_results_tab_without_validation_results_says_so(store, tmp_path):
    for lr in (0.1, 0.01):
        for seed in (0, 1):
            add(store, "lstm", seed, {"": {"accuracy": 0.5 + lr + seed / 100}}, **{"train.lr": lr})
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(ResultsView)
        await pilot.press("f3")
        await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        # never a silent fall-back to the test set or to every run
        assert table.row_count == 0 and "no validation results" in text(view.query_one("#results-caption", Static))
        await pilot.press("v")
        await settle(pilot)
        assert cells(table) == {"lstm": ["0.605 ± 0.007"]}  # lr 0.1, chosen on test


# --------------------------------------------------------------------------- runs table
GRID_PROFILE = """\
schema_version = 2
name = "grid"
[[tasks]]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
seq_len = 16
variants = { vocab_size = [12] }
[sweep]
models = ["lstm", "transformer"]
seeds = [0]
[sweep.grid]
"train.lr" = [1e-4, 1e-3]
"train.weight_decay" = [0.0, 0.1]
[model]
d_model = 8
n_layers = 1
[train]
steps = 4
batch_size = 4
device = "cpu"
"""


def grid_store(store: Store) -> list[int]:
    """16 runs: 2 task settings (baseline, vocab_size=12) x 2 models x 2 lr x 2 wd; runs 1-4
    finished with accuracies 0.4, 0.9, 0.1, 0.6, run 5 running, the rest pending."""
    from workbench.spec import profile as profiles

    ids = store.add_runs(s.to_dict() for s in profiles.expand(profiles.loads(GRID_PROFILE)))
    for rid, acc in zip(ids[:4], (0.4, 0.9, 0.1, 0.6)):
        store.conn.execute("UPDATE runs SET state='finished', started=1, ended=2, progress=1.0, "
                           "last_accuracy=? WHERE id=?", (acc, rid))
    store.conn.execute("UPDATE runs SET state='running', started=?, heartbeat=?, progress=0.5 WHERE id=?",
                       (1e9, 4e9, ids[4]))  # a heartbeat far ahead: reap leaves it be
    store.conn.commit()
    return ids


def row_ids(table) -> list[int]:
    return [int(table.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(table.row_count)]


def plain(table, rid: int, col: str) -> str:
    c = table.get_cell(str(rid), col)
    return c.plain if hasattr(c, "plain") else str(c)


def test_grid_labels_and_compact_values():
    from workbench.tui.run_cells import compact, grid_labels

    assert grid_labels(["train.lr", "train.weight_decay", "model.options.mamba.d_state"]) == \
        {"train.lr": "lr", "train.weight_decay": "wd", "model.options.mamba.d_state": "d_state"}
    # tails that would be ambiguous keep enough parts
    assert grid_labels(["model.d_model", "task.d_model"]) == {"model.d_model": "model.d_model",
                                                              "task.d_model": "task.d_model"}
    assert [compact(v) for v in (1e-4, 5e-4, 0.1, 0.0, 16, 3e-05, "cosine", True)] == \
        ["1e-4", "5e-4", "0.1", "0", "16", "3e-5", "cosine", "true"]


async def test_runs_table_shows_grid_values_and_task_setting(store, tmp_path):
    ids = grid_store(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        assert [plain(table, rid, "grid") for rid in ids[:4]] == \
            ["lr=1e-4 wd=0", "lr=1e-4 wd=0.1", "lr=1e-3 wd=0", "lr=1e-3 wd=0.1"]
        assert plain(table, ids[0], "task") == "mad_selective_copying"  # the baseline
        assert plain(table, ids[-1], "task") == "mad_selective_copying [vocab_size=12]"
        assert str(table.columns["grid"].label) == "grid"


async def test_runs_table_sorts_by_any_column(store, tmp_path):
    ids = grid_store(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        assert str(table.columns["id"].label) == "id ▲" and row_ids(table) == ids
        table.move_cursor(row=1)  # run ids[1]
        while table.sort_column != "accuracy":
            await pilot.press("s")  # the next column
        await pilot.pause()
        assert str(table.columns["accuracy"].label) == "eval acc ▲" and str(table.columns["id"].label) == "id"
        got = row_ids(table)
        assert got[:4] == [ids[2], ids[0], ids[3], ids[1]]  # 0.1 0.4 0.6 0.9, then no accuracy
        assert got[4:] == ids[4:]
        assert table.current_run_id == ids[1]  # the cursor stays on its run
        await pilot.press("S")  # the other direction; runs without a value still last
        await pilot.pause()
        assert str(table.columns["accuracy"].label) == "eval acc ▼"
        assert row_ids(table)[:4] == [ids[1], ids[3], ids[0], ids[2]] and row_ids(table)[4:] == ids[4:]
        # the order holds across polls, and a changed value moves its row
        store.conn.execute("UPDATE runs SET last_accuracy=0.95 WHERE id=?", (ids[2],))
        store.conn.commit()
        app.poll_runs()
        await settle(pilot)
        assert row_ids(table)[:2] == [ids[2], ids[1]]
        table.sort_by("grid")  # by the grid point's values, numerically
        await pilot.pause()
        lrs = [plain(table, rid, "grid") for rid in row_ids(table)]
        assert lrs == sorted(lrs, key=lambda g: [float(p.split("=")[1]) for p in g.split()])
        table.sort_by("state")
        await pilot.pause()
        assert plain(table, row_ids(table)[0], "state") == "running"


async def test_runs_table_filters_by_profile_model_state(store, tmp_path):
    ids = grid_store(store)
    other = store.add_runs([{"profile": "other", "model": "mamba", "label": "mamba", "task": "t",
                             "seq_len": 8, "seed": 0, "fields": {}}])
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        from workbench.tui.run_filter import FilterScreen
        table = app.query_one(RunsTable)
        assert table.row_count == 17
        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.screen, FilterScreen)
        assert "profiles: grid, other" in str(app.screen.query_one("#filter-hint", Static).render())
        await paste_into(pilot, "#filter-input", "state:finished,running model:lstm")  # (typed: seconds)
        await pilot.press("enter")
        await settle(pilot)
        shown = set(row_ids(table))
        assert shown == {r.id for r in table.all_runs if r.state in ("finished", "running") and r.label == "lstm"}
        assert shown and table.filter_label == "filter state:finished,running model:lstm"
        # the line under the table counts what the filter shows, and says which filter
        line = str(app.query_one("#runs-summary", Static).render())
        assert line.startswith(f"{len(shown)} runs ") and "filter state:finished,running model:lstm" in line
        await pilot.press("slash")
        await pilot.pause()
        app.screen.query_one("#filter-input").value = ""
        await pilot.press(*"mamba", "enter")  # a bare word: any of profile, model, task, state
        await settle(pilot)
        assert row_ids(table) == other
        await pilot.press("slash")
        await pilot.pause()
        app.screen.query_one("#filter-input").value = "colour:red"
        await pilot.press("enter")
        await pilot.pause()
        assert "unknown key 'colour'" in str(app.screen.query_one("#filter-error", Static).render())
        await pilot.press("escape")  # keeps the filter as it was
        await pilot.pause()
        assert row_ids(table) == other
        await pilot.press("f")  # f with a filter: every run again
        await pilot.pause()
        assert table.row_count == 17 and not table.filter
        table.move_cursor(row=0)
        await pilot.press("f")  # only this profile
        await pilot.pause()
        assert table.profile_filter == "grid" and sorted(row_ids(table)) == ids
        assert table.filter_label == "profile grid only"


async def test_kill_and_resume_every_marked_run_after_one_confirmation(store, tmp_path, monkeypatch):
    from workbench.execute import resume
    from workbench.tui.dialogs import ConfirmScreen

    ids = grid_store(store)
    sched = FakeScheduler()
    resumed = []
    monkeypatch.setattr(resume, "resume_runs", lambda st, rids, *a, **k: (resumed.append(list(rids)) or
                                                                        (list(rids), [])))
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(RunsTable)
        table.move_cursor(row=3)  # finished run ids[3], then running ids[4], pending ids[5]
        await pilot.press("space")
        assert table.cursor_row == 4  # space marks and moves down, as the footer says
        await pilot.press("space", "space")
        assert table.marked == {ids[3], ids[4], ids[5]}
        from textual.widgets._footer import FooterKey

        assert any(k.key == "space" and "down" in k.description for k in app.query(FooterKey))
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        question = str(app.screen.query_one("#question", Static).render())
        assert "Kill 2 marked runs" in question and f"{ids[4]}, {ids[5]}" in question
        assert "1 more marked run already ended" in question
        await pilot.press("y")
        await settle(pilot)
        assert sorted(sched.killed) == [ids[4], ids[5]]  # the finished one is left alone
        app.poll_runs()
        await settle(pilot)
        assert plain(table, ids[4], "state") == plain(table, ids[5], "state") == "killed"
        await pilot.press("r")
        await pilot.pause()
        question = str(app.screen.query_one("#question", Static).render())
        assert "Resume 2 marked runs" in question and "1 more marked run" in question
        await pilot.press("n")  # no: nothing happens
        await settle(pilot)
        assert resumed == []
        await pilot.press("r", "y")
        await settle(pilot)
        assert resumed == [[ids[4], ids[5]]]
        # nothing marked: the run under the cursor, confirmed by the app as before
        await pilot.press("u")
        table.move_cursor(row=6)
        await pilot.press("k")
        await pilot.pause()
        assert f"Kill run {ids[6]}" in str(app.screen.query_one("#question", Static).render())


@pytest.mark.parametrize("size", [(80, 24), (115, 30)])
async def test_small_terminal_keeps_state_progress_accuracy(store, tmp_path, size):
    grid_store(store)
    store.conn.execute("UPDATE runs SET profile='a-profile-name-that-is-long' WHERE id > 8")
    store.conn.commit()
    app = make_app(store, tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.pause()
        table = app.query_one(RunsTable)
        header = next(line for line in screen_lines(app) if " id ▲" in line)
        for name in ("state", "progress", "eval acc", "model"):
            assert f" {name} " in header + " ", (name, header)
        assert len(header.rstrip()) <= size[0]
        # every column shown fits: no horizontal scrolling
        assert table.virtual_size.width <= table.size.width
        assert "device" not in table.columns  # the least useful (the same on every row) went first
        await pilot.press("f")  # one profile: its column no longer tells rows apart
        await pilot.pause()
        assert "profile" not in table.columns
        if size[0] == 115:  # room for one more column: one whose value varies, not the profile's
            assert "elapsed" in table.columns
    if size[0] != 80:
        return  # (the wide table once, after the narrowest)
    wide = make_app(store, tmp_path)
    async with wide.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        assert {"profile", "task", "grid", "seq_len", "seed", "loss", "elapsed"} <= set(
            wide.query_one(RunsTable).columns)


def test_run_filter_terms_and_label():
    from workbench.store import Run
    from workbench.tui.run_filter import RunFilter

    def mk(**kw) -> Run:
        base = dict(id=1, profile="grid", idx=0, model="mamba", label="mamba-4l", task="mqar", seq_len=8,
                    seed=0, spec={"task_setting": "num_kv_pairs=8"}, fields={}, state="running", device=None,
                    slot=None, host=None, pid=None, pid_start=None, created=0.0, started=None, ended=None,
                    heartbeat=None, progress=0.0, step=0, total_steps=None, epoch=None, last_loss=None,
                    last_accuracy=None, backend=None, error=None, info={}, log_path=None)
        return Run(**{**base, **kw})

    r = mk()
    assert RunFilter("model:mamba")(r) and RunFilter("model:MAMBA-4L")(r)  # registry name or label
    assert RunFilter("state:finished,running")(r) and not RunFilter("state:finished")(r)
    assert RunFilter("profile:gr*")(r) and not RunFilter("profile:gr")(r)  # exact unless *
    assert RunFilter("task:*kv_pairs=8*")(r)  # the task setting
    assert RunFilter("kv")(r) and not RunFilter("lstm")(r)  # a bare word: a substring anywhere
    assert not RunFilter("model:mamba state:pending")(r)  # every term holds
    assert RunFilter("").text() == "" and not RunFilter("")
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        RunFilter("colour:red")
