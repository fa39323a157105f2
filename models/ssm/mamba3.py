"""The Mamba-3 mixer, SISO (Lahoti, Li, Chen, Wang, Bick, Kolter, Dao, Gu, "Mamba-3:
Improved Sequence Modeling using State Space Principles", ICLR 2026), structured as
state-spaces/mamba's ``mamba_ssm/modules/mamba3.py`` ``Mamba3`` (written here from the paper
and that module's structure; no code copied). The recurrence: ``models.kernels.mamba3_scan``.

Mamba3(u), u: (batch, L, d_model), d_inner = expand * d_model, nheads = d_inner // headdim,
R = rotation angles (num_rope_angles = floor(d_state * rope_fraction / 2); 0 when
complex_state is False):

    z, x, B, C, dd_dt, dd_A, trap, angle = in_proj(u)   (no conv, unlike Mamba-2)
    B, C  = RMSNorm(B), RMSNorm(C) over d_state, per group; broadcast to heads; + B_bias, C_bias
    A     = -heavy_tail(dd_A) clamped to <= -A_floor     (data-dependent, per head and step)
    dt    = softplus(dd_dt + dt_bias);  lam = sigmoid(trap);  omega = tanh(angle) * pi
    y     = mamba3 scan(q=C, k=B, v=x, adt=A dt, dt, lam, omega) + D x
    y     = y * silu(z)   (or RMSNorm(y) * silu(z) per head when outproj_norm)
    out   = out_proj(y)

Parameter names and shapes follow mamba-ssm's Mamba3 (is_mimo=False): in_proj, dt_bias,
B_bias, C_bias (nheads, 1, d_state), B_norm.weight, C_norm.weight, D, norm.weight (with
outproj_norm), out_proj, and with mimo_rank > 1 (MIMO, is_mimo=True) B_bias, C_bias
(nheads, rank, d_state), mimo_x, mimo_z, mimo_o (nheads, rank, headdim); in_proj's output
order [z, x, B, C, dd_dt, dd_A, trap, angle], B and C laid out (rank, ngroups, d_state).
``complex_state=False`` (no angles: a real state) is the paper's ablation, not a mamba-ssm
option.

MIMO (mimo_rank r > 1): x_r = x * mimo_x[:, r] feeds r outer products per step into the one
state, r queries C_r read it; y_r = S^T C_r + D x_r, gated by silu(z * mimo_z[:, r]) (after
the per-head norm with outproj_norm), and y = sum_r y_r * mimo_o[:, r] (the paper's
rank-r inputs and outputs; mamba-ssm's ``mamba3_MIMO_step_ref``). It runs as
``mamba3_scan.mamba3_mimo`` (one SSD call over the L r rank positions, any backend but
mamba_ssm, or the ref); mamba-ssm's TileLang MIMO kernel is not wired in.

Backends: ``torch`` / ``cpu`` (the chunked scan on the workbench's SSD), ``ref`` (step by
step), ``mamba_ssm`` (mamba-ssm's Triton ``mamba3_siso_combined``, CUDA only, when it
imports) and ``auto`` (mamba_ssm on CUDA when it imports, else the SSD's auto choice).

Recurrent state: (theta (b, nheads, R), S (b, nheads, d_state, headdim), kr_prev (b,
nheads, d_state), x_prev (b, nheads, headdim)), float32 or float64; MIMO: kr_prev
(b, rank, nheads, d_state), x_prev (b, rank, nheads, headdim).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import recomputed
from models.kernels import gated_norm_cpu, mamba3_scan
from models.kernels import linear_rnn_backends as lrb
from models.kernels.segment_recompute import StatefulSegments

# steps per segment of the training forward's recomputed scan (Mamba3._mix_recomputed): at
# 2 x 2048, d_model 256 (quiet 2-core CPU) one layer's step took 232 ms at 512, 252 at 1024,
# 255 whole (the plain path: 291), and the 7-layer step's peak 609 MiB at 512, 697 at 1024
SEGMENT_LEN = 512
BIAS_APART = True   # False: SISO B, C get their per-head biases before the scan (A/B timings)
# The segment recompute's second run of the C scan reuses the checkpoints its first run
# stored (mamba3_scan._chunked's scan_tape; issue 43). False: it runs the scan's forward
# again (A/B timings, the tests' twin)
SCAN_TAPE = True

BACKENDS = ("auto", "torch", "cpu", "fla", "ref", "mamba_ssm")


@functools.lru_cache(maxsize=None)
def mamba_ssm_status() -> tuple[Callable | None, str]:
    """(mamba3_siso_combined or None, why). Any exception at import is 'unavailable'."""
    if not torch.cuda.is_available():
        return None, "no CUDA GPU (mamba-ssm's Mamba-3 kernels are Triton GPU kernels)"
    try:
        from mamba_ssm.ops.triton.mamba3.mamba3_siso_combined import mamba3_siso_combined
    except Exception as exc:
        return None, f"mamba_ssm Mamba-3 not importable ({type(exc).__name__}: {exc})".split("\n")[0]
    return mamba3_siso_combined, "mamba_ssm.ops.triton.mamba3.mamba3_siso_combined"


def resolve_backend(backend: str, device_type: str) -> str:
    if backend not in BACKENDS:
        raise lrb.BackendError(f"backend {backend!r} unknown for Mamba3; expected one of "
                               f"{', '.join(BACKENDS)}")
    if backend == "mamba_ssm":
        fn, why = mamba_ssm_status()
        if device_type != "cuda" or fn is None:
            raise lrb.BackendError(f"backend 'mamba_ssm' unavailable for {device_type!r} tensors: "
                                   f"{why}; use 'auto' or 'torch'")
        return "mamba_ssm"
    if backend == "auto" and device_type == "cuda" and mamba_ssm_status()[0] is not None:
        return "mamba_ssm"
    if backend == "ref":
        return "ref"
    return lrb.resolve(backend, device_type)   # the SSD's choice: cpu C kernel, fla, torch


def heavy_tail(x: torch.Tensor) -> torch.Tensor:
    """1 + x for x >= 0, 1 / (1 - x) for x < 0: positive, continuous (mamba-ssm's
    heavy_tail_activation for the data-dependent A)."""
    return x.clamp_min(0) + torch.reciprocal(1 - x.clamp_max(0))


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim (mamba-ssm's RMSNormGated, no z)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`RMSNorm`'s arithmetic with the weight passed in."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Mamba3: {name} must be a positive int, got {value!r}")


class Mamba3(nn.Module):
    """Mamba-3 mixer (SISO, or MIMO with mimo_rank > 1): (batch, L, d_model) -> same, causal.

    Options (mamba-ssm's defaults in brackets where they differ): d_state 64 [128],
    expand 2, headdim 32 [64], ngroups 1, rope_fraction 0.5 (0.5 or 1.0), complex_state
    True, dt_min 0.001, dt_max 0.1, dt_init_floor 1e-4, A_floor 1e-4, outproj_norm False,
    mimo_rank 1 [4 with is_mimo], chunk_size None (the SSD's tuned size), backend "auto".
    """

    def __init__(self, d_model: int, d_state: int = 64, expand: int = 2, headdim: int = 32,
                 ngroups: int = 1, rope_fraction: float = 0.5, complex_state: bool = True,
                 dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4,
                 A_floor: float = 1e-4, outproj_norm: bool = False, mimo_rank: int = 1,
                 chunk_size: int | None = None, backend: str = "auto"):
        super().__init__()
        for name, value in (("d_model", d_model), ("d_state", d_state), ("expand", expand),
                            ("headdim", headdim), ("ngroups", ngroups), ("mimo_rank", mimo_rank)):
            _positive_int(name, value)
        if backend not in BACKENDS:
            raise lrb.BackendError(f"backend {backend!r} unknown for Mamba3; expected one of "
                                   f"{', '.join(BACKENDS)}")
        if rope_fraction not in (0.5, 1.0):
            raise ValueError(f"Mamba3: rope_fraction must be 0.5 or 1.0, got {rope_fraction!r}")
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"Mamba3: headdim {headdim} does not divide d_inner {d_inner}")
        nheads = d_inner // headdim
        if nheads % ngroups:
            raise ValueError(f"Mamba3: ngroups {ngroups} does not divide nheads {nheads}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"Mamba3: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        n_rot = int(d_state * rope_fraction) // 2 * 2
        self.num_angles = n_rot // 2 if complex_state else 0
        if complex_state and self.num_angles == 0:
            raise ValueError(f"Mamba3: d_state {d_state} too small for a rotation; "
                             "use complex_state=False")
        self.d_model, self.d_state, self.expand, self.headdim = d_model, d_state, expand, headdim
        self.d_inner, self.nheads, self.ngroups = d_inner, nheads, ngroups
        self.A_floor, self.chunk_size, self.backend_choice = A_floor, chunk_size, backend
        self.outproj_norm, self.mimo_rank = outproj_norm, mimo_rank
        self._last_backend: str | None = None
        gn = ngroups * d_state * mimo_rank
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * gn + 3 * nheads + self.num_angles,
                                 bias=False)
        dt = torch.exp(torch.rand(nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))   # softplus^{-1}(dt)
        self.B_bias = nn.Parameter(torch.ones(nheads, mimo_rank, d_state))
        self.C_bias = nn.Parameter(torch.ones(nheads, mimo_rank, d_state))
        if mimo_rank > 1:   # mamba-ssm's init: x and out averaged over the ranks, z copied
            self.mimo_x = nn.Parameter(torch.full((nheads, mimo_rank, headdim), 1.0 / mimo_rank))
            self.mimo_z = nn.Parameter(torch.ones(nheads, mimo_rank, headdim))
            self.mimo_o = nn.Parameter(torch.full((nheads, mimo_rank, headdim), 1.0 / mimo_rank))
        self.B_norm, self.C_norm = RMSNorm(d_state), RMSNorm(d_state)
        self.D = nn.Parameter(torch.ones(nheads))
        for p in (self.dt_bias, self.D):
            p._no_weight_decay = True
        if outproj_norm:
            self.norm = RMSNorm(headdim)
            self.norm.weight = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    @property
    def backend(self) -> str:
        if self._last_backend is not None:
            return self._last_backend
        try:
            return resolve_backend(self.backend_choice, self.D.device.type)
        except lrb.BackendError:
            return self.backend_choice

    # -- pieces --------------------------------------------------------------------------
    def _split(self, u: torch.Tensor):
        """u (b, L, d_model) -> in_proj's parts z, x, Braw, Craw, dd_dt, dd_A, trap, angle."""
        di, h, r = self.d_inner, self.nheads, self.mimo_rank
        gn = self.ngroups * self.d_state * r
        return torch.split(self.in_proj(u), [di, di, gn, gn, h, h, h, self.num_angles], dim=-1)

    def _params(self):
        """The parameters :meth:`_scan_inputs` reads, in its order (passed in, so that
        :func:`models.common.recomputed` reaches their gradients)."""
        return (self.dt_bias, self.B_bias, self.C_bias, self.B_norm.weight, self.C_norm.weight,
                getattr(self, "mimo_x", None))

    def _scan_inputs(self, x, Braw, Craw, dd_dt, dd_A, trap, ang, dt_bias, B_bias, C_bias,
                     B_w, C_w, mimo_x, bias_apart: bool = False):
        """in_proj's parts (but z) and the parameters of :meth:`_params` -> dict of the scan's
        inputs (module doc), heads broadcast. B and C are normalised per group, before they
        are broadcast to the heads (the same numbers as normalising each head's copy, at
        1 / heads of the work and memory). ``bias_apart`` (SISO): q and k stay broadcast over
        the heads without their biases, which come as ``qk_bias`` (C_bias, B_bias) (heads, N)
        for the scan to add (on a CPU inside the rotation's C call, :data:`BIAS_APART`)."""
        h, r = self.nheads, self.mimo_rank
        f = torch.float64 if x.dtype == torch.float64 else torch.float32

        def grp(t, w, bias):   # (..., r * ngroups * N) -> (..., r, nheads, N), + bias
            t = _rms_norm(t.unflatten(-1, (r, self.ngroups, self.d_state)).to(f), w,
                          self.B_norm.eps)
            t = (t.expand(*t.shape[:-2], h, self.d_state) if self.ngroups == 1   # head i reads
                 else t.repeat_interleave(h // self.ngroups, dim=-2))           # group i // (h / g)
            return t if apart else t + bias.transpose(0, 1).to(f)
        apart = bias_apart and r == 1
        B, C = grp(Braw, B_w, B_bias), grp(Craw, C_w, C_bias)            # (b, L, r, h, N)
        xh = x.unflatten(-1, (h, self.headdim))
        v = xh.to(f)[..., None, :, :] * mimo_x.transpose(0, 1).to(f) if r > 1 else xh
        if r == 1:
            B, C = B[..., 0, :, :], C[..., 0, :, :]
        A = -heavy_tail(dd_A.to(f)).clamp(max=-self.A_floor)
        dt = F.softplus(dd_dt.to(f) + dt_bias.to(f))
        omega = None
        if self.num_angles:
            omega = (torch.tanh(ang.to(f)) * math.pi)[..., None, :].expand(*ang.shape[:-1], h,
                                                                            self.num_angles)
        return dict(x=v, q=C, k=B, adt=A * dt, dt=dt, lam=torch.sigmoid(trap.to(f)), omega=omega,
                    qk_bias=(C_bias[:, 0].to(f), B_bias[:, 0].to(f)) if apart else None)

    def _inputs(self, u: torch.Tensor):
        """u (b, L, d_model) -> dict of the scan's inputs (module doc), heads broadcast, with
        z and in_proj's raw parts (``raw``: Braw, Craw, dd_dt, trap, angle)."""
        z, x, Braw, Craw, dd_dt, dd_A, trap, ang = self._split(u)
        p = self._scan_inputs(x, Braw, Craw, dd_dt, dd_A, trap, ang, *self._params())
        return dict(p, z=z, raw=(Braw, Craw, dd_dt, trap, ang))

    def _siso_segment(self, backend, tape, x, Braw, Craw, dd_dt, dd_A, trap, ang, dt_bias,
                      B_bias, C_bias, B_w, C_w, mimo_x, *state):
        """One time segment of the SISO scan from ``state``: in_proj's parts (b, t, .), the
        parameters of :meth:`_params` -> (y (b, t, h, P), no D skip; *next state)
        (:meth:`_mix_recomputed`'s core)."""
        p = self._scan_inputs(x, Braw, Craw, dd_dt, dd_A, trap, ang, dt_bias, B_bias, C_bias,
                              B_w, C_w, mimo_x, bias_apart=BIAS_APART)
        y, nxt = mamba3_scan.mamba3(p["q"], p["k"], p["x"], p["adt"], p["dt"], p["lam"],
                                    p["omega"], state, True, backend=backend,
                                    chunk_size=self.chunk_size, qk_bias=p["qk_bias"],
                                    scan_tape=tape)
        return (y, *nxt)

    def _mix_recomputed(self, u, backend: str) -> torch.Tensor:
        """The SISO forward from a zero state (training's forward) on the chunked scan: the
        scan and its inputs (normalised B and C per head, rotated, scaled; the trapezoid's
        correction) run SEGMENT_LEN steps at a time carrying the state, and are recomputed
        in the backward a segment at a time
        (:class:`models.kernels.segment_recompute.StatefulSegments`), so autograd keeps
        in_proj's output and the scan's output y per layer instead of about ten (b, L,
        heads, d_state) tensors (197 -> 57 MiB per layer at 2 x 2048, d_model 256, where
        Mamba keeps 59), and the backward's recomputed graph is one segment's. On a CPU the C
        scan's forward runs once: the recompute replays the checkpoints the first run stored
        (:data:`SCAN_TAPE`). Same arithmetic as
        :meth:`_inputs` + ``mamba3_scan.mamba3`` (the state carries exactly)."""
        z, x, Braw, Craw, dd_dt, dd_A, trap, ang = self._split(u)
        f = torch.float64 if x.dtype == torch.float64 else torch.float32
        state = tuple(t.to(f) for t in self.init_state(u.shape[0]))
        # one tape per call: its segments' first (no-grad) scans leave their checkpoints
        # there for the backward's recompute, which takes them back last first
        tape = [] if SCAN_TAPE and torch.is_grad_enabled() else None
        y = StatefulSegments.apply(functools.partial(self._siso_segment, backend, tape),
                                   SEGMENT_LEN, 7, 6, x, Braw, Craw, dd_dt, dd_A, trap, ang,
                                   *self._params(), *state)
        return self.out_proj(self._skip_gate(y, x.unflatten(-1, (self.nheads, self.headdim)), z)
                             .flatten(-2).to(z.dtype))

    def _skip_gate(self, y, xh, z):
        """:meth:`_gate` (y (b, L, h, P), xh the scan's values as heads, z in_proj's z part)
        for training's forward: without outproj_norm, on a CPU in float32 / float64, the
        fused C kernel (``gated_norm_cpu.skip_gate``: one pass each way, keeping y, x and z);
        else recomputed (its two (b, L, d_inner) intermediates were 16 MiB a layer)."""
        zh = z.unflatten(-1, (self.nheads, self.headdim))
        if (self.mimo_rank == 1 and not self.outproj_norm
                and gated_norm_cpu.skip_gate_applies(y, xh, zh, self.D)):
            return gated_norm_cpu.skip_gate(y, xh, zh, self.D)
        return recomputed(self._gate, y, xh, z, *self._gate_params())

    def _out(self, y: torch.Tensor, p: dict) -> torch.Tensor:
        """D skip, gate and out_proj: y (b, L, h, P), MIMO (b, L, r, h, P) -> (b, L, d_model)."""
        return self.out_proj(self._gate(y, p["x"], p["z"], *self._gate_params())
                             .flatten(-2).to(p["z"].dtype))

    def _gate_params(self):
        """The parameters :meth:`_gate` reads, in its order (None where absent)."""
        norm = getattr(self, "norm", None)
        return (self.D, None if norm is None else norm.weight, getattr(self, "mimo_z", None),
                getattr(self, "mimo_o", None))

    def _gate(self, y, x, z, D, norm_w, mimo_z, mimo_o):
        """The D skip and the gate (and the per-head norm with outproj_norm): y (b, L, h, P),
        MIMO (b, L, r, h, P), x the scan's values, z in_proj's z part -> (b, L, h, P), the
        input of out_proj; parameters passed in (:func:`models.common.recomputed`)."""
        y = y + D.to(y.dtype)[:, None] * x.to(y.dtype)
        z = z.to(y.dtype).unflatten(-1, (self.nheads, self.headdim))
        if self.mimo_rank > 1:
            z = z[..., None, :, :] * mimo_z.transpose(0, 1).to(y.dtype)     # (b, L, r, h, P)
        if self.outproj_norm:   # norm before gate, per head (mamba-ssm: group_size=headdim)
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm.eps)
            y = y * norm_w.to(y.dtype).unflatten(-1, (self.nheads, self.headdim))
        y = y * F.silu(z)
        if self.mimo_rank > 1:
            y = (y * mimo_o.transpose(0, 1).to(y.dtype)).sum(-3)           # (b, L, h, P)
        return y

    def _mix(self, u, state, want_state: bool):
        resolved = resolve_backend(self.backend_choice, u.device.type)
        if resolved == "mamba_ssm" and not self.num_angles:
            resolved = "torch"      # mamba-ssm's kernel always rotates: a real state runs here
        if self.mimo_rank > 1 and resolved == "mamba_ssm":
            resolved = lrb.resolve("auto", u.device.type)   # no MIMO kernel wired: the SSD's
        self._last_backend = resolved
        if (state is None and not want_state and self.mimo_rank == 1
                and resolved not in ("mamba_ssm", "ref")):
            return self._mix_recomputed(u, resolved), None
        p = self._inputs(u)
        if self.mimo_rank > 1:
            fn = functools.partial(mamba3_scan.mamba3_mimo, backend=resolved,
                                   chunk_size=self.chunk_size)
            y, S = fn(p["q"], p["k"], p["x"], p["adt"], p["dt"], p["lam"], p["omega"], state,
                      want_state)
            return self._out(y, p), S
        if resolved == "mamba_ssm":
            return self._mix_mamba_ssm(u, p, state, want_state)
        backend = "ref" if resolved == "ref" else resolved
        y, S = mamba3_scan.mamba3(p["q"], p["k"], p["x"], p["adt"], p["dt"], p["lam"],
                                  p["omega"], state, want_state, backend=backend,
                                  chunk_size=self.chunk_size)
        return self._out(y, p), S

    def _mix_mamba_ssm(self, u, p, state, want_state):
        """mamba-ssm's fused SISO kernel; its state layout S (b, h, P, N) is transposed."""
        fn = mamba_ssm_status()[0]
        h = self.nheads
        B, C = (self.B_norm(t.unflatten(-1, (self.ngroups, self.d_state)).float())
                for t in (p["raw"][0], p["raw"][1]))
        _, _, dd_dt, trap, ang = p["raw"]
        angles = ang.float()[..., None, :].expand(*ang.shape[:-1], h, self.num_angles)
        S0 = None if state is None else (state[0], state[1].transpose(-1, -2).contiguous(),
                                         state[2], state[3].to(u.dtype))
        out = fn(Q=C, K=B, V=p["x"], ADT=p["adt"].transpose(1, 2).contiguous(),
                 DT=p["dt"].transpose(1, 2).contiguous(), Trap=trap.transpose(1, 2).contiguous(),
                 Q_bias=self.C_bias[:, 0], K_bias=self.B_bias[:, 0], Angles=angles, D=None,
                 Z=None, chunk_size=self.chunk_size or 64, Input_States=S0,
                 return_final_states=want_state)
        y, S = (out[0], (out[1], out[2].transpose(-1, -2), out[3], out[4])) if want_state else (out, None)
        return self._out(y.float(), p), S

    # -- public --------------------------------------------------------------------------
    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (batch, L, d_model) -> (batch, L, d_model)."""
        return self._mix(u, None, False)[0]

    def forward_with_state(self, u: torch.Tensor, state):
        """A chunk u (batch, L, d_model) from ``state`` -> (out, next state); chaining chunks
        equals one forward over their concatenation."""
        return self._mix(u, state, True)

    def init_state(self, batch: int):
        """Zeros: (theta (b, h, R), S (b, h, N, P), kr_prev (b, h, N), x_prev (b, h, P))."""
        p = self.D
        f = torch.float64 if p.dtype == torch.float64 else torch.float32
        z = lambda *s: torch.zeros(batch, *s, device=p.device, dtype=f)  # noqa: E731
        h, r = self.nheads, self.mimo_rank
        if r > 1:
            return (z(h, self.num_angles), z(h, self.d_state, self.headdim),
                    z(r, h, self.d_state), z(r, h, self.headdim))
        return (z(h, self.num_angles), z(h, self.d_state, self.headdim), z(h, self.d_state),
                z(h, self.headdim))

    def step(self, u_t: torch.Tensor, state):
        """One token: u_t (batch, d_model) -> (out_t (batch, d_model), next state), the
        recurrence itself (``mamba3_ref`` over one step)."""
        p = self._inputs(u_t[:, None])
        ref = mamba3_scan.mamba3_mimo_ref if self.mimo_rank > 1 else mamba3_scan.mamba3_ref
        y, S = ref(p["q"], p["k"], p["x"], p["adt"], p["dt"], p["lam"],
                                      p["omega"], state, True)
        return self._out(y, p)[:, 0], S

    def state_size(self) -> int:
        """Floats of recurrent state per sequence: S, the previous rotated B and x (the
        trapezoid's), and the angles."""
        h = self.nheads
        r = self.mimo_rank
        return h * (self.d_state * self.headdim + r * (self.d_state + self.headdim)
                    + self.num_angles)
