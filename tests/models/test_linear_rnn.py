"""Linear-RNN operators (models/kernels/linear_rnn.py): every chunked op against its
step-by-step ``*_ref`` twin (outputs and gradients, float64), streaming, float32 stability
with very negative log-gates, and the identities between the five operators."""
from __future__ import annotations

import importlib

import pytest
import torch

from models.kernels import linear_rnn as lr
from models.kernels.linear_rnn_ops import make_inputs

F64 = torch.float64
NAMES = list(lr.OPS)
GATED = [n for n, spec in lr.OPS.items() if spec[2] is not None]
DELTA = [n for n, spec in lr.OPS.items() if spec[3]]


def _state(args, seed=1):
    q, v = args[0], args[2]
    B, _, H, K = q.shape
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, K, v.shape[-1], generator=gen, dtype=q.dtype).requires_grad_()


def _outputs_and_grads(fn, args, S0, **kw):
    """Run fn with initial state S0 and the final state out; a random linear functional of
    (o, final_state) is backpropagated; returns o, final state and grads of args + S0."""
    o, s = fn(*args, initial_state=S0, output_final_state=True, **kw)
    gen = torch.Generator().manual_seed(7)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() + \
        (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    grads = torch.autograd.grad(loss, [*args, S0])
    return o.detach(), s.detach(), grads


def _assert_match(name, args, S0, chunk_size, atol=1e-10, rtol=1e-8):
    fast, ref, _, _ = lr.OPS[name]
    o1, s1, g1 = _outputs_and_grads(fast, args, S0, chunk_size=chunk_size)
    o2, s2, g2 = _outputs_and_grads(ref, args, S0)
    torch.testing.assert_close(o1, o2, atol=atol, rtol=rtol)
    torch.testing.assert_close(s1, s2, atol=atol, rtol=rtol)
    _, _, gate, needs_beta = lr.OPS[name]
    labels = ["q", "k", "v"] + ["g"] * (gate is not None) + ["beta"] * needs_beta
    for label, a, b in zip([*labels, "initial_state"], g1, g2):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"d{label}: {m}")


# ---------------------------------------------------------------------------------------
# chunked == ref, float64, outputs and gradients
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64, None])
@pytest.mark.parametrize("name", NAMES)
def test_chunked_matches_ref(name, chunk_size):
    # T = 37: not a multiple of any chunk size > 1; gates in (-3, 0)
    args = make_inputs(name, time=37, gate_range=(-3.0, 0.0))
    _assert_match(name, args, _state(args), chunk_size)


@pytest.mark.parametrize("gate_range", [(-1e-3, 0.0), (-20.0, -5.0), (-20.0, 0.0)],
                         ids=["near0", "very_negative", "mixed"])
@pytest.mark.parametrize("name", GATED)
def test_gate_extremes_match_ref(name, gate_range):
    args = make_inputs(name, time=37, gate_range=gate_range, seed=3)
    _assert_match(name, args, _state(args), 16)


@pytest.mark.parametrize("gate_range", [(-1.0, 0.0), (-20.0, 0.0)], ids=["mild", "mixed"])
@pytest.mark.parametrize("chunk_size", [1, 8, 16, 24, 64])
def test_gla_subchunked_path_matches_ref(chunk_size, gate_range, monkeypatch):
    """gla's chunk has two forms: one matmul when the gates' range in a chunk is safe (what
    float64 with mild gates takes), sub-chunks of 8 otherwise. Force the second."""
    monkeypatch.setattr(lr, "GLA_FACTORISED", False)
    args = make_inputs("gla", time=37, gate_range=gate_range, seed=6)
    _assert_match("gla", args, _state(args), chunk_size)


@pytest.mark.parametrize("beta_value", [0.0, 1.0])
@pytest.mark.parametrize("name", DELTA)
def test_beta_extremes_match_ref(name, beta_value):
    args = make_inputs(name, time=37, seed=4)
    with torch.no_grad():
        args[-1].fill_(beta_value)
    _assert_match(name, args, _state(args), 16)


@pytest.mark.parametrize("name", NAMES)
def test_short_sequences_and_no_state(name):
    fast, ref, _, _ = lr.OPS[name]
    for T in (1, 5, 8):
        args = make_inputs(name, time=T, requires_grad=False)
        o1, s1 = fast(*args)
        o2, s2 = ref(*args)
        assert s1 is None and s2 is None
        assert o1.shape == args[2].shape
        torch.testing.assert_close(o1, o2)


