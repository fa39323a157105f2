"""The C linear-RNN kernels (backend "cpu", models/kernels/linear_rnn_cpu.py) against their
oracle, the step-by-step ``*_ref`` functions of models/kernels/linear_rnn.py: outputs, final
states and every gradient in float64, over chunk boundaries, odd sizes, extreme gates and
betas, strided views, streaming and thread counts."""
from __future__ import annotations

import pytest
import torch

from models.kernels import linear_rnn as lr
from models.kernels import linear_rnn_backends as lrb
from models.kernels import linear_rnn_cpu as lc
from models.kernels.linear_rnn_ops import make_inputs

pytestmark = pytest.mark.skipif(not lc.available(),
                                reason=f"C kernels unavailable: {lc.unavailable_reason()}")

OPS = list(lr.OPS)


def _grads(fn, args, S0, weights):
    o, S = fn(*args, initial_state=S0, output_final_state=True)
    w_o, w_S = weights
    leaves = [a for a in (*args, S0) if a is not None and a.requires_grad]
    return (o, S, *torch.autograd.grad((o * w_o).sum() + (S * w_S).sum(), leaves))


def _compare(name, args, S0, chunk_len=None, atol=1e-10):
    ref = lr.OPS[name][1]
    gen = torch.Generator().manual_seed(1)
    B, T, H, _ = args[0].shape
    K, V = args[0].shape[-1], args[2].shape[-1]
    weights = (torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
               torch.randn(B, H, K, V, generator=gen, dtype=torch.float64))
    want = _grads(ref, args, S0, weights)
    got = _grads(lambda *a, **kw: lc.OPS[name](*a, chunk_len=chunk_len, **kw), args, S0,
                 weights)
    for i, (w, g) in enumerate(zip(want, got)):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-9, msg=lambda m: f"[{i}] {m}")


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("T, chunk_len", [(37, 8), (64, 64), (5, 64), (41, 1), (130, None)])
def test_equals_ref_with_gradients(name, T, chunk_len):
    args = make_inputs(name, batch=2, time=T, heads=3, key_dim=7, value_dim=5,
                          gate_range=(-2.0, 0.0), seed=T)
    S0 = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    _compare(name, args, S0, chunk_len)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("K, V", [(16, 16), (16, 33), (3, 40)])
def test_tile_padding(name, K, V):
    """Value dims below, at and past the 16-lane tile; no initial state."""
    args = make_inputs(name, batch=1, time=23, heads=2, key_dim=K, value_dim=V, seed=K + V)
    _compare(name, args, None, 8)


@pytest.mark.parametrize("name", [n for n in OPS if lr.OPS[n][2] is not None])
@pytest.mark.parametrize("gate_range", [(-1e-4, 0.0), (-30.0, -20.0)])
def test_extreme_gates(name, gate_range):
    args = make_inputs(name, batch=1, time=29, heads=2, key_dim=6, value_dim=4,
                          gate_range=gate_range, seed=3)
    S0 = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    _compare(name, args, S0, 8)


