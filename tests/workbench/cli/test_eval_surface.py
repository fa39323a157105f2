"""Evaluation's surface (issue 42 item 7): what an lm-eval user sees of an evaluation run.

- the run view shows each task's metric, value ± lm-eval's standard error and documents in
  place of two empty charts, and counts (params) as integers with thousands separators;
- export (Markdown, JSON) and the Results tab put a stored ``<metric>_stderr`` beside the
  value and say '± lm-eval's standard error', never 'mean ± std over 0/1 run(s)'; JSON has
  no record for the run-level eval set '' (no metric value);
- lm-eval's ``git describe`` leaves no ``fatal: not a git repository`` in the log;
- ``eval --output-path DIR --log-samples`` writes lm-eval's results JSON and per-sample
  JSONL per task (its EvaluationTracker), and the folder is not part of the run's identity;
- a saved evaluation profile writes ``limit = 10`` (an integer) and no settings at their
  defaults; a missing include folder is refused in one line (CLI, profile, form at once);
- ``run:abc`` is refused in one line before lm-eval's task names are indexed, and labels
  are printed as written (no ``run🔤`` from rich's emoji codes).

Stored numbers are written by hand into a scratch store; the one end-to-end run uses the
tiny GPT-NeoX and task folder of tests/workbench/cli/test_lm_eval.py."""
from __future__ import annotations

import io
import json
import os

import pytest
from rich.console import Console
from test_lm_eval import made, needs_lm_eval  # noqa: F401 (the module-scoped fixture)
from test_tui import make_app, settle, store, type_into  # noqa: F401
from textual.widgets import Static

from workbench.spec.eval_spec import eval_spec
from workbench.store import Store

RESULTS = {"tiny_mc": {"acc": 0.6, "acc_stderr": 0.2449, "acc_norm": 0.4, "acc_norm_stderr": 0.2449,
                       "samples": 5.0},
           "tiny_lambada": {"perplexity": 16.07, "perplexity_stderr": 3.2, "acc": 0.2, "acc_stderr": 0.2,
                            "samples": 5.0}}


def stored_eval(store: Store, label: str = "neox", params: float = 965890.0) -> int:
    """A finished evaluation run holding RESULTS, as eval_run stores them."""
    (rid,) = store.add_runs([eval_spec(f"org/{label}", list(RESULTS), profile="eval", label=label)])
    store.mark_started(rid, os.getpid(), "cpu", None)
    for task, m in RESULTS.items():
        store.set_results(rid, m, eval_set=task)
    store.set_results(rid, {"wall_s": 12.5, "params": params}, eval_set="")
    store.finish(rid, "finished")
    return rid


