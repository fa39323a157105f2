"""Based (models/linear_rnn/based.py): Taylor feature map, normalised linear attention, BaseConv, entry."""
from __future__ import annotations

import math

import pytest
import torch

import models
from helpers import run_pieces, run_steps
from models.linear_rnn.based import BaseConv, BasedLinearAttention, taylor_expanded_dim, taylor_feature_map
from models.kernels.linear_rnn_backends import BackendError
from models.attention.sliding_window import SlidingWindowAttention
from models.kernels.linear_rnn_backends import resolve as _resolve

CPU_AUTO = _resolve("auto", "cpu")   # "cpu" (the C kernels) where they build, else "torch"

D = 16


def test_taylor_map_is_the_explicit_formula():
    f = 4
    x = torch.randn(3, f, dtype=torch.float64)
    phi = taylor_feature_map(x)
    assert phi.shape == (3, taylor_expanded_dim(f)) == (3, 1 + 4 + 16)
    for n in range(3):
        expected = [1.0] + [x[n, i] / f ** 0.25 for i in range(f)]
        expected += [x[n, i] * x[n, j] / (math.sqrt(2) * math.sqrt(f)) for i in range(f) for j in range(f)]
        torch.testing.assert_close(phi[n], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)


def test_taylor_map_kernel_is_second_order_taylor_of_exp():
    f = 16
    q, k = torch.randn(5, f, dtype=torch.float64), torch.randn(5, f, dtype=torch.float64)
    s = (q * k).sum(-1) / math.sqrt(f)
    kernel = (taylor_feature_map(q) * taylor_feature_map(k)).sum(-1)
    torch.testing.assert_close(kernel, 1 + s + s ** 2 / 2, rtol=1e-13, atol=0)
    assert (kernel >= 0.5 - 1e-12).all()


def _layer(n_heads=2, feature_dim=4, backend="auto"):
    torch.manual_seed(0)
    return BasedLinearAttention(D, n_heads=n_heads, feature_dim=feature_dim, backend=backend).double()


@pytest.mark.parametrize("n_heads", [1, 2])
def test_forward_is_normalised_taylor_attention(n_heads):
    m = _layer(n_heads)
    b, L, f, dv = 2, 21, 4, D // n_heads
    x = torch.randn(b, L, D, dtype=torch.float64)
    q = taylor_feature_map(m.proj_q(x).view(b, L, n_heads, f))
    k = taylor_feature_map(m.proj_k(x).view(b, L, n_heads, f))
    v = m.proj_v(x).view(b, L, n_heads, dv)
    A = torch.einsum("blhf,bshf->bhls", q, k) * torch.ones(L, L, dtype=torch.float64).tril()
    y = torch.einsum("bhls,bshd->blhd", A, v) / (A.sum(-1).transpose(1, 2)[..., None] + m.eps)
    torch.testing.assert_close(m(x), m.proj_o(y.reshape(b, L, D)), rtol=0, atol=1e-12)


def test_forward_with_state_and_step_equal_forward():
    m = _layer()
    x = torch.randn(2, 37, D, dtype=torch.float64)
    y = m(x)
    torch.testing.assert_close(run_pieces(m, x, [5, 1, 20, 11]), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(run_steps(m, x), y, rtol=0, atol=1e-12)


def test_ref_backend_equals_torch_and_state_size():
    m, ref = _layer(), _layer(backend="ref")
    x = torch.randn(2, 19, D, dtype=torch.float64)
    torch.testing.assert_close(ref(x), m(x), rtol=0, atol=1e-12)
    assert (m.backend, ref.backend) == (CPU_AUTO, "ref")
    state = m.init_state(3)
    assert m.state_size() == sum(s.numel() for s in state) // 3 == 2 * 21 * (8 + 1)


def test_default_feature_dim_runs_torch_under_auto_and_refuses_fla():
    m = BasedLinearAttention(D)
    assert m.expanded_dim == 273 and m.backend == CPU_AUTO
    with pytest.raises(BackendError, match="256"):
        BasedLinearAttention(D, backend="fla")
    with pytest.raises(ValueError, match="n_heads"):
        BasedLinearAttention(D, n_heads=3)


def test_gradients_finite():
    m = _layer()
    x = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    m(x).pow(2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_base_conv_formula_and_streaming():
    torch.manual_seed(0)
    c = BaseConv(D, kernel_size=3).double()
    x = torch.randn(2, 11, D, dtype=torch.float64)
    w, bias = c.conv.weight[:, 0], c.conv.bias                     # (D, 3), (D,)
    xp = torch.cat([torch.zeros(2, 2, D, dtype=torch.float64), x], dim=1)
    conv = torch.stack([sum(w[:, j] * xp[:, t + j] for j in range(3)) + bias for t in range(11)], 1)
    torch.testing.assert_close(c(x), conv * c.projection(x) + x, rtol=0, atol=1e-12)
    state, ys = c.init_state(2), []
    for chunk in x.split([1, 4, 6], dim=1):
        y, state = c.forward_with_state(chunk, state)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), c(x), rtol=0, atol=1e-12)
    assert c.state_size() == sum(s.numel() for s in state) // 2 == 2 * D


def test_based_entry_layout_follows_zoology_cycling():
    m2 = models.build("based", d_model=D, n_layers=2)
    assert [type(l.mixer) for l in m2.layers] == [BaseConv, BasedLinearAttention]  # zoology MQAR
    assert m2.mlps is None
    m5 = models.build("based", d_model=D, n_layers=5)
    assert [type(l.mixer) for l in m5.layers] == [
        BaseConv, BasedLinearAttention, SlidingWindowAttention, BaseConv, BasedLinearAttention]
    swa = m5.layers[2].mixer
    assert swa.window == 64 and swa.n_heads == 1
    assert m5.layers[1].mixer.feature_dim == 16
    expected = 2 * (D * 2 + 273 * (D + 1)) + (2 * 63 * D + 1)
    assert m5.state_size() == expected


def test_based_entry_streams_like_forward():
    torch.manual_seed(0)
    m = models.build("based", d_model=D, n_layers=3, window=4, feature_dim=3,
                     channel_mixer="swiglu").double()
    x = torch.randn(2, 17, D, dtype=torch.float64)
    torch.testing.assert_close(m.forward_chunked(x, 5), m(x), rtol=0, atol=1e-12)


def test_based_entry_bad_pattern_letter():
    with pytest.raises(ValueError, match="'M'"):
        models.build("based", d_model=D, n_layers=2, pattern="CBM")
