"""Scaling fits with their own honesty (issue 41 item 2; workbench/results/scaling.py).

A fit runs along size only: a grid over ``task.tokenizer`` gives one fit per tokenizer (a
loss per byte and a loss per BPE token are never one law), four tasks are never four points
of one fit, and another grid axis (``train.lr``) splits the fits, while widths, depths, a
``model.size`` grid and a budget grid are what a fit spans. A row with fewer than three
sizes, a loss that rises (b <= 0) or points that do not decrease is shown as such in
``export --scaling`` (md, csv, json), on the figure and in the TUI's panel, with no a, b or
multiplier; a multiplier the reference's fit never reaches is said, never ``inf``.
Stores are filled through the store's API with fake finished runs (no training)."""
from __future__ import annotations

import csv
import io
import json
import math
import os

import pytest

from workbench import cli
from workbench.results import plot, scaling
from workbench.store import Store

SIZES = ((32, 1e13), (48, 4e13), (64, 1.6e14))      # (d_model, training FLOPs)


def add(store: Store, profile: str, model: str, C: float, loss: float, grid: dict | None = None,
        seed: int = 0, **fields) -> int:
    """One finished run with ``fields`` (run fields as workbench.spec.expand records them) and
    ``grid`` (its grid point: recorded both in its fields and as the spec's grid)."""
    grid = dict(grid or {})
    f = {"model": model, "task": fields.pop("task", "lm"), "seq_len": 128, "seed": seed,
         "d_model": 64, "n_layers": 4, **fields, **grid}
    (rid,) = store.add_runs([{"profile": profile, "model": model, "label": model, "task": f["task"],
                              "seq_len": 128, "seed": seed, "fields": f, "grid": grid or None}])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    store.set_results(rid, {"loss": loss, "perplexity": math.exp(loss), "train_flops": C,
                            "tokens_trained": C / 1e6, "flops_per_token": 1e6})
    assert store.finish(rid, "finished")
    return rid


