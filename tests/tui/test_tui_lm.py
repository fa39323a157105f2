"""Pilot tests of the TUI's language-modelling pieces (issue 33 item 5): the ``lm`` task and
a budget in tokens, FLOPs or tokens per parameter in the sweep form (save -> reload gives
the same profile; a loaded token budget is shown, not "None"; the steps it becomes), FLOPs
and tokens as the compare view's x axis, the run view's perplexity and tokens seen, and the
Results tab's scaling fits. Stores are filled through the store's API (no training)."""
from __future__ import annotations

from pathlib import Path

import pytest

from textual.widgets import Input, Select, Static

from helpers import until
from test_tui import SIZE, fill_form, make_app, settle, store, type_into  # noqa: F401
from workbench.spec import profile as profiles
from workbench.tui.dialogs import PathScreen
from workbench.tui.model_picker import ModelPicker
from workbench.tui.sweep_form import SweepForm

LM_PROFILE = """\
schema_version = 2
name = "lm-tokens"
[task]
name = "lm"
source = "{source}"
tokenizer = "bpe"
vocab_size = 300
[sweep]
models = ["transformer", "mamba"]
seq_lens = [32]
seeds = [0]
[model]
d_model = 16
n_layers = 1
[train]
tokens = 20000
batch_size = 4
device = "cpu"
"""


def corpus(tmp_path: Path) -> Path:
    """One text file (nanoGPT's shape; cut by position, each split gets text enough for L 32:
    six documents of a folder would all land in train, which the form's check refuses)."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox {i} jumps over the lazy dog\n" * 20 for i in range(6)))
    return path


def text(widget) -> str:
    return str(widget.render())


async def wait_budget_steps(pilot, form: SweepForm) -> str:
    """The budget's steps line once its count (a thread worker after a pause) is shown."""
    import time

    deadline = time.monotonic() + 60  # (a loaded machine: the first FLOP count imports the models)
    shown = ""
    while time.monotonic() < deadline:
        await pilot.pause(0.1)
        await settle(pilot)
        shown = text(form.query_one("#budget-steps", Static))
        if form._budget_timer is None and "counting" not in shown:
            return shown
    raise AssertionError(f"the budget's steps never showed: {shown!r}")


async def test_lm_task_with_a_token_budget_saves_and_reloads_the_same_profile(store, tmp_path):
    app = make_app(store, tmp_path)
    src = corpus(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        form = app.query_one(SweepForm)
        await type_into(pilot, "#name", "lm-form")
        app.query_one("#models", ModelPicker).set_picked(["transformer"])
        app.query_one("#task", Select).value = "lm"
        await until(pilot, lambda: form._params_task == "lm", timeout=60)   # its inputs mounted
        await settle(pilot)
        # the task's own options are inputs of the form
        for p in ("source", "tokenizer", "vocab_size", "text_column"):
            assert app.query(f"#param-{p}"), p
        app.query_one("#param-source", Input).value = str(src)
        app.query_one("#param-tokenizer", Input).value = "bpe"
        app.query_one("#param-vocab_size", Input).value = "300"
        app.query_one("#seq_lens", Input).value = "32"
        app.query_one("#batch_size", Input).value = "4"
        app.query_one("#budget_kind", Select).value = "tokens"
        await type_into(pilot, "#budget", "20k")
        shown = await wait_budget_steps(pilot, form)
        # 20,000 tokens of 4 x 32 a step: ceil(156.25) = 157 steps
        assert shown.startswith("= 157 steps a run (128 tokens a step)"), shown
        # evaluate every follows the steps the budget became (about 20 evaluations)
        assert app.query_one("#eval_every", Input).value == "8"
        assert "steps, 19 evals" in text(form.query_one("#unit-eval_every", Static))

        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, PathScreen), text(form.query_one("#form-status", Static))
        await pilot.press("enter")
        await settle(pilot)
        path = tmp_path / "profiles" / "lm-form.toml"
        assert path.exists(), text(form.query_one("#form-status", Static))
        saved = path.read_text()
        # the keys a hand-written profile has: a whole number of tokens, no steps
        train = saved.split("[train]\n")[1].split("\n[")[0].splitlines()
        assert "tokens = 20000" in train and not [x for x in train if x.startswith("steps")], saved
        p = profiles.load(path)
        assert p.task.name == "lm" and p.task.params()["tokenizer"] == "bpe"
        assert p.task.params()["vocab_size"] == 300 and p.task.params()["source"] == str(src)
        assert p.train.tokens == 20000 and p.train.steps is None

        # reload: the budget shows in its own unit, and building gives the same profile
        await form.fill(p)
        await settle(pilot)
        assert app.query_one("#budget_kind", Select).value == "tokens"
        assert app.query_one("#budget", Input).value == "20000"
        assert form.build_profile() == p


