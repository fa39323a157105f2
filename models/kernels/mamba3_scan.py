"""The Mamba-3 recurrence, SISO and MIMO (Lahoti, Li, Chen, Wang, Bick, Kolter, Dao, Gu,
"Mamba-3: Improved Sequence Modeling using State Space Principles", ICLR 2026): step-by-step
oracles :func:`mamba3_ref` / :func:`mamba3_mimo_ref` and chunked forms :func:`mamba3` /
:func:`mamba3_mimo`, each one call of the workbench's SSD (``simple_gla``: C kernel, chunked
PyTorch or fla). Written from the paper and from the step references in state-spaces/mamba
``tests/ops/triton/test_mamba3_siso.py`` (``mamba3_siso_step_ref``) and
``tests/ops/tilelang/test_mamba3_mimo.py`` (``mamba3_MIMO_step_ref``); no code copied.

SISO shapes (one head count for q, k and v; the mixer broadcasts B/C groups to heads):
    q, k   (batch, L, heads, N)   C and B (biases already added, not yet rotated)
    v      (batch, L, heads, P)   x
    adt    (batch, L, heads)      log decay A_t dt_t (<= 0)
    dt     (batch, L, heads)      step size dt_t (> 0)
    lam    (batch, L, heads)      trapezoid weight lambda_t in [0, 1] (sigmoid of trap)
    omega  (batch, L, heads, R) or None, R <= N / 2: rotation rates (tanh(angle) * pi)
MIMO (rank r) puts a rank axis after L: q, k (batch, L, r, heads, N), v (batch, L, r,
heads, P) (x already up-projected per rank); adt, dt, lam and omega as SISO.

Per head, with theta_t = theta_{t-1} + omega_t dt_t (mod 2 pi), kr_t = rot(k_t, theta_t),
qr_t = rot(q_t, theta_t) (pairs (2i, 2i+1) of the state turned by theta_t[i], i < R, the
rest unchanged: the complex state written as data-dependent rotary embeddings), and
alpha_t = exp(adt_t):

    S_t = alpha_t S_{t-1} + (1 - lam_t) dt_t alpha_t sum_j kr_{t-1,j} v_{t-1,j}^T
          + lam_t dt_t sum_j kr_{t,j} v_{t,j}^T,              o_{t,i} = S_t^T qr_{t,i}

(exponential-trapezoidal rule; SISO is rank 1; lam = 1 is Mamba-2's Euler step.) The state
carried across calls is (theta (b, h, R), S (b, h, N, P), kr_prev, v_prev): the trapezoid
needs the previous rotated B and x, (b, h, N) and (b, h, P) for SISO, (b, r, h, N) and
(b, r, h, P) for MIMO. mamba-ssm keeps S as (b, h, P, N); here it is the SSD's (N, P).
MIMO's rotation is the SISO one (pairs (2i, 2i+1)), as mamba-ssm's step reference; its
TileLang kernel pairs i with i + N/2, a fixed permutation of the state's channels.

On a CPU, MIMO's backend ``cpu`` (``auto``'s choice there) is a fused C kernel instead
(:mod:`models.kernels.mamba3_mimo_cpu`: rotation, rank-r update, readouts and the r x r term
per step, backward by hand); the form below is its fallback and the ``torch`` backend.

Chunked form (one SSD call): with mu_t = (1 - lam_t) dt_t, the trapezoid's previous-step
term folds into the current keys, k'_{t,j} = (lam_t dt_t + mu_{t+1}) kr_{t,j}
(mu_{L+1} := 0), the first step's term into the initial state, S'_0 = S_0 + mu_1 sum_j
kr_{0,j} v_{0,j}^T; the SSD's running state is then S_t + mu_{t+1} sum_j kr_{t,j} v_{t,j}^T,
which at t = L is S_L. The r ranks of a step are r positions of the SSD's sequence (length
L r; the decay alpha_t on the first, 1 on the others), so the query (t, i) has seen the keys
(t, j <= i) of its own step. One correction per step, an r x r product, adds the keys
j > i and removes the next step's term:
    o_{t,i} = SSD_{t,i} + sum_j ((lam_t dt_t + mu_{t+1}) [j > i] - mu_{t+1})
                          (qr_{t,i} . kr_{t,j}) v_{t,j}.
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


def _broadcast(a: tuple, b: tuple) -> torch.Size:
    """The broadcast of two shapes (torch.broadcast_shapes' rule; that function imports
    torch's symbolic shapes and sympy on first use, most of a second of a cold process)."""
    n = max(len(a), len(b))
    out = []
    for x, y in zip((1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)):
        if x != y and 1 not in (x, y):
            raise RuntimeError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return torch.Size(out)


def _turn(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """rotate() with cos and sin given, written into one new tensor (no stack or cat)."""
    R = c.shape[-1]
    out = torch.empty(_broadcast(x.shape[:-1], c.shape[:-1]) + x.shape[-1:],
                      dtype=x.dtype, device=x.device)
    out[..., 2 * R:] = x[..., 2 * R:]
    a, b = x[..., 0:2 * R:2], x[..., 1:2 * R:2]
    ya, yb = out[..., 0:2 * R:2], out[..., 1:2 * R:2]
    torch.mul(a, c, out=ya)
    ya.addcmul_(b, s, value=-1)
    torch.mul(a, s, out=yb)
    yb.addcmul_(b, c)
    return out


class _Rotate(torch.autograd.Function):
    """rotate(x, theta) with a hand-written backward, for the chunked forms: x's gradient is
    the gradient turned back (-theta), theta's is sum(dy_b y_a - dy_a y_b) over each pair.
    Autograd through :func:`rotate` makes about five times the passes over x (slices, stack,
    cat and their backwards), which at MIMO's sizes is a large part of the chunked form."""

    @staticmethod
    def forward(ctx, x, theta):
        c, s = torch.cos(theta), torch.sin(theta)
        y = _turn(x, c, s)
        ctx.save_for_backward(y, c, s)
        ctx.theta_shape = theta.shape
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        y, c, s = ctx.saved_tensors
        R = c.shape[-1]
        dx = _turn(dy, c, -s)
        dtheta = (dy[..., 1:2 * R:2] * y[..., 0:2 * R:2]
                  - dy[..., 0:2 * R:2] * y[..., 1:2 * R:2]).sum_to_size(ctx.theta_shape)
        return dx, dtheta


def rotate_fast(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """:func:`rotate` (same arguments and result) with the hand-written backward of _Rotate;
    once differentiable."""
    if theta.shape[-1] == 0:
        return x
    if 2 * theta.shape[-1] > x.shape[-1]:
        raise ValueError(f"rotate: {theta.shape[-1]} angles need 2*{theta.shape[-1]} channels, "
                         f"x has {x.shape[-1]}")
    return _Rotate.apply(x, theta)


def _rotate_pair(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor,
                 coef: torch.Tensor | None = None, bias: tuple | None = None):
    """(rotate_fast(q, theta), rotate_fast(k, theta), kc, qk); on a CPU in float32 / float64
    with theta of q's leading shape (SISO) all in one C call (:mod:`models.kernels.rotate_cpu`:
    cos and sin once, one pass per direction), which with ``coef`` (q's leading shape) also
    gives kc = k coef[..., None] and qk = (q * k).sum(-1) of the rotated pair; else kc and
    qk are None (the caller forms them). ``bias`` (q_bias, k_bias), each (heads, N): q and
    k (..., heads, N) are q + q_bias, k + k_bias (the C call reads q and k broadcast over
    their heads in place and adds the bias on the way)."""
    from models.kernels import rotate_cpu

    if rotate_cpu.applies(q, k, theta) and (coef is None or coef.shape == q.shape[:-1]):
        if bias is not None:
            out = rotate_cpu.RotatePairFn.apply(q, k, theta, None if coef is None else
                                                coef.to(q.dtype), *(t.to(q.dtype) for t in bias))
            return out if coef is not None else (*out, None, None)
        if coef is None:
            return (*rotate_cpu.RotatePairFn.apply(q, k, theta), None, None)
        return rotate_cpu.RotatePairFn.apply(q, k, theta, coef.to(q.dtype))
    if bias is not None:
        q, k = _add_bias(q, k, bias)
    return rotate_fast(q, theta), rotate_fast(k, theta), None, None


def _add_bias(q, k, bias):
    """(q + q_bias, k + k_bias), or (q, k) where bias is None."""
    if bias is None:
        return q, k
    return q + bias[0].to(q.dtype), k + bias[1].to(k.dtype)


def angles(omega: torch.Tensor, dt: torch.Tensor, theta0: torch.Tensor) -> torch.Tensor:
    """theta_t = (theta0 + sum_{s<=t} omega_s dt_s) mod 2 pi: omega (b, L, h, R), dt (b, L, h),
    theta0 (b, h, R) -> (b, L, h, R). The mod has zero gradient, as mamba-ssm's floor.
    On a CPU in float32 / float64 one C pass each way (``rotate_cpu.AnglesFn``; this torch
    form is its twin and the other devices')"""
    from models.kernels import rotate_cpu

    if rotate_cpu.angles_apply(omega, dt, theta0):
        return rotate_cpu.AnglesFn.apply(omega, dt, theta0)
    th = theta0[:, None] + torch.cumsum(omega * dt[..., None], dim=1)
    return th - TWO_PI * torch.floor(th / TWO_PI).detach()


def _check(q, k, v, adt, dt, lam, omega, initial_state, rank: bool):
    """Shapes of the SISO (rank=False) or MIMO (rank=True) arguments; one-line errors."""
    name, lead = ("mamba3_mimo", "batch, L, rank, heads") if rank else ("mamba3", "batch, L, heads")
    nd = 5 if rank else 4
    if q.dim() != nd or k.shape != q.shape or v.dim() != nd or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"{name}: q, k ({lead}, N) and v ({lead}, P), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, L, h, N = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
    for arg, t in (("adt", adt), ("dt", dt), ("lam", lam)):
        if t.shape != (b, L, h):
            raise ValueError(f"{name}: {arg} must be (batch, L, heads) = ({b}, {L}, {h}), "
                             f"got {tuple(t.shape)}")
    if omega is not None and (omega.shape[:3] != (b, L, h) or 2 * omega.shape[3] > N):
        raise ValueError(f"{name}: omega must be (batch, L, heads, R) with 2R <= N = {N}, got "
                         f"{tuple(omega.shape)}")
    if initial_state is not None and len(initial_state) != 4:
        raise ValueError(f"{name}: initial_state is (theta, S, kr_prev, v_prev)")


def _dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _prepare(q, k, v, adt, dt, lam, omega, initial_state):
    """Inputs in the compute dtype (>= float32) and the initial state (zeros if None) in the
    rank layout: q, k, v (b, L, r, h, .); state (theta, S, kr_prev (b, r, h, N), v_prev)."""
    dtype = _dtype(v)
    q, k, v, adt, dt, lam = (t.to(dtype) for t in (q, k, v, adt, dt, lam))
    omega = None if omega is None else omega.to(dtype)
    b, _, r, h, N = q.shape
    P, R = v.shape[-1], 0 if omega is None else omega.shape[-1]
    if initial_state is None:
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=q.device)  # noqa: E731
        state = (z(b, h, R), z(b, h, N, P), z(b, r, h, N), z(b, r, h, P))
    else:
        state = tuple(t.to(dtype) for t in initial_state)
    return (q, k, v, adt, dt, lam, omega), state


def _steps(q, k, v, adt, dt, lam, omega, state):
    """The recurrence one step at a time, rank layout (module doc). Returns (o (b, L, r, h, P),
    final state)."""
    theta, S, k_prev, v_prev = state
    outer = lambda a, c: torch.einsum("brhn,brhp->bhnp", a, c)  # noqa: E731  sum_j k_j v_j^T
    prev = outer(k_prev, v_prev)
    # unbind, not x[:, t]: each x[:, t]'s backward writes a zero gradient as long as x, which
    # makes the backward quadratic in L (minutes at L = 4096)
    xs = [x.unbind(1) for x in (q, k, v, adt, dt, lam)]
    xs.append(omega.unbind(1) if omega is not None else [None] * q.shape[1])
    outs = []
    for q_t, k_t, v_t, adt_t, dt_t, lam_t, omega_t in zip(*xs):
        if omega_t is not None:
            theta = theta + omega_t * dt_t[..., None]
            theta = theta - TWO_PI * torch.floor(theta / TWO_PI).detach()
        qr, kr = rotate(q_t, theta[:, None]), rotate(k_t, theta[:, None])
        alpha = torch.exp(adt_t)[..., None, None]
        beta = ((1 - lam_t) * dt_t)[..., None, None]       # weight of the previous inputs
        gamma = (lam_t * dt_t)[..., None, None]            # weight of the current inputs
        cur = outer(kr, v_t)
        S = alpha * (S + beta * prev) + gamma * cur
        outs.append(torch.einsum("brhn,bhnp->brhp", qr, S))
        prev, k_prev, v_prev = cur, kr, v_t
    return torch.stack(outs, dim=1), (theta, S, k_prev, v_prev)


def _chunked(q, k, v, adt, dt, lam, omega, state, output_final_state, backend, chunk_size,
             bias=None, scan_tape=None):
    """One SSD call over the L r positions, then the per-step r x r correction (module doc).
    Rank layout; same returns as :func:`_steps` (state None unless output_final_state).
    ``scan_tape`` (a list; SISO, the C scan, final state asked): the SSD call through
    ``linear_rnn_cpu.simple_gla_taped``, for a caller that runs this twice, without and then
    with autograd (a segment recompute): the second run reuses the first's checkpoints."""
    theta0, S0, k0, v0 = state
    b, L, r, h, N = q.shape
    dtype = v.dtype
    mu = (1 - lam) * dt                                    # (b, L, h)
    mu_next = torch.cat((mu[:, 1:], torch.zeros_like(mu[:, :1])), dim=1)
    coef = lam * dt + mu_next
    kc = qk = None               # k coef and SISO's q . k, from the C rotation where it runs
    if omega is not None:
        theta = angles(omega, dt, theta0)                   # (b, L, h, R)
        q, k, kc, qk = _rotate_pair(q, k, theta[:, :, None], coef[:, :, None] if r == 1 else None,
                                    bias)
    else:
        q, k = _add_bias(q, k, bias)
    if kc is None:
        kc = k * coef[:, :, None, :, None]
    S0 = S0 + mu[:, 0, :, None, None] * torch.einsum("brhn,brhp->bhnp", k0, v0)
    # the decay once per step, on its first rank's position
    g = torch.cat((adt[:, :, None], adt.new_zeros(b, L, r - 1, h)), dim=2)
    op, resolved = lrb.get_op("simple_gla", backend, v.device.type)
    kwargs = {"chunk_size": chunk_size} if chunk_size is not None and resolved == "torch" else {}
    if scan_tape is not None and resolved == "cpu" and r == 1 and output_final_state:
        from models.kernels import linear_rnn_cpu

        o, S = linear_rnn_cpu.simple_gla_taped(q.flatten(1, 2), kc.flatten(1, 2),
                                               v.flatten(1, 2), g.flatten(1, 2), 1.0, S0,
                                               scan_tape)
    else:
        o, S = op(q.flatten(1, 2), kc.flatten(1, 2), v.flatten(1, 2),
                  g.flatten(1, 2), scale=1.0, initial_state=S0,
                  output_final_state=output_final_state, **kwargs)
    later = torch.ones(r, r, dtype=dtype, device=q.device).triu(1)   # [j > i]
    w = (coef[:, :, None, :, None] * later[:, None, :]
         - mu_next[:, :, None, :, None])                   # (b, L, r_i, h, r_j)
    o = o.to(dtype).unflatten(1, (L, r))
    if r == 1:      # SISO: elementwise (einsum would run a batched 1 x 1 matmul, slower)
        o = o + (((q * k).sum(-1) if qk is None else qk)[..., None] * w) * v
    else:
        scores = torch.einsum("btihn,btjhn->btihj", q, k) * w
        o = o + torch.einsum("btihj,btjhp->btihp", scores, v)
    if not output_final_state:
        return o, None
    theta_L = theta[:, -1] if omega is not None else theta0
    return o, (theta_L, S.to(dtype), k[:, -1], v[:, -1])


def _fused(q, k, v, adt, dt, lam, omega, state, output_final_state, chunk_size):
    """MIMO through the fused C kernel (:mod:`models.kernels.mamba3_mimo_cpu`): the angles and
    the trapezoid's coefficients here (autograd), the rotation, recurrence, readout and the
    r x r term in C. Rank layout; same returns as :func:`_chunked`."""
    from models.kernels import mamba3_mimo_cpu

    theta0, S0, k0, v0 = state
    b, L, r, h, N = q.shape
    # (b, L, h, R); R = 0 without rotation (the kernel then turns nothing)
    theta = angles(omega, dt, theta0) if omega is not None else q.new_zeros(b, L, h, 0)
    mu = (1 - lam) * dt
    mu_next = torch.cat((mu[:, 1:], torch.zeros_like(mu[:, :1])), dim=1)
    U0 = S0 + mu[:, 0, :, None, None] * torch.einsum("brhn,brhp->bhnp", k0, v0)
    o, S = mamba3_mimo_cpu.mamba3_mimo_scan(q, k, v, adt, lam * dt + mu_next, mu_next, U0,
                                            theta, chunk_size)
    if not output_final_state:
        return o, None
    if omega is None:
        return o, (theta0, S, k[:, -1], v[:, -1])
    return o, (theta[:, -1], S, rotate(k[:, -1], theta[:, -1, None]), v[:, -1])


def _siso(fn, q, k, v, adt, dt, lam, omega, initial_state, *rest):
    """Run the rank-layout ``fn`` on SISO arguments as rank 1; SISO outputs and state."""
    _check(q, k, v, adt, dt, lam, omega, initial_state, rank=False)
    if initial_state is not None:
        th, S, kp, vp = initial_state
        initial_state = (th, S, kp[:, None], vp[:, None])
    args, state = _prepare(q[:, :, None], k[:, :, None], v[:, :, None], adt, dt, lam, omega,
                           initial_state)
    o, fin = fn(*args, state, *rest)
    return o[:, :, 0], (None if fin is None else (fin[0], fin[1], fin[2][:, 0], fin[3][:, 0]))


def _mimo(fn, q, k, v, adt, dt, lam, omega, initial_state, *rest):
    _check(q, k, v, adt, dt, lam, omega, initial_state, rank=True)
    args, state = _prepare(q, k, v, adt, dt, lam, omega, initial_state)
    return fn(*args, state, *rest)


def _check_backend(name, backend):
    if backend not in BACKENDS:
        raise lrb.BackendError(f"{name}: backend {backend!r} unknown; expected one of "
                               f"{', '.join(BACKENDS)}")


def mamba3_ref(q, k, v, adt, dt, lam, omega=None, initial_state=None,
               output_final_state=False):
    """The SISO recurrence one step at a time (the oracle). Returns (o (b, L, h, P), final
    state (theta, S, kr_prev, v_prev) or None); computes in >= float32."""
    o, fin = _siso(_steps, q, k, v, adt, dt, lam, omega, initial_state)
    return o, (fin if output_final_state else None)


def mamba3(q, k, v, adt, dt, lam, omega=None, initial_state=None, output_final_state=False,
           backend="auto", chunk_size=None, qk_bias=None, scan_tape=None):
    """SISO, chunked (module doc): one ``simple_gla`` call of backend ``backend`` ("auto",
    "torch", "cpu", "fla"; "ref" runs :func:`mamba3_ref`). Same returns as the ref.
    ``qk_bias`` (q_bias, k_bias), each (heads, N): the scan runs on q + q_bias, k + k_bias
    (q and k may be broadcast over heads; on a CPU the rotation's C call adds them).
    ``scan_tape``: see :func:`_chunked` (Mamba-3's segment recompute passes one)."""
    _check_backend("mamba3", backend)
    if backend == "ref":
        q, k = _add_bias(q, k, qk_bias)
        return mamba3_ref(q, k, v, adt, dt, lam, omega, initial_state, output_final_state)
    return _siso(_chunked, q, k, v, adt, dt, lam, omega, initial_state, output_final_state,
                 backend, chunk_size, qk_bias, scan_tape)


def mamba3_mimo_ref(q, k, v, adt, dt, lam, omega=None, initial_state=None,
                    output_final_state=False):
    """The MIMO recurrence one step at a time. Returns (o (b, L, r, h, P), final state
    (theta, S, kr_prev (b, r, h, N), v_prev (b, r, h, P)) or None)."""
    o, fin = _mimo(_steps, q, k, v, adt, dt, lam, omega, initial_state)
    return o, (fin if output_final_state else None)


def mamba3_mimo(q, k, v, adt, dt, lam, omega=None, initial_state=None,
                output_final_state=False, backend="auto", chunk_size=None):
    """MIMO, chunked: one ``simple_gla`` call over the L r positions (module doc), backends as
    :func:`mamba3`; ``chunk_size`` counts those positions (torch backend only). Backend
    ``cpu`` (and ``auto`` on a CPU) runs the fused C kernel of
    :mod:`models.kernels.mamba3_mimo_cpu` when it builds (``chunk_size``: steps between its
    stored states), else this SSD form. Same returns as the ref."""
    _check_backend("mamba3_mimo", backend)
    if backend == "ref":
        return mamba3_mimo_ref(q, k, v, adt, dt, lam, omega, initial_state, output_final_state)
    if backend in ("auto", "cpu") and lrb.resolve(backend, v.device.type) == "cpu":
        from models.kernels import mamba3_mimo_cpu

        # else the SSD form below (also for an odd state size: the kernel turns pairs)
        if mamba3_mimo_cpu.load()[0] is not None and q.shape[-1] % 2 == 0:
            return _mimo(_fused, q, k, v, adt, dt, lam, omega, initial_state,
                         output_final_state, chunk_size)
    return _mimo(_chunked, q, k, v, adt, dt, lam, omega, initial_state, output_final_state,
                 backend, chunk_size)


# -- for bench --ops -------------------------------------------------------------------------
OPS = ("mamba3", "mamba3_mimo")
BENCH_MIMO_RANK = 4


def get_op(name: str, backend: str, device_type: str = "cpu"):
    """(fn, resolved backend) for ``name`` in OPS: fn(*make_inputs(...)[0], initial_state=,
    output_final_state=) -> (o, state); both run on the SSD of ``backend`` but ``ref``."""
    if name not in OPS:
        raise KeyError(f"unknown Mamba-3 op {name!r}; known: {', '.join(OPS)}")
    if backend == "ref":
        return (mamba3_ref if name == "mamba3" else mamba3_mimo_ref), "ref"
    resolved = lrb.resolve(backend, device_type)
    fn = mamba3 if name == "mamba3" else mamba3_mimo
    return (lambda *a, **kw: fn(*a, backend=resolved, **kw)), resolved


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