def export(store: Store, profile: str, capsys, *extra: str) -> tuple[int, str, str]:
    rc = cli.main(["--store", str(store.root), "export", "--profile", profile, "--scaling", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture()
def store(tmp_path):
    return Store(tmp_path / "store")


def tokenizer_grid(store: Store, sizes=((64, None),)) -> None:
    """Profile 'tok': mamba and transformer over task.tokenizer = [bytes, bpe] at ``sizes``
    (the issue's case with one size: bpe costs more FLOPs and has the higher loss per token,
    so a line through the two tokenizers "rises", b = -1.8)."""
    for model, k, a in (("mamba", 1.0, 36.0), ("transformer", 1.1, 40.0)):
        for tok, scale in (("bytes", 0.5), ("bpe", 1.0)):
            for d, C in sizes:
                grid = {"task.tokenizer": tok} if C is None else {"task.tokenizer": tok, "model.d_model": d}
                if C is None:  # one size: the issue's numbers
                    C, loss = (3.23e11 * k, 1.5 * k) if tok == "bytes" else (4.71e11 * k, 3.0 * k)
                else:
                    C = C * (1.3 if tok == "bpe" else 1.0)
                    loss = scale * a * C ** -0.1
                add(store, "tok", model, C, loss, grid, d_model=d, task_setting="baseline",
                    **{"task.source": "stdlib"})


# --------------------------------------------------------------------------- along size only
def test_a_tokenizer_grid_is_never_fitted_across_tokenizers(store, capsys):
    tokenizer_grid(store)
    res = scaling.analyse(store, "tok")
    assert res["axes"] == ["task.tokenizer"]
    assert list(res["groups"]) == ["mamba · task.tokenizer=bytes", "mamba · task.tokenizer=bpe",
                                   "transformer · task.tokenizer=bytes", "transformer · task.tokenizer=bpe"]
    for g in res["groups"].values():  # one tokenizer each: one size, no fit, no multiplier
        assert (len(g.points), g.status, g.note, g.fit, g.multiplier) == (1, "too_few_sizes", "1 point: no fit",
                                                                           None, None)
    assert res["fits"] == {} and res["at"] is None
    rc, md, err = export(store, "tok", capsys)
    assert rc == 0 and "no scaling law among the 4 row(s)" in err
    assert "| mamba · task.tokenizer=bpe | 1 | 4.71e+11 | – | 1 point: no fit | – |" in md
    assert "-1.8" not in md and "inf" not in md and "no row here is a law" in md
    rc, js, _ = export(store, "tok", capsys, "--format", "json")
    rows = json.loads(js)
    assert [(r["model"], r["settings"], r["status"], r["b"], r["multiplier"]) for r in rows] == [
        ("mamba", {"task.tokenizer": "bytes"}, "too_few_sizes", None, None),
        ("mamba", {"task.tokenizer": "bpe"}, "too_few_sizes", None, None),
        ("transformer", {"task.tokenizer": "bytes"}, "too_few_sizes", None, None),
        ("transformer", {"task.tokenizer": "bpe"}, "too_few_sizes", None, None)]
    rc, text, _ = export(store, "tok", capsys, "--format", "csv")
    table = list(csv.DictReader(io.StringIO(text)))
    assert [(r["model"], r["task.tokenizer"], r["status"], r["b"]) for r in table] == [
        ("mamba", "bytes", "too_few_sizes", ""), ("mamba", "bpe", "too_few_sizes", ""),
        ("transformer", "bytes", "too_few_sizes", ""), ("transformer", "bpe", "too_few_sizes", "")]


def test_a_tokenizer_grid_with_widths_gets_one_law_per_tokenizer(store, capsys):
    tokenizer_grid(store, sizes=SIZES)
    res = scaling.analyse(store, "tok")
    assert list(res["fits"]) == list(res["groups"])  # all four rows are laws
    for label, g in res["groups"].items():
        tok = g.context["task.tokenizer"]
        assert label.endswith(f"task.tokenizer={tok}") and len(g.points) == 3
        a = (36.0 if g.model == "mamba" else 40.0) * (0.5 if tok == "bytes" else 1.0)
        assert (g.fit.a, g.fit.b) == pytest.approx((a, 0.1), rel=1e-6)  # each tokenizer's own law
    # the multiplier compares like with like: transformer at bpe against mamba at bpe
    for tok in ("bytes", "bpe"):
        assert res["groups"][f"transformer · task.tokenizer={tok}"].multiplier == \
            pytest.approx((36.0 / 40.0) ** 10, rel=1e-5)
        assert res["groups"][f"mamba · task.tokenizer={tok}"].multiplier == 1.0
    rc, md, err = export(store, "tok", capsys)
    assert rc == 0 and err == ""
    assert "| transformer · task.tokenizer=bpe | 3 | 1.30e+13..2.08e+14 | 40 | 0.100 ± 0.000 | 0.349" in md
    assert "per model and value of task.tokenizer" in md


def test_four_tasks_are_never_one_fit(store):
    for model in ("gated_deltanet", "mamba"):
        for i, task in enumerate(("parity", "modular_arithmetic", "cycle_navigation", "permutation_composition")):
            extra = {"task.num_states": 5} if task == "cycle_navigation" else {}
            add(store, "state", model, 1e12 * (1 + i), 0.2 + 0.3 * i, task=task, task_setting="baseline", **extra)
    res = scaling.analyse(store, "state")
    assert res["task"] == "several tasks" and res["fits"] == {}
    # one row per task, named by the task alone (not by each task's parameters too)
    assert list(res["groups"])[:4] == ["gated_deltanet · task=parity", "gated_deltanet · task=modular_arithmetic",
                                       "gated_deltanet · task=cycle_navigation",
                                       "gated_deltanet · task=permutation_composition"]
    assert {(len(g.points), g.status) for g in res["groups"].values()} == {(1, "too_few_sizes")}


def test_sizes_and_budgets_are_spanned_other_grid_axes_split(store):
    # widths and depths: one law (the solved options of a size vary with it too)
    for model in ("transformer", "mamba"):
        for (d, C), L in zip(SIZES, (2, 4, 8)):
            add(store, "sizes", model, C, 40.0 * C ** -0.1, {"model.d_model": d}, d_model=d, n_layers=L,
                **{"opt.expand": d // 16})
    res = scaling.analyse(store, "sizes")
    assert res["axes"] == [] and list(res["fits"]) == ["transformer", "mamba"]
    # a budget grid (train.tokens) at one width is a compute axis too
    for T in (1e6, 4e6, 1.6e7):
        add(store, "budget", "mamba", 6e6 * T, 40.0 * (6e6 * T) ** -0.1, {"train.tokens": T})
    assert list(scaling.analyse(store, "budget")["fits"]) == ["mamba"]
    # a learning-rate grid: one fit per lr, never the lrs as points
    for lr, scale in ((1e-3, 1.0), (3e-3, 0.9)):
        for d, C in SIZES:
            add(store, "lr", "mamba", C, scale * 40.0 * C ** -0.1, {"train.lr": lr, "model.size": f"s{d}"},
                d_model=d, size=f"s{d}")
    res = scaling.analyse(store, "lr")
    assert list(res["fits"]) == ["mamba · train.lr=0.001", "mamba · train.lr=0.003"]
    assert res["fits"]["mamba · train.lr=0.003"].a == pytest.approx(36.0, rel=1e-6)


# --------------------------------------------------------------------------- honesty flags
def flagged_store(store: Store) -> None:
    """Profile 'flags': transformer a law (3 sizes), mamba 2 sizes, gla rising with size,
    hyena not decreasing at its middle size (yet b > 0)."""
    for (d, C) in SIZES:
        add(store, "flags", "transformer", C, 40.0 * C ** -0.1, {"model.d_model": d}, d_model=d)
        add(store, "flags", "gla", C, 0.5 * C ** 0.1 / 1e1, {"model.d_model": d}, d_model=d)
    for (d, C) in SIZES[:2]:
        add(store, "flags", "mamba", C, 36.0 * C ** -0.1, {"model.d_model": d}, d_model=d)
    for (d, C), L in zip(SIZES, (4.0, 4.2, 2.0)):
        add(store, "flags", "hyena", C, L, {"model.d_model": d}, d_model=d)


def test_two_points_a_rising_fit_and_points_that_do_not_decrease_are_flagged(store, capsys):
    flagged_store(store)
    res = scaling.analyse(store, "flags")
    g = res["groups"]
    assert list(res["fits"]) == ["transformer"]
    assert (g["mamba"].status, g["mamba"].note, g["mamba"].fit) == ("too_few_sizes", "2 points: no fit", None)
    assert g["gla"].status == "rises" and g["gla"].fit.b == pytest.approx(-0.1, rel=1e-6)
    assert g["gla"].note == "loss rises: b = -0.10, not a law"
    assert g["hyena"].status == "not_decreasing" and g["hyena"].fit.b > 0
    assert g["hyena"].note.startswith("not decreasing at 4e+13: b = ")
    assert {k: v.multiplier for k, v in g.items()} == {"transformer": 1.0, "gla": None, "mamba": None,
                                                       "hyena": None}
    rc, md, _ = export(store, "flags", capsys)
    lines = md.splitlines()
    assert rc == 0 and lines[0] == "| model | points | FLOPs range | a | b | multiplier vs transformer |"
    assert "| mamba | 2 | 1.00e+13..4.00e+13 | – | 2 points: no fit | – |" in lines
    assert "| gla | 3 | 1.00e+13..1.60e+14 | – | loss rises: b = -0.10, not a law | – |" in lines
    assert any(ln.startswith("| hyena | 3 |") and "not decreasing at 4e+13" in ln and ln.endswith("| – |")
               for ln in lines)
    rc, js, _ = export(store, "flags", capsys, "--format", "json")
    rows = {r["label"]: r for r in json.loads(js)}
    assert {k: r["status"] for k, r in rows.items()} == {
        "transformer": "ok", "gla": "rises", "mamba": "too_few_sizes", "hyena": "not_decreasing"}
    assert rows["mamba"]["status_text"] == "2 points: no fit" and rows["mamba"]["b"] is None
    assert rows["gla"]["b"] is None and rows["gla"]["rejected_fit"]["b"] == pytest.approx(-0.1, rel=1e-6)
    assert rows["gla"]["multiplier"] is None and rows["gla"]["status_text"].startswith("loss rises")
    assert rows["transformer"]["b"] == pytest.approx(0.1) and rows["transformer"]["multiplier"] == 1.0
    rc, text, _ = export(store, "flags", capsys, "--format", "latex")
    assert "2 points: no fit" in text and "loss rises" in text


def test_a_rising_reference_gives_no_multiplier_never_inf(store, capsys):
    flagged_store(store)
    res = scaling.analyse(store, "flags", reference="gla")
    t = res["groups"]["transformer"]
    assert t.multiplier is None and t.multiplier_note == "gla: loss rises: b = -0.10, not a law"
    rc, md, _ = export(store, "flags", capsys, "--reference", "gla")
    assert "inf" not in md
    row = "| transformer | 3 | 1.00e+13..1.60e+14 | 40 | 0.100 ± 0.000 | – (gla: loss rises: b = -0.10, not a law) |"
    assert row in md.splitlines()


def test_an_infinite_multiplier_is_said_not_printed(store, capsys):
    # irreducible losses: the reference levels off at E = 2.0, the other at 1.0: at C* the
    # other's loss is below anything the reference reaches
    for (d, C) in SIZES + ((80, 6.4e14),):
        add(store, "irr", "ref", C, 2.0 + 30.0 * C ** -0.1, {"model.d_model": d}, d_model=d)
        add(store, "irr", "low", C, 1.0 + 30.0 * C ** -0.1, {"model.d_model": d}, d_model=d)
    res = scaling.analyse(store, "irr", form="irreducible", at=1e18)
    low = res["groups"]["low"]
    assert low.ok and low.multiplier is None and low.multiplier_note == "ref's fit never reaches this loss"
    assert math.isinf(scaling.multiplier(low.fit, res["groups"]["ref"].fit, 1e18))  # what it was
    rc, md, _ = export(store, "irr", capsys, "--irreducible", "--at", "1e18")
    assert rc == 0 and "inf" not in md and "– (ref's fit never reaches this loss)" in md
    rc, js, _ = export(store, "irr", capsys, "--irreducible", "--at", "1e18", "--format", "json")
    row = {r["label"]: r for r in json.loads(js)}["low"]
    assert row["status"] == "ok" and row["multiplier"] is None
    assert row["multiplier_note"] == "ref's fit never reaches this loss"


def test_the_figure_draws_no_line_for_a_row_that_is_no_law(store):
    flagged_store(store)
    fig = plot.scaling_figure(store, "flags")
    (ax,) = fig.axes
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "transformer: b = 0.100 ± 0.000" in labels
    assert "mamba: 2 points: no fit" in labels and "gla: loss rises: b = -0.10, not a law" in labels
    assert any(x.startswith("hyena: not decreasing") for x in labels)
    # points only for those: no fitted line, no band
    for model in ("mamba", "gla", "hyena"):
        assert [ln.get_linestyle() for ln in ax.get_lines() if ln.get_label().startswith(model)] == ["None"]
    assert len(ax.collections) == 1  # the one law's band
    # the issue's tokenizer figure: points per tokenizer, no line rising through them
    other = Store(store.root.parent / "tok")
    tokenizer_grid(other)
    (ax,) = plot.scaling_figure(other, "tok").axes
    assert {ln.get_label() for ln in ax.get_lines()} == {
        f"{m} · task.tokenizer={t}: 1 point: no fit" for m in ("mamba", "transformer") for t in ("bytes", "bpe")}
    assert "no law" in ax.get_title()


# --------------------------------------------------------------------------- the TUI's panel
async def test_the_panel_flags_rows_and_says_why_without_a_law(store):
    from textual.app import App
    from textual.widgets import DataTable, Static

    from workbench.results.aggregate import records
    from workbench.tui.scaling_panel import ScalingPanel, analyse_all

    flagged_store(store)
    tokenizer_grid(store)

    class Host(App):
        def compose(self):
            yield ScalingPanel()

    async with Host().run_test(size=(160, 40)) as pilot:
        panel = pilot.app.query_one(ScalingPanel)
        recs = records(store, "flags")
        panel.show(analyse_all(store, "flags", recs), "loss", recs)
        await pilot.pause()
        table = panel.query_one("#scaling-table", DataTable)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert rows["mamba"][4] == "2 points: no fit" and rows["mamba"][5] == "–"
        assert rows["gla"][4] == "loss rises: b = -0.10, not a law" and rows["gla"][3] == "–"
        assert rows["hyena"][4].startswith("not decreasing") and rows["transformer"][5] == "1"
        assert table.get_row_at(list(rows).index("gla"))[4].style == "yellow"
        assert set(panel.plotted()) == {"transformer", "mamba", "gla", "hyena"}  # every row's points
        # no law at all: the title says why, per row
        recs = records(store, "tok")
        panel.show(analyse_all(store, "tok", recs), "loss", recs)
        await pilot.pause()
        title = str(panel.query_one("#scaling-title", Static).render())
        assert "none yet" in title and "mamba · task.tokenizer=bpe" in title and "1 point: no fit" in title
        assert "-1.8" not in title