async def test_a_loaded_flops_or_tokens_per_param_budget_is_shown_and_kept(store, tmp_path):
    src = corpus(tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await app.mount_tab("sweep")  # (mounted when first shown; here it stays hidden)
        form = app.query_one(SweepForm)
        for key, value, shown in (("flops", "3e12", "3e+12"), ("tokens_per_param", "20", "20")):
            p = profiles.loads(LM_PROFILE.format(source=src).replace("tokens = 20000", f"{key} = {value}"))
            await form.fill(p)
            await settle(pilot)
            assert app.query_one("#budget_kind", Select).value == key
            assert app.query_one("#budget", Input).value == shown  # not "None"
            assert form.build_profile() == p
            steps = await wait_budget_steps(pilot, form)
            # the models' steps differ (their FLOPs and parameters do): one part per model
            assert "; steps: transformer " in steps and ", mamba " in steps, steps
            expected = sorted({s.budget["steps"] for s in profiles.expand(p)})
            assert steps.startswith(f"= {expected[0]:,}..{expected[-1]:,} steps"), (steps, expected)


async def test_a_bad_token_budget_is_refused_under_the_budget(store, tmp_path):
    src = corpus(tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, profiles.loads(LM_PROFILE.format(source=src)))
        await type_into(pilot, "#budget", "1.5k2")
        assert "not a number of tokens" in await wait_budget_steps(pilot, form)
        assert form.build_profile() is None
        assert "train for: '1.5k2' is not a number of tokens" in text(form.query_one("#err-budget", Static))
        await type_into(pilot, "#budget", "1e6")
        await wait_budget_steps(pilot, form)
        assert form.build_profile().train.tokens == 1_000_000
        # back to steps: the steps line goes
        app.query_one("#budget_kind", Select).value = "steps"
        await type_into(pilot, "#budget", "50")
        assert await wait_budget_steps(pilot, form) == ""
        assert not form.query_one("#budget-steps", Static).display
        assert form.build_profile().train.steps == 50


# --------------------------------------------------------------------------- compare: x axis
def lm_runs(store, models=("lstm", "transformer"), seeds=(0,)) -> list[int]:
    """Runs (of a small profile; the task does not matter here) that record what an LM
    run records: tokens a step and FLOPs per token in their info, eval loss, perplexity and
    bits per byte at steps 2 and 4, train/flops and tokens_trained beside them."""
    import os

    from test_curves import sweep

    ids = sweep(store, models=models, seeds=seeds)
    for i, rid in enumerate(ids):
        store.mark_started(rid, os.getpid(), "cpu", None)
        fpt = 1e6 * (i + 1)  # each model its own FLOPs per token
        store.set_info(rid, {"tokens_per_step": 128, "flops_per_token": fpt})
        rows = []
        for step, loss in ((2, 3.0 - i / 10), (4, 2.0 - i / 10)):
            rows += [(step, None, "eval", "loss", loss), (step, None, "eval", "perplexity", 2.718 ** loss),
                     (step, None, "eval", "bits_per_byte", loss / 0.693 / 3),
                     (step, None, "train", "tokens_trained", 128 * step),
                     (step, None, "train", "flops", fpt * 128 * step)]
        store.add_metrics(rid, rows)
    return ids


async def test_compare_puts_training_tokens_or_flops_on_the_x_axis(store, tmp_path):
    from test_tui import poll_view
    from workbench.tui.compare_view import CompareScreen
    from workbench.tui.plots import CurvePlot

    ids = lm_runs(store)
    bare = lm_runs(store, models=("lstm",))[0]
    store.set_info(bare, {"tokens_per_step": None, "flops_per_token": None})  # counted nothing
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = CompareScreen(store, ids)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        loss = screen.query_one("#compare-loss", CurvePlot)
        await pilot.press("l")  # train loss -> eval loss (what these runs logged)
        assert screen.loss_metric == ("eval", "loss") and loss.curves
        await pilot.press("l")  # -> perplexity: LM runs offer it
        assert screen.loss_metric == ("eval", "perplexity")
        assert loss.curves[0].mean == [pytest.approx(2.718 ** 3.0), pytest.approx(2.718 ** 2.0)]
        axes = []
        for _ in range(5):
            await pilot.press("x")
            axes.append(screen.axis)
        assert axes == ["epoch", "wall", "tokens", "flops", "step"]
        await pilot.press("x", "x", "x")  # tokens: step x tokens a step
        assert loss.xlabel == "training tokens"
        assert [c.x for c in loss.curves] == [[256.0, 512.0], [256.0, 512.0]]
        await pilot.press("x")  # FLOPs: x each run's FLOPs per token
        assert loss.xlabel == "training FLOPs"
        assert [c.x for c in loss.curves] == [[256e6, 512e6], [512e6, 1024e6]]
        assert "x: flops" in text(screen.query_one("#compare-title", Static))
        await pilot.press("escape")

        # a run without a count has no point against FLOPs, and the plot says why
        screen = CompareScreen(store, [bare])
        app.push_screen(screen)
        await poll_view(pilot, screen)
        await pilot.press("l", "x", "x", "x", "x")
        assert screen.axis == "flops" and not screen.query_one("#compare-loss", CurvePlot).curves
        assert "record no token or FLOP count" in screen.query_one("#compare-loss", CurvePlot).empty_text


# --------------------------------------------------------------------------- run view
async def test_run_view_shows_perplexity_bits_per_byte_and_tokens_seen(store, tmp_path):
    from test_tui import poll_view
    from workbench.tui.run_view import RunScreen

    rid = lm_runs(store)[1]  # FLOPs per token 2e6; eval loss 1.9 at step 4
    store.heartbeat(rid, step=3)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = RunScreen(store, rid)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        title = text(screen.query_one("#run-title", Static))
        assert f"ppl {2.718 ** 1.9:.4g}" in title and f"bpb {1.9 / 0.693 / 3:.4g}" in title, title
        # tokens seen follow the step (3 x 128), not only the last evaluation's count
        assert "384 tokens (7.68e+08 FLOPs)" in title, title
        store.heartbeat(rid, step=4000)
        await poll_view(pilot, screen)
        assert "512k tokens (1.02e+12 FLOPs)" in text(screen.query_one("#run-title", Static))


# --------------------------------------------------------------------------- results: fits
def scaling_grid(store) -> list[int]:
    """Finished runs of lstm and transformer at three widths each (a "model.d_model" grid:
    sizes, which a fit may span; lengths may not, issue 41), loss = a C^-b with b 0.1 and 0.2
    exactly, and two seeds."""
    import os

    import tomli_w

    prof = profiles.loads(tomli_w.dumps({
        "schema_version": 2, "name": "cmp",
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["lstm", "transformer"], "seq_lens": [16], "seeds": [0, 1],
                  "grid": {"model.d_model": [16, 32, 64]}},
        "model": {"n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu"},
    }))
    ids = store.add_runs(s.to_dict() for s in profiles.expand(prof))  # lstm/transformer x 3 widths x seeds 0/1
    runs = {r.id: r for r in store.runs(ids=ids)}
    for rid in ids:
        r = runs[rid]
        b = 0.1 if r.model == "lstm" else 0.2
        d = r.fields["d_model"]
        C = 1e12 * d
        store.mark_started(rid, os.getpid(), "cpu", None)
        store.set_results(rid, {"loss": 50.0 * C ** -b, "accuracy": 0.5, "train_flops": C,
                                "tokens_trained": 1000.0 * d, "flops_per_token": 1e9})
        store.finish(rid, "finished")
    return ids


