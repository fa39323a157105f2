"""Pieces recomputed in the backward (models.common.recomputed): the norms, gates and short
convolutions keep only their inputs for the backward, and their gradients are unchanged."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.common import RMSNorm, recomputed
from models.linear_rnn.linear_mixers import GatedHeadRMSNorm, HeadRMSNorm
from models.ssm.mamba2 import GatedRMSNorm
from models.conv.short_conv import ShortConvolution as ShortConv

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


# ---------------------------------------------------------------------------------------
# recomputed_in_slices, and the mixers' pieces recomputed from their input (issue 21:
# Mamba-2, RetNet and the delta rules at L = 16384 below the Transformer's peak)
# ---------------------------------------------------------------------------------------

import models.common as common                                    # noqa: E402
from models.kernels import linear_rnn                              # noqa: E402
from models.linear_rnn.delta_mixers import DeltaNet, GatedDeltaNet        # noqa: E402
from models.linear_rnn.linear_mixers import GatedLinearAttention, MultiScaleRetention, rotary  # noqa: E402
from models.ssm.mamba2 import Mamba2                                   # noqa: E402


def _conv_plain(x, w, b, left=None):
    """silu(causal depthwise conv), x (batch, L, D) time-major, by F.conv1d (channels first)."""
    k = w.shape[-1]
    prev = x.new_zeros(x.shape[0], k - 1, x.shape[2]) if left is None else left
    xp = torch.cat([prev, x], 1).transpose(1, 2)
    return F.silu(F.conv1d(xp, w, b, groups=x.shape[2])).transpose(1, 2)


def test_recomputed_in_slices_equals_the_whole_with_a_conv_halo(monkeypatch):
    """Slices of 4 steps with 3 steps of conv context (and the left context at the start)
    give the whole-sequence output and gradients, and keep only the inputs."""
    monkeypatch.setattr(common, "SLICE_LEN", 4)
    x, w, b, left = _inputs((2, 23, 6), (6, 1, 4), (6,), (2, 3, 6))

    def piece(h, x, w, b, left):
        return _conv_plain(x, w, b, None if h else left)[:, h:] * x[:, h:]

    out = common.recomputed_in_slices(piece, 1, 3, x, w, b, left)
    want = _conv_plain(x, w, b, left) * x
    torch.testing.assert_close(out, want)
    for a, g in zip(_grads(out, [x, w, b, left], []), _grads(want, [x, w, b, left], [])):
        torch.testing.assert_close(a, g)
    kept, _ = _saved_bytes(lambda *a: common.recomputed_in_slices(piece, 1, 3, *a), x, w, b, left)
    assert kept == sum(t.numel() * t.element_size() for t in (x, w, b, left))
    with torch.no_grad():                  # not recording: the same slices, same result
        torch.testing.assert_close(common.recomputed_in_slices(piece, 1, 3, x, w, b, left), want)


def _rms(x, w, eps=1e-5):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def _plain_mamba2(m, u):
    """Mamba2's forward as plain autograd ops (one in_proj, F.conv1d, the *_ref operator)."""
    di, N, H, P = m.d_inner, m.d_state, m.nheads, m.headdim
    z, xBC, dt_raw = m.in_proj(u).split([di, m.conv_dim, H], -1)
    xBC = _conv_plain(xBC, m.conv1d.weight, m.conv1d.bias)
    x, B, C = xBC.split([di, N, N], -1)
    x = x.unflatten(-1, (H, P))
    dt = F.softplus(dt_raw + m.dt_bias)
    heads = lambda t: t[:, :, None].expand(-1, -1, H, -1)         # noqa: E731 (one group)
    o, _ = linear_rnn.simple_gla_ref(heads(C), heads(B), x * dt[..., None],
                                     dt * -torch.exp(m.A_log), scale=1.0)
    y = (o + m.D[:, None] * x).flatten(-2) * F.silu(z)
    return m.out_proj(_rms(y, m.norm.weight))


def _plain_retnet(m, x):
    B, T, _ = x.shape
    pos = torch.arange(T).expand(B, T)
    q, k = (rotary(p(x).unflatten(-1, (m.n_heads, -1)), pos) for p in (m.q_proj, m.k_proj))
    v = m.v_proj(x).unflatten(-1, (m.n_heads, -1))
    g = m.log_decay().to(x.dtype).expand(B, T, -1)
    o, _ = linear_rnn.simple_gla_ref(q, k, v, g)
    o = m.group_norm(o.reshape(B * T, -1)).reshape(B, T, -1)
    return m.o_proj(o * F.silu(m.g_proj(x)))


