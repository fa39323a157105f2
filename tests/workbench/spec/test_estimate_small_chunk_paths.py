"""The resource estimate and the layers' small-chunk paths (models.common.take_whole;
workbench/spec/cost_probe.py, "the small-chunk paths").

Mamba-2 (on a CPU, ``WHOLE_MAX_BYTES``) and the delta rules (any device,
``PROJ_WHOLE_MAX_BYTES``) keep more per layer while a chunk is small. The probe runs tiny
batches and lengths, so it used to measure the small path for every run, and the 125M
Mamba-2 of profiles/lm-scaling-paper-gpu.toml read 124.3 GiB instead of the 86.6 GiB of
the sliced path its run takes. These tests shrink the thresholds (monkeypatch) so that a
tiny model's run is past them, and hold the estimate to the path the run takes: past the
threshold (or on CUDA for Mamba-2), the estimate with the small path switched off
(threshold 0); under it, the estimate with the small path always on. The two differ, so
each comparison can fail.
"""
from __future__ import annotations

import pytest
import torch

import models
from models import common
from models.linear_rnn import delta_mixers
from models.linear_rnn.delta_mixers import _DeltaBase
from models.ssm import mamba2
from models.ssm.mamba2 import Mamba2
from workbench.spec import cost_probe as cp
from workbench.spec import estimate

PROFILE = """
schema_version = 1
name = "small-chunks"
[task]
name = "induction_heads"
vocab_size = 16
[sweep]
models = ["{model}"]
seq_lens = [{L}]
[model]
d_model = 16
n_layers = 2
[train]
steps = 10
batch_size = {B}
"""

LIMITS = {"mamba2": (mamba2, "WHOLE_MAX_BYTES"), "gated_deltanet": (delta_mixers, "PROJ_WHOLE_MAX_BYTES")}
RUN_BYTES_TOKENS = 1024   # the shrunk threshold, in tokens: above every probe batch (2 x 256)


def _fresh(monkeypatch):
    """No probe from an earlier setting of the thresholds, nothing read or written on disk."""
    monkeypatch.setattr(cp, "_PROBES", {})
    monkeypatch.setattr(cp, "_ROWS", {})
    monkeypatch.setattr(cp, "_DISK", {})
    monkeypatch.setattr(cp, "_save_disk_cache", lambda probes: None)


def _bytes_per_token(model: str) -> int:
    """What the layer's small path keeps per token (float32): in_proj's output for Mamba-2,
    the one projection matmul's for the delta rules."""
    net = models.build(model, d_model=16, n_layers=1)
    for m in net.modules():
        if isinstance(m, Mamba2):
            return m.in_proj.out_features * 4
        if isinstance(m, _DeltaBase):
            return (sum(m._split) + m.b_proj.weight.shape[0]) * 4
    raise AssertionError(f"{model} has no small-chunk layer")


def _parts(monkeypatch, model: str, limit: int, B: int, L: int, device: str = "cpu") -> dict:
    from workbench.spec import profile as P
    from workbench.spec.expand import expand

    _fresh(monkeypatch)
    monkeypatch.setattr(*LIMITS[model], limit)
    (spec,) = expand(P.loads(PROFILE.format(model=model, B=B, L=L), "small-chunks.toml"))
    est = estimate.estimate_run(spec, estimate.Limit(device=device, bytes=None, what=""))
    assert est.error is None, est.error
    return est.parts


@pytest.mark.parametrize("model", ["mamba2", "gated_deltanet"])
def test_a_run_past_the_threshold_is_estimated_on_the_sliced_path(monkeypatch, model):
    """Threshold 1024 tokens: a run of 8 x 512 tokens takes the sliced path, so its estimate
    is the one with the small path off (threshold 0); a run of 1 x 512 takes the small path,
    so its estimate is the one with it always on. Before the fix the probe (at most 2 x 256
    tokens, all under the threshold) measured the small path for both."""
    limit = RUN_BYTES_TOKENS * _bytes_per_token(model)
    always = 1 << 62
    big, big_sliced = (_parts(monkeypatch, model, lim, 8, 512) for lim in (limit, 0))
    assert big == big_sliced
    small, small_whole = (_parts(monkeypatch, model, lim, 1, 512) for lim in (limit, always))
    assert small == small_whole
    # the two paths keep different amounts, so the comparisons above tell them apart
    assert small != _parts(monkeypatch, model, 0, 1, 512)
    assert small["activations"] > _parts(monkeypatch, model, 0, 1, 512)["activations"]


