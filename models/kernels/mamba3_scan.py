"""The Mamba-3 SISO recurrence (Lahoti, Li, Chen, Wang, Bick, Kolter, Dao, Gu, "Mamba-3:
Improved Sequence Modeling using State Space Principles", ICLR 2026): a step-by-step
oracle :func:`mamba3_ref` and a chunked form :func:`mamba3` built on the workbench's SSD
(``simple_gla``). Written from the paper and from the step reference in state-spaces/mamba
``tests/ops/triton/test_mamba3_siso.py`` (``mamba3_siso_step_ref``); no code copied.

Shapes (one head count for q, k and v; the mixer broadcasts B/C groups to heads):
    q, k   (batch, L, heads, N)   C and B (biases already added, not yet rotated)
    v      (batch, L, heads, P)   x
    adt    (batch, L, heads)      log decay A_t dt_t (<= 0)
    dt     (batch, L, heads)      step size dt_t (> 0)
    lam    (batch, L, heads)      trapezoid weight lambda_t in [0, 1] (sigmoid of trap)
    omega  (batch, L, heads, R) or None, R <= N / 2: rotation rates (tanh(angle) * pi)

Per head, with theta_t = theta_{t-1} + omega_t dt_t (mod 2 pi), kr_t = rot(k_t, theta_t),
qr_t = rot(q_t, theta_t) (pairs (2i, 2i+1) of the state turned by theta_t[i], i < R, the
rest unchanged: the complex state written as data-dependent rotary embeddings), and
alpha_t = exp(adt_t):

    S_t = alpha_t S_{t-1} + (1 - lam_t) dt_t alpha_t kr_{t-1} v_{t-1}^T + lam_t dt_t kr_t v_t^T
    o_t = S_t^T qr_t

(exponential-trapezoidal rule; lam = 1 is Mamba-2's Euler step: S_t = alpha_t S_{t-1} +
dt_t k_t v_t^T.) The state carried across calls is (theta (b, h, R), S (b, h, N, P),
kr_prev (b, h, N), v_prev (b, h, P)): the trapezoid needs the previous rotated B and x.
mamba-ssm keeps S as (b, h, P, N); here it is the SSD operator's (N, P) layout.

Chunked form (one SSD call): with mu_t = (1 - lam_t) dt_t, the trapezoid's previous-step
term folds into the current key, k'_t = (lam_t dt_t + mu_{t+1}) kr_t (mu_{L+1} := 0), the
first step's term into the initial state, S'_0 = S_0 + mu_1 kr_0 v_0^T, and the diagonal is
corrected, o_t = SSD_t - mu_{t+1} (qr_t . kr_t) v_t. The SSD's running state is then
S_t + mu_{t+1} kr_t v_t^T, which at t = L is S_L.
"""
from __future__ import annotations

import math

import torch

from models.kernels import linear_rnn_backends as lrb

TWO_PI = 2 * math.pi
BACKENDS = ("auto", "torch", "cpu", "fla", "ref")

Mamba3OpState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Turn pairs (x[2i], x[2i+1]) by theta[i]: x (..., N), theta (..., R), 2R <= N -> (..., N).
    Channels past 2R are unchanged (mamba-ssm's rope_fraction < 1)."""
    R = theta.shape[-1]
    if R == 0:
        return x
    if 2 * R > x.shape[-1]:
        raise ValueError(f"rotate: {R} angles need 2*{R} channels, x has {x.shape[-1]}")
    head, tail = x[..., : 2 * R], x[..., 2 * R:]
    a, b = head.unflatten(-1, (R, 2)).unbind(-1)
    c, s = torch.cos(theta), torch.sin(theta)
    turned = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    return torch.cat((turned, tail), dim=-1)


def _check(q, k, v, adt, dt, lam, omega, initial_state):
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"mamba3: q and k must be (batch, L, heads, N) alike, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    b, L, h, N = q.shape
    if v.dim() != 4 or v.shape[:3] != (b, L, h):
        raise ValueError(f"mamba3: v must be (batch, L, heads, P) = ({b}, {L}, {h}, P), got "
                         f"{tuple(v.shape)}")
    for name, t in (("adt", adt), ("dt", dt), ("lam", lam)):
        if t.shape != (b, L, h):
            raise ValueError(f"mamba3: {name} must be (batch, L, heads) = ({b}, {L}, {h}), "
                             f"got {tuple(t.shape)}")
    if omega is not None and (omega.shape[:3] != (b, L, h) or 2 * omega.shape[3] > N):
        raise ValueError(f"mamba3: omega must be (batch, L, heads, R) with 2R <= N = {N}, got "
                         f"{tuple(omega.shape)}")
    if initial_state is not None and len(initial_state) != 4:
        raise ValueError("mamba3: initial_state is (theta, S, kr_prev, v_prev)")


def _state0(q, v, omega, initial_state, dtype) -> Mamba3OpState:
    b, _, h, N = q.shape
    P, R = v.shape[-1], 0 if omega is None else omega.shape[-1]
    if initial_state is None:
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=q.device)  # noqa: E731
        return z(b, h, R), z(b, h, N, P), z(b, h, N), z(b, h, P)
    return tuple(t.to(dtype) for t in initial_state)  # type: ignore[return-value]