def test_ref_oracles_are_what_they_claim():
    """The refs themselves against closed forms: linear attention is causal
    (Q K^T) V * scale; the delta rule with beta = 1 and unit keys writes v exactly."""
    q, k, v = make_inputs("linear_attention", time=11, requires_grad=False)
    o, _ = lr.linear_attention_ref(q, k, v, scale=0.5)
    scores = torch.einsum("bihk,bjhk->bhij", q, k).tril()
    torch.testing.assert_close(o, 0.5 * torch.einsum("bhij,bjhv->bihv", scores, v))
    q, k, v, beta = make_inputs("delta_rule", time=6, requires_grad=False)
    _, S = lr.delta_rule_ref(q, k, v, torch.ones_like(beta), output_final_state=True)
    torch.testing.assert_close(torch.einsum("bhk,bhkv->bhv", k[:, -1], S), v[:, -1])
    # default scale is key_dim ** -0.5
    o1, _ = lr.linear_attention(q, k, v)
    o2, _ = lr.linear_attention(q, k, v, scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(o1, o2)


# ---------------------------------------------------------------------------------------
# long sequences under autograd: segments recomputed in the backward
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("segment_len", [16, 20])
@pytest.mark.parametrize("name", NAMES)
def test_segment_recompute_matches_ref(name, segment_len):
    # 45 steps in segments of 16 or 20 (the last one short), chunks of 8 inside
    args = make_inputs(name, time=45, gate_range=(-3.0, 0.0))
    fast, ref, _, _ = lr.OPS[name]
    o1, s1, g1 = _outputs_and_grads(fast, args, _state(args), chunk_size=8,
                                    segment_len=segment_len)
    o2, s2, g2 = _outputs_and_grads(ref, args, _state(args))
    torch.testing.assert_close(o1, o2, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(s1, s2, atol=1e-10, rtol=1e-8)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("name", DELTA)
def test_segment_recompute_with_l2norm_in_kernel(name):
    # unnormalised q, k: the op normalises them inside each (recomputed) segment
    args = make_inputs(name, time=45, gate_range=(-2.0, 0.0))
    with torch.no_grad():
        args[1].mul_(3.0)
    fast, ref, _, _ = lr.OPS[name]
    kw = {"use_qk_l2norm_in_kernel": True}
    o1, s1, g1 = _outputs_and_grads(fast, args, _state(args), chunk_size=8, segment_len=16, **kw)
    o2, s2, g2 = _outputs_and_grads(ref, args, _state(args), **kw)
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(s1, s2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["gla", "gated_delta_rule"])
def test_segment_recompute_without_state_or_some_grads(name):
    # no initial state, no final state out, and v without gradient
    args = make_inputs(name, time=40, gate_range=(-1.0, 0.0))
    args[2] = args[2].detach()
    fast, ref, _, _ = lr.OPS[name]
    o1, _ = fast(*args, chunk_size=8, segment_len=16)
    o2, _ = ref(*args)
    w = torch.randn(o1.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    grad_inputs = [a for a in args if a.requires_grad]
    g1 = torch.autograd.grad((o1 * w).sum(), grad_inputs)
    g2 = torch.autograd.grad((o2 * w).sum(), grad_inputs)
    torch.testing.assert_close(o1, o2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_segment_recompute_saves_little_for_backward(name):
    # What autograd keeps for the backward: segmented, the inputs and a few start states;
    # whole-sequence, every chunk's matrices (several times the inputs).
    args = make_inputs(name, time=256, heads=2, key_dim=8, value_dim=8)
    fast = lr.OPS[name][0]

    def saved_bytes(segment_len):
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fast(*args, chunk_size=16, output_final_state=True, segment_len=segment_len)
        return sum(seen.values())

    inputs = sum(a.numel() * a.element_size() for a in args)
    segmented, whole = saved_bytes(64), saved_bytes(0)
    assert segmented <= inputs + 4 * 2 * 2 * 8 * 8 * 8, (segmented, inputs)
    assert whole > 2 * segmented


# ---------------------------------------------------------------------------------------
# streaming: pieces with the state carried equal one pass
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_streaming_in_pieces_equals_one_pass(name):
    fast, ref, _, _ = lr.OPS[name]
    args = make_inputs(name, time=45, gate_range=(-2.0, 0.0), requires_grad=False)
    S0 = _state(args).detach()
    o_full, s_full = fast(*args, initial_state=S0, output_final_state=True, chunk_size=16)
    for fn in (fast, ref):
        S, outs, t = S0, [], 0
        for n in (10, 17, 1, 17):
            piece = [a[:, t:t + n] for a in args]
            kw = {"chunk_size": 16} if fn is fast else {}
            o, S = fn(*piece, initial_state=S, output_final_state=True, **kw)
            outs.append(o)
            t += n
        torch.testing.assert_close(torch.cat(outs, 1), o_full)
        torch.testing.assert_close(S, s_full)


# ---------------------------------------------------------------------------------------
# float32 with very negative log-gates: finite and close to the float64 ref
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", GATED)
def test_float32_very_negative_gates_finite_and_close(name):
    fast, ref, _, _ = lr.OPS[name]
    a64 = make_inputs(name, time=150, gate_range=(-20.0, 0.0), seed=5, requires_grad=False)
    # the summed log-gate over a 64-chunk reaches ~ -640 .. -1280: exp(+that) is inf in fp32
    a32 = [a.float().requires_grad_() for a in a64]
    S0 = _state(a64).detach()
    o32, s32 = fast(*a32, initial_state=S0.float(), output_final_state=True)
    (o32.square().sum() + s32.square().sum()).backward()
    assert torch.isfinite(o32).all() and torch.isfinite(s32).all()
    for a in a32:
        assert torch.isfinite(a.grad).all()
    a64 = [a.requires_grad_() for a in a64]
    o64, s64 = ref(*a64, initial_state=S0, output_final_state=True)
    (o64.square().sum() + s64.square().sum()).backward()
    torch.testing.assert_close(o32.double(), o64.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s32.double(), s64.detach(), atol=1e-4, rtol=1e-4)
    for a, b in zip(a32, a64):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=2e-3, rtol=2e-3)


def test_half_precision_inputs_come_back_in_their_dtype():
    q, k, v, g = (a.to(torch.bfloat16) for a in
                  make_inputs("gla", time=20, requires_grad=False))
    o, s = lr.gla(q, k, v, g, output_final_state=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


# ---------------------------------------------------------------------------------------
# identities between the operators
# ---------------------------------------------------------------------------------------

def test_simple_gla_is_gla_with_broadcast_gate():
    q, k, v, g = make_inputs("simple_gla", time=37, gate_range=(-5.0, 0.0),
                                requires_grad=False)
    S0 = _state([q, k, v]).detach()
    a = lr.simple_gla(q, k, v, g, initial_state=S0, output_final_state=True, chunk_size=16)
    b = lr.gla(q, k, v, g[..., None].expand_as(q), initial_state=S0, output_final_state=True,
               chunk_size=16)
    torch.testing.assert_close(a, b)


def test_delta_rule_is_gated_delta_rule_with_zero_gate():
    q, k, v, beta = make_inputs("delta_rule", time=37, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    a = lr.delta_rule(q, k, v, beta, initial_state=S0, output_final_state=True, chunk_size=16)
    b = lr.gated_delta_rule(q, k, v, torch.zeros_like(beta), beta, initial_state=S0,
                            output_final_state=True, chunk_size=16)
    torch.testing.assert_close(a, b)


def test_linear_attention_is_simple_gla_with_zero_gate():
    q, k, v = make_inputs("linear_attention", time=37, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    a = lr.linear_attention(q, k, v, initial_state=S0, output_final_state=True, chunk_size=16)
    b = lr.simple_gla(q, k, v, torch.zeros(q.shape[:3], dtype=F64), initial_state=S0,
                      output_final_state=True, chunk_size=16)
    torch.testing.assert_close(a, b)


def test_l2norm_option_normalises_q_and_k():
    q, k, v, g, beta = make_inputs("gated_delta_rule", time=20, requires_grad=False)
    a, _ = lr.gated_delta_rule(3 * q, 2 * k, v, g, beta, use_qk_l2norm_in_kernel=True)
    b, _ = lr.gated_delta_rule_ref(torch.nn.functional.normalize(q, dim=-1), k, v, g, beta)
    torch.testing.assert_close(a, b)


def test_bad_shapes_are_refused():
    q, k, v, g = make_inputs("gla", time=9, requires_grad=False)
    with pytest.raises(ValueError, match="g must be"):
        lr.gla(q, k, v, g[..., 0])
    with pytest.raises(ValueError, match="g must be"):
        lr.simple_gla(q, k, v, g)
    with pytest.raises(ValueError, match="initial_state"):
        lr.gla(q, k, v, g, initial_state=torch.zeros(2, 2, 8, 7, dtype=F64))
    with pytest.raises(ValueError, match="q, k"):
        lr.linear_attention(q, k[..., :4], v)


# ---------------------------------------------------------------------------------------
# fla's own naive references, where fla imports
# ---------------------------------------------------------------------------------------

def _fla_naive(module, name):
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # fla.ops imports Triton kernels; any failure means "not usable"
        pytest.skip(f"flash-linear-attention not importable here ({type(e).__name__}: {e}); "
                    "it is an optional extra, not installed in this environment")
    fn = getattr(mod, name, None)
    if fn is None:
        pytest.skip(f"this fla version has no {module}.{name}")
    return fn


def test_gla_matches_fla_naive():
    fn = _fla_naive("fla.ops.gla.naive", "naive_recurrent_gla")
    q, k, v, g = make_inputs("gla", time=37, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    o_fla, s_fla = fn(q=q, k=k, v=v, gk=g, initial_state=S0, output_final_state=True)
    o, s = lr.gla(q, k, v, g, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(o, o_fla.to(o.dtype))
    torch.testing.assert_close(s, s_fla.to(s.dtype))


def test_gated_delta_rule_matches_fla_naive():
    fn = _fla_naive("fla.ops.gated_delta_rule.naive", "naive_recurrent_gated_delta_rule")
    q, k, v, g, beta = make_inputs("gated_delta_rule", time=37, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    o_fla, s_fla = fn(q=q, k=k, v=v, beta=beta, g=g, initial_state=S0,
                      output_final_state=True)
    o, s = lr.gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(o, o_fla.to(o.dtype))
    torch.testing.assert_close(s, s_fla.to(s.dtype))
