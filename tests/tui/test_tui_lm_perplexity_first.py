"""Language-model runs shown through what language modelling measures (issue 42 item 1):
the runs table's bits per byte (not accuracy), the run view's bits-per-byte curve against
training tokens and its title with train and eval figures labelled apart, wrapped between
whole fields; the Results tab opening on bits per byte; the compare legend naming the
metric `l` switched to; early stopping on eval loss as an lm sweep's default (form and
expansion), without changing any run's identity while early stopping is off.

The store holds runs of a real ``lm`` profile (expanded from TOML) whose measurements are
inserted the way the worker writes them (train loss every step; eval loss, accuracy,
sequence accuracy, perplexity and bits per byte at evaluations; tokens a step in the info),
so no training runs here."""
from __future__ import annotations

import math
import os

from textual.widgets import DataTable, Select, Static

from helpers import tiny_lm_corpus, tiny_lm_profile_text, until
from test_tui import make_app, poll_view, settle, store  # noqa: F401
from workbench.spec import profile as profiles
from workbench.spec.run_spec import spec_key

TOKENS_PER_STEP = 4 * 32


def lm_profile(tmp_path, name="lm-ppl", tail="", models=("transformer", "mamba")) -> profiles.Profile:
    corpus = tmp_path / f"corpus-{name}"
    if not corpus.exists():
        tiny_lm_corpus(corpus, "the quick brown fox jumps over the lazy dog. " * 8)
    return profiles.loads(tiny_lm_profile_text(corpus, name, models=models, steps=8) + tail)


def lm_store(store, tmp_path, finished=True) -> list[int]:
    """Two lm runs (transformer, mamba) with the worker's measurements: train loss per step,
    eval figures at steps 4 and 8 (bits per byte 2.5 -> 1.5 and 2.0 -> 1.25), finished."""
    ids = store.add_runs(s.to_dict() for s in profiles.expand(lm_profile(tmp_path)))
    for i, rid in enumerate(ids):
        store.mark_started(rid, os.getpid(), "cpu", None)
        store.set_info(rid, {"tokens_per_step": TOKENS_PER_STEP, "flops_per_token": 1e5})
        rows = [(s, None, "train", "loss", 3.0 - 0.1 * s - i / 10) for s in range(1, 9)]
        for step, bpb in ((4, 2.5 - i / 2), (8, 1.5 - i / 4)):
            loss = bpb * math.log(2) * 1.2  # 1.2 bytes a token
            rows += [(step, None, "eval", "loss", loss), (step, None, "eval", "accuracy", 0.3),
                     (step, None, "eval", "sequence_accuracy", 0.0),
                     (step, None, "eval", "perplexity", math.exp(loss)),
                     (step, None, "eval", "bits_per_byte", bpb),
                     (step, None, "train", "tokens_trained", TOKENS_PER_STEP * step)]
        store.add_metrics(rid, rows)
        store.heartbeat(rid, step=8, progress=1.0, last_loss=2.2 - i / 10, last_accuracy=0.3)
        if finished:
            last = {k: v for _, _, split, k, v in rows[-6:] if split == "eval"}
            store.set_results(rid, {**last, "params": 1000})
            store.finish(rid, "finished")
    return ids


def text(widget) -> str:
    return str(widget.render())