@pytest.mark.parametrize("name", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("beta_value", [0.0, 1.0])
def test_beta_zero_and_one(name, beta_value):
    args = make_inputs(name, batch=1, time=19, heads=2, key_dim=6, value_dim=4, seed=5)
    args[-1] = torch.full_like(args[-1], beta_value).requires_grad_()
    S0 = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    _compare(name, args, S0, 4)


@pytest.mark.parametrize("name", OPS)
def test_strided_views_read_in_place(name):
    """Time-major slices of one projection and a head-broadcast k (Mamba-2's B): the kernel
    reads them through their strides; same results as contiguous copies."""
    gen = torch.Generator().manual_seed(7)
    B, T, H, K, V = 2, 21, 3, 8, 6
    proj = torch.randn(B, T, H * (K + V + K + 1), generator=gen, dtype=torch.float64)
    q = proj[..., :H * K].unflatten(-1, (H, K))
    v = proj[..., H * K:H * (K + V)].unflatten(-1, (H, V))
    k = torch.randn(B, T, 1, K, generator=gen, dtype=torch.float64).expand(B, T, H, K)
    g = -proj[..., H * (K + V):H * (K + V + K)].unflatten(-1, (H, K)).abs()
    beta = proj[..., -H:].sigmoid()
    _, _, gate, needs_beta = lr.OPS[name]
    extra = ([g if gate == "vector" else g[..., 0]] if gate else []) + ([beta] if needs_beta else [])
    assert q.stride(-1) == 1 and not q.is_contiguous() and k.stride(2) == 0
    o1, S1 = lc.OPS[name](q, k, v, *extra, output_final_state=True)
    o2, S2 = lc.OPS[name](*(x.contiguous() for x in (q, k, v, *extra)), output_final_state=True)
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(S1, S2, atol=0, rtol=0)


@pytest.mark.parametrize("name", OPS)
def test_streaming_in_pieces_equals_one_pass(name):
    args = make_inputs(name, batch=2, time=50, heads=2, key_dim=8, value_dim=8,
                          requires_grad=False)
    o, S = lc.OPS[name](*args, output_final_state=True)
    state, outs = None, []
    for lo, hi in [(0, 1), (1, 17), (17, 50)]:
        o_p, state = lc.OPS[name](*(a[:, lo:hi] for a in args), initial_state=state,
                                  output_final_state=True)
        outs.append(o_p)
    torch.testing.assert_close(torch.cat(outs, 1), o, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state, S, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_float32_close_to_float64_and_independent_of_threads(name):
    args64 = make_inputs(name, batch=2, time=300, heads=4, key_dim=16, value_dim=16,
                            gate_range=(-0.5, 0.0))
    args32 = [a.detach().float().requires_grad_() for a in args64]
    o64, _ = lc.OPS[name](*args64)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            o32, _ = lc.OPS[name](*args32)
            results.append((o32, *torch.autograd.grad(o32.square().sum(), args32)))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(results[0][0].double(), o64, atol=2e-4, rtol=2e-4)
    for a, b in zip(*results):
        assert torch.equal(a, b)       # one (batch, head) per work item: no order effects


def test_half_precision_in_float32_and_empty_sequences():
    args = make_inputs("gla", batch=1, time=9, heads=2, key_dim=4, value_dim=4,
                          dtype=torch.bfloat16, requires_grad=False)
    o, S = lc.gla(*args, output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    want, _ = lr.gla_ref(*(a.float() for a in args))
    torch.testing.assert_close(o.float(), want, atol=0.05, rtol=0.05)
    empty = make_inputs("delta_rule", batch=2, time=0, heads=2, key_dim=4, value_dim=3)
    S0 = torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    o, S = lc.delta_rule(*empty, initial_state=S0, output_final_state=True)
    assert o.shape == (2, 0, 2, 3) and torch.equal(S, S0)
    (gS0,) = torch.autograd.grad(S.sum(), [S0])
    assert torch.equal(gS0, torch.ones_like(S0))


def test_keeps_one_state_per_chunk_for_the_backward():
    """What autograd holds: the inputs and T / CHUNK_LEN states, not per-step tensors."""
    B, T, H, K = 2, 1024, 2, 16
    args = make_inputs("gated_delta_rule", batch=B, time=T, heads=H, key_dim=K,
                          value_dim=K, dtype=torch.float32)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lc.gated_delta_rule(*args)
    inputs = sum(a.numel() * a.element_size() for a in args)
    states = B * H * (T // lc.CHUNK_LEN) * K * K * 4
    assert sum(saved) <= inputs + states + 64


def test_backend_resolution():
    assert lrb.resolve("auto", "cpu") == "cpu"
    assert lrb.get_op("gla", "cpu")[0] is lc.gla
    with pytest.raises(lrb.BackendError, match="CPU tensors only"):
        lrb.resolve("cpu", "cuda")
    with pytest.raises(lrb.BackendError, match="unknown backend"):
        lrb.resolve("c", "cpu")


def test_bad_shapes_are_value_errors():
    q, k, v = make_inputs("linear_attention", time=5)
    with pytest.raises(ValueError, match="v must be"):
        lc.linear_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match="g must be"):
        lc.gla(q, k, v, torch.zeros(2, 5, 2))


@pytest.mark.parametrize("name", ["delta_rule", "gated_delta_rule"])
def test_l2norm_in_kernel_equals_ref_and_keeps_no_normalised_copies(name):
    """use_qk_l2norm_in_kernel: q and k normalised per step in C, gradients mapped back
    through the norm there (one key row of zeros checks the eps branch)."""
    args = make_inputs(name, batch=2, time=33, heads=2, key_dim=8, value_dim=5, seed=11)
    gen = torch.Generator().manual_seed(2)
    args[0] = (3 * torch.randn(2, 33, 2, 8, generator=gen, dtype=torch.float64)).requires_grad_()
    raw_k = torch.randn(2, 33, 2, 8, generator=gen, dtype=torch.float64)
    raw_k[0, 4, 1] = 0.0
    args[1] = raw_k.requires_grad_()
    S0 = torch.randn(2, 2, 8, 5, dtype=torch.float64, requires_grad=True)
    w_o = torch.randn(2, 33, 2, 5, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (lr.OPS[name][1], lc.OPS[name]):
        o, S = fn(*args, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        grads.append((o, S, *torch.autograd.grad((o * w_o).sum() + S.square().sum(), [*args, S0])))
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.data_ptr()) or t,
                                                  lambda t: t):
        lc.OPS[name](*args, use_qk_l2norm_in_kernel=True)
    assert args[0].data_ptr() in saved and args[1].data_ptr() in saved   # the raw q, k