def _dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def angles(omega: torch.Tensor, dt: torch.Tensor, theta0: torch.Tensor) -> torch.Tensor:
    """theta_t = (theta0 + sum_{s<=t} omega_s dt_s) mod 2 pi: omega (b, L, h, R), dt (b, L, h),
    theta0 (b, h, R) -> (b, L, h, R). The mod has zero gradient, as mamba-ssm's floor."""
    th = theta0[:, None] + torch.cumsum(omega * dt[..., None], dim=1)
    return th - TWO_PI * torch.floor(th / TWO_PI).detach()


def mamba3_ref(q, k, v, adt, dt, lam, omega=None, initial_state=None,
               output_final_state=False):
    """The recurrence one step at a time (the oracle). Returns (o (b, L, h, P), final
    state (theta, S, kr_prev, v_prev) or None); computes in >= float32."""
    _check(q, k, v, adt, dt, lam, omega, initial_state)
    dtype = _dtype(v)
    q, k, v, adt, dt, lam = (t.to(dtype) for t in (q, k, v, adt, dt, lam))
    omega = None if omega is None else omega.to(dtype)
    theta, S, k_prev, v_prev = _state0(q, v, omega, initial_state, dtype)
    outs = []
    for t in range(q.shape[1]):
        if omega is not None:
            theta = theta + omega[:, t] * dt[:, t, :, None]
            theta = theta - TWO_PI * torch.floor(theta / TWO_PI).detach()
        qr, kr = rotate(q[:, t], theta), rotate(k[:, t], theta)
        alpha = torch.exp(adt[:, t])[..., None, None]
        beta = (1 - lam[:, t]) * dt[:, t]                  # weight of the previous input
        gamma = lam[:, t] * dt[:, t]                       # weight of the current input
        S = (alpha * (S + beta[..., None, None] * k_prev[..., :, None] * v_prev[..., None, :])
             + gamma[..., None, None] * kr[..., :, None] * v[:, t, :, None, :])
        outs.append(torch.einsum("bhn,bhnp->bhp", qr, S))
        k_prev, v_prev = kr, v[:, t]
    o = torch.stack(outs, dim=1)
    return o, ((theta, S, k_prev, v_prev) if output_final_state else None)


def mamba3(q, k, v, adt, dt, lam, omega=None, initial_state=None, output_final_state=False,
           backend="auto", chunk_size=None):
    """The chunked form (module doc): one ``simple_gla`` call of backend ``backend``
    ("auto", "torch", "cpu", "fla"; "ref" runs :func:`mamba3_ref`). Same returns as the ref."""
    if backend not in BACKENDS:
        raise lrb.BackendError(f"mamba3: backend {backend!r} unknown; expected one of "
                               f"{', '.join(BACKENDS)}")
    if backend == "ref":
        return mamba3_ref(q, k, v, adt, dt, lam, omega, initial_state, output_final_state)
    _check(q, k, v, adt, dt, lam, omega, initial_state)
    dtype = _dtype(v)
    q, k, v, adt, dt, lam = (t.to(dtype) for t in (q, k, v, adt, dt, lam))
    omega = None if omega is None else omega.to(dtype)
    theta0, S0, k0, v0 = _state0(q, v, omega, initial_state, dtype)
    if omega is not None:
        theta = angles(omega, dt, theta0)
        q, k = rotate(q, theta), rotate(k, theta)
    mu = (1 - lam) * dt                                    # (b, L, h)
    mu_next = torch.cat((mu[:, 1:], torch.zeros_like(mu[:, :1])), dim=1)
    coef = lam * dt + mu_next
    S0 = S0 + mu[:, 0, :, None, None] * k0[..., :, None] * v0[..., None, :]
    op, resolved = lrb.get_op("simple_gla", backend, v.device.type)
    kwargs = {"chunk_size": chunk_size} if chunk_size is not None and resolved == "torch" else {}
    o, S = op(q, k * coef[..., None], v, adt, scale=1.0, initial_state=S0,
              output_final_state=output_final_state, **kwargs)
    o = o.to(dtype) - (mu_next * (q * k).sum(-1))[..., None] * v
    if not output_final_state:
        return o, None
    theta_L = theta[:, -1] if omega is not None else theta0
    return o, (theta_L, S.to(dtype), k[:, -1], v[:, -1])


