"""fla's GPU kernels, as ``auto`` picks them on CUDA, against the workbench's float64
references: every linear-RNN operator (outputs, final state and the gradients of a random
functional, with an initial state, at an odd length) and forgetting attention.

Skipped without a CUDA device and an importable fla (flash-linear-attention, an optional
extra): a GPU session (scripts/gpu-session.sh) runs it; on a CPU it only checks that it
skips. The tolerance is relative to each tensor's largest magnitude, loose enough for
fla's float32 kernels (TF32 tensor-core products included) and tight enough that a wrong
gate convention, a missing initial state or a transposed state fails.
"""
from __future__ import annotations

import pytest
import torch
from helpers import op_state

from models.kernels import generalized_delta
from models.kernels import linear_rnn_backends as lb
from models.kernels.linear_rnn_ops import ALL_OPS, make_inputs

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: fla's kernels run only on a GPU", allow_module_level=True)
_fla_ok, _fla_why = lb.fla_status()
if not _fla_ok:
    pytest.skip(f"fla not usable here: {_fla_why}", allow_module_level=True)

REL = 5e-3      # max |got - want| / max |want|, per tensor
T = 67          # odd, not a multiple of any chunk size fla uses


def _inputs(name: str):
    """float64 CPU leaves for op ``name``: 2 heads of 32 x 32, length T."""
    make = generalized_delta.make_inputs if name in generalized_delta.OPS else make_inputs
    return [a.requires_grad_() for a in make(name, time=T, key_dim=32, value_dim=32,
                                              dtype=torch.float64, requires_grad=False)]


def _results(fn, args, S0):
    """o, final state and the gradients of one random functional of both (weights drawn on
    the CPU in float64, so the reference and the GPU run take the same functional)."""
    o, s = fn(*args, initial_state=S0, output_final_state=True)
    gen = torch.Generator().manual_seed(7)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o)
    ws = torch.randn(s.shape, generator=gen, dtype=torch.float64).to(s)
    loss = (o * wo).sum() + (s * ws).sum()
    return [o, s, *torch.autograd.grad(loss, [*args, S0])]


def _assert_rel_close(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        err = (a.double().cpu() - b.double()).abs().max().item()
        scale = b.double().abs().max().item() or 1.0
        assert err <= REL * scale, f"{what}: result {i} differs by {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("name", [*ALL_OPS, *generalized_delta.OPS])
def test_fla_op_matches_the_reference(name):
    fn, chosen = lb.get_op(name, "auto", "cuda")
    assert chosen == "fla", f"auto picked {chosen!r} on CUDA with fla installed"
    ref, _ = lb.get_op(name, "ref", "cpu")
    args64 = _inputs(name)
    S0 = op_state(args64)
    want = _results(ref, args64, S0)
    args = [a.detach().float().cuda().requires_grad_() for a in args64]
    S0g = S0.detach().float().cuda().requires_grad_()
    got = _results(fn, args, S0g)
    _assert_rel_close(got, want, name)


def test_fla_forgetting_attention_matches_the_definition():
    from models.attention import forgetting_attention as fox

    fn, chosen = fox.get_op("forgetting_attn", "auto", "cuda")
    assert chosen == "fla", f"auto picked {chosen!r} on CUDA with fla installed"
    q, k, v, g = fox.make_inputs(2, T, 2, 64, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(q.shape, generator=gen, dtype=torch.float64)

    def outputs_and_grads(f, xs):
        o = f(*xs)
        return [o, *torch.autograd.grad((o * w.to(o)).sum(), xs)]

    want = outputs_and_grads(fox.forgetting_attn_ref, [q, k, v, g])
    xs = [x.detach().float().cuda().requires_grad_() for x in (q, k, v, g)]
    _assert_rel_close(outputs_and_grads(fn, xs), want, "forgetting_attn")
