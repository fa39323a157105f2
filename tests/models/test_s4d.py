"""S4D: init formulas, Vandermonde split kernel, kernel vs recurrence, step mode (CPU, float64)."""
import math

import pytest
import torch

import models
from models.ssm.s4d import INITS, S4D, s4d_init, vandermonde_naive, vandermonde_split

from helpers import run_steps


def test_init_formulas():
    N = 8
    A, B = s4d_init("real", N)
    assert torch.allclose(A.real, -torch.arange(1, N + 1, dtype=torch.float64)) and (A.imag == 0).all()
    A, _ = s4d_init("lin", N)
    assert A.shape == (N // 2,)
    for n in range(N // 2):
        assert A[n].real == -0.5 and abs(A[n].imag - math.pi * n) < 1e-12
    A, B = s4d_init("inv", N)
    for n in range(N // 2):
        assert A[n].real == -0.5
        assert abs(A[n].imag - (N / math.pi) * (N / (2 * n + 1) - 1)) < 1e-12
    assert torch.allclose(B, torch.ones(N // 2, dtype=torch.complex128))
    A, _ = s4d_init("legs", N)
    assert torch.allclose(A.real, torch.full((N // 2,), -0.5, dtype=torch.float64)) and (A.imag > 0).all()
    m = S4D(3, d_state=N, init="inv").double()
    assert torch.allclose(m.A(), s4d_init("inv", N)[0].expand(3, N // 2))


def test_options_validated():
    with pytest.raises(ValueError, match="init"):
        S4D(2, 8, init="foo")
    with pytest.raises(ValueError, match="disc"):
        S4D(2, 8, disc="euler")
    with pytest.raises(ValueError, match="kernel_mode"):
        S4D(2, 8, kernel_mode="fast")


@pytest.mark.parametrize("L", [1, 2, 15, 16, 17, 100, 257])
def test_vandermonde_split_equals_naive(L):
    torch.manual_seed(0)
    W = torch.randn(3, 5, dtype=torch.complex128)
    dtA = torch.complex(-torch.rand(3, 5, dtype=torch.float64), 3 * torch.randn(3, 5, dtype=torch.float64))
    assert torch.allclose(vandermonde_split(W, dtA, L), vandermonde_naive(W, dtA, L), atol=1e-12)
    # and the naive one is the definition
    direct = torch.stack([(W * torch.exp(dtA * l)).sum(-1) for l in range(L)], -1)
    assert torch.allclose(vandermonde_naive(W, dtA, L), direct, atol=1e-12)


def _recurrence(m: S4D, u: torch.Tensor) -> torch.Tensor:
    """x_k = Abar x_{k-1} + Bbar u_k, y_k = s Re(C x_k) + D u_k with Abar, Bbar written out
    from the continuous parameters (not from m.discretize)."""
    A = m.A()
    B = torch.complex(m.B_re, m.B_im)
    C = torch.complex(m.C_re, m.C_im)
    dt = m.log_dt.exp()[:, None]
    if m.disc == "zoh":
        Abar, Bbar = torch.exp(dt * A), (torch.exp(dt * A) - 1) / A * B
    else:
        Abar, Bbar = (1 + dt * A / 2) / (1 - dt * A / 2), dt * B / (1 - dt * A / 2)
    s = 1.0 if m.init == "real" else 2.0
    x = torch.zeros(u.shape[0], *A.shape, dtype=A.dtype)
    ys = []
    for t in range(u.shape[1]):
        x = Abar * x + Bbar * u[:, t, :, None]
        ys.append(s * (C * x).sum(-1).real + m.D * u[:, t])
    return torch.stack(ys, 1)


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
@pytest.mark.parametrize("kernel_mode", ["split", "naive"])
def test_forward_matches_recurrence(init, disc, kernel_mode):
    torch.manual_seed(1)
    m = S4D(3, d_state=8, init=init, disc=disc, kernel_mode=kernel_mode).double()
    with torch.no_grad():
        m.log_dt.copy_(torch.tensor([-2.0, -1.0, 0.0]))
    u = torch.randn(2, 41, 3, dtype=torch.float64)
    with torch.no_grad():
        y, ref = m(u), _recurrence(m, u)
    assert ref.abs().max() > 0.1
    assert torch.allclose(y, ref, atol=1e-10), (y - ref).abs().max()


@pytest.mark.parametrize("init", ["real", "lin", "inv"])
def test_step_matches_forward(init):
    torch.manual_seed(2)
    m = S4D(4, d_state=6, init=init).double()
    u = torch.randn(3, 30, 4, dtype=torch.float64)
    with torch.no_grad():
        y = m(u)
    assert torch.allclose(run_steps(m, u), y, atol=1e-10)


def test_backbone_step_and_state_size():
    torch.manual_seed(3)
    d, n_layers, N = 8, 2, 6
    m = models.build("s4d", d_model=d, n_layers=n_layers, d_state=N, init="inv").double()
    assert models.state_size(m) == n_layers * d * N
    x = torch.randn(2, 25, d, dtype=torch.float64)
    with torch.no_grad():
        y = m(x)
    assert torch.allclose(run_steps(m, x), y, atol=1e-9)


def test_float32_split_kernel_accuracy_long():
    """At L=4096 the split kernel in float32 stays close to float64 (FACTS: ~1e-6)."""
    torch.manual_seed(4)
    m = S4D(8, d_state=16, init="lin")
    with torch.no_grad():
        K32 = m.kernel(4096)
        K64 = m.double().kernel(4096)
    assert (K32.double() - K64).abs().max() < 1e-4 * K64.abs().max()
