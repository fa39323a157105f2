"""Issue 43 (training at LM shapes): RWKV-7's pre-operator and output pieces as autograd
Functions with hand-written backwards (models/kernels/rwkv7_cpu.py), their elementwise
chains in C (csrc/rwkv7_fused.c) and in torch: the same values and gradients as the plain
arithmetic, and the mixer the same as its recomputed path."""
from __future__ import annotations

import pytest
import torch

from models.kernels import rwkv7_cpu as rc
from models.linear_rnn.dplr_mixers import RWKV7Attention

DT = torch.float64
CHAINS = ["c", "torch"]


@pytest.fixture(params=CHAINS)
def chains(request, monkeypatch):
    """Small slices (items cross slice and batch-row boundaries), C or torch chains."""
    monkeypatch.setattr(rc, "SLICE", 5)
    if request.param == "c":
        if rc._LIBRARY.load()[0] is None:
            pytest.skip(f"RWKV-7 C kernel unavailable: {rc._LIBRARY.load()[1]}")
        monkeypatch.setattr(rc, "USE_C", True)
        assert rc.chains() is rc._CChains
    else:
        monkeypatch.setattr(rc, "USE_C", False)
        assert rc.chains() is rc._TorchChains
    return request.param


def _p(gen, *shape, scale=0.5):
    return (torch.randn(*shape, generator=gen, dtype=DT) * scale).requires_grad_()


def _prep_args(B=2, T=13, D=8, R=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [_p(g, B, T, D, scale=1), _p(g, B, D, scale=1), _p(g, 6, D), _p(g, D, D),
            _p(g, D, D), _p(g, D, D), _p(g, R, D), _p(g, D, R), _p(g, D), _p(g, R, D),
            _p(g, D, R), _p(g, D), _p(g, D), _p(g, D)]


def _out_args(B=2, T=13, H=2, K=4, R=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    D = H * K
    return [_p(g, B, T, H, K, scale=1), _p(g, B, T, D, scale=1), _p(g, B, D, scale=1),
            _p(g, B, T, H, K), _p(g, B, T, H, K), _p(g, B, T, H, K), _p(g, D), _p(g, R, D),
            _p(g, D, R), _p(g, H, K), _p(g, D), _p(g, D), _p(g, D, D)]


def _prep_fn(H):
    return lambda *a: rc.RWKV7PrepFn.apply(a[0], a[1], a[2][:5], *a[3:], H)


def _out_fn(eps):
    return lambda *a: rc.RWKV7OutFn.apply(*a, eps)


def _same(fn, ref, args, rtol=1e-10, atol=1e-12):
    got, want = fn(*args), ref(*args)
    got, want = (got,) if torch.is_tensor(got) else got, (want,) if torch.is_tensor(want) else want
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    gen = torch.Generator().manual_seed(7)
    gs = [torch.randn(o.shape, generator=gen, dtype=DT) for o in want]
    for a, b in zip(torch.autograd.grad(got, args, gs), torch.autograd.grad(want, args, gs)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def test_prep_matches_reference_and_gradcheck(chains):
    args = _prep_args()
    _same(_prep_fn(2), lambda *a: rc.rwkv7_prep_ref(*a, 2), args)
    assert torch.autograd.gradcheck(_prep_fn(2), args)


def test_prep_with_a_vanishing_head_takes_the_clamped_norm(chains):
    """k o k_k = 0 over a head: kk = 0 and its gradient is g / eps (F.normalize's clamp)."""
    args = _prep_args()
    with torch.no_grad():
        args[12][:4] = 0                       # k_k: head 0 vanishes
    _same(_prep_fn(2), lambda *a: rc.rwkv7_prep_ref(*a, 2), args, rtol=1e-9, atol=1e-6)


def test_prep_skips_unused_outputs(chains):
    """Outputs without a gradient (None in the backward) count as zeros."""
    args = _prep_args()
    got = _prep_fn(2)(*args)[0].sum() + _prep_fn(2)(*args)[4].sum()
    want = rc.rwkv7_prep_ref(*args, 2)
    want = want[0].sum() + want[4].sum()
    g_want = torch.autograd.grad(want, args, allow_unused=True)
    for a, b, t in zip(torch.autograd.grad(got, args), g_want, args):
        torch.testing.assert_close(a, torch.zeros_like(t) if b is None else b, rtol=1e-10,
                                   atol=1e-12)


def test_out_matches_reference_and_gradcheck(chains):
    args = _out_args()
    _same(_out_fn(1e-3), lambda *a: rc.rwkv7_out_ref(*a, 1e-3), args)
    assert torch.autograd.gradcheck(_out_fn(1e-3), args)


def _mixer(seed=0):
    torch.manual_seed(seed)
    m = RWKV7Attention(16, n_heads=2, decay_low_rank_dim=4, a_low_rank_dim=4,
                       gate_low_rank_dim=6).double()
    with torch.no_grad():                      # r_k starts at zero: give the bonus a weight
        m.r_k.normal_()
    return m


@pytest.mark.parametrize("with_state", [False, True])
def test_mixer_equals_its_recomputed_path(chains, monkeypatch, with_state):
    """The Functions (taken on a CPU in float64) against the recomputed pieces they
    replace (taken when ``applies`` says no), values and every gradient."""
    m = _mixer()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, 16, generator=gen, dtype=DT, requires_grad=True)
    state = m.init_state(2)
    state = (state[0].normal_(generator=gen), state[1].normal_(generator=gen))
    w = torch.randn(2, 11, 16, generator=gen, dtype=DT)

    def run():
        y = m.forward_with_state(x, state)[0] if with_state else m(x)
        params = [x, *m.parameters()]
        return y, torch.autograd.grad((y * w).sum(), params)

    y_new, g_new = run()
    monkeypatch.setattr(rc, "applies", lambda x: False)
    y_old, g_old = run()
    torch.testing.assert_close(y_new, y_old, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_new, g_old):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_applies_to_cpu_float32_and_float64_only():
    assert rc.applies(torch.zeros(1, dtype=torch.float32))
    assert rc.applies(torch.zeros(1, dtype=DT))
    assert not rc.applies(torch.zeros(1, dtype=torch.bfloat16))
