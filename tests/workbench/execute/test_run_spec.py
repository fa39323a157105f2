"""The worker's typed spec: ``RunSpec.from_dict`` reads a stored spec dict, filling the
schema's defaults for keys older stores lack, refusing unknown keys, and keeping values as
stored; a run queued by an older version still runs, is interrupted and resumes."""
import os
import signal

import pytest

from tasks import metrics as task_metrics
from workbench.execute import resume
from workbench.spec.profile import expand, loads
from workbench.spec.run_spec import RunSpec, spec_key
from workbench.spec.schema import EarlyStopping, TrainSection
from workbench.store import Store
from workbench.train import checkpoint, worker

PROFILE = """
schema_version = {version}
name = "old"
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 32
num_test_examples = 8
[sweep]
models = ["lstm"]
seq_lens = [10]
{grid}
[model]
d_model = 8
n_layers = 1
[train]
steps = 12
batch_size = 8
lr = 3e-3
eval_every = 4
log_every = 2
device = "cpu"
"""

# train keys added after the first stores were written (git log -S of the worker's
# cfg.get calls: optimizer in 725804f, compile in 037b040, checkpoint_* in ef875be)
ADDED_SINCE = ("optimizer", "compile", "checkpoint_every", "checkpoint_minutes")


def current(version=1, grid=""):
    return expand(loads(PROFILE.format(version=version, grid=grid)))[0].to_dict()


def as_first_stored(d):
    """The spec dict as the first stores held it: no train keys added since."""
    old = {**d, "train": {k: v for k, v in d["train"].items() if k not in ADDED_SINCE}}
    assert "grid" not in old and "task_setting" not in old  # schema 1 specs never had them
    return old


def test_from_dict_gives_the_schema_defaults_for_keys_older_stores_lack():
    s = RunSpec.from_dict(as_first_stored(current()))
    defaults = TrainSection.model_fields
    for key in ADDED_SINCE:
        assert getattr(s.train, key) == defaults[key].default, key
    assert (s.train.optimizer, s.train.compile, s.train.checkpoint_every, s.train.checkpoint_minutes) == \
        ("adamw", False, 0, 10.0)
    assert s.grid is None and s.task_setting is None
    # the stored values, typed
    assert (s.train.steps, s.train.lr, s.train.batch_size, s.seed) == (12, 3e-3, 8, 0)
    assert s.train.betas == (0.9, 0.999) and isinstance(s.train.betas, tuple)
    assert isinstance(s.train.early_stopping, EarlyStopping) and s.train.early_stopping.patience == 0


def test_a_missing_early_stopping_key_gets_its_default_too():
    d = current()
    del d["train"]["early_stopping"]["target"]
    assert RunSpec.from_dict(d).train.early_stopping.target is None


@pytest.mark.parametrize("version,grid", [(1, ""), (2, '[sweep.grid]\n"train.lr" = [1e-3, 3e-3]')])
def test_a_current_spec_round_trips(version, grid):
    d = current(version, grid)
    s = RunSpec.from_dict(d)
    assert s.to_dict() == d and spec_key(s.to_dict()) == spec_key(d)


@pytest.mark.parametrize("where,change,named", [
    ("top", {"optimiser": "adam"}, "optimiser"),
    ("train", {"lr_decay": 0.5}, "train.lr_decay"),
    ("early_stopping", {"patient": 3}, "train.early_stopping.patient"),
])
def test_an_unknown_key_is_an_error_naming_it(where, change, named):
    d = current()
    {"top": d, "train": d["train"], "early_stopping": d["train"]["early_stopping"]}[where].update(change)
    with pytest.raises(ValueError, match=rf"unknown key\(s\) {named}"):
        RunSpec.from_dict(d)


def test_a_missing_required_key_is_an_error_naming_it():
    d = current()
    del d["seed"]
    with pytest.raises(ValueError, match=r"missing key\(s\) seed"):
        RunSpec.from_dict(d)


def test_values_are_taken_as_stored_not_checked_again():
    # the schema refuses lr > 1 today; a run already stored with one still runs as stored
    d = current()
    d["train"]["lr"] = 1e30
    assert RunSpec.from_dict(d).train.lr == 1e30


# --------------------------------------------------------------------------- through the worker
def attempt(monkeypatch, store, rid, at=None):
    """The worker in-process; with ``at`` = k, SIGTERM arrives in this attempt's k-th step."""
    real, calls = task_metrics.loss, [0]

    def loss(logits, targets):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(logits, targets)

    monkeypatch.setattr(task_metrics, "loss", loss)
    assert store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    try:
        return worker.run(str(store.root), rid)
    finally:
        monkeypatch.setattr(task_metrics, "loss", real)


def train_rows(store, rid):
    return [(m["step"], m["split"], m["name"], m["value"]) for m in store.metrics(rid)]


def test_a_run_queued_by_an_older_version_runs_stops_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # the in-process worker is gone
    new = current()
    whole = Store(tmp_path / "whole")
    (w,) = whole.add_runs([new])
    assert attempt(monkeypatch, whole, w) == 0

    old = as_first_stored(new)
    store = Store(tmp_path / "old")
    (rid,) = store.add_runs([old])
    assert attempt(monkeypatch, store, rid, at=5) == 128 + signal.SIGTERM
    r = store.get(rid)
    assert r.state == "preempted" and r.info["checkpoint"]["step"] == 5, r.error
    # the checkpoint carries the identity of the spec as stored (not with defaults filled)
    assert checkpoint.read_header(checkpoint.path_for(store.root, rid)).spec_key == spec_key(old)
    assert resume.requeue(store, rid) == "resumed"
    assert attempt(monkeypatch, store, rid) == 0
    r = store.get(rid)
    assert r.state == "finished", r.error
    assert [x["step"] for x in r.info["resumed"]] == [5]
    # the defaults filled in are what the current spec says: the same computation
    assert train_rows(store, rid) == train_rows(whole, w)
