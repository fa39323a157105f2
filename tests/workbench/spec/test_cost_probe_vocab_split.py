"""The memory probe with the vocabulary apart (workbench/spec/cost_probe.py, "the vocabulary
apart"): a token model with a per-position head is probed with a vocabulary of
SPLIT_VOCAB tokens, and the real vocabulary's embedding, head and float32 log-softmax
are added from their shapes. These tests hold the split to a probe of the whole model.

Tolerance: the split adds integers (parameters, bytes) to each probe length's row before
the same fit a whole probe makes, so the two are equal up to the fit's float rounding; a
relative 1e-9 allows that rounding and nothing else (a missing logits term at vocabulary
300 and d_model 16 moves per-sample bytes by 20% or more, as a too-small vocabulary moved
the 125M models' estimates by 11 GiB before the log-softmax was counted).
"""
from __future__ import annotations

import pytest
import torch

import tasks
from workbench.spec import cost_probe as cp
from workbench.spec import probe_vocab

LENGTHS = (64, 128, 256, 1000, 2048)


def _fresh(monkeypatch):
    """Empty in-process caches (no probe from an earlier test), nothing read or written on disk."""
    monkeypatch.setattr(cp, "_PROBES", {})
    monkeypatch.setattr(cp, "_ROWS", {})
    monkeypatch.setattr(cp, "_DISK", {})
    monkeypatch.setattr(cp, "_save_disk_cache", lambda probes: None)


def _whole_and_split(task, model: str, d_model: int, n_layers: int, options: dict):
    whole = cp._probe_task(task, model, d_model, n_layers, options, False)
    split = probe_vocab.split_vocab(task, model, d_model, options)
    assert split is not None, "this shape must be probed with the vocabulary apart"
    small, small_options, vocab = split
    assert small.vocab_size <= probe_vocab.SPLIT_VOCAB and small.num_classes <= probe_vocab.SPLIT_VOCAB
    return whole, cp._probe_task(small, model, d_model, n_layers, small_options, False, vocab)


def _assert_same(whole: cp.Profile, split: cp.Profile) -> None:
    for f in cp.Profile._FITS:
        for L in LENGTHS:
            a, b = getattr(whole, f)(L), getattr(split, f)(L)
            assert b == pytest.approx(a, rel=1e-9, abs=1e-6), (f, L, a, b)
    assert (whole.backend, whole.can_stream) == (split.backend, split.can_stream)


@pytest.mark.parametrize("model", ["transformer", "mamba", "mamba2", "gated_deltanet", "rwkv7", "lstm", "hyena"])
@pytest.mark.parametrize("vocab,tie", [(300, None), (300, False), (257, True)])
def test_the_split_probe_equals_a_probe_of_the_whole_model(monkeypatch, model, vocab, tie):
    """Tied and untied heads, models whose largest saved tensor is the logits and models
    where it is the body's, at a depth that is probed directly."""
    _fresh(monkeypatch)
    torch.manual_seed(0)
    task = tasks.build("mqar", vocab_size=vocab, seq_len=64, num_kv_pairs=4)
    options = {} if tie is None else {"tie_embeddings": tie}
    whole, split = _whole_and_split(task, model, 16, 2, options)
    _assert_same(whole, split)
    # what the vocabulary adds, measured by the whole probe: the float32 log-softmax of
    # the logits (4 bytes a class and position, the logits themselves are not kept)
    small, small_options, _ = probe_vocab.split_vocab(task, model, 16, options)
    body = cp._probe_task(small, model, 16, 2, small_options, False)
    for L in (64, 256):
        assert whole.per_sample(L) - body.per_sample(L) == pytest.approx(4 * L * (vocab - small.num_classes))
    assert whole.params(256) - body.params(256) >= (vocab - probe_vocab.SPLIT_VOCAB) * 16


@pytest.mark.parametrize("model", ["transformer", "mamba"])
def test_the_split_holds_for_deep_models_and_for_classes_unlike_the_vocabulary(monkeypatch, model):
    """Deep models are probed at 2 and 4 layers and extrapolated: the vocabulary is added
    at each depth, once. A per-position head over classes other than the input tokens
    (here 40 classes over 300 tokens, so untied) adds its own logits, not the vocabulary's."""
    _fresh(monkeypatch)
    _assert_same(*_whole_and_split(tasks.build("mqar", vocab_size=1000, seq_len=64, num_kv_pairs=4),
                                   model, 16, 7, {}))
    shape = probe_vocab.ShapeTask("shape", 64, "per_position", vocab_size=300, num_classes=40)
    _assert_same(*_whole_and_split(shape, model, 16, 2, {}))


