"""Schema 2 profiles: [sweep.grid] over dotted keys, [[tasks]] with one-at-a-time
variants, schema 1 identity kept, dry-run JSON and idempotent replay of a grid."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.spec import profile as P
from workbench.execute import launch, scheduler
from workbench.spec.run_spec import spec_key
from workbench.store import Store

ROOT = Path(__file__).resolve().parents[3]

GRID = """\
schema_version = 2
name = "g"
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
[sweep]
models = ["transformer", "lstm"]
seq_lens = [12]
seeds = [0, 1]
[sweep.grid]
"train.lr" = [1e-4, 5e-4, 1e-3]
"train.weight_decay" = [0.0, 0.1]
[model]
d_model = 16
n_layers = 2
[model.options.transformer]
n_heads = 2
[train]
steps = 5
batch_size = 4
"""


def bad(text: str) -> str:
    with pytest.raises(P.ProfileError) as e:
        P.loads(text, "bad.toml")
    return str(e.value)


def test_grid_expands_cartesian_with_models_lengths_seeds():
    specs = P.expand(P.loads(GRID, "g.toml"))
    assert len(specs) == 2 * 1 * 3 * 2 * 2
    points = {(s.model, s.grid["train.lr"], s.grid["train.weight_decay"], s.seed) for s in specs}
    assert len(points) == 24
    for s in specs:  # the value is what trains, and it is in the fields under its dotted name
        assert s.train.lr == s.grid["train.lr"] == s.fields["train.lr"]
        assert s.train.weight_decay == s.grid["train.weight_decay"] == s.fields["train.weight_decay"]
        assert s.task_setting == s.fields["task_setting"] == "baseline"
        assert s.to_dict()["grid"] == s.grid
    # seeds innermost, then grid points: one grid point's seeds are neighbours
    assert [(s.grid["train.lr"], s.seed) for s in specs[:4]] == [(1e-4, 0), (1e-4, 1), (1e-4, 0), (1e-4, 1)]
    assert [s.grid["train.weight_decay"] for s in specs[:4]] == [0.0, 0.0, 0.1, 0.1]


def test_grid_over_model_width_option_and_task_parameter():
    text = (GRID.replace('"train.weight_decay" = [0.0, 0.1]\n',
                         '"model.d_model" = [16, 32]\n"task.num_tokens_to_copy" = [2, 3]\n'
                         '"model.options.transformer.n_heads" = [1, 2]\n')
            .replace('[model.options.transformer]\nn_heads = 2\n', ''))
    specs = P.expand(P.loads(text, "g.toml"))
    assert len(specs) == 2 * 3 * 2 * 2 * 2 * 2
    for s in specs:
        assert s.d_model == s.grid["model.d_model"] == s.fields["model.d_model"]
        assert s.task_params["num_tokens_to_copy"] == s.grid["task.num_tokens_to_copy"]
        assert s.fields["task.num_tokens_to_copy"] == s.grid["task.num_tokens_to_copy"]
        if s.model == "transformer":
            assert s.model_options["n_heads"] == s.grid["model.options.transformer.n_heads"]
        else:
            assert "n_heads" not in s.model_options


def test_unquoted_dotted_grid_keys_mean_the_same():
    text = GRID.replace('"train.lr"', "train.lr").replace('"train.weight_decay"', "train.weight_decay")
    assert P.expand(P.loads(text, "g.toml")) == P.expand(P.loads(GRID, "g.toml"))


@pytest.mark.parametrize("line, value, key, why", [
    ('"train.lr" = [1e-4, 5.0]', "5.0", "train.lr", "less than or equal to 1"),
    ('"train.weight_decay" = [0.0, -1.0]', "-1.0", "train.weight_decay", "greater than or equal to 0"),
    ('"train.epochs" = [true]', "true", "train.epochs", "expected an integer"),
    ('"model.d_model" = [16, 0]', "0", "model.d_model", "greater than 0"),
    ('"train.nope" = [1]', "1", "train.nope", "unknown key 'train.nope'"),
])
def test_a_bad_grid_value_names_key_value_and_line(line, value, key, why):
    target = '"train.lr" = [1e-4, 5e-4, 1e-3]' if key == "train.lr" else '"train.weight_decay" = [0.0, 0.1]'
    text = GRID.replace(target, line)
    msg = bad(text)
    lineno = text.splitlines().index(line) + 1
    assert f"sweep.grid '{key}' = {value} (line {lineno})" in msg and why in msg, msg


def test_grid_values_are_checked_together_and_against_the_registries():
    # each value alone is fine; adamw's lr * weight_decay >= 1 only at one combination
    msg = bad(GRID.replace('"train.weight_decay" = [0.0, 0.1]', '"train.weight_decay" = [0.0, 50.0]')
              .replace("[1e-4, 5e-4, 1e-3]", "[1e-4, 0.05]"))
    assert "sweep.grid point 'train.lr' = 0.05, 'train.weight_decay' = 50.0" in msg and "lr * weight_decay" in msg
    # a model option value the model refuses, placed at its grid value
    text = GRID.replace('"train.weight_decay" = [0.0, 0.1]', '"model.options.transformer.n_heads" = [2, 3]')
    text = text.replace("[model.options.transformer]\nn_heads = 2\n", "")
    msg = bad(text)
    lineno = text.splitlines().index('"model.options.transformer.n_heads" = [2, 3]') + 1
    assert "model.options.transformer.n_heads' = 3" in msg and f"line {lineno}" in msg, msg
    # a task parameter the task does not have
    msg = bad(GRID.replace('"train.weight_decay" = [0.0, 0.1]', '"task.nokey" = [1, 2]'))
    assert "sweep.grid 'task.nokey'" in msg and "no parameter 'nokey'" in msg
    # a grid over a model the sweep does not run would only repeat runs
    msg = bad(GRID.replace('"train.weight_decay" = [0.0, 0.1]', '"model.options.mamba.d_state" = [8, 16]'))
    assert "'mamba' is not a model of the sweep" in msg
    # schema 1 has no grid
    assert "needs schema_version = 2" in bad(GRID.replace("schema_version = 2", "schema_version = 1"))


VARIANTS = """\
schema_version = 2
name = "v"
[[tasks]]
name = "mad_in_context_recall"
vocab_size = 16
seq_len = 32
num_train_examples = 64
num_test_examples = 16
variants = { seq_len = [16, 64], num_train_examples = [128, 32] }
[[tasks]]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
[sweep]
models = ["lstm"]
seq_lens = [12, 20]
seeds = [0]
[model]
d_model = 16
[train]
steps = 3
batch_size = 4
"""


def test_variants_give_baseline_plus_each_change_alone():
    p = P.loads(VARIANTS, "v.toml")
    specs = P.expand(p)
    recall = [s for s in specs if s.task == "mad_in_context_recall"]
    settings = {s.task_setting: (s.seq_len, s.task_params["num_train_examples"]) for s in recall}
    # 1 + 4 settings; each variant changes one value, the rest is the baseline
    assert settings == {"baseline": (32, 64), "seq_len=16": (16, 64), "seq_len=64": (64, 64),
                        "num_train_examples=128": (32, 128), "num_train_examples=32": (32, 32)}
    assert len(recall) == 5  # a task's own seq_len (and a seq_len variant) wins over sweep.seq_lens
    assert all(s.fields["task_setting"] == s.task_setting for s in specs)
    copying = [s for s in specs if s.task == "mad_selective_copying"]
    assert [(s.task_setting, s.seq_len) for s in copying] == [("baseline", 12), ("baseline", 20)]
    # the dump round-trips both sections and the variants
    again = P.loads(P.dumps(p), "v.toml")
    assert again == p and P.expand(again) == specs


def test_bad_variants_and_task_lists_are_named():
    assert "task 'mad_in_context_recall' has no parameter 'nope'" in bad(
        VARIANTS.replace("num_train_examples = [128, 32]", "nope = [1]")) or "no parameter 'nope'" in bad(
        VARIANTS.replace("num_train_examples = [128, 32]", "nope = [1]"))
    msg = bad(VARIANTS.replace("seq_len = [16, 64]", "seq_len = [16, 7]"))
    lineno = next(i for i, l in enumerate(VARIANTS.splitlines(), 1) if l.startswith("variants"))
    assert "(seq_len=7)" in msg and f"line {lineno}" in msg, msg
    assert "duplicate" in bad(VARIANTS.replace('name = "mad_selective_copying"', 'name = "mad_in_context_recall"'))
    assert "needs schema_version = 2" in bad(VARIANTS.replace("schema_version = 2", "schema_version = 1"))


# Spec keys (checkpoint.spec_key, the identity replay matches on) of a schema 1 profile as
# the schema 1 code expanded it (frozen before schema 2 existed): they must never change,
# or replaying an old profile would queue its finished runs again.
def _keys_sha(specs) -> str:
    return hashlib.sha256("\n".join(spec_key(s.to_dict()) for s in specs).encode()).hexdigest()[:16]


FROZEN = {  # shipped schema 1 profiles: (runs, sha256 of their spec keys) before schema 2
    "mad-in-context-recall.toml": (2, "788e081c720a2dd1"),
    "mad-selective-copying.toml": (6, "ae586d3186775094"),
    "induction-heads.toml": (1, "5250b9d5993a4b90"),
    "digits-image.toml": (5, "711be737b66ca068"),
}


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_schema1_profiles_keep_their_spec_keys(name):
    p = P.load(ROOT / "profiles" / name, check_registries=False)
    assert p.schema_version == 1
    specs = P.expand(p)
    assert all("grid" not in s.to_dict() and "task_setting" not in s.to_dict() for s in specs)
    assert (len(specs), _keys_sha(specs)) == FROZEN[name]


def test_schema1_dump_stays_schema1():
    p = P.load(ROOT / "profiles" / "mad-in-context-recall.toml")
    d = P.to_dict(p)
    assert "tasks" not in d and "grid" not in d["sweep"] and d["task"]["name"] == "mad_in_context_recall"
    assert P.expand(P.loads(P.dumps(p), "mad-in-context-recall.toml")) == P.expand(p)


def cli(tmp_path, *args, timeout=300, columns=None):
    env = dict(os.environ, **({"COLUMNS": str(columns)} if columns else {}))
    return subprocess.run([sys.executable, "-m", "workbench.cli", "--store", str(tmp_path / "store"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_dry_run_json_has_grid_values_under_dotted_keys(tmp_path, cache_env, capsys):
    from workbench import cli as workbench_cli

    prof = tmp_path / "g.toml"
    prof.write_text(GRID)
    # the JSON through the CLI's main in this process; the table below through the command
    assert workbench_cli.main(["--store", str(tmp_path / "store"), "run", "--dry-run", "--format", "json",
                               str(prof)]) == 0, capsys.readouterr().err
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 24
    assert {(x["model"], x["train.lr"], x["train.weight_decay"], x["seed"]) for x in rows} == {
        (m, lr, wd, s) for m in ("transformer", "lstm") for lr in (1e-4, 5e-4, 1e-3) for wd in (0.0, 0.1)
        for s in (0, 1)}
    assert all(x["task_setting"] == "baseline" and x["seq_len"] == 12 for x in rows)
    assert not (tmp_path / "store").exists()
    # at 80 columns the grid's axes stay whole (issue 32: they read 'train…'); the constant
    # columns that no longer fit are named under the table
    r = cli(tmp_path, "run", "--dry-run", str(prof), columns=80)
    assert r.returncode == 0 and "24 run(s) would be launched" in r.stdout
    header = r.stdout.splitlines()[0].split()
    assert header[:5] == ["model", "L", "seed", "train.lr", "train.weight_decay"], header
    assert "…" not in r.stdout
    assert "left out at 80 columns: task, setting, device" in r.stdout
    r = cli(tmp_path, "run", "--dry-run", str(prof), columns=160)
    assert r.stdout.splitlines()[0].split()[:3] == ["model", "task", "setting"] and "left out" not in r.stdout


class FakePopen:
    launched: list = []

    def __init__(self, cmd, **kw):
        self.cmd, self.pid = cmd, os.getpid()
        FakePopen.launched.append(cmd)


def test_replaying_a_grid_profile_queues_nothing_the_second_time(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)
    FakePopen.launched = []
    store = Store(tmp_path / "st")
    first = launch.submit(store, P.loads(GRID, "g.toml"))
    assert len(first.queued) == 24 and len(FakePopen.launched) == 1
    stored = {json.dumps(r.spec["grid"], sort_keys=True) for r in store.runs()}
    assert len(stored) == 6  # the grid point is in each run's record
    for rid in first:
        store.finish(rid, "finished")
    again = launch.submit(store, P.loads(GRID, "g.toml"))
    assert again.queued == [] and sorted(again.skipped) == sorted(first) and len(store.runs()) == 24
    assert len(FakePopen.launched) == 1
    # one more grid value: only its runs are new
    more = launch.submit(store, P.loads(GRID.replace("[0.0, 0.1]", "[0.0, 0.1, 0.2]"), "g.toml"))
    assert len(more.queued) == 12 and len(more.skipped) == 24


def test_a_5000_run_grid_expands():
    text = (GRID.replace("seeds = [0, 1]", "seeds = [0, 1, 2, 3, 4]")
            .replace('"train.weight_decay" = [0.0, 0.1]',
                     '"train.weight_decay" = [0.0, 0.01, 0.02, 0.05, 0.1]\n'
                     '"train.warmup_steps" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n'
                     '"train.batch_size" = [2, 4, 8, 16, 32]')
            .replace("[1e-4, 5e-4, 1e-3]", "[1e-4, 5e-4]").replace("steps = 5", "steps = 20"))
    specs = P.expand(P.loads(text, "big.toml"))
    assert len(specs) == 2 * 2 * 5 * 10 * 5 * 5 == 5000
    assert len({spec_key(s.to_dict()) for s in specs}) == 5000
