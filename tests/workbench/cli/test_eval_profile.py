"""Evaluation profiles (issue 34 item 1): an ``[eval]`` table of models and lm-eval tasks,
strictly validated, checked by ``profile check``, listed by ``run --dry-run``, run through the
eval runner (``eval --from FILE``, ``run FILE``) and reported measured beside published.
The tiny checkpoint and task folder are test_lm_eval.py's, made here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from workbench.spec import profile as P
from workbench.spec.eval_profile import EvalProfile, eval_specs

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed: pip install 'ssm-workbench[eval]'")
SHIPPED = Path(__file__).resolve().parents[3] / "profiles" / "zero-shot-table3.toml"

TEXT = """schema_version = 2
name = "tiny-eval"
description = "a tiny evaluation"
[eval]
models = [
  { label = "neox", model = "MODEL" },
  { label = "hub", model = "someone/tiny-lm" },
]
tasks = ["tiny_mc", "tiny_lambada"]
include = ["TASKS"]
batch_size = 2
bootstrap_iters = 10
device = "cpu"
[[published]]
model = "neox"
eval_set = "tiny_mc"
metric = "acc"
value = 0.123
source = "made up for the test"
"""


def text(model: str = "/nonexistent", tasks: str = "/nonexistent", hub: bool = True) -> str:
    t = TEXT.replace("MODEL", model).replace("TASKS", tasks)
    return t if hub else t.replace('  { label = "hub", model = "someone/tiny-lm" },\n', "")


def test_an_eval_profile_validates_and_expands_to_one_eval_run_per_model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "t").mkdir()
    p = P.loads(text(str(tmp_path / "m"), str(tmp_path / "t")), "tiny.toml", check_registries=False)
    assert isinstance(p, EvalProfile)
    specs = eval_specs(p)
    assert [s["label"] for s in specs] == ["neox", "hub"]
    assert [s["model"] for s in specs] == [str(tmp_path / "m"), "someone/tiny-lm"]
    for s in specs:
        assert s["kind"] == "eval" and s["profile"] == "tiny-eval"
        assert s["eval"]["tasks"] == ["tiny_mc", "tiny_lambada"] and s["eval"]["include"] == [str(tmp_path / "t")]
        assert s["eval"]["batch_size"] == 2 and s["eval"]["device"] == "cpu"


@pytest.mark.parametrize("change, names", [
    (("batch_size = 2", "batchsize = 2"), ["unknown key 'eval.batchsize'", "(line 11)"]),
    (('source = "made', 'sorce = "made'), ["unknown key 'published[0].sorce'"]),
    (('{ label = "hub", model', '{ label = "hub", path = "x", model'), ["unknown key 'eval.models[1].path'"]),
    (('metric = "acc"', 'metric = "accuracy"'), ["published[0].metric", "'acc', 'acc_norm' or 'perplexity'"]),
    (('eval_set = "tiny_mc"', 'eval_set = "hellaswag"'), ["published[0].eval_set", "'hellaswag' is not one"]),
    (('model = "neox"', 'model = "pythia"'), ["published[0].model", "'pythia' is not a model label"]),
    (("batch_size = 2", "batch_size = 0"), ["eval.batch_size"]),
    (('tasks = ["tiny_mc", "tiny_lambada"]', 'tasks = ["tiny_mc", "tiny_mc"]'), ["duplicate entries tiny_mc"]),
])
def test_a_wrong_or_unknown_key_is_refused_naming_it_and_the_file(change, names):
    with pytest.raises(P.ProfileError) as e:
        P.loads(text().replace(*change), "dir/tiny.toml", check_registries=False)
    msg = str(e.value)
    assert msg.startswith("dir/tiny.toml: invalid profile")
    for n in names:
        assert n in msg, msg


def test_models_and_task_folders_are_checked_where_they_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(P.ProfileError) as e:
        P.loads(text("no/such/folder/here", "missing-tasks", hub=False), "tiny.toml")
    msg = str(e.value)
    assert "'no/such/folder/here' is no folder here" in msg and "no such folder 'missing-tasks'" in msg


def test_an_output_path_that_cannot_be_a_folder_is_refused_in_the_profile(tmp_path):
    """The profile path (run FILE, eval --from) refuses what the form and --output-path refuse."""
    (tmp_path / "t").mkdir()
    (tmp_path / "a-file").write_text("x")
    base = text("someone/tiny-lm", str(tmp_path / "t"), hub=False).replace(
        "batch_size = 2", 'batch_size = 2\noutput_path = "OUT"')
    for out, why in [(tmp_path / "a-file", "is a file, not a folder"),
                     (tmp_path / "a-file" / "below", "is a file: no folder can be made under it")]:
        with pytest.raises(P.ProfileError) as e:
            P.loads(base.replace("OUT", str(out)), "tiny.toml")
        assert "eval.output_path" in str(e.value) and why in str(e.value)
    P.loads(base.replace("OUT", str(tmp_path / "new" / "out")), "tiny.toml")


def test_dry_run_lists_the_evaluations_and_queues_nothing(tmp_path, monkeypatch, capsys):
    from test_lm_eval_tasks import fake_index
    from workbench.cli import main

    fake_index(monkeypatch, ["tiny_mc", "tiny_lambada"])  # the task names are checked: as lm-eval's
    from test_eval_preflight import fake_checkpoint

    fake_checkpoint(tmp_path / "m")  # a folder is checked as a checkpoint (config, weights, tokenizer)
    (tmp_path / "t").mkdir()
    f = tmp_path / "tiny.toml"
    f.write_text(text(str(tmp_path / "m"), str(tmp_path / "t")))
    assert main(["--store", str(tmp_path / "st"), "run", str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "neox" in out and "someone/tiny-lm" in out and "tiny_mc, tiny_lambada" in out
    assert "2 evaluation run(s) would be launched" in out
    assert not (tmp_path / "st").exists()


def test_the_shipped_table3_profile_passes_profile_check_and_offline_needs_the_hub_ids(
        tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    from test_lm_eval_tasks import TABLE3, fake_index

    fake_index(monkeypatch, TABLE3)  # lm-eval's real names: test_lm_eval_tasks.py's slow test
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    p = P.load(SHIPPED, check_registries=False)
    assert [m.model for m in p.eval.models] == ["EleutherAI/pythia-160m", "state-spaces/mamba-130m-hf",
                                                "EleutherAI/pythia-410m", "state-spaces/mamba-370m-hf"]
    assert p.eval.tasks == ["lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande"]
    # the 4 x 7 numbers of the paper's Table 3 rows, as published values
    assert len(p.published) == 28 and {(x.model, x.eval_set, x.metric) for x in p.published} >= {
        ("Mamba-130M", "lambada_openai", "perplexity"), ("Pythia-410M", "winogrande", "acc")}
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert main(["profile", "check", str(SHIPPED)]) == 0
    assert "1 valid" in capsys.readouterr().out
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["profile", "check", str(SHIPPED)]) == 0  # needing data is no failure
    out = capsys.readouterr().out
    assert "1 needs data that is absent" in out
    for ref in ("EleutherAI/pythia-160m", "state-spaces/mamba-130m-hf", "EleutherAI/pythia-410m",
                "state-spaces/mamba-370m-hf"):
        assert f"hf download {ref}" in out


@needs_lm_eval
@pytest.mark.slow  # about 18 s on a busy 2-core machine (lm-eval's import and task set-up)
def test_a_tiny_eval_profile_runs_and_report_shows_measured_beside_published(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from test_lm_eval import write_neox, write_tasks
    from workbench.cli import main
    from workbench.store import Store

    model = write_neox(tmp_path / "neox")
    tasks = write_tasks(tmp_path / "tasks", tmp_path / "datasets-cache")
    f = tmp_path / "tiny.toml"
    f.write_text(text(str(model), str(tasks), hub=False))
    st = str(tmp_path / "st")
    assert main(["--store", st, "eval", "--from", str(f), "--inline"]) == 0
    out = capsys.readouterr().out
    assert "tiny_mc" in out and "tiny_lambada" in out and "export --profile tiny-eval" in out
    store = Store(st)
    (run,) = store.runs(profile="tiny-eval")
    assert run.state == "finished" and run.label == "neox"
    res = store.results([run.id])[run.id]
    acc = res["tiny_mc"]["acc"]
    assert res["tiny_lambada"]["perplexity"] > 1
    # `run FILE` asks for the same run: found finished, not evaluated again
    assert main(["--store", st, "run", str(f), "--quiet"]) == 0
    assert "evaluated on these tasks already" in capsys.readouterr().out
    assert len(store.runs(profile="tiny-eval")) == 1
    assert main(["--store", st, "report", str(f)]) == 0
    report = capsys.readouterr().out
    row = next(line for line in report.splitlines() if line.startswith("| neox | tiny_mc | acc |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "0.123"                                      # published
    assert cells[4].startswith(f"{acc:.3f} ± ")                     # measured, with its stderr
    assert cells[5] == f"{acc - 0.123:+.3f}" and cells[6] == "made up for the test"
    assert "tiny_lambada perplexity" in report                      # every number measured


def test_eval_from_refuses_a_training_profile_and_extra_models(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    from helpers import tiny_profile_text
    from workbench.cli import main

    train = tmp_path / "train.toml"
    train.write_text(tiny_profile_text(steps=2))
    assert main(["--store", str(tmp_path / "st"), "eval", "--from", str(train)]) == 2
    assert "not an evaluation profile" in capsys.readouterr().err
    assert main(["--store", str(tmp_path / "st"), "eval", "x/y", "--from", str(train)]) == 2
    assert "give no MODEL" in capsys.readouterr().err


def test_score_refuses_an_evaluation_profile_in_one_line(capsys):
    from workbench.cli import main

    assert main(["score", str(SHIPPED)]) == 2
    err = capsys.readouterr().err
    assert "an evaluation profile has no MAD score" in err and len(err.strip().splitlines()) == 1
