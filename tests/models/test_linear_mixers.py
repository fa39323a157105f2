"""The linear-RNN mixers (models/linear_rnn/linear_mixers.py, models/linear_rnn/delta_mixers.py) and their
registry entries (models/catalog_linear_rnn.py).

Per mixer, float64: one forward == forward_with_state over uneven pieces == a step loop;
backend "ref" == "torch" (outputs and gradients); state_size == the real state's numel;
the initial state propagates to the final state exactly as the paper's transition says
(decays, gates and delta-rule projections written out here, independently of the layer:
a wrong sign or a wrong constant in a gate fails it); linear attention's normaliser
against the softmax-free formula written out; RetNet's decay constants.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models
from helpers import run_steps
from models.kernels.linear_rnn_backends import BackendError
from models.linear_rnn.delta_mixers import DeltaNet, GatedDeltaNet
from models.linear_rnn.linear_mixers import GatedLinearAttention, LinearAttention, MultiScaleRetention
from models.conv.short_conv import ShortConvolution
from models.kernels.linear_rnn_backends import resolve as _resolve

CPU_AUTO = _resolve("auto", "cpu")   # "cpu" (the C kernels) where they build, else "torch"

F64 = torch.float64
D, B, T = 16, 2, 29
PIECES = [1, 2, 9, 17]          # uneven, shorter than the conv kernel first
ENTRIES = ["gla", "retnet", "linear_attention", "deltanet", "gated_deltanet"]

MIXERS = {
    "gla": lambda **kw: GatedLinearAttention(D, **kw),
    "retnet": lambda **kw: MultiScaleRetention(D, **kw),
    "linear_attention": lambda **kw: LinearAttention(D, **kw),
    "linear_attention[identity,raw]": lambda **kw: LinearAttention(
        D, feature_map="identity", normalize=False, **kw),
    "linear_attention[rms]": lambda **kw: LinearAttention(D, output_norm="rms", **kw),
    "deltanet": lambda **kw: DeltaNet(D, **kw),
    "deltanet[no conv]": lambda **kw: DeltaNet(D, use_short_conv=False, **kw),
    "gated_deltanet": lambda **kw: GatedDeltaNet(D, **kw),
}


def _mixer(name, seed=0, **kw):
    torch.manual_seed(seed)
    m = MIXERS[name](**kw).double()
    # larger gates than the init gives, so that decays are visible within T steps
    if isinstance(m, GatedDeltaNet):
        with torch.no_grad():
            m.dt_bias.add_(2.0)
    return m


def _x(seed=1, t=T):
    return torch.randn(B, t, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _random_state(m, seed=2):
    """A random non-zero state of the mixer's layout (counter: a random position)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 1000, s.shape, generator=gen) if not s.is_floating_point()
                 else torch.randn(s.shape, generator=gen, dtype=s.dtype)
                 for s in m.init_state(B))


# ---------------------------------------------------------------------------------------
# forward == chunks == steps; ref == torch; state size
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MIXERS))
def test_forward_equals_pieces_equals_steps(name):
    m = _mixer(name, chunk_size=8)         # chunks of 8: several chunks and a partial one
    x = _x()
    with torch.no_grad():
        y = m(x)
        state, ys = m.init_state(B), []
        for piece in x.split(PIECES, dim=1):
            yp, state = m.forward_with_state(piece, state)
            ys.append(yp)
        state_steps, ys_steps = m.init_state(B), []
        for x_t in x.unbind(1):
            y_t, state_steps = m.step(x_t, state_steps)
            ys_steps.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(torch.stack(ys_steps, 1), y, atol=1e-10, rtol=1e-9)
    for a, b in zip(state, state_steps):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name", list(MIXERS))
def test_from_a_nonzero_state_pieces_equal_steps(name):
    """A carried state (matrix, conv cache, position) is used the same way by both paths."""
    m = _mixer(name, chunk_size=8)
    x, s0 = _x(t=11), _random_state(m)
    with torch.no_grad():
        y, s1 = m.forward_with_state(x, s0)
        state, ys = s0, []
        for x_t in x.unbind(1):
            y_t, state = m.step(x_t, state)
            ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, atol=1e-10, rtol=1e-9)
    for a, b in zip(state, s1):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name", list(MIXERS))