# --------------------------------------------------------------------------- runs table
async def test_runs_table_shows_lm_runs_bits_per_byte_under_a_header_that_says_so(store, tmp_path):
    from workbench.tui.runs_table import RunsTable

    lm_store(store, tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.poll()
        await settle(pilot)
        table = app.query_one(RunsTable)
        # train and eval figures labelled apart (the loss column is the last train loss)
        assert str(table.columns["accuracy"].label) == "eval bpb"
        assert str(table.columns["loss"].label) == "train loss"
        cells = [table.get_row(k) for k in table.rows]
        col = list(table.columns).index("accuracy")
        assert [str(c[col]) for c in cells] == ["1.500", "1.250"]  # the last evaluation's, not 0.300
        table.sort_by("accuracy")  # sorts by what it shows: the lower bits per byte first
        assert str(table.get_row_at(0)[col]) == "1.250"


def test_a_table_of_lm_and_other_runs_says_acc_or_bpb(store, tmp_path):
    from test_curves import sweep
    from workbench.tui.run_cells import accuracy_header, row_cells, table_runs

    lm_store(store, tmp_path)
    sweep(store, models=("lstm",), seeds=(0,))
    runs = table_runs(store)
    assert accuracy_header(runs) == "eval acc|bpb"
    assert accuracy_header([r for r in runs if r.task != "lm"]) == "eval acc"
    other = next(r for r in runs if r.task != "lm")
    store.heartbeat(other.id, last_accuracy=0.75)
    other = next(r for r in table_runs(store) if r.task != "lm")
    assert row_cells(other)["accuracy"].plain == "0.750"


# --------------------------------------------------------------------------- run view
async def test_run_view_plots_bits_per_byte_against_tokens_and_labels_train_and_eval(store, tmp_path):
    from workbench.tui.plots import MetricPlot
    from workbench.tui.run_view import RunScreen

    rid = lm_store(store, tmp_path)[0]
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = RunScreen(store, rid)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        second = screen.query_one("#acc-plot", MetricPlot)
        assert second.title == "eval bits per byte" and list(second.series) == ["eval bpb"]
        assert second.series["eval bpb"] == ([4, 8], [2.5, 1.5])
        loss = screen.query_one("#loss-plot", MetricPlot)
        assert {p.xlabel for p in (loss, second)} == {"training tokens"}
        assert second.xscale == TOKENS_PER_STEP
        title = text(screen.query_one("#run-title", Static))
        eval_loss = 1.5 * math.log(2) * 1.2
        for field in ("train loss 2.2", f"eval loss {eval_loss:.4g}", f"eval ppl {math.exp(eval_loss):.4g}",
                      "eval bpb 1.5"):
            assert field in title.replace("\n", "  "), title
        assert "acc " not in title and "  loss" not in title.replace("train loss", "").replace("eval loss", "")
        # the side panel's results lead with eval loss, perplexity and bits per byte
        results = text(screen.query_one("#run-results", Static)).splitlines()
        assert [line.split()[0] for line in results[1:4]] == ["loss", "perplexity", "bits_per_byte"], results


async def test_the_run_title_wraps_between_whole_fields_while_training(store, tmp_path):
    """At 120x40, then resized to 80x24 (one app): the title's lines fit, every labelled
    figure whole on one line with its value beside its name."""
    from workbench.tui.run_view import RunScreen

    rid = lm_store(store, tmp_path, finished=False)[1]  # running: the title is at its longest
    store.heartbeat(rid, step=6)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = RunScreen(store, rid)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        for size in [(120, 40), (80, 24)]:
            if app.size != size:
                await pilot.resize_terminal(*size)
                await poll_view(pilot, screen)
            widget = screen.query_one("#run-title", Static)
            lines = text(widget).split("\n")
            assert all(len(line) <= widget.content_size.width for line in lines), (size, lines)
            fields = [f for line in lines for f in line.split("  ") if f]
            # every labelled figure whole on one line, its value beside its name
            for name in ("train loss", "eval loss", "eval ppl", "eval bpb"):
                assert any(f.startswith(name + " ") and len(f) > len(name) + 1 for f in fields), (size, name, lines)
            assert any(f.endswith("tokens (7.68e+07 FLOPs)") for f in fields), (size, lines)


# --------------------------------------------------------------------------- results, compare
async def test_results_tab_opens_an_lm_profile_on_bits_per_byte(store, tmp_path):
    lm_store(store, tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        from workbench.tui.results_view import ResultsView

        view = app.query_one(ResultsView)
        view.poll()
        await settle(pilot)
        assert app.query_one("#results-metric", Select).value == "bits_per_byte"


async def test_compare_legend_names_the_metric_l_switched_to(store, tmp_path):
    from workbench.tui.compare_view import CompareScreen

    ids = lm_store(store, tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = CompareScreen(store, ids)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        legend = screen.query_one("#compare-legend", DataTable)
        heads = lambda: [str(legend.columns[k].label) for k in ("loss", "acc")]  # noqa: E731
        assert heads() == ["train loss", "eval bpb"]  # language models: bits per byte, not accuracy
        assert screen.query_one("#compare-acc").title == "eval bits per byte"
        await pilot.press("l", "l", "l")  # eval loss, perplexity, bits per byte
        await settle(pilot)
        assert screen.loss_metric == ("eval", "bits_per_byte")
        assert heads()[0] == "eval bpb"
        col = list(legend.columns).index("loss")
        assert [str(legend.get_row_at(i)[col]) for i in range(legend.row_count)] == ["1.5", "1.25"]
        await pilot.press("a")  # the second plot: perplexity next
        await settle(pilot)
        assert screen.acc_metric == ("eval", "perplexity") and heads()[1] == "eval ppl"


def footer_keys(screen) -> dict[str, str]:
    from textual.widgets._footer import FooterKey

    return {w.key: w.description for w in screen.query(FooterKey)}


async def test_compare_keys_are_named_by_the_metric_their_plot_shows(store, tmp_path):
    """The footer's ``a`` is not "Acc metric" where the second plot shows a language model's
    bits per byte or perplexity: ``l`` and ``a`` read as the metric each plot shows now."""
    from workbench.tui.compare_view import CompareScreen

    ids = lm_store(store, tmp_path)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = CompareScreen(store, ids)
        app.push_screen(screen)
        await poll_view(pilot, screen)
        await settle(pilot)
        keys = footer_keys(screen)
        assert keys["l"] == "train loss" and keys["a"] == "eval bpb", keys
        await pilot.press("a")
        await settle(pilot)
        assert footer_keys(screen)["a"] == "eval ppl"
        await pilot.press("l")
        await settle(pilot)
        assert footer_keys(screen)["l"] == "eval loss"
        assert "Acc metric" not in footer_keys(screen).values()


# --------------------------------------------------------------------------- early stopping
def test_an_lm_sweep_stops_early_on_eval_loss_unless_it_says_otherwise(tmp_path):
    on = "[train.early_stopping]\npatience = 3\n"
    assert profiles.expand(lm_profile(tmp_path, tail=on))[0].train.early_stopping.metric == "loss"
    written = on + 'metric = "accuracy"\n'
    assert profiles.expand(lm_profile(tmp_path, tail=written))[0].train.early_stopping.metric == "accuracy"
    # off (the default): the metric changes nothing, and the spec is what it always was
    off = profiles.expand(lm_profile(tmp_path))[0]
    assert off.train.early_stopping.metric == "accuracy"
    assert '"early_stopping": {"metric": "accuracy", "min_delta": 0.0, "patience": 0, "target": null}' \
        in spec_key(off.to_dict())


def test_other_tasks_keep_eval_accuracy_as_their_early_stopping_metric():
    import tomli_w

    prof = profiles.loads(tomli_w.dumps({
        "schema_version": 1, "name": "es", "task": {"name": "mad_selective_copying", "vocab_size": 8,
                                                     "num_tokens_to_copy": 2, "num_train_examples": 64,
                                                     "num_test_examples": 16},
        "sweep": {"models": ["lstm"], "seq_lens": [16], "seeds": [0]},
        "model": {"d_model": 8, "n_layers": 1},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu", "early_stopping": {"patience": 2}}}))
    assert profiles.expand(prof)[0].train.early_stopping.metric == "accuracy"


async def test_the_form_stops_an_lm_sweep_on_eval_loss_and_saves_the_same_runs_while_off(store, tmp_path):
    from test_tui import fill_form
    from workbench.tui.sweep_form import SweepForm

    app = make_app(store, tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f2")
        await settle(pilot)
        form = app.query_one(SweepForm)
        assert form.query_one("#es_metric", Select).value == "accuracy"
        form.query_one("#task", Select).value = "lm"
        # (the task's change is handled after its inputs are built: a while on a loaded machine)
        await until(pilot, lambda: form.query_one("#es_metric", Select).value == "loss", timeout=60)
        assert form.query_one("#es_metric", Select).value == "loss"
        # a loaded lm profile: off, the form's runs are the file's (same spec_key); on, eval loss
        prof = lm_profile(tmp_path)
        await fill_form(pilot, prof)
        assert form.query_one("#es_metric", Select).value == "loss"
        built = form.build_profile()
        assert [spec_key(s.to_dict()) for s in profiles.expand(built)] == \
            [spec_key(s.to_dict()) for s in profiles.expand(prof)]
        form.query_one("#patience").value = "3"
        await settle(pilot)
        assert {s.train.early_stopping.metric for s in profiles.expand(form.build_profile())} == {"loss"}
