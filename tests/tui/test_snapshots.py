"""Snapshot tests of the main screens (pytest-textual-snapshot): each screen is rendered
to SVG at a fixed terminal size over a store with fixed contents and compared with the
accepted picture in tests/tui/__snapshots__/test_snapshots/. A visual change fails here;
after looking at the report (the failing test writes an HTML diff), accept it with
``pytest tests/tui/test_snapshots.py --snapshot-update``.

The pictures depend on Textual's rendering, so they are compared only under the Textual
version they were recorded with (``SNAPSHOT_TEXTUAL``); under another the tests skip and
say so - update the pictures after checking them.
"""
from __future__ import annotations

import math
from importlib.metadata import version

import pytest
from textual.widgets import Input

from test_curves import sweep
from helpers import workers_done
from test_tui import FakeScheduler
from workbench.store import Store
from workbench.tui import run_view
from workbench.tui.app import WorkbenchApp

SNAPSHOT_TEXTUAL = "8.2.8"
SIZE = (140, 40)
T0 = 1_700_000_000.0  # fixed times: elapsed columns and wall axes do not depend on the clock

pytestmark = pytest.mark.skipif(
    version("textual") != SNAPSHOT_TEXTUAL,
    reason=f"snapshots recorded with textual {SNAPSHOT_TEXTUAL}, this is {version('textual')}: "
           "check the screens and run pytest tests/tui/test_snapshots.py --snapshot-update")


def fixed_store(root) -> Store:
    """lstm and transformer, seeds 0 and 1, at L=16 and 32: 8 finished runs with smooth
    loss and accuracy curves and results; one more run pending."""
    store = Store(root)
    ids = sweep(store, seq_lens=(16, 32))
    for i, rid in enumerate(ids):
        model, long, seed = i // 4, (i // 2) % 2, i % 2
        rate = 0.1 + 0.1 * model + 0.05 * long + 0.02 * seed
        store.add_metrics(rid, [(s, s / 10, "train", "loss", 2.5 * math.exp(-rate * s) + 0.1)
                                for s in range(0, 41)])
        store.add_metrics(rid, [(s, s / 10, "eval", "accuracy", 1 - 0.8 * math.exp(-rate * s))
                                for s in range(10, 41, 10)])
        store.set_results(rid, {"accuracy": 0.9 - 0.1 * model + 0.01 * seed - 0.02 * (i % 4 > 1),
                                "step_time_ms": 12.0 + 5 * model, "params": 1000 + 500 * model})
        store.conn.execute(
            "UPDATE runs SET state='finished', device='cpu', started=?, ended=?, heartbeat=?,"
            " progress=1.0, step=40, total_steps=40, epoch=4, last_loss=?, last_accuracy=?"
            " WHERE id=?", (T0, T0 + 30 + 5 * i, T0 + 30 + 5 * i, 0.1 + 0.01 * i, 0.9, rid))
        store.conn.execute("UPDATE metrics SET t=? + step WHERE run_id=?", (T0, rid))
    store.conn.commit()
    sweep(store, models=("lstm",), seeds=(2,), seq_lens=(16,))  # a queued run
    return store


def make(tmp_path, monkeypatch) -> WorkbenchApp:
    # the system panel says what NVML found: the same words on every machine here
    monkeypatch.setattr(run_view, "nvml_note", lambda: "No NVIDIA GPU (snapshot)")
    return WorkbenchApp(store=fixed_store(tmp_path / "store"), profiles_dir=tmp_path / "profiles",
                        scheduler=FakeScheduler(), figures_dir=tmp_path / "figures")


async def settled(pilot) -> None:
    pilot.app.sub_title = "store"  # not the temporary path
    for _ in range(3):  # the 2 Hz polls: let each view read and draw
        await workers_done(pilot.app)
        await pilot.pause(0.3)
    await workers_done(pilot.app)
    for inp in pilot.app.screen.query(Input):  # a blinking cursor is on in some pictures only
        inp.cursor_blink = False
    await pilot.pause()


# each main screen: the keys that reach it from the runs table
SCREENS = {
    "runs_table": (),
    "run_view": ("enter",),
    "compare_view_grouped_over_seeds": ("p",),
    "results_tab": ("f3",),
    "sweep_form": ("f2",),
}


@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(screen, snap_compare, tmp_path, monkeypatch):
    async def reach(pilot):
        await settled(pilot)
        if SCREENS[screen]:
            await pilot.press(*SCREENS[screen])
            await settled(pilot)

    assert snap_compare(make(tmp_path, monkeypatch), terminal_size=SIZE, run_before=reach)