def _plain_delta(m, x):
    qkv = torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], -1)
    qkv = _conv_plain(qkv, m.qkv_conv1d.weight, m.qkv_conv1d.bias)
    q, k, v = (t.unflatten(-1, (m.n_heads, -1)) for t in qkv.split([m.key_dim, m.key_dim, m.value_dim], -1))
    beta = m.b_proj(x).sigmoid()
    if isinstance(m, GatedDeltaNet):
        g = -m.A_log.exp() * F.softplus(m.a_proj(x) + m.dt_bias)
        o, _ = linear_rnn.gated_delta_rule_ref(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        o = _rms(o, m.o_norm.weight) * F.silu(m.g_proj(x).unflatten(-1, (m.n_heads, -1)))
    else:
        o, _ = linear_rnn.delta_rule_ref(q, k, v, beta, use_qk_l2norm_in_kernel=True)
        o = _rms(o, m.o_norm.weight)
    return m.o_proj(o.flatten(-2))


def _plain_gla(m, x):
    q, k, v = (p(x).unflatten(-1, (m.n_heads, -1)) for p in (m.q_proj, m.k_proj, m.v_proj))
    g = (F.logsigmoid(m.gk_proj(x)) / m.gate_logit_normalizer).unflatten(-1, (m.n_heads, -1))
    o, _ = linear_rnn.gla_ref(q, k, v, g)
    o = _rms(o, m.g_norm_swish_gate.weight) * F.silu(m.g_proj(x).unflatten(-1, (m.n_heads, -1)))
    return m.o_proj(o.flatten(-2))


LAYERS = {
    # name: (layer, plain maths, widths (per step, batch) of its input and of the operator's
    # output o: all that the layer keeps besides the operator's own inputs and states)
    "mamba2": (lambda bk: Mamba2(16, d_state=8, headdim=8, backend=bk), _plain_mamba2,
               lambda m: 16 + m.d_inner),
    "retnet": (lambda bk: MultiScaleRetention(16, backend=bk), _plain_retnet,
               lambda m: 16 + m.value_dim),
    "gated_deltanet": (lambda bk: GatedDeltaNet(16, backend=bk), _plain_delta,
                       lambda m: 16 + m.value_dim),
    "deltanet": (lambda bk: DeltaNet(16, backend=bk), _plain_delta, lambda m: 16 + m.value_dim),
    "gla": (lambda bk: GatedLinearAttention(16, backend=bk), _plain_gla,
            lambda m: 16 + m.value_dim),
}


def _layer(name, backend):
    torch.manual_seed(0)
    m = LAYERS[name][0](backend).double()
    with torch.no_grad():                     # away from the init (norm weights 1, D 1, ...)
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    return m


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("name", LAYERS)
def test_layer_pieces_equal_plain_maths_with_gradients(name, backend, monkeypatch):
    """The layer (its pieces recomputed from its input in slices of 8 steps, Mamba-2's
    operator in segments of 8) == the same maths as plain autograd ops, float64."""
    from models.kernels import linear_rnn_cpu
    from models.ssm import mamba2

    if backend == "cpu" and not linear_rnn_cpu.available():
        pytest.skip("no C kernels")
    monkeypatch.setattr(common, "SLICE_LEN", 8)
    monkeypatch.setattr(mamba2, "OP_SEGMENT_LEN", 8)
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 0)   # the sliced path (long chunks')
    from models.linear_rnn import delta_mixers                 # and the delta rules' (long inputs')
    monkeypatch.setattr(delta_mixers, "PROJ_WHOLE_MAX_BYTES", 0)
    m, plain = _layer(name, backend), LAYERS[name][1]
    (x,) = _inputs((2, 29, 16))
    out, want = m(x), plain(m, x)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)
    params = list(m.parameters())
    for a, b in zip(_grads(out, [x], params), _grads(want, [x], params)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("name", LAYERS)
def test_layer_keeps_its_input_and_the_operators_output_only(name, monkeypatch):
    """Besides what the operator keeps (its inputs and states), autograd keeps the layer's
    input x and the operator's output o, and per-head scalars (dt, gates, beta, positions):
    no projection, gate, conv output or norm intermediate (each as wide as o or wider)."""
    from models.linear_rnn import linear_mixers     # the delta rules use linear_mixers.get_op
    from models.ssm import mamba2

    in_op = []

    def wrap(get_op):
        def get(*a, **kw):
            op, resolved = get_op(*a, **kw)

            def run(*args, **kwargs):
                in_op.append(True)
                try:
                    return op(*args, **kwargs)
                finally:
                    in_op.pop()
            return run, resolved
        return get
    monkeypatch.setattr(mamba2.lrb, "get_op", wrap(mamba2.lrb.get_op))
    monkeypatch.setattr(linear_mixers, "get_op", wrap(linear_mixers.get_op))
    monkeypatch.setattr(mamba2, "WHOLE_MAX_BYTES", 0)   # the sliced path (long chunks')
    from models.linear_rnn import delta_mixers                 # and the delta rules' (long inputs')
    monkeypatch.setattr(delta_mixers, "PROJ_WHOLE_MAX_BYTES", 0)
    m = _layer(name, "torch")
    (x,) = _inputs((2, 64, 16))
    seen, outside = set(), [0]

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            if not in_op:
                outside[0] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x)
    per_step = 2 * 64 * 8                                      # batch 2, L 64, float64
    params = sum(p.numel() * p.element_size() for p in m.parameters())
    heads = getattr(m, "nheads", getattr(m, "n_heads", 0))
    allowed = LAYERS[name][2](m) * per_step + 4 * (heads + 1) * per_step + params
    assert 0 < outside[0] <= allowed, (outside[0], allowed)


def test_sliced_rms_norm_only_for_a_length_axis():
    """RMSNorm slices (batch, length, ...) inputs; a (batch, d) token is normalised whole
    (its axis 1 is the normalised one)."""
    m = RMSNorm(2000).double()
    x = torch.randn(3, 2000, dtype=F64, requires_grad=True)
    torch.testing.assert_close(m(x), _plain_rms(x, m.weight, m.eps))