async def test_results_tab_carries_the_scaling_fits_of_a_grid(store, tmp_path):
    from textual.widgets import DataTable

    from workbench.results import scaling
    from workbench.tui.results_view import ResultsView
    from workbench.tui.scaling_panel import ScalingPanel, short

    scaling_grid(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        panel = view.query_one(ScalingPanel)
        assert view.current()[1] == "accuracy" and panel.display  # not loss-like: the fits of loss
        table = panel.query_one("#scaling-table", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        header, body = scaling.rows(scaling.analyse(store, "cmp", "loss"))
        assert rows == [[short(c) for c in r] for r in body]  # what export --scaling prints
        assert [str(c.label) for c in table.columns.values()] == header == [
            "model", "points", "FLOPs range", "a", "b", "multiplier vs lstm"]
        assert [r[0] for r in rows] == ["lstm", "transformer"]
        assert rows[0][4].startswith("0.100") and rows[1][4].startswith("0.200")  # the exponents
        # b 0.2 gets there sooner (the cell: the multiplier, then its uncertainty where known)
        assert rows[0][5].split()[0] == "1" and float(rows[1][5].split()[0].rstrip("*")) > 1
        assert "loss against training FLOPs" in text(panel.query_one("#scaling-title", Static))
        # the plot: FLOPs, then tokens on x (x in the Results tab)
        assert panel.plotted()["lstm"] == [16e12, 32e12, 64e12]
        await pilot.press("x")
        assert panel.axis == "tokens" and panel.plotted()["lstm"] == [16000.0, 32000.0, 64000.0]
        await pilot.press("x")
        assert panel.axis == "flops"


async def test_the_fits_title_names_x_only_while_the_plot_shows(store, tmp_path):
    from workbench.tui.results_view import ResultsView
    from workbench.tui.scaling_panel import ScalingPanel

    scaling_grid(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:  # narrow: the table alone, no plot
        await pilot.press("f3")
        await settle(pilot)
        panel = app.query_one(ResultsView).query_one(ScalingPanel)
        plot = panel.query_one("#scaling-plot")
        title = lambda: text(panel.query_one("#scaling-title", Static))  # noqa: E731
        assert panel.display and not plot.display
        assert "loss against training FLOPs" in title() and "x:" not in title(), title()
        await pilot.resize_terminal(140, 40)  # wide: the plot, and the key that changes its axis
        await settle(pilot)
        await pilot.pause(0.1)
        assert plot.display and "x: plot against training tokens" in title(), title()
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        await pilot.pause(0.1)
        assert not plot.display and "x:" not in title(), title()


async def test_results_tab_has_no_fits_without_a_compute_and_says_why_with_too_few(store, tmp_path):
    from test_curves import sweep
    from workbench.tui.results_view import ResultsView
    from workbench.tui.scaling_panel import ScalingPanel

    import os
    ids = sweep(store, seq_lens=(16,))  # one budget per model: no law to fit
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
        store.set_results(rid, {"loss": 1.0, "train_flops": 1e12})
        store.finish(rid, "finished")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        panel = app.query_one(ResultsView).query_one(ScalingPanel)
        assert panel.display and "none yet" in text(panel.query_one("#scaling-title", Static))
        assert "lstm" in text(panel.query_one("#scaling-title", Static))
        store.set_results(ids[0], {"train_flops": None})  # (a run without a compute)
        for rid in ids:
            store.set_results(rid, {"train_flops": None})
        app.query_one(ResultsView).poll()
        await settle(pilot)
        assert not panel.display  # no compute anywhere: not a scaling grid, no panel


# --------------------------------------------------------------------------- recipe and size
PRESET_PROFILE = """\
schema_version = 2
name = "lm-presets"
recipe = "transformer++"
[task]
name = "lm"
source = "{source}"
[sweep]
models = ["transformer", {{ name = "mamba", recipe = "mamba" }}]
seq_lens = [32]
[model]
size = "tiny-1m"
[train]
tokens_per_param = 20
batch_size = 4
warmup_steps = 2
"""


async def test_a_profile_with_a_recipe_and_size_loads_and_saves_the_keys_it_wrote(store, tmp_path):
    src = corpus(tmp_path)
    path = tmp_path / "presets.toml"
    path.write_text(PRESET_PROFILE.format(source=src))
    p = profiles.load(path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, p)
        assert app.query_one("#recipe", Select).value == "transformer++"
        assert app.query_one("#size", Select).value == "tiny-1m"
        # what the presets fill is empty, its placeholder says from where
        for fid in ("d_model", "n_layers", "lr", "betas", "weight_decay"):
            assert app.query_one(f"#{fid}", Input).value == "", fid
        assert app.query_one("#d_model", Input).placeholder == "128 (size tiny-1m)"
        assert app.query_one("#betas", Input).placeholder == "0.9, 0.95 (recipe)"
        assert app.query_one("#lr", Input).placeholder == "0.003 (size x recipe 5)"  # 6e-4 x 5
        assert app.query_one("#budget", Input).value == "20"
        built = form.build_profile()
        assert profiles.to_dict(built) == profiles.to_dict(p)  # the keys the file wrote, no more
        assert [s.to_dict() for s in profiles.expand(built)] == [s.to_dict() for s in profiles.expand(p)]
        # a typed value wins over the recipe's, as in a hand-written profile
        app.query_one("#weight_decay", Input).value = "0.05"
        await settle(pilot)
        assert form.build_profile().train.weight_decay == 0.05
        assert profiles.to_dict(form.build_profile())["train"]["weight_decay"] == 0.05


async def test_picking_a_recipe_and_size_in_the_form_empties_what_they_fill(store, tmp_path):
    src = corpus(tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, profiles.loads(LM_PROFILE.format(source=src)))
        assert app.query_one("#recipe", Select).value == "none"
        assert app.query_one("#betas", Input).value == "0.9, 0.999" and app.query_one("#d_model", Input).value == "16"
        app.query_one("#weight_decay", Input).value = "0.2"  # typed: stays
        app.query_one("#recipe", Select).value = "gpt3"
        app.query_one("#size", Select).value = "tiny-3m"
        await settle(pilot)
        assert app.query_one("#betas", Input).value == "" and app.query_one("#grad_clip", Input).value == ""
        assert app.query_one("#weight_decay", Input).value == "0.2"
        # d_model 16 came from the loaded profile, not the form: it stays, and wins over the size
        assert app.query_one("#d_model", Input).value == "16" and app.query_one("#n_layers", Input).value == "1"
        prof = form.build_profile()
        assert prof.recipe == "gpt3" and prof.model.size == "tiny-3m"
        spec = profiles.expand(prof)[0].to_dict()
        assert spec["train"]["betas"] == [0.9, 0.95] and spec["train"]["weight_decay"] == 0.2
        assert spec["d_model"] == 16 and spec["train"]["lr"] == 0.0006  # the size's lr: nobody wrote one
        # back to none: the emptied fields get the form's values again
        app.query_one("#recipe", Select).value = "none"
        app.query_one("#size", Select).value = "none"
        await settle(pilot)
        assert app.query_one("#betas", Input).value == "0.9, 0.999"
        prof = form.build_profile()
        assert prof.recipe is None and prof.model.size is None


async def test_the_lm_options_say_what_they_take_and_a_bad_pair_is_shown_as_typed(store, tmp_path):
    src = corpus(tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, profiles.loads(LM_PROFILE.format(source=src)))
        assert "bytes char bpe or id" in text(form.query_one("#unit-param-tokenizer", Static))
        assert form.query_one("#param-tokenizer", Input).suggester is not None
        # vocab_size is a BPE's: with the bytes tokenizer the task refuses it, under vocab_size
        await type_into(pilot, "#param-tokenizer", "bytes")
        await settle(pilot)
        err = text(form.query_one("#err-param-vocab_size", Static))
        assert "vocab_size is the size of a trained BPE" in err, err
        assert form.query_one("#err-param-vocab_size", Static).display
        await type_into(pilot, "#param-tokenizer", "bpe")
        await settle(pilot)
        assert text(form.query_one("#err-param-vocab_size", Static)) == ""
        assert form.build_profile() is not None