def test_on_cuda_mamba2_is_estimated_sliced_and_the_delta_rules_by_size(monkeypatch):
    """Mamba-2's small path is CPU-only: a small CUDA run is estimated sliced (the probe
    runs on the CPU, where it would have taken it). The delta rules' is on any device."""
    always = 1 << 62
    for model, small_path in (("mamba2", False), ("gated_deltanet", True)):
        limit = RUN_BYTES_TOKENS * _bytes_per_token(model)
        got = _parts(monkeypatch, model, limit, 1, 512, device="cuda")
        want = _parts(monkeypatch, model, always if small_path else 0, 1, 512, device="cuda")
        assert got == want, model
        # the small path's activations (on the CPU, where Mamba-2 takes it) differ
        whole = _parts(monkeypatch, model, always, 1, 512)["activations"]
        assert (got["activations"] == whole) == small_path, model


@pytest.mark.parametrize("model", ["mamba2", "gated_deltanet"])
def test_bench_estimate_follows_the_path_of_the_step_it_predicts(monkeypatch, model):
    """`bench --estimate`'s twin (a bare backbone on the CPU) decides the same way."""
    limit = RUN_BYTES_TOKENS * _bytes_per_token(model)

    def est(lim, B, L=512):
        monkeypatch.setattr(*LIMITS[model], lim)
        return estimate.bench_estimate(model, {}, 16, 2, B, L)

    assert est(limit, 8) == est(0, 8) != est(1 << 62, 8)
    assert est(limit, 1) == est(1 << 62, 1) != est(0, 1)


def test_the_probe_records_each_kind_of_call_and_keeps_it_on_disk(monkeypatch):
    """The sliced probe records the layer's threshold (bytes per token, limit, CPU only,
    tokens per batch token); the profile carries it through the disk cache's form, and the
    whole probe is stored under its own key."""
    from types import SimpleNamespace

    import tasks

    _fresh(monkeypatch)
    task = tasks.build("mqar", vocab_size=300, seq_len=64, num_kv_pairs=4)
    spec = SimpleNamespace(model="mamba2", model_options={}, d_model=16, n_layers=6)
    sliced = cp.probe(spec, False, task)
    bpt = _bytes_per_token("mamba2")
    assert sliced.whole_calls == ((bpt, mamba2.WHOLE_MAX_BYTES, True, 1.0),)
    assert sliced.whole == ()
    assert cp.Profile.from_dict(sliced.to_dict()) == sliced
    tokens = mamba2.WHOLE_MAX_BYTES // bpt
    kind = (bpt, mamba2.WHOLE_MAX_BYTES, True)
    assert sliced.whole_at(tokens, "cpu") == {kind}
    assert sliced.whole_at(tokens + 1, "cpu") == set() == sliced.whole_at(1, "cuda")
    whole = cp.probe_at(spec, False, task, tokens)
    assert whole.whole == (kind,) and whole is not sliced
    assert whole.per_sample(2048) > sliced.per_sample(2048)
    assert cp.probe_at(spec, False, task, tokens + 1) is sliced
    assert cp.probe_key(spec, task, False) != cp.probe_key(spec, task, False, frozenset({kind}))
    assert set(cp._disk_cache()) == {cp.probe_key(spec, task, False),
                                     cp.probe_key(spec, task, False, frozenset({kind}))}
    # a stored probe of the older form (no recorded calls) is probed again, not misread
    old = {k: v for k, v in sliced.to_dict().items() if k not in ("whole_calls", "whole")}
    monkeypatch.setattr(cp, "_PROBES", {})
    cp._disk_cache()[cp.probe_key(spec, task, False)] = old
    assert cp.probe(spec, False, task) == sliced


def test_outside_the_probe_the_layers_choose_as_before(monkeypatch):
    """take_whole is the old inline rule (size against the limit; CPU only where so) and
    Mamba2._whole asks it; inside whole_choices each call is recorded and forced."""
    assert common.take_whole(4, 16, 64, cpu_only=True, device="cpu")
    assert not common.take_whole(5, 16, 64, cpu_only=True, device="cpu")
    assert not common.take_whole(4, 16, 64, cpu_only=True, device="cuda")
    assert common.take_whole(4, 16, 64, cpu_only=False, device=torch.device("cuda"))
    layer = Mamba2(16)
    u = torch.zeros(2, 8, 16)
    need = 2 * 8 * layer.in_proj.out_features * 4
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", need)
    assert layer._whole(u)
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", need - 1)
    assert not layer._whole(u)
    kind = (layer.in_proj.out_features * 4, need - 1, True)
    with common.whole_choices({kind}) as rec:
        assert layer._whole(u)                          # forced whole, past the limit
    with common.whole_choices() as rec2:
        monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 1 << 62)
        assert not layer._whole(u)                      # forced sliced, under it
    assert rec.calls == [(16, *kind)] and rec2.calls == [(16, kind[0], 1 << 62, True)]
    assert layer._whole(u)                              # outside: the rule again
