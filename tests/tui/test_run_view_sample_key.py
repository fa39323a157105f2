"""The run view offers `g` (Sample text) where there is text to sample: an lm run's view
(issue 42 item 2: "the run view offers it for finished lm runs"), not an evaluation run's,
whose footer listed it and whose `g` only said it was refused."""
from __future__ import annotations

from textual.widgets._footer import FooterKey

import os

from test_tui import make_app, settle, store  # noqa: F401
from test_tui_lm_perplexity_first import lm_store
from workbench.spec.eval_spec import eval_spec
from workbench.tui.run_view import RunScreen


def stored_eval(store) -> int:  # noqa: F811
    """A finished evaluation run with one task's results, as eval_run stores them."""
    (rid,) = store.add_runs([eval_spec("org/neox", ["tiny_py"], profile="eval", label="neox")])
    store.mark_started(rid, os.getpid(), "cpu", None)
    store.set_results(rid, {"bits_per_byte": 4.55, "samples": 5.0}, eval_set="tiny_py")
    store.set_results(rid, {"params": 1000.0}, eval_set="")
    store.finish(rid, "finished")
    return rid


def keys(screen) -> set[str]:
    return {w.key for w in screen.query(FooterKey)}


async def test_g_is_offered_in_an_lm_runs_view_and_not_in_an_evaluations(store, tmp_path):  # noqa: F811
    lm = lm_store(store, tmp_path)[0]
    evaluation = stored_eval(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(RunScreen(store, evaluation, app.store_lock))
        await settle(pilot)
        assert app.screen.run is not None and "g" not in keys(app.screen), keys(app.screen)
        assert "k" in keys(app.screen)
        app.pop_screen()
        app.push_screen(RunScreen(store, lm, app.store_lock))
        await settle(pilot)
        assert "g" in keys(app.screen), keys(app.screen)
