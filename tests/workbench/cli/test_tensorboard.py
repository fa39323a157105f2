"""Runs as TensorBoard event files (workbench/results/tensorboard.py): ``export --format
tensorboard`` and ``train.tensorboard = true``, read back with the ``tensorboard``
package's own event reader (EventAccumulator), as TensorBoard and ``wandb sync`` read them."""
from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from helpers import tiny_profile_text  # noqa: E402
from tasks import metrics as task_metrics  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.results import tensorboard as tb  # noqa: E402
from workbench.spec.profile import expand, loads  # noqa: E402
from workbench.store import Store  # noqa: E402
from workbench.train import worker  # noqa: E402


def grid_text(steps=20, eval_every=10, log_every=5, extra=""):
    """2 models x 2 learning rates x 2 seeds; ``extra``: TOML lines after [train]'s keys."""
    return tiny_profile_text("tb", schema_version=2, models=["lstm", {"name": "transformer", "label": "attn"}],
                             seeds=[0, 1], grid={"train.lr": [1e-3, 3e-3]}, examples=(64, 16), d_model=16,
                             steps=steps, batch_size=8, eval_every=eval_every, log_every=log_every,
                             warmup_steps=0, device="cpu", tail=extra)


def specs(steps=20, eval_every=10, log_every=5, extra=""):
    return [s.to_dict() for s in expand(loads(grid_text(steps, eval_every, log_every, extra)))]


def read(folder):
    """{tag: [(step, value), ...]} of every scalar in a run folder, and the accumulator."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}, acc


def fill(store: Store, rid: int, k: int) -> None:
    """A finished run with curves and results (no training): distinct numbers per run."""
    store.mark_started(rid, os.getpid(), "cpu", None)
    store.add_metrics(rid, [(s, s / 10, "train", "loss", 3.0 - s / 10 + k) for s in (5, 10, 15, 20)]
                      + [(s, s / 10, "eval", "accuracy", s / 40 + k / 100) for s in (10, 20)]
                      + [(20, 2.0, "train", "lr", None)])  # a non-finite value, kept as NULL
    store.set_results(rid, {"accuracy": 0.5 + k / 100, "loss": 1.25 + k, "params": 1000.0 + k})
    store.set_results(rid, {"accuracy": 0.4 + k / 100}, eval_set="valid")
    store.heartbeat(rid, step=20)
    assert store.finish(rid, "finished")


def test_export_writes_one_folder_per_run_named_by_its_grid_point(tmp_path, capsys):
    store = Store(tmp_path / "st")
    ids = store.add_runs(specs())  # 2 models x 2 lr x 2 seeds
    for k, rid in enumerate(ids):
        fill(store, rid, k)
    out = tmp_path / "tb"
    assert main(["--store", str(store.root), "export", "--format", "tensorboard", "-o", str(out)]) == 0
    assert f"wrote {len(ids)} run folder(s)" in capsys.readouterr().out
    folders = sorted(p.name for p in (out / "tb").iterdir())
    assert "lstm_mad_selective_copying_L10_seed0_lr=0.001_run1" in folders
    assert "attn_mad_selective_copying_L10_seed1_lr=0.003_run8" in folders
    assert len(folders) == len(ids)
    for k, rid in enumerate(ids):
        run = store.get(rid)
        scalars, acc = read(tb.run_dir(out, rid, run.spec))
        rows = [r for r in store.metrics(rid) if r["value"] is not None]
        want: dict = {}
        for r in rows:
            want.setdefault(f"{r['split']}/{r['name']}", []).append((r["step"], r["value"]))
        for tag, points in want.items():  # every curve point, its step and value
            assert scalars[tag] == [(s, pytest.approx(v)) for s, v in points], tag
        assert "train/lr" not in scalars  # NULL (non-finite) is not a point
        assert scalars["results/accuracy"] == [(20, pytest.approx(0.5 + k / 100))]
        assert scalars["results/loss"] == [(20, pytest.approx(1.25 + k))]
        assert scalars["results/valid/accuracy"] == [(20, pytest.approx(0.4 + k / 100))]
        hp = acc.PluginTagToContent("hparams")  # the settings, for the HParams tab and wandb
        assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hp)
        from tensorboard.plugins.hparams import plugin_data_pb2

        start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"])
        got = {k2: v.ListFields()[0][1] for k2, v in start.session_start_info.hparams.items()}
        assert got["model"] == run.label and got["seed"] == run.seed and got["train.lr"] == run.spec["grid"]["train.lr"]

    # exported again: the folder is replaced, never a second copy of each point
    assert main(["--store", str(store.root), "export", "--format", "tensorboard", "-o", str(out),
                 "--run", str(ids[0])]) == 0
    folder = tb.run_dir(out, ids[0], store.get(ids[0]).spec)
    assert len(list(folder.glob(tb.EVENT_PREFIX + "*"))) == 1
    assert read(folder)[0]["train/loss"] == [(s, pytest.approx(3.0 - s / 10)) for s in (5, 10, 15, 20)]
    assert not [p for p in (out / "tb").iterdir() if p.name.startswith(".")]  # no temporary folders


def test_export_without_runs_or_tensorboardx_is_one_line(tmp_path, capsys, monkeypatch):
    store = Store(tmp_path / "st")
    assert main(["--store", str(store.root), "export", "--format", "tensorboard"]) == 1
    assert "no finished runs" in capsys.readouterr().err
    (rid,) = store.add_runs(specs()[:1])
    fill(store, rid, 0)

    def missing():
        raise tb.TensorBoardMissing(f"TensorBoard event files need tensorboardX: {tb.TB_EXTRA}")

    monkeypatch.setattr(tb, "summary_writer", missing)
    assert main(["--store", str(store.root), "export", "--format", "tensorboard"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ssm-workbench[tensorboard]'" in err
    assert not tb.default_root(store.root).exists()


def test_profile_check_says_tensorboardx_is_missing(tmp_path, monkeypatch):
    import importlib.util

    from workbench.spec.profile import ProfileError, load

    path = tmp_path / "p.toml"
    text = grid_text(extra="tensorboard = true")
    path.write_text(text)
    load(str(path))  # installed: valid
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tensorboardX" else real(n, *a))
    line = text.splitlines().index("tensorboard = true") + 1
    with pytest.raises(ProfileError, match=rf"train.tensorboard \(line {line}\).*ssm-workbench\[tensorboard\]"):
        load(str(path))


class Died(BaseException):
    """Like SIGKILL: none of the worker's own handling runs."""


