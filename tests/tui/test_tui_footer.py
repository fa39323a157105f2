"""The footer at 80 columns: every key it draws is whole (a key that does not fit is
dropped, with the keys after it, rather than cut mid-word: "f Thi")."""
from __future__ import annotations

from textual.widgets._footer import FooterKey

from helpers import screen_lines
from test_curves import sweep
from test_tui import make_app, poll, settle
from workbench.store import Store
from workbench.tui.help_screen import KeysFooter


def footer_check(app) -> tuple[list[str], list[str]]:
    """(the descriptions of the keys drawn, of the keys hidden); fails on a key drawn past
    the footer's edge or not drawn whole."""
    footer = app.screen.query_one(KeysFooter)
    line = screen_lines(app)[footer.region.y]
    shown, hidden = [], []
    for key in footer.query(FooterKey):
        if not key.display:
            hidden.append(key.description)
            continue
        r = key.region
        assert r.width > 0 and r.right <= footer.region.right, f"{key.description!r} past the edge: {line!r}"
        text = f"{key.key_display} {key.description}"
        assert text in line, f"{text!r} not whole in the footer {line!r}"
        shown.append(key.description)
    return shown, hidden


async def test_every_footer_key_is_whole_at_80_columns(tmp_path):
    """The runs tab, the results tab and the sweep form in turn (one app): at 80 columns
    every key drawn is whole, ? first; at 200 the dropped keys come back."""
    store = Store(tmp_path / "store")
    sweep(store, seq_lens=(16, 32))
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await poll(pilot)
        for tab, key in [("runs", "f1"), ("results", "f3"), ("sweep", "f2")]:
            if tab != "runs":  # (the runs tab: as the app starts)
                await pilot.resize_terminal(80, 24)
                await pilot.press(key)
                await settle(pilot)
            await pilot.pause(0.1)
            shown, hidden = footer_check(app)
            assert shown and shown[0] == "Keys", (tab, shown)  # ? first, always
            if tab == "runs":
                # the runs table's keys do not all fit in 80 columns: the last are dropped whole
                assert hidden and "This profile" in hidden and "Open" in shown
            # wider again: the dropped keys come back
            await pilot.resize_terminal(200, 24)
            await pilot.pause(0.1)
            assert footer_check(app)[1] == [], tab
