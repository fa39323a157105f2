"""Issue 43, training at LM shapes: Mamba-3's segment recompute runs each segment twice
(without autograd, then recording for the backward); the C scan's second run reuses the
checkpoints and final state its first run stored (``linear_rnn_cpu.simple_gla_taped``,
``mamba3_scan._chunked``'s ``scan_tape``, ``models.ssm.mamba3.SCAN_TAPE``) instead of running
its forward again. Against the plain C scan and the layer with the tape off: values and
gradients (float64, exact), segments paired last first, an empty tape falling back."""
from __future__ import annotations

import pytest
import torch

from models.kernels import linear_rnn_cpu as lc

F64 = torch.float64

needs_c = pytest.mark.skipif(not lc.available(), reason="C kernels not built")


def _scan_inputs(T=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K, V = 2, 3, 8, 5
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen, dtype=F64)
    g = -torch.rand(B, T, H, generator=gen, dtype=F64)
    S0 = torch.randn(B, H, K, V, generator=gen, dtype=F64)
    return [t.requires_grad_() for t in (q, k, v, g, S0)]


@needs_c
def test_taped_scan_replays_the_plain_scans_backward():
    args = _scan_inputs()
    gen = torch.Generator().manual_seed(4)
    w_o = torch.randn(2, 37, 3, 5, generator=gen, dtype=F64)
    w_s = torch.randn(2, 3, 8, 5, generator=gen, dtype=F64)

    def grads(o, S):
        return torch.autograd.grad((o * w_o).sum() + (S * w_s).sum(), args)
    want_o, want_S = lc.simple_gla(*args[:4], scale=0.5, initial_state=args[4],
                                   output_final_state=True)
    want = grads(want_o, want_S)
    tape = []
    with torch.no_grad():                      # the first run: exact outputs, tape filled
        o, S = lc.simple_gla_taped(*args[:4], 0.5, args[4], tape)
    torch.testing.assert_close(o, want_o, atol=0, rtol=0)
    torch.testing.assert_close(S, want_S, atol=0, rtol=0)
    assert len(tape) == 1
    o2, S2 = lc.simple_gla_taped(*args[:4], 0.5, args[4], tape)   # the recording run
    assert not tape
    torch.testing.assert_close(S2, want_S, atol=0, rtol=0)
    for i, (a, b) in enumerate(zip(grads(o2, S2), want)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=lambda m, i=i: f"grad {i}: {m}")
    # a recording call with nothing on the tape is the plain scan
    o3, S3 = lc.simple_gla_taped(*args[:4], 0.5, args[4], [])
    torch.testing.assert_close(o3, want_o)
    for a, b in zip(grads(o3, S3), want):
        torch.testing.assert_close(a, b)


@needs_c
def test_taped_calls_pair_last_first():
    a1, a2 = _scan_inputs(seed=1), _scan_inputs(seed=2)
    tape = []
    with torch.no_grad():
        lc.simple_gla_taped(*a1[:4], None, a1[4], tape)
        lc.simple_gla_taped(*a2[:4], None, a2[4], tape)
    # the backward's recompute runs the second segment first: it takes the second's entry
    _, S2 = lc.simple_gla_taped(*a2[:4], None, a2[4], tape)
    _, S1 = lc.simple_gla_taped(*a1[:4], None, a1[4], tape)
    for args, S in ((a1, S1), (a2, S2)):
        want = lc.simple_gla(*args[:4], initial_state=args[4], output_final_state=True)[1]
        torch.testing.assert_close(S, want, atol=0, rtol=0)


@needs_c
@pytest.mark.parametrize("L, seg", [(50, 16), (40, 512)])
def test_mamba3_training_step_equal_with_the_tape_on_and_off(L, seg, monkeypatch):
    import models
    import models.ssm.mamba3 as m3

    torch.manual_seed(0)
    m = models.build("mamba3", d_model=32, n_layers=2).to(F64)
    monkeypatch.setattr(m3, "SEGMENT_LEN", seg)
    x = torch.randn(2, L, 32, dtype=F64)

    def step():
        m.zero_grad(set_to_none=True)
        y = m(x)
        (y * y).mean().backward()
        return [y.detach(), *(p.grad.clone() for p in m.parameters() if p.grad is not None)]
    monkeypatch.setattr(m3, "SCAN_TAPE", False)
    want = step()
    replays = []
    apply = lc._ScanReplay.apply
    monkeypatch.setattr(lc._ScanReplay, "apply", lambda *a: replays.append(1) or apply(*a))
    monkeypatch.setattr(m3, "SCAN_TAPE", True)
    got = step()
    assert len(replays) == 2 * -(-L // seg)     # every segment of both layers replayed
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=lambda m, i=i: f"tensor {i}: {m}")