def test_ref_backend_equals_torch_backend(name):
    outs = []
    for backend in ("torch", "ref"):
        m = _mixer(name, backend=backend, chunk_size=8)
        x = _x().requires_grad_()
        y = m(x)
        assert m.backend == backend
        (y * _x(seed=5)).sum().backward()
        grads = [x.grad] + [p.grad for p in m.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        outs.append((y.detach(), grads))
    (y1, g1), (y2, g2) = outs
    torch.testing.assert_close(y1, y2, atol=1e-10, rtol=1e-9)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("name", list(MIXERS))
def test_state_size_is_the_real_state(name):
    m = _mixer(name)
    _, state = m.forward_with_state(_x(t=5), m.init_state(B))
    assert m.state_size() == sum(s.numel() for s in state) // B
    assert [s.shape for s in state] == [s.shape for s in m.init_state(B)]


# ---------------------------------------------------------------------------------------
# the transitions, written out from the papers
# ---------------------------------------------------------------------------------------

def _transition(name, m, x, extras):
    """The per-step linear map of the initial state, M_t (batch, heads, K, K), S_t = M_t
    S_{t-1} + (terms without S), from the papers' formulas (not the layer's code; only
    the delta rules' keys are taken from the layer, after its short conv from ``extras``)."""
    H, K = m.n_heads, m.head_k_dim
    eye = torch.eye(K, dtype=F64).expand(B, x.shape[1], H, K, K)
    if name == "gla":                       # diag(exp(logsigmoid(x W_g1 W_g2 + b) / 16))
        g = F.logsigmoid(m.gk_proj(x)).unflatten(-1, (H, K)) / 16.0
        return eye * g.exp()[..., None]
    if name == "retnet":                    # gamma_h = 1 - 2^(-5-h)
        gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=F64))
        return eye * gamma[:, None, None]
    if name.startswith("linear_attention"):
        return eye
    # delta rules: exp(g) (I - beta k k^T), k L2-normalised
    k = F.normalize(m._inputs(x, extras)[0][1], dim=-1)
    beta = torch.sigmoid(m.b_proj(x))
    M = eye - beta[..., None, None] * k[..., :, None] * k[..., None, :]
    if name == "gated_deltanet":            # g = -exp(A_log) softplus(x W_a + dt_bias)
        g = -m.A_log.exp() * F.softplus(m.a_proj(x) + m.dt_bias)
        M = M * g.exp()[..., None, None]
    return M


@pytest.mark.parametrize("name", list(MIXERS))
def test_initial_state_propagates_by_the_papers_transition(name):
    """S_T(S0) - S_T(0) = M_T ... M_1 S0 (the recurrence is affine in S). Catches a gate of
    the wrong sign or scale, a wrong decay constant, a delta rule that does not project."""
    m = _mixer(name)
    x = _x(t=13)
    s0 = _random_state(m)
    zero = (torch.zeros_like(s0[0]), *s0[1:])
    with torch.no_grad():
        S_a = m.forward_with_state(x, s0)[1][0]
        S_b = m.forward_with_state(x, zero)[1][0]
        expected = s0[0]
        for M_t in _transition(name, m, x, s0[1:]).unbind(1):            # (B, H, K, K)
            expected = M_t @ expected
    assert (S_a - S_b).abs().max() > 1e-3 * expected.abs().max()  # not trivially zero
    torch.testing.assert_close(S_a - S_b, expected, atol=1e-10, rtol=1e-8)


def test_retnet_decay_constants():
    m = MultiScaleRetention(D, n_heads=4)
    torch.testing.assert_close(m.log_decay().exp(),
                               torch.tensor([1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256],
                                            dtype=F64), atol=0, rtol=1e-15)


def test_retnet_position_counter_advances_and_moves_the_rotation():
    m = _mixer("retnet")
    x = _x(t=7)
    s = m.init_state(B)
    _, s1 = m.forward_with_state(x, s)
    assert s1[1].tolist() == [7] * B
    s_far = (s[0], s[1] + 100)               # same state, later position
    with torch.no_grad():
        y0 = m.forward_with_state(x, s)[0]
        y1 = m.forward_with_state(x, s_far)[0]
    # from a zero matrix state, retention depends on relative positions only
    torch.testing.assert_close(y0, y1, atol=1e-10, rtol=1e-9)
    s_nz = _random_state(m)
    with torch.no_grad():
        y2 = m.forward_with_state(x, s_nz)[0]
        y3 = m.forward_with_state(x, (s_nz[0], s_nz[1] + 100))[0]
    assert not torch.allclose(y2, y3)        # ...but q at an absolute position meets S


