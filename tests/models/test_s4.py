"""Dense S4, HiPPO-LegS / DPLR form, and the S4 DPLR Cauchy kernel (CPU, float64)."""
import math

import pytest
import torch

from models.ssm.hippo import legs, legs_dplr, legs_low_rank
from models.ssm.s4 import S4, bilinear, matrix_power_pow2, power_vectors, zoh
from models.ssm.s4_dplr import S4DPLR

from helpers import run_steps


def recurrence(Abar, Bbar, C, D, u):
    """Direct recurrence x_k = Abar x_{k-1} + Bbar u_k, y_k = C x_k + D u_k.
    Abar (d,N,N), Bbar (d,N), C (d,N), D (d,), u (batch, L, d) -> (batch, L, d)."""
    x = torch.zeros(u.shape[0], *Bbar.shape, dtype=Abar.dtype)
    ys = []
    for t in range(u.shape[1]):
        x = torch.einsum("hnm,bhm->bhn", Abar, x) + Bbar * u[:, t, :, None]
        ys.append(torch.einsum("hn,bhn->bh", C, x).real + D * u[:, t])
    return torch.stack(ys, 1)


def test_legs_entries():
    A, B = legs(3)
    s = math.sqrt
    expected = torch.tensor([[-1, 0, 0], [-s(3), -2, 0], [-s(5), -s(15), -3]], dtype=torch.float64)
    assert torch.allclose(A, expected)
    assert torch.allclose(B, torch.tensor([1, s(3), s(5)], dtype=torch.float64))


@pytest.mark.parametrize("N", [2, 8, 16])
def test_dplr_form_reconstructs_legs(N):
    hp = legs_dplr(N)
    A, B = legs(N)
    V = torch.cat([hp["V"], hp["V"].conj()], 1)
    assert torch.allclose(V.conj().T @ V, torch.eye(N, dtype=V.dtype), atol=1e-12)
    Lam = torch.cat([hp["Lambda"], hp["Lambda"].conj()])
    assert torch.allclose(Lam.real, torch.full((N,), -0.5, dtype=torch.float64))
    P = legs_low_rank(N)
    rec = V @ torch.diag(Lam) @ V.conj().T - (P[:, None] * P[None, :])
    assert (rec - A).abs().max() < 1e-12
    assert (V @ torch.cat([hp["B"], hp["B"].conj()]) - B).abs().max() < 1e-12


def test_power_helpers():
    torch.manual_seed(0)
    A = torch.randn(3, 5, 5, dtype=torch.float64) / 3
    b = torch.randn(3, 5, dtype=torch.float64)
    for L in (1, 2, 7, 16, 33):
        V = power_vectors(A, b, L)
        ref = torch.stack([torch.linalg.matrix_power(A, l) @ b[..., None] for l in range(L)], -1)[..., 0, :]
        assert torch.allclose(V, ref, atol=1e-12)
        assert torch.allclose(matrix_power_pow2(A, L), torch.linalg.matrix_power(A, L), atol=1e-12)


@pytest.mark.parametrize("L", [37, 64])
def test_dense_s4_matches_recurrence(L):
    torch.manual_seed(1)
    m = S4(3, d_state=8).double()
    with torch.no_grad():
        m.log_dt.copy_(torch.tensor([-2.0, -1.0, 0.0]))
    u = torch.randn(2, L, 3, dtype=torch.float64)
    Abar, Bbar = m.discretize()
    # bilinear by hand for channel 0
    A0, dt0 = m.A[0], m.log_dt[0].exp()
    I = torch.eye(8, dtype=torch.float64)
    assert torch.allclose(Abar[0], torch.linalg.inv(I - dt0 / 2 * A0) @ (I + dt0 / 2 * A0))
    with torch.no_grad():
        assert torch.allclose(m(u), recurrence(Abar, Bbar, m.C, m.D, u), atol=1e-10)