def plain(renderable, width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# ------------------------------------------------------------------ the run view
async def test_the_run_view_of_an_evaluation_shows_results_not_empty_charts(store, tmp_path):  # noqa: F811
    from workbench.tui.plots import MetricPlot
    from workbench.tui.run_view import RunScreen

    rid = stored_eval(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(RunScreen(store, rid, app.store_lock))
        await settle(pilot)
        screen = app.screen
        assert not any(p.display for p in screen.query(MetricPlot))  # no "no loss curve" charts
        assert screen.query_one("#eval-results").display
        table = plain(screen.query_one("#eval-table", Static).content)
        lines = [" ".join(line.split()) for line in table.splitlines()]
        # a line per task (its documents), its metrics under it (tests/tui/test_eval_table_narrow.py)
        assert "tiny_mc 5" in lines and "acc 0.600 ± 0.245" in lines, table
        assert "acc_norm 0.400 ± 0.245" in lines, table
        assert "tiny_lambada 5" in lines and "acc 0.200 ± 0.200" in lines and "perplexity 16.07 ± 3.2" in lines, table
        assert table.index("tiny_mc") < table.index("tiny_lambada")  # in [eval] tasks' order
        side = str(screen.query_one("#run-results", Static).render())
        assert "965,890" in side and "9.6589e+05" not in side, side
        assert "tiny_mc" not in side  # the tasks are in the table, not twice


# ------------------------------------------------------------------ export and the Results tab
def test_export_shows_lm_evals_standard_error_beside_each_value(tmp_path, capsys):
    from workbench.cli import main

    store = Store(tmp_path / "st")
    stored_eval(store)
    assert main(["--store", str(store.root), "export", "--profile", "eval", "--metric", "acc,perplexity",
                 "--cols", "eval_set"]) == 0
    out = capsys.readouterr().out
    assert "| neox | 0.200 ± 0.200 (stderr) | 0.600 ± 0.245 (stderr) |" in out, out
    assert "16.070 ± 3.200 (stderr)" in out
    assert "± lm-eval's standard error" in out and "std over" not in out and "0/1 run(s)" not in out
    assert "(default)" not in out  # the run-level eval set has no acc: no empty column


def test_export_json_has_no_record_without_metric_values_and_carries_the_stderr(tmp_path, capsys):
    from workbench.cli import main

    store = Store(tmp_path / "st")
    stored_eval(store)
    assert main(["--store", str(store.root), "export", "--profile", "eval", "--metric", "acc",
                 "--cols", "eval_set", "--format", "json"]) == 0
    recs = json.loads(capsys.readouterr().out)
    assert [r["eval_set"] for r in recs] == ["tiny_lambada", "tiny_mc"]  # no eval_set "" of nulls
    mc = next(r for r in recs if r["eval_set"] == "tiny_mc")
    assert mc["acc"]["mean"] == 0.6 and mc["acc"]["stderr"] == pytest.approx(0.2449)


def test_a_cell_of_several_runs_keeps_its_std_not_a_stderr():
    from workbench.results import aggregate, export

    recs = [{"model": "m", "eval_set": "", "acc": a, "acc_stderr": 0.1, "task": "copy", "seed": seed}
            for seed, a in enumerate((0.5, 0.7))]
    t = aggregate.table(recs, "acc", ["model"], [])
    cell = next(iter(t["cells"].values()))
    assert "stderr" not in cell and export.fmt_cell(cell) == "0.600 ± 0.141"
    assert "mean ± std over 2 run(s) per cell" in export._caption("acc", t, {"best_over": []})


# ------------------------------------------------------------------ git and lm-eval's files
@needs_lm_eval
def test_lm_evals_git_hash_leaves_nothing_on_stderr(tmp_path, monkeypatch, capfd):
    import lm_eval.evaluator as evaluator

    from workbench.train.eval_run import quiet_git_hash

    monkeypatch.chdir(tmp_path)  # no git repository here or above
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    with quiet_git_hash():
        assert evaluator.get_git_commit_hash() is None
    assert "fatal" not in capfd.readouterr().err
    evaluator.get_git_commit_hash()  # lm-eval's own, restored: git's complaint on the inherited stderr
    assert "not a git repository" in capfd.readouterr().err


@needs_lm_eval
def test_eval_writes_lm_evals_files_with_log_samples_and_no_git_noise(made, tmp_path, capfd):  # noqa: F811
    from workbench.cli import main
    from workbench.spec.run_spec import spec_key

    out = tmp_path / "lm-eval-out"
    args = ["--store", str(tmp_path / "st"), "eval", str(made["neox"]), "--tasks", "tiny_mc",
            "--include", str(made["tasks"]), "--bootstrap-iters", "10", "--device", "cpu", "--inline",
            "--output-path", str(out), "--log-samples"]
    cwd = os.getcwd()
    os.chdir(tmp_path)  # outside any git repository: lm-eval's git describe fails here
    try:
        assert main(args) == 0
    finally:
        os.chdir(cwd)
    said = capfd.readouterr()
    assert "not a git repository" not in said.err + said.out
    folder = out / str(made["neox"]).replace("/", "__")  # lm-eval's sanitize_model_name
    (results,) = folder.glob("results_*.json")
    (samples,) = folder.glob("samples_tiny_mc_*.jsonl")
    assert f"wrote {results}" in said.out and f"wrote {samples}" in said.out
    store = Store(tmp_path / "st")
    data = json.loads(results.read_text())
    assert data["results"]["tiny_mc"]["acc,none"] == pytest.approx(store.results([1])[1]["tiny_mc"]["acc"])
    lines = [json.loads(x) for x in samples.read_text().splitlines()]
    assert len(lines) == 5 and {"doc_id", "resps", "acc"} <= set(lines[0])
    run = store.get(1)
    assert run.spec["eval"]["output_path"] == str(out) and run.spec["eval"]["log_samples"] is True
    plain_spec = eval_spec(run.spec["model"], ["tiny_mc"], include=[str(made["tasks"])], bootstrap_iters=10,
                           device="cpu")
    assert spec_key(plain_spec) == spec_key(run.spec)  # the folder changes no number: the same run
    other = tmp_path / "elsewhere"
    assert main(args[:-3] + ["--output-path", str(other)]) == 0  # found again: says where its files are
    said = " ".join(capfd.readouterr().out.split())  # (the console wraps long lines)
    assert "evaluated on these tasks already" in said and f"--fresh writes them into {other}" in said, said
    assert not other.exists()


def test_log_samples_needs_an_output_folder(tmp_path, capsys):
    from workbench.cli import main
    from workbench.spec.profile import ProfileError, loads

    assert main(["--store", str(tmp_path / "st"), "eval", "org/m", "--tasks", "x", "--log-samples",
                 "--dry-run"]) == 2
    assert "--log-samples writes lm-eval's per-document files into --output-path" in capsys.readouterr().err
    with pytest.raises(ProfileError, match="log_samples writes"):
        loads('schema_version = 2\nname = "e"\n[eval]\nmodels = [{label = "m", model = "org/m"}]\n'
              'tasks = ["x"]\nlog_samples = true\n')


# ------------------------------------------------------------------ profiles and the form
def test_a_saved_eval_profile_writes_integers_and_no_defaults(tmp_path):
    from workbench.spec.profile import loads
    from workbench.tui.eval_form import save_profile

    text = ('schema_version = 2\nname = "e"\n[eval]\nmodels = [{label = "m", model = "org/m"}]\n'
            'tasks = ["x"]\nlimit = 10\n')
    saved = save_profile(loads(text), tmp_path / "e.toml").read_text()
    assert "limit = 10\n" in saved, saved
    for default in ("bootstrap_iters", "dtype", "device", "batch_size", "seed", "devices", "executor"):
        assert default not in saved, saved
    assert loads(saved).eval.limit == 10
    frac = save_profile(loads(text.replace("limit = 10", "limit = 0.5\nbootstrap_iters = 50")),
                        tmp_path / "f.toml").read_text()
    assert "limit = 0.5\n" in frac and "bootstrap_iters = 50\n" in frac  # set: written


def test_a_missing_include_folder_is_refused_in_one_line(tmp_path, capsys):
    from workbench.cli import main

    assert main(["--store", str(tmp_path / "st"), "eval", "org/m", "--tasks", "x", "--include",
                 str(tmp_path / "nope"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"eval: --include {tmp_path / 'nope'}: no such folder"]
    prof = tmp_path / "e.toml"
    prof.write_text(f'schema_version = 2\nname = "e"\n[eval]\nmodels = [{{label = "m", model = "org/m"}}]\n'
                    f'tasks = ["x"]\ninclude = ["{tmp_path / "nope"}"]\n')
    assert main(["profile", "check", str(prof)]) != 0
    said = capsys.readouterr()
    assert "eval.include[0] (line 6): no such folder" in said.out + said.err


async def test_the_eval_form_says_a_missing_include_folder_at_once(store, tmp_path):  # noqa: F811
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f4")
        await settle(pilot)
        await type_into(pilot, "#ev-include", str(tmp_path / "nope"))
        await pilot.pause(0.6)  # the check runs CHECK_S after typing stops
        await settle(pilot)
        err = str(app.screen.query_one("#err-ev-include", Static).render())
        assert "no such folder" in err and "nope" in err, err
        await type_into(pilot, "#ev-include", str(tmp_path))
        await pilot.pause(0.6)
        await settle(pilot)
        assert "no such folder" not in str(app.screen.query_one("#err-ev-include", Static).render())


# ------------------------------------------------------------------ run:abc and emoji codes
def test_run_abc_is_refused_in_one_line_before_the_task_names(tmp_path, capsys, monkeypatch):
    from workbench.cli import main
    from workbench.spec import lm_eval_tasks

    def indexed(*a, **kw):
        raise AssertionError("lm-eval's task names indexed before the model reference was checked")

    monkeypatch.setattr(lm_eval_tasks, "unknown_tasks", indexed)
    assert main(["--store", str(tmp_path / "st"), "eval", "run:abc", "--tasks", "x", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eval: model 'run:abc': a run is written run:N, N its id (a whole number), e.g. run:12"]


def test_labels_are_printed_as_written_not_as_emoji(tmp_path, capsys):
    from workbench.cli import common, eval_cmd

    store = Store(tmp_path / "st")
    rid = stored_eval(store, label="run:abc:")
    console = Console(width=160, record=True, file=io.StringIO())
    assert eval_cmd._wait(store, [rid], console, quiet=False) is None  # the progress line
    eval_cmd._summary(store, [rid], console, "eval")
    text = console.export_text()
    assert "run:abc:" in text and "🔤" not in text, text
    common._console().print("queued run:abc: again", markup=False)
    assert "run:abc: again" in capsys.readouterr().out


async def test_the_results_tab_shows_stderrs_beside_values_not_as_metrics_to_cycle(store, tmp_path):  # noqa: F811
    from textual.widgets import DataTable

    from workbench.tui.results_view import ResultsView

    stored_eval(store)
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        view = app.query_one(ResultsView)
        seen = []
        for _ in range(12):
            seen.append(view.current()[1])
            await pilot.press("m")
            await settle(pilot)
        assert "acc" in seen and not any(m.endswith("_stderr") for m in seen), seen
        while view.current()[1] != "acc":
            await pilot.press("m")
            await settle(pilot)
        table = view.query_one("#results-table", DataTable)
        assert [str(c) for c in table.get_row_at(0)[1:]] == ["0.200 ± 0.200", "0.600 ± 0.245"]
        caption = str(view.query_one("#results-caption", Static).render())
        assert "± lm-eval's standard error" in caption and "0/1 run(s)" not in caption, caption