def test_a_large_vocabulary_is_never_built_and_the_estimate_is_unchanged(monkeypatch):
    """`probe` builds only the small stand-in for an LM-shaped task (the 50k-vocabulary
    models of profiles/lm-scaling-paper-gpu.toml were most of a cold `profile check`), and
    its estimate is the whole probe's."""
    from types import SimpleNamespace

    _fresh(monkeypatch)
    built: list[tuple[int, int]] = []
    real_build = cp._build

    def recording(task, *args, **kwargs):
        built.append((task.vocab_size, task.num_classes))
        return real_build(task, *args, **kwargs)

    monkeypatch.setattr(cp, "_build", recording)
    task = tasks.build("mqar", vocab_size=8192, seq_len=64, num_kv_pairs=4)
    spec = SimpleNamespace(model="mamba", model_options={}, d_model=16, n_layers=6)
    prof = cp.probe(spec, False, task)
    assert built and max(max(b) for b in built) <= probe_vocab.SPLIT_VOCAB, built
    monkeypatch.setattr(cp, "_build", real_build)
    whole = cp._probe_task(task, "mamba", 16, 6, {}, False)
    _assert_same(whole, prof)
    # the float32 log-softmax of the logits is in the estimate: 4 bytes a class and position
    assert prof.per_sample(2048) >= 2048 * 8192 * 4
    assert prof.largest(2048) == pytest.approx(2048 * 8192 * 4)


def test_vocabularies_of_one_model_share_one_probe_of_its_body(monkeypatch):
    """Two vocabularies (and two depths sharing the 2-layer probe) of one model: the body
    is measured once per depth, not once per vocabulary or per depth asked."""
    from types import SimpleNamespace

    _fresh(monkeypatch)
    measured: list = []
    real = cp._measure_depth

    def counted(task, model, d_model, n_layers, *args):
        measured.append((task.vocab_size, n_layers))
        return real(task, model, d_model, n_layers, *args)

    monkeypatch.setattr(cp, "_measure_depth", counted)
    for vocab in (500, 700):
        task = tasks.build("mqar", vocab_size=vocab, seq_len=64, num_kv_pairs=4)
        for depth in (2, 8):
            cp.probe(SimpleNamespace(model="gated_deltanet", model_options={}, d_model=16, n_layers=depth),
                     False, task)
    assert sorted(measured) == [(probe_vocab.SPLIT_VOCAB, 2), (probe_vocab.SPLIT_VOCAB, 4)]


def test_small_vocabularies_and_other_shapes_are_probed_whole():
    task = tasks.build("mqar", vocab_size=12, seq_len=64, num_kv_pairs=4)  # at most SPLIT_VOCAB tokens
    assert probe_vocab.split_vocab(task, "mamba", 16, {}) is None
    pooled = probe_vocab.ShapeTask("shape", 64, "pooled", vocab_size=5000, num_classes=2, pooled=True)
    assert probe_vocab.split_vocab(pooled, "mamba", 16, {}) is None
    features = probe_vocab.ShapeTask("shape", 64, "per_position", vocab_size=None, num_classes=5000, input_dim=3)
    assert probe_vocab.split_vocab(features, "mamba", 16, {}) is None


def test_the_profile_check_counts_each_backbone_once(monkeypatch):
    """The profile check builds every model configuration on the meta device; the
    estimate's size check reuses those counts instead of building the backbone again."""
    from workbench.spec import check, estimate
    from workbench.spec import profile as P

    _fresh(monkeypatch)
    monkeypatch.setattr(cp, "_BACKBONE_WEIGHTS", {})
    monkeypatch.setattr(cp, "_TOO_BIG", {})
    monkeypatch.setattr(check, "_META_BUILT", {})
    import models.registry as R

    calls: list = []
    real = R.build_shapes

    def counted(name, *args, **kwargs):
        calls.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(R, "build_shapes", counted)
    text = """schema_version = 2
name = "once"
[task]
name = "mqar"
vocab_size = 64
num_kv_pairs = 2
num_train_examples = 16
num_test_examples = 8
[sweep]
models = ["gated_deltanet"]
seq_lens = [64]
[model]
d_model = 16
n_layers = 2
[train]
epochs = 1
batch_size = 4
device = "cpu"
"""
    prof = P.loads(text, "once.toml")
    assert calls.count("gated_deltanet") == 1  # the check's build
    [e] = estimate.estimate_profile(prof)
    assert e.error is None and e.params
    assert calls.count("gated_deltanet") == 1  # none for the estimate's size check