# -- MIMO ------------------------------------------------------------------------------------
# Rank-r inputs and outputs (the paper's MIMO; state-spaces/mamba
# tests/ops/tilelang/test_mamba3_mimo.py ``mamba3_MIMO_step_ref``): each step writes r outer
# products into the same state and reads it with r queries,
#     S_t = alpha_t S_{t-1} + (1 - lam_t) dt_t alpha_t sum_r kr_{t-1,r} v_{t-1,r}^T
#           + lam_t dt_t sum_r kr_{t,r} v_{t,r}^T,          o_{t,r} = S_t^T qr_{t,r}.
# Shapes: q, k (b, L, r, h, N); v (b, L, r, h, P) (x already up-projected per rank);
# adt, dt, lam (b, L, h); omega (b, L, h, R) or None. State (theta (b, h, R), S (b, h, N, P),
# kr_prev (b, r, h, N), v_prev (b, r, h, P)). The rotation is the SISO one (pairs (2i, 2i+1)),
# as that reference's; the TileLang kernel pairs i with i + N/2, a fixed permutation of the
# state's channels (the same model up to how B and C's projections are laid out).

def _check_mimo(q, k, v, adt, dt, lam, omega):
    if q.dim() != 5 or k.shape != q.shape or v.dim() != 5 or v.shape[:4] != q.shape[:4]:
        raise ValueError(f"mamba3_mimo: q, k (batch, L, rank, heads, N) and v (batch, L, rank, "
                         f"heads, P), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, L, _, h, N = q.shape
    for name, t in (("adt", adt), ("dt", dt), ("lam", lam)):
        if t.shape != (b, L, h):
            raise ValueError(f"mamba3_mimo: {name} must be ({b}, {L}, {h}), got {tuple(t.shape)}")
    if omega is not None and (omega.shape[:3] != (b, L, h) or 2 * omega.shape[3] > N):
        raise ValueError(f"mamba3_mimo: omega must be (batch, L, heads, R), 2R <= {N}")


def _mimo_state0(q, v, omega, initial_state, dtype):
    b, _, r, h, N = q.shape
    P, R = v.shape[-1], 0 if omega is None else omega.shape[-1]
    if initial_state is None:
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=q.device)  # noqa: E731
        return z(b, h, R), z(b, h, N, P), z(b, r, h, N), z(b, r, h, P)
    return tuple(t.to(dtype) for t in initial_state)


def mamba3_mimo_ref(q, k, v, adt, dt, lam, omega=None, initial_state=None,
                    output_final_state=False):
    """The MIMO recurrence one step at a time. Returns (o (b, L, r, h, P), state or None)."""
    _check_mimo(q, k, v, adt, dt, lam, omega)
    dtype = _dtype(v)
    q, k, v, adt, dt, lam = (t.to(dtype) for t in (q, k, v, adt, dt, lam))
    omega = None if omega is None else omega.to(dtype)
    theta, S, k_prev, v_prev = _mimo_state0(q, v, omega, initial_state, dtype)
    outs = []
    for t in range(q.shape[1]):
        if omega is not None:
            theta = theta + omega[:, t] * dt[:, t, :, None]
            theta = theta - TWO_PI * torch.floor(theta / TWO_PI).detach()
        qr, kr = rotate(q[:, t], theta[:, None]), rotate(k[:, t], theta[:, None])
        alpha = torch.exp(adt[:, t])[..., None, None]
        beta, gamma = (1 - lam[:, t]) * dt[:, t], lam[:, t] * dt[:, t]
        prev = torch.einsum("brhn,brhp->bhnp", k_prev, v_prev)
        cur = torch.einsum("brhn,brhp->bhnp", kr, v[:, t])
        S = alpha * (S + beta[..., None, None] * prev) + gamma[..., None, None] * cur
        outs.append(torch.einsum("brhn,bhnp->brhp", qr, S))
        k_prev, v_prev = kr, v[:, t]
    o = torch.stack(outs, dim=1)
    return o, ((theta, S, k_prev, v_prev) if output_final_state else None)


