"""The CPU fast paths of Mamba-2 and Mamba-3 at language-model shapes (issue 43 item 2)
equal their plain twins, outputs and gradients, in float64:

- Mamba-2's ``_mix_whole`` (in_proj and the conv once, plain autograd; taken on a CPU when
  in_proj's output fits ``WHOLE_MAX_BYTES``) == the sliced, recomputing path (the one for
  long chunks) == the step-by-step ``ref`` operator;
- Mamba-3's ``_mix_recomputed`` (the scan and its inputs recomputed in the backward; the
  training forward from a zero state) == ``forward_with_state`` from zeros (the plain
  autograd path) == the ``ref`` backend, and keeps a fraction of what that path keeps.
"""
from __future__ import annotations

import pytest
import torch

from models.ssm import mamba2, mamba3
from models.ssm.mamba2 import Mamba2
from models.ssm.mamba3 import Mamba3

F64 = torch.float64


def _perturbed(m):
    torch.manual_seed(1)
    m = m.double()
    with torch.no_grad():                     # away from the init (norm weights 1, D 1, ...)
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    return m


def _run(m, fn):
    """(output, gradients of the input and every parameter) of sum(fn(x) * w)."""
    torch.manual_seed(2)
    x = torch.randn(2, 37, m.d_model, dtype=F64, requires_grad=True)
    out = fn(m, x)
    w = torch.randn(out.shape, dtype=F64)
    m.zero_grad(set_to_none=True)
    (out * w).sum().backward()
    return out.detach(), [x.grad] + [p.grad for p in m.parameters()]


def _assert_same(a, b, atol=1e-10):
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=1e-8)
    assert len(a[1]) == len(b[1])
    for ga, gb in zip(a[1], b[1]):
        torch.testing.assert_close(ga, gb, atol=atol, rtol=1e-8)


@pytest.mark.parametrize("kw", [{}, {"ngroups": 2}, {"bias": True, "d_conv": 2}])
@pytest.mark.parametrize("with_state", [False, True])
def test_mamba2_whole_path_equals_sliced_path_and_ref(kw, with_state, monkeypatch):
    """The whole path (taken, spied) equals the sliced path (SLICE_LEN 8, so several slices
    with conv context) and the ref operator's, with and without a carried state."""
    import models.common as common

    monkeypatch.setattr(common, "SLICE_LEN", 8)
    m = _perturbed(Mamba2(16, d_state=8, headdim=8, backend="cpu", **kw))
    if with_state:
        torch.manual_seed(3)
        conv, S = (torch.randn(t.shape, dtype=F64) for t in m.init_state(2))

        def fn(m, x):
            out, (c, s) = m.forward_with_state(x, (conv, S))
            return torch.cat([out.flatten(), c.flatten(), s.flatten()])
    else:
        def fn(m, x):
            return m(x)
    taken = []
    whole = Mamba2._mix_whole
    monkeypatch.setattr(Mamba2, "_mix_whole", lambda self, *a: taken.append(1) or whole(self, *a))
    fast = _run(m, fn)
    assert taken, "the whole path did not run"
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 0)
    taken.clear()
    sliced = _run(m, fn)
    assert not taken
    m.backend_choice = "ref"
    ref = _run(m, fn)
    _assert_same(fast, sliced)
    _assert_same(fast, ref)


def test_mamba2_whole_path_only_on_cpu_under_the_byte_limit(monkeypatch):
    m = Mamba2(16, d_state=8, headdim=8)
    width = m.in_proj.out_features
    u = torch.zeros(2, 10, 16)
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 2 * 10 * width * 4)
    assert m._whole(u)
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 2 * 10 * width * 4 - 1)
    assert not m._whole(u)
    assert not m._whole(torch.zeros(2, 10, 16, device="meta"))


MAMBA3 = [{}, {"ngroups": 2}, {"complex_state": False}, {"outproj_norm": True},
          {"rope_fraction": 1.0, "d_state": 8}]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("kw", MAMBA3)
@pytest.mark.parametrize("seg", [8, 512])
def test_mamba3_recomputed_forward_equals_plain_path_and_ref(kw, backend, seg, monkeypatch):
    """forward (the recomputed piece, spied; segments of 8 steps carrying the state, or one
    segment) == forward_with_state from zeros (plain autograd, nothing recomputed) == the
    step-by-step ref, outputs and all gradients."""
    monkeypatch.setattr(mamba3, "SEGMENT_LEN", seg)
    kw = dict(kw)
    m = _perturbed(Mamba3(16, d_state=kw.pop("d_state", 16), headdim=8, backend=backend, **kw))
    taken = []
    piece = Mamba3._mix_recomputed
    monkeypatch.setattr(Mamba3, "_mix_recomputed",
                        lambda self, *a: taken.append(1) or piece(self, *a))
    fast = _run(m, lambda m, x: m(x))
    assert taken, "the recomputed path did not run"
    taken.clear()
    plain = _run(m, lambda m, x: m.forward_with_state(x, m.init_state(2))[0])
    assert not taken
    m.backend_choice = "ref"
    ref = _run(m, lambda m, x: m(x))
    assert not taken
    _assert_same(fast, plain)
    _assert_same(fast, ref)


def _saved_bytes(fn):
    seen, total = set(), [0]

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_mamba3_training_forward_keeps_no_per_head_state_sized_tensors():
    """What autograd keeps for a training forward (in_proj's output, the layer input, the
    scan's output and the gate) is under a third of what the plain path keeps (there, B
    and C per head normalised, rotated and scaled: ~10 (b, L, heads, d_state) tensors)."""
    torch.manual_seed(0)
    m = Mamba3(32, d_state=32, headdim=8, backend="cpu")      # 8 heads of a 32-wide state
    x = torch.randn(2, 64, 32, requires_grad=True)
    fast = _saved_bytes(lambda: m(x))
    plain = _saved_bytes(lambda: m.forward_with_state(x, m.init_state(2)))
    assert fast < plain / 3, (fast, plain)


@pytest.mark.parametrize("shape", [(2, 37, 16), (5, 16), (2, 7, 3, 16)])
def test_stack_rms_norm_fused_backward_equals_plain_arithmetic(shape, monkeypatch):
    """The residual stacks' RMSNorm on a CPU runs RMSNormFn (spied), whose hand-written
    backward equals autograd through the plain arithmetic (rms_norm_ref), float64."""
    from models.common import RMSNorm
    from models.kernels import rms_norm_cpu

    torch.manual_seed(0)
    m = RMSNorm(16).double()
    with torch.no_grad():
        m.weight.add_(0.1 * torch.randn(16, dtype=F64))
    x = torch.randn(shape, dtype=F64, requires_grad=True)
    w = torch.randn(shape, dtype=F64)
    calls = []
    fwd = rms_norm_cpu.RMSNormFn.forward
    monkeypatch.setattr(rms_norm_cpu.RMSNormFn, "forward",
                        staticmethod(lambda ctx, *a: calls.append(1) or fwd(ctx, *a)))
    out = m(x)
    assert calls
    got = torch.autograd.grad((out * w).sum(), [x, m.weight])
    want_out = rms_norm_cpu.rms_norm_ref(x, m.weight, m.eps)
    want = torch.autograd.grad((want_out * w).sum(), [x, m.weight])
    torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-10)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    x1 = x.detach().requires_grad_(True)             # the weight alone, the input alone
    (gx,) = torch.autograd.grad((m(x1) * w).sum(), [x1])
    torch.testing.assert_close(gx, want[0], atol=1e-12, rtol=1e-10)
