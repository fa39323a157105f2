"""lm-eval task names checked before anything runs (workbench/spec/lm_eval_tasks.py), and
evaluations refused up front where a Slurm job cannot run them (issue 34 item 1).

lm-eval's own ~15,000 task files take 10-50 s to index, so the fast tests here stand a
small fixed set in for lm-eval's names (:func:`fake_index`); the include folders are always
indexed by lm-eval's real TaskManager. The check against lm-eval's real index, and its
disk cache, is the slow test at the end."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from workbench.spec import lm_eval_tasks
from workbench.spec import profile as P

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed: pip install 'ssm-workbench[eval]'")
TABLE3 = ["lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande"]


def fake_index(monkeypatch, names=(*TABLE3, "hellaswag_de", "lambada_standard", "arc_challenge_mt")):
    """lm-eval's own names as ``names`` (instead of indexing its task files); returns the
    list of calls, so a test can tell whether lm-eval's names were asked for at all."""
    calls = []

    def default_names(announce=None):
        calls.append(1)
        return frozenset(names)

    monkeypatch.setattr(lm_eval_tasks, "default_names", default_names)
    return calls


def write_task(folder: Path, name: str = "my_choice") -> Path:
    """One lm-eval multiple-choice task (YAML + JSON lines) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mc.jsonl").write_text(json.dumps({"q": "the cat sat on the", "choices": ["mat", "sea"], "label": 0})
                                     + "\n")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{q}}\"\ndoc_to_target: \"{{label}}\"\n"
        "doc_to_choice: \"{{choices}}\"\nmetric_list:\n  - metric: acc\n")
    return folder


def eval_profile(path: Path, tasks: list[str], include: list[str] = (), extra: str = "") -> Path:
    """An evaluation profile of one model (a folder beside it: no hub id, which offline
    would make the profile need data) on ``tasks``."""
    from test_eval_preflight import fake_checkpoint

    fake_checkpoint(path.parent / "model")  # a folder is checked as a checkpoint (config, weights, tokenizer)
    path.write_text(
        'schema_version = 2\nname = "names"\n' + extra +
        f'[eval]\nmodels = [{{ label = "m", model = "{path.parent / "model"}" }}]\ntasks = {json.dumps(tasks)}\n'
        + (f"include = {json.dumps([str(i) for i in include])}\n" if include else "") + 'device = "cpu"\n')
    return path


# ------------------------------------------------------------------ the check itself
def test_closest_names_ignore_case_and_rank_by_similarity():
    known = ["hellaswag", "hellaswag_de", "piqa", "winogrande"]
    assert lm_eval_tasks.closest("hellaswg", known)[0] == "hellaswag"
    assert lm_eval_tasks.closest("HellaSwag", known)[0] == "hellaswag"
    assert lm_eval_tasks.closest("zzzz", known) == []
    line = lm_eval_tasks.describe({"hellaswg": ["hellaswag"], "zzzz": []}, [])
    assert "'hellaswg' (closest: hellaswag)" in line and "'zzzz' (no close name)" in line and "\n" not in line


@needs_lm_eval
def test_a_task_of_an_include_folder_is_accepted_without_lm_evals_index(tmp_path, monkeypatch):
    calls = fake_index(monkeypatch)
    tasks = write_task(tmp_path / "my-tasks")
    assert lm_eval_tasks.unknown_tasks(["my_choice"], [str(tasks)]) == {}
    assert calls == []  # every name was the folder's: lm-eval's own were not needed
    # beside lm-eval's own names, and misspelt: the folder's name is suggested
    assert lm_eval_tasks.unknown_tasks(["my_choice", "hellaswag"], [str(tasks)]) == {}
    assert lm_eval_tasks.unknown_tasks(["my_choise"], [str(tasks)]) == {"my_choise": ["my_choice"]}


def test_lm_evals_names_are_cached_on_disk_by_version_and_folder(tmp_path, monkeypatch):
    """The index is built once (a stand-in TaskManager counts it) and read back while the
    stamp holds; another lm-eval (a changed stamp) indexes again."""
    pytest.importorskip("lm_eval")
    import lm_eval.tasks

    built = []

    class Manager:
        def __init__(self, *a, **kw):
            built.append(kw)
            self.all_tasks = ["hellaswag", "piqa"]

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Manager)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    said = []
    assert lm_eval_tasks.default_names(said.append) == {"hellaswag", "piqa"}
    assert lm_eval_tasks.default_names(said.append) == {"hellaswag", "piqa"}
    assert len(built) == 1 and lm_eval_tasks.cache_path().is_file()
    assert len(said) == 1 and "indexing lm-eval's task files" in said[0]  # told before indexing, once
    monkeypatch.setattr(lm_eval_tasks, "_version", lambda: "99.0")
    assert lm_eval_tasks.default_names() == {"hellaswag", "piqa"} and len(built) == 2


# ------------------------------------------------------------------ where it is asked
@needs_lm_eval
def test_profile_check_refuses_an_unknown_task_naming_the_closest(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    fake_index(monkeypatch)
    f = eval_profile(tmp_path / "p.toml", ["lambada_openai", "hellaswg"])
    assert main(["profile", "check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "eval.tasks[1] (line 5)" in err and "unknown lm-eval task 'hellaswg' (closest: hellaswag" in err
    assert "lambada_openai" not in err  # the known one is not named
    # run and run --dry-run refuse it too, before anything is queued
    st = tmp_path / "st"
    for extra in ([], ["--dry-run"]):
        assert main(["--store", str(st), "run", str(f), *extra]) == 2
        assert "closest: hellaswag" in capsys.readouterr().err
    assert not st.exists()


@needs_lm_eval
def test_profile_check_accepts_a_task_of_its_include_folder(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    fake_index(monkeypatch)
    tasks = write_task(tmp_path / "my-tasks")
    f = eval_profile(tmp_path / "p.toml", ["my_choice", "piqa"], [str(tasks)])
    assert main(["profile", "check", str(f)]) == 0
    assert "1 valid" in capsys.readouterr().out


@needs_lm_eval
def test_eval_refuses_an_unknown_task_before_queueing_and_dry_run_lists_the_runs(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    fake_index(monkeypatch)
    tasks = write_task(tmp_path / "my-tasks")
    st = tmp_path / "st"
    assert main(["--store", str(st), "eval", "someone/tiny-lm", "--tasks", "my_choise,piqa",
                 "--include", str(tasks)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eval: unknown lm-eval task 'my_choise' (closest: my_choice)") and err.count("\n") == 1
    assert not st.exists()
    assert main(["--store", str(st), "eval", "someone/tiny-lm", "run:3", "--tasks", "my_choice,piqa",
                 "--include", str(tasks), "--dry-run"]) == 2  # the models are checked too: no store, no run:3
    assert capsys.readouterr().err == f"eval: model run:3: no such run (no store at {st})\n"
    assert main(["--store", str(st), "eval", "someone/tiny-lm", "other/lm", "--tasks", "my_choice,piqa",
                 "--include", str(tasks), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "someone/tiny-lm" in out and "other/lm" in out and "my_choice, piqa" in out
    assert "2 evaluation run(s) would be launched" in out and not st.exists()


def test_without_lm_eval_profile_check_says_the_names_were_not_checked(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(lm_eval_tasks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))
    f = eval_profile(tmp_path / "p.toml", ["no_such_task_at_all"])
    assert main(["profile", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "lm-eval task names not checked: lm-eval is not installed (pip install 'ssm-workbench[eval]'" in out


# ------------------------------------------------------------------ Slurm: one process, one device
@pytest.mark.parametrize("slurm, words", [
    ("nodes = 2", ["slurm.nodes", "an evaluation runs on one device"]),
    ("gpus_per_run = 2", ["slurm.gpus_per_run", "uses one GPU"]),
    ("gpus_per_node = 1", ["slurm.gpus_per_node", "not gpus_per_node"]),
])
def test_an_eval_profile_on_slurm_is_refused_where_a_job_cannot_run_it(tmp_path, slurm, words):
    f = eval_profile(tmp_path / "p.toml", ["piqa"], extra=f'executor = "slurm"\n[slurm]\n{slurm}\n')
    with pytest.raises(P.ProfileError) as e:
        P.load(f, check_registries=False)
    for w in words:
        assert w in str(e.value), str(e.value)
    # the same [slurm] table is no error while the profile runs locally
    P.load(eval_profile(tmp_path / "q.toml", ["piqa"], extra=f"[slurm]\n{slurm}\n"), check_registries=False)


def test_an_eval_profile_on_slurm_needs_a_gpu_for_cuda(tmp_path):
    f = eval_profile(tmp_path / "p.toml", ["piqa"], extra='executor = "slurm"\n[slurm]\ngpus_per_run = 0\n')
    assert P.load(f, check_registries=False).executor == "slurm"  # device "cpu": a CPU job
    f.write_text(f.read_text().replace('device = "cpu"', 'device = "cuda"'))
    with pytest.raises(P.ProfileError, match='gpus_per_run = 0 with device "cuda"'):
        P.load(f, check_registries=False)


@needs_lm_eval
@pytest.mark.parametrize("args, words", [
    (["--executor", "slurm", "--slurm", "gpus_per_run=2"], "eval: --slurm gpus_per_run: gpus_per_run = 2"),
    (["--executor", "slurm", "--slurm", "partiton=gpu"], "eval: --slurm partiton: unknown setting; known: partition"),
    (["--slurm", "partition=gpu"], "eval: --slurm settings are for --executor slurm"),
    (["--executor", "slurm", "--slurm", "gpus_per_run=0", "--inline"], "not with --executor slurm"),
    (["--executor", "slurm", "--slurm", "gpus_per_run=0", "--device", "cuda"], 'with device "cuda"'),
])
def test_eval_on_slurm_refuses_bad_settings_in_one_line(tmp_path, monkeypatch, capsys, args, words):
    from workbench.cli import main

    fake_index(monkeypatch)
    st = tmp_path / "st"
    assert main(["--store", str(st), "eval", "someone/tiny-lm", "--tasks", "piqa", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not st.exists()


@needs_lm_eval
def test_eval_on_slurm_refuses_a_run_that_is_no_language_model_before_queueing(tmp_path, monkeypatch, capsys):
    from workbench.cli import main
    from workbench.store import Store

    fake_index(monkeypatch)
    st = tmp_path / "st"
    Store(st).close()
    assert main(["--store", str(st), "eval", "run:7", "--tasks", "piqa", "--executor", "slurm",
                 "--slurm", "gpus_per_run=0"]) == 2
    assert "eval: model run:7: no such run" in capsys.readouterr().err
    assert Store(st).runs() == []


# ------------------------------------------------------------------ lm-eval's real index
@needs_lm_eval
@pytest.mark.slow  # indexes lm-eval's ~15,000 task files once: 12 s on a quiet 2-core box, 5 min at load 10
def test_lm_evals_real_index_knows_table3_and_suggests_for_a_typo(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert lm_eval_tasks.unknown_tasks(TABLE3, []) == {}
    assert lm_eval_tasks.cache_path().is_file()
    assert lm_eval_tasks.unknown_tasks(["hellaswg"], [])["hellaswg"][0] == "hellaswag"
    f = eval_profile(tmp_path / "p.toml", [*TABLE3, "arc_chalenge"])
    assert main(["profile", "check", str(f)]) == 2
    assert "'arc_chalenge' (closest: arc_challenge" in capsys.readouterr().err
    f = eval_profile(tmp_path / "p.toml", TABLE3)
    assert main(["profile", "check", str(f)]) == 0


def test_a_slurm_job_imports_this_copy_of_the_project_whatever_folder_it_starts_in(tmp_path):
    """The job starts in the submitting folder, and `python -m` puts that folder first on the
    path: a user's tasks/ folder of lm-eval YAMLs shadowed the workbench's tasks package
    (ImportError in the job). The script puts this copy's root on PYTHONPATH, as the local
    scheduler does for its workers (not for another Python named in [slurm] python)."""
    from workbench.execute.slurm import SlurmSettings, job_script

    root = str(Path(__file__).resolve().parents[3])
    lines = job_script(3, SlurmSettings(gpus_per_run=0), tmp_path, tmp_path, "x").splitlines()
    line = next(i for i, text in enumerate(lines) if text.startswith("export PYTHONPATH="))
    assert lines[line] == f"export PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}"
    assert line < len(lines) - 1 and lines[-1].startswith("exec ")
    other = job_script(3, SlurmSettings(gpus_per_run=0, python="/opt/py/bin/python"), tmp_path, tmp_path, "x")
    assert "PYTHONPATH" not in other


@needs_lm_eval
def test_executor_slurm_on_the_command_line_checks_the_profiles_slurm_table(tmp_path, monkeypatch, capsys):
    """`run FILE --executor slurm` and `eval --from FILE --executor slurm --slurm K=V` validate
    the [slurm] table as if the file said executor = "slurm"; a valid one is listed as jobs."""
    from workbench.cli import main

    fake_index(monkeypatch)
    f = eval_profile(tmp_path / "p.toml", ["piqa"], extra="[slurm]\ngpus_per_run = 2\n")
    st = tmp_path / "st"
    assert main(["--store", str(st), "run", str(f), "--dry-run"]) == 0  # local: [slurm] unused
    capsys.readouterr()
    assert main(["--store", str(st), "run", str(f), "--executor", "slurm", "--dry-run"]) == 2
    assert "slurm.gpus_per_run" in capsys.readouterr().err
    assert main(["--store", str(st), "eval", "--from", str(f), "--executor", "slurm", "--slurm", "gpus_per_run=0",
                 "--slurm", "nodes=2", "--dry-run"]) == 2
    assert "'slurm.nodes' (from --slurm nodes=2): nodes = 2: an evaluation runs on one device" in \
        capsys.readouterr().err
    assert main(["--store", str(st), "eval", "--from", str(f), "--executor", "slurm", "--slurm", "gpus_per_run=0",
                 "--dry-run"]) == 0
    assert "1 evaluation run(s) would be launched as Slurm jobs" in capsys.readouterr().out
    assert not st.exists()