def _train(store, rid, stop_at=None, die_at=None):
    """The worker in-process; with ``stop_at`` = k, SIGTERM arrives in training step k; with
    ``die_at`` = k the worker dies there."""
    real, calls = task_metrics.loss, [0]

    def loss(logits, targets):
        calls[0] += 1
        if calls[0] == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if calls[0] == die_at:
            raise Died()
        return real(logits, targets)

    task_metrics.loss = loss
    try:
        assert store.mark_started(rid, os.getpid(), "cpu", "cpu0")
        return worker.run(str(store.root), rid)
    finally:
        task_metrics.loss = real


def _store_curves(store, rid):
    want: dict = {}
    for r in store.metrics(rid):
        if r["value"] is not None:
            want.setdefault(f"{r['split']}/{r['name']}", []).append((r["step"], pytest.approx(r["value"], rel=1e-6)))
    return want


def test_a_training_run_writes_its_events_live(tmp_path):
    store = Store(tmp_path / "st")
    spec = specs(steps=12, eval_every=6, log_every=3, extra="tensorboard = true")[0]
    (rid,) = store.add_runs([spec])
    assert _train(store, rid) == 0
    assert store.get(rid).state == "finished", store.get(rid).error
    folder = tb.run_dir(tb.default_root(store.root), rid, spec)
    assert folder.name == f"lstm_mad_selective_copying_L10_seed0_lr=0.001_run{rid}"
    scalars, acc = read(folder)
    want = _store_curves(store, rid)
    assert set(want) <= set(scalars) and want["train/loss"] and want["eval/accuracy"]
    for tag, points in want.items():
        assert scalars[tag] == points, tag
    res = store.results([rid])[rid]
    assert scalars["results/accuracy"] == [(12, pytest.approx(res[""]["accuracy"]))]
    assert scalars["results/valid/loss"] == [(12, pytest.approx(res["valid"]["loss"]))]
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")


def test_a_resumed_run_purges_the_interrupted_attempts_later_points(tmp_path, monkeypatch):
    """A worker dies 3 steps after its checkpoint at step 5; the resumed attempt's events
    replace those 3 points (TensorBoard's purge step), as its rows replace them in the store."""
    from workbench.execute import resume

    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)
    store = Store(tmp_path / "st")
    spec = specs(steps=12, eval_every=6, log_every=1, extra="tensorboard = true\ncheckpoint_every = 5")[0]
    (rid,) = store.add_runs([spec])
    with pytest.raises(Died):
        _train(store, rid, die_at=9)
    folder = tb.run_dir(tb.default_root(store.root), rid, spec)
    assert [s for s, _ in read(folder)[0]["train/loss"]] == list(range(1, 9))  # 6..8 after the checkpoint
    store.finish(rid, "crashed", "worker exited without finishing")
    assert resume.requeue(store, rid) == "resumed"
    assert _train(store, rid) == 0
    scalars, _ = read(folder)
    # one point per step, each the store's (the resumed attempt's) value
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))
    assert scalars["train/loss"] == _store_curves(store, rid)["train/loss"]