def mamba3_mimo(q, k, v, adt, dt, lam, omega=None, initial_state=None,
                output_final_state=False, chunk_size=64):
    """The MIMO recurrence chunked (PyTorch): per chunk of C steps, the r keys of every step
    and the r queries of every step meet in one (C r) x (C r) masked, decayed score matrix
    (a key is seen by every query of its own step and later ones), plus the carried state;
    the trapezoid is folded in as in :func:`mamba3`. Same returns as the ref."""
    _check_mimo(q, k, v, adt, dt, lam, omega)
    dtype = _dtype(v)
    q, k, v, adt, dt, lam = (t.to(dtype) for t in (q, k, v, adt, dt, lam))
    omega = None if omega is None else omega.to(dtype)
    theta0, S, k0, v0 = _mimo_state0(q, v, omega, initial_state, dtype)
    b, L, r, h, N = q.shape
    if omega is not None:
        theta = angles(omega, dt, theta0)                   # (b, L, h, R)
        q, k = rotate(q, theta[:, :, None]), rotate(k, theta[:, :, None])
    mu = (1 - lam) * dt
    mu_next = torch.cat((mu[:, 1:], torch.zeros_like(mu[:, :1])), dim=1)
    kc = k * (lam * dt + mu_next)[:, :, None, :, None]
    S = S + mu[:, 0, :, None, None] * torch.einsum("brhn,brhp->bhnp", k0, v0)
    C = max(1, min(chunk_size, L))
    outs = []
    for c0 in range(0, L, C):
        sl = slice(c0, min(c0 + C, L))
        qi, ki, vi, gi = q[:, sl], kc[:, sl], v[:, sl], torch.cumsum(adt[:, sl], dim=1)  # gi (b, T, h)
        T = qi.shape[1]
        # decay from step s to step t (s <= t), per head: (b, h, T, T)
        diff = gi.transpose(1, 2)[..., :, None] - gi.transpose(1, 2)[..., None, :]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        dec = torch.exp(diff.masked_fill(~mask, -math.inf))
        scores = torch.einsum("btrhn,bsuhn->bhtrsu", qi, ki) * dec[:, :, :, None, :, None]
        o = torch.einsum("bhtrsu,bsuhp->btrhp", scores, vi)
        o = o + torch.einsum("btrhn,bhnp->btrhp", qi, S) * torch.exp(gi)[:, :, None, :, None]
        outs.append(o)
        tail = torch.exp(gi[:, -1:] - gi)                  # (b, T, h): decay to the chunk's end
        S = (torch.exp(gi[:, -1])[..., None, None] * S
             + torch.einsum("bsuhn,bsh,bsuhp->bhnp", ki, tail, vi))
    o = torch.cat(outs, dim=1)
    # the SSD's running state held mu_{t+1} kr_t v_t^T of the next step already: remove it
    diag = torch.einsum("btrhn,btuhn->btrhu", q, k)         # (b, L, r, h, r)
    o = o - mu_next[:, :, None, :, None] * torch.einsum("btrhu,btuhp->btrhp", diag, v)
    if not output_final_state:
        return o, None
    theta_L = theta[:, -1] if omega is not None else theta0
    return o, (theta_L, S, k[:, -1], v[:, -1])


# -- for bench --ops -------------------------------------------------------------------------
OPS = ("mamba3", "mamba3_mimo")
BENCH_MIMO_RANK = 4


def get_op(name: str, backend: str, device_type: str = "cpu"):
    """(fn, resolved backend) for ``name`` in OPS: fn(*make_inputs(...)[0], initial_state=,
    output_final_state=) -> (o, state). MIMO runs its PyTorch chunked form for any backend
    but ``ref``."""
    if name not in OPS:
        raise KeyError(f"unknown Mamba-3 op {name!r}; known: {', '.join(OPS)}")
    if backend == "ref":
        return (mamba3_ref if name == "mamba3" else mamba3_mimo_ref), "ref"
    if name == "mamba3_mimo":
        return mamba3_mimo, "torch"
    resolved = lrb.resolve(backend, device_type)
    return (lambda *a, **kw: mamba3(*a, backend=resolved, **kw)), resolved


def make_inputs(name: str, batch: int, L: int, heads: int, dim: int, dtype=torch.float32,
                seed: int = 0, device="cpu", rank: int = BENCH_MIMO_RANK):
    """Random (args, initial_state) for op ``name``, all leaves requiring grad: q, k, v
    (batch, L, heads, dim), MIMO with a rank axis after L; adt = -a dt with a in (0, 1),
    dt in (0.01, 0.1), lam in (0, 1), dim / 4 angle rates (rope_fraction 0.5) in (-pi, pi)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=g, dtype=dtype)  # noqa: E731
    lead = (batch, L, rank) if name == "mamba3_mimo" else (batch, L)
    R = max(1, dim // 4)
    dt = 0.01 + 0.09 * u(batch, L, heads)
    args = [r(*lead, heads, dim), r(*lead, heads, dim), r(*lead, heads, dim), -u(batch, L, heads) * dt,
            dt, u(batch, L, heads), (u(batch, L, heads, R) * 2 - 1) * math.pi]
    pre = (batch, rank) if name == "mamba3_mimo" else (batch,)
    state = [u(batch, heads, R), r(batch, heads, dim, dim), r(*pre, heads, dim), r(*pre, heads, dim)]
    to = lambda t: t.to(device).requires_grad_()  # noqa: E731
    return [to(t) for t in args], tuple(to(t) for t in state)