# ---------------------------------------------------------------------------------------
# linear attention's normaliser
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("feature_map", ["elu+1", "identity"])
@pytest.mark.parametrize("normalize", [True, False])
def test_linear_attention_formula(feature_map, normalize):
    """o_t = sum_{s<=t} (q_t.k_s) v_s / (sum_{s<=t} q_t.k_s + eps / scale), with q, k the
    feature-mapped projections: the attention matrix written out, no softmax."""
    torch.manual_seed(0)
    m = LinearAttention(D, feature_map=feature_map, normalize=normalize).double()
    x = _x()
    H = m.n_heads
    phi = (lambda t: F.elu(t) + 1) if feature_map == "elu+1" else (lambda t: t)
    q = phi(m.q_proj(x).unflatten(-1, (H, -1)))                  # (B, T, H, K)
    k = phi(m.k_proj(x).unflatten(-1, (H, -1)))
    v = m.v_proj(x).unflatten(-1, (H, -1))
    scale = m.head_k_dim ** -0.5
    A = torch.einsum("bthk,bshk->bhts", q, k) * scale
    A = A * torch.ones(T, T, dtype=F64).tril()                   # causal, unnormalised
    o = torch.einsum("bhts,bshv->bthv", A, v)
    if normalize:
        o = o / (A.sum(-1).transpose(1, 2)[..., None] + m.eps)
    expected = m.o_proj(o.flatten(-2))
    with torch.no_grad():
        torch.testing.assert_close(m(x), expected, atol=1e-10, rtol=1e-9)
    if normalize and feature_map == "elu+1":                     # rows of A / sum A sum to 1
        w = A / A.sum(-1, keepdim=True)
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))


# ---------------------------------------------------------------------------------------
# the short conv, options, errors, parameters
# ---------------------------------------------------------------------------------------

def test_short_conv_streams_and_steps():
    torch.manual_seed(0)
    c = ShortConvolution(6, kernel_size=4).double()
    x = torch.randn(B, 13, 6, dtype=F64)
    y, cache = c(x)
    ref = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), c.weight, groups=6)).transpose(1, 2)
    torch.testing.assert_close(y, ref)
    s, ys = c.init_state(B), []
    for piece in x.split([1, 2, 10], 1):
        yp, s = c(piece, s)
        ys.append(yp)
    torch.testing.assert_close(torch.cat(ys, 1), y)
    torch.testing.assert_close(s, cache)
    torch.testing.assert_close(cache, x[:, -3:].transpose(1, 2))
    assert c.state_size() == 6 * 3


def test_gate_parameters_have_no_weight_decay_and_fla_init():
    torch.manual_seed(0)
    m = GatedDeltaNet(64, n_heads=8)
    assert m.A_log._no_weight_decay and m.dt_bias._no_weight_decay
    A = m.A_log.exp()
    assert ((A > 0) & (A <= 16)).all()
    dt = F.softplus(m.dt_bias)
    assert ((dt >= 1e-4 * 0.999) & (dt <= 0.1 * 1.001)).all()
    assert (m.log_gate(torch.randn(2, 3, 64)) <= 0).all()


def test_backend_choice_and_errors():
    m = GatedLinearAttention(D)
    assert m.backend_choice == "auto" and m.backend == CPU_AUTO   # CPU parameters
    with pytest.raises(BackendError, match="bogus"):
        DeltaNet(D, backend="bogus")
    assert issubclass(BackendError, ValueError)
    from models.kernels.linear_rnn_backends import fla_status
    if not fla_status()[0]:
        with pytest.raises(BackendError, match="fla"):
            GatedDeltaNet(D, backend="fla")


@pytest.mark.parametrize("make, match", [
    (lambda: GatedLinearAttention(16, n_heads=3), "expand_k"),
    (lambda: MultiScaleRetention(12, n_heads=4), "even"),
    (lambda: LinearAttention(16, feature_map="relu"), "feature_map"),
    (lambda: LinearAttention(16, output_norm="layer"), "output_norm"),
    (lambda: DeltaNet(16, conv_size=0), "conv_size"),
    (lambda: GatedDeltaNet(16, chunk_size=0), "chunk_size"),
    (lambda: DeltaNet(16, n_heads=0), "n_heads"),
])
def test_bad_options_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------------------------------
# registry entries: the stack streams and steps
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("channel_mixer", ["none", "swiglu"])
@pytest.mark.parametrize("name", ENTRIES)
def test_entry_streams_and_steps(name, channel_mixer):
    torch.manual_seed(0)
    m = models.build(name, d_model=D, n_layers=2, channel_mixer=channel_mixer,
                     chunk_size=8).double().eval()
    assert models.entry(name).family == "linear-rnn"
    x = _x(t=21)
    with torch.no_grad():
        y = m(x)
        torch.testing.assert_close(m.forward_chunked(x, 6), y, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(run_steps(m, x), y, atol=1e-10, rtol=1e-9)
    assert models.state_size(m) == 2 * m.layers[0].mixer.state_size()
    assert models.backend(m) == CPU_AUTO
