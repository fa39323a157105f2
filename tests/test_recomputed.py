"""Pieces recomputed in the backward (models.common.recomputed): the norms, gates and short
convolutions keep only their inputs for the backward, and their gradients are unchanged."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.common import RMSNorm, recomputed
from models.linear_mixers import GatedHeadRMSNorm, HeadRMSNorm
from models.mamba2 import GatedRMSNorm
from models.short_conv import ShortConvolution as ShortConv

F64 = torch.float64


def _saved_bytes(fn, *args):
    """Bytes autograd keeps for the backward of fn(*args), each storage once."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(seen.values()), out


def _inputs(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen, dtype=F64, requires_grad=True) for s in shapes]


def _grads(out, inputs, params):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), [*inputs, *params])


def _plain_rms(x, weight, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight


CASES = {
    # name: (module, inputs' shapes, the same maths without recomputation)
    "RMSNorm": (lambda: RMSNorm(16).double(), [(2, 50, 16)],
                lambda m, x: _plain_rms(x, m.weight, m.eps)),
    "HeadRMSNorm": (lambda: HeadRMSNorm(8).double(), [(2, 50, 3, 8)],
                    lambda m, x: _plain_rms(x, m.weight, m.eps)),
    "GatedHeadRMSNorm": (lambda: GatedHeadRMSNorm(8).double(), [(2, 50, 3, 8), (2, 50, 3, 8)],
                         lambda m, x, z: _plain_rms(x, m.weight, m.eps) * F.silu(z)),
    "GatedRMSNorm": (lambda: GatedRMSNorm(16, group_size=8).double(), [(2, 50, 16), (2, 50, 16)],
                     lambda m, y, z: (_plain_rms((y * F.silu(z)).unflatten(-1, (2, 8)), 1.0, m.eps)
                                      .flatten(-2) * m.weight)),
    "ShortConv": (lambda: ShortConv(16, 4).double(), [(2, 50, 16)],
                  lambda m, x: F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), m.weight,
                                               m.bias, groups=16)).transpose(1, 2)),
}


def _run(m, args):
    out = m(*args)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", CASES)
def test_recomputed_piece_equals_plain_maths_with_gradients(name):
    make, shapes, plain = CASES[name]
    m = make()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    args = _inputs(*shapes)
    params = list(m.parameters())
    out, want = _run(m, args), plain(m, *args)
    torch.testing.assert_close(out, want)
    for a, b in zip(_grads(out, args, params), _grads(want, args, params)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", CASES)
def test_recomputed_piece_keeps_only_its_inputs(name):
    make, shapes, plain = CASES[name]
    m = make()
    args = _inputs(*shapes)
    kept, _ = _saved_bytes(lambda *a: _run(m, a), *args)
    plain_kept, _ = _saved_bytes(lambda *a: plain(m, *a), *args)
    inputs = sum(a.numel() * a.element_size() for a in args)
    params = sum(p.numel() * p.element_size() for p in m.parameters())
    # the short conv keeps its left-padded input (3 more steps)
    assert kept <= 1.1 * inputs + params, (kept, inputs)
    assert plain_kept > 1.5 * kept


def test_recomputed_is_plain_without_autograd():
    calls = []

    def fn(x):
        calls.append(torch.is_grad_enabled())
        return x * x                        # its backward needs x: recomputed
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        recomputed(fn, x)
    recomputed(fn, torch.ones(3))          # nothing needs a gradient
    assert calls == [False, True]
    y = recomputed(fn, x)
    y.sum().backward()                      # recorded: fn runs again in the backward
    assert len(calls) == 4 and torch.equal(x.grad, torch.full((3,), 2.0))