def _explicit_kernel(m: S4DPLR, L: int) -> torch.Tensor:
    """K_l = C Abar^l Bbar with C = Ctilde (I - Abar^L)^-1, by explicit matrix powers."""
    A, B, Ct, dt = m.dense_system()
    Abar, Bbar = (bilinear if m.disc == "bilinear" else zoh)(A, B, dt.to(A.dtype))
    N = A.shape[-1]
    I = torch.eye(N, dtype=A.dtype)
    C = torch.einsum("hn,hnm->hm", Ct, torch.linalg.inv(I - torch.linalg.matrix_power(Abar, L)))
    K = torch.stack([torch.einsum("hn,hnm,hm->h", C, torch.linalg.matrix_power(Abar, l), Bbar)
                     for l in range(L)], -1)
    assert K.imag.abs().max() < 1e-9   # a real system in a complex basis
    return K.real


def _perturbed_dplr(disc, seed=0, freq_chunk=512):
    torch.manual_seed(seed)
    m = S4DPLR(3, d_state=8, disc=disc, freq_chunk=freq_chunk).double()
    with torch.no_grad():   # move away from the HiPPO init so every term matters
        m.log_dt.copy_(torch.tensor([-1.5, -0.7, 0.2]))
        m.log_neg_re.add_(0.3 * torch.randn_like(m.log_neg_re))
        m.im.add_(torch.randn_like(m.im))
        m.P.add_(0.3 * torch.randn_like(m.P))
        m.B.add_(0.3 * torch.randn_like(m.B))
    return m


@pytest.mark.parametrize("disc", ["bilinear", "zoh"])
@pytest.mark.parametrize("L", [32, 33])
def test_dplr_kernel_matches_explicit_powers(disc, L):
    m = _perturbed_dplr(disc, freq_chunk=5)   # small chunks: exercise the chunk loop
    with torch.no_grad():
        K = m.kernel(L)
        Ke = _explicit_kernel(m, L)
    assert Ke.abs().max() > 0.1
    assert torch.allclose(K, Ke, atol=1e-10), (K - Ke).abs().max()


def test_dplr_layer_matches_recurrence():
    m = _perturbed_dplr("bilinear", seed=3)
    L = 24
    u = torch.randn(2, L, 3, dtype=torch.float64)
    A, B, Ct, dt = m.dense_system()
    Abar, Bbar = bilinear(A, B, dt.to(A.dtype))
    I = torch.eye(A.shape[-1], dtype=A.dtype)
    C = torch.einsum("hn,hnm->hm", Ct, torch.linalg.inv(I - torch.linalg.matrix_power(Abar, L)))
    with torch.no_grad():
        assert torch.allclose(m(u), recurrence(Abar, Bbar, C, m.D, u.to(torch.float64)), atol=1e-9)


def test_dplr_chunked_gradients_match_unchunked():
    m1 = _perturbed_dplr("bilinear", seed=4, freq_chunk=3)
    m2 = _perturbed_dplr("bilinear", seed=4, freq_chunk=10_000)
    w = torch.randn(3, 40, dtype=torch.float64)
    g = []
    for m in (m1, m2):
        (m.kernel(40) * w).sum().backward()
        g.append(torch.cat([p.grad.flatten() for p in (m.log_neg_re, m.im, m.P, m.B, m.C, m.log_dt)]))
    assert torch.isfinite(g[0]).all()
    assert torch.allclose(g[0], g[1], atol=1e-10)


def test_dplr_options_validated():
    with pytest.raises(ValueError, match="disc"):
        S4DPLR(2, 8, disc="euler")
    with pytest.raises(ValueError, match="even"):
        S4DPLR(2, 7)


def test_dplr_float32_long_kernel_close_to_float64():
    torch.manual_seed(5)
    m = S4DPLR(4, d_state=16)
    with torch.no_grad():
        K32 = m.kernel(1024)
        K64 = m.double().kernel(1024)
    assert torch.isfinite(K32).all()
    assert (K32.double() - K64).abs().max() < 1e-4 * K64.abs().max()


def test_dense_s4_backbone_step_matches_forward():
    import models
    torch.manual_seed(6)
    m = models.build("s4", d_model=4, n_layers=2, d_state=6).double()
    assert models.state_size(m) == 2 * 4 * 6
    x = torch.randn(2, 20, 4, dtype=torch.float64)
    with torch.no_grad():
        y = m(x)
    assert torch.allclose(run_steps(m, x), y, atol=1e-9)
