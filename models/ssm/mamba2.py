"""The Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and
Efficient Algorithms Through Structured State Space Duality", ICML 2024), structured as
state-spaces/mamba's ``mamba_ssm/modules/mamba2.py`` ``Mamba2`` block (written here
from the paper and that module's structure; no code copied).

Mamba2(u), for u: (batch, length, d_model), d_inner = expand * d_model,
nheads = d_inner // headdim, conv_dim = d_inner + 2 * ngroups * d_state:

    z, xBC, dt_raw = in_proj(u)          (b, L, d_inner), (b, L, conv_dim), (b, L, nheads)
    xBC   = silu(causal depthwise conv1d(xBC))          kernel d_conv, left-padded
    x, B, C = split(xBC)                 x (b, L, nheads, headdim); B, C (b, L, ngroups, d_state)
    dt    = softplus(dt_raw + dt_bias)   (b, L, nheads)
    A     = -exp(A_log)                  (nheads,) one scalar per head
    per head h (group g(h) = h // (nheads // ngroups)), state S_t: (d_state, headdim)
        S_t = exp(dt_t A_h) S_{t-1} + B_t (dt_t x_t)^T      y_t = S_t^T C_t + D_h x_t
    y     = RMSNorm(y * silu(z))         gated norm, normalised per group of heads
                                         (mamba-ssm's RMSNormGated, norm_before_gate=False)
    out   = out_proj(y)                  (b, L, d_model)

The SSD recurrence is the scalar-gated linear attention ``simple_gla`` of
``models.kernels.linear_rnn`` with q = C, k = B, v = x * dt, g = dt * A, scale = 1
(the SSD duality, paper Section 5), obtained through
``models.kernels.linear_rnn_backends.get_op``. No outer norm or residual: the backbone
(``models.ssm.mamba.RecurrentStack``) adds pre-norm residuals.

Backends (``backend=``): ``torch`` (chunked PyTorch SSD), ``ref`` (the step-by-step
oracle), ``fla`` (flash-linear-attention's ``chunk_simple_gla``, CUDA only),
``mamba_ssm`` (mamba-ssm's fused Triton SSD ``mamba_chunk_scan_combined``, CUDA only, when
``mamba_ssm.ops.triton.ssd_combined`` imports) and ``auto``: on CUDA tensors mamba_ssm when
it imports, else fla when it imports, else torch; on CPU torch. The conv is the same on
every backend (see ``Mamba2._conv``). ``step`` without autograd on a CPU (float32 /
float64, backend auto or cpu) is one C call between in_proj and out_proj
(``models.kernels.mamba_step_cpu``), else plain PyTorch.

Training memory and speed: on a CPU, a chunk whose in_proj output fits WHOLE_MAX_BYTES
(64 MiB: batch 2 x 2048 steps at d_model 256 is 19 MiB) runs ``Mamba2._mix_whole``: in_proj
and the conv once each, plain autograd (the fast path at language-model shapes). Larger
chunks, and every other device, keep in_proj's output never whole: the conv's B, C part and the value
x * dt (the operator's inputs) and the gate / D skip / norm / out_proj (one piece after the
operator) are each recomputed from the layer input u in the backward, a slice of steps at a
time (``models.common.recomputed_in_slices``); autograd keeps u, B, C, x * dt, dt, the
operator's output and the operator's own state checkpoints (``Mamba2._mix``).

Parameter names follow mamba-ssm's Mamba2 (in_proj, conv1d, dt_bias, A_log, D, norm.weight,
out_proj) with the same shapes, so its checkpoints load with ``load_state_dict``
(D_has_hdim=False, d_ssm = d_inner as in its defaults).

Recurrent state: ``(conv_state (batch, conv_dim, d_conv - 1), ssm_state (batch, nheads,
d_state, headdim))``. The ssm state is in the operator's (key_dim = d_state,
value_dim = headdim) layout: mamba-ssm's ``ssm_state`` (batch, nheads, headdim, d_state)
is its transpose over the last two dimensions.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import causal_conv, conv_cache, recomputed, recomputed_in_slices
from models.kernels import gated_norm_cpu, mamba_step_cpu
from models.kernels import linear_rnn_backends as lrb

BACKENDS = ("auto", "torch", "ref", "fla", "cpu", "mamba_ssm")

Mamba2State = tuple[torch.Tensor, torch.Tensor]  # (conv_state, ssm_state)

OP_SEGMENT_LEN = 4096  # steps per call of the cpu operator under autograd (Mamba2._ssd)

# On a CPU, a chunk whose in_proj output is at most this many bytes runs Mamba2._mix_whole
# (in_proj and the conv once, plain autograd); larger ones the sliced, recomputing path
WHOLE_MAX_BYTES = 64 * 2**20


def _atleast_f32(t: torch.Tensor) -> torch.Tensor:
    """Upcast half / bfloat16 to float32 (the SSD runs in >= fp32); keep float64 as is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


@functools.lru_cache(maxsize=None)
def mamba_ssm_status() -> tuple[Callable | None, str]:
    """(mamba_chunk_scan_combined or None, one line saying why / what).

    Any exception at import counts as unavailable (FACTS.md: ``import mamba_ssm`` fails
    with errors other than ImportError on machines where its CUDA extensions are missing).
    """
    if not torch.cuda.is_available():
        return None, "no CUDA GPU (mamba-ssm's SSD kernels are Triton GPU kernels)"
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as exc:  # ImportError, or an extension / Triton failure inside it
        return None, f"mamba_ssm not importable ({type(exc).__name__}: {exc})".split("\n")[0]
    return mamba_chunk_scan_combined, "mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined"


def check_backend(backend: str) -> None:
    """Raise BackendError (a ValueError) naming ``backend`` unless it is one of BACKENDS."""
    if backend not in BACKENDS:
        raise lrb.BackendError(f"backend {backend!r} unknown for Mamba2; expected one of "
                               f"{', '.join(BACKENDS)}")


def resolve_backend(backend: str, device_type: str) -> str:
    """The backend that runs for tensors on ``device_type`` (see the module docstring)."""
    check_backend(backend)
    if backend == "mamba_ssm":
        if device_type != "cuda":
            raise lrb.BackendError(f"backend 'mamba_ssm' runs on CUDA tensors only; these are on "
                                   f"{device_type!r}: use 'auto' or 'torch'")
        fn, why = mamba_ssm_status()
        if fn is None:
            raise lrb.BackendError(f"backend 'mamba_ssm' unavailable: {why}; install mamba-ssm "
                                   "(the optional extra) or use 'auto' / 'torch'")
        return "mamba_ssm"
    if backend == "auto" and device_type == "cuda" and mamba_ssm_status()[0] is not None:
        return "mamba_ssm"
    return lrb.resolve(backend, device_type)


class GatedRMSNorm(nn.Module):
    """norm(y * silu(z)): RMS over groups of ``group_size`` channels, times ``weight``.

    mamba-ssm's ``RMSNormGated`` with norm_before_gate=False (``layernorm_gated.py``).
    y, z: (..., d) -> (..., d); computed in >= float32, returned in y's dtype.
    """

    def __init__(self, d: int, group_size: int, eps: float = 1e-5):
        super().__init__()
        if d % group_size:
            raise ValueError(f"group_size {group_size} does not divide {d}")
        self.eps, self.group_size = eps, group_size
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if gated_norm_cpu.applies(y, z, self.weight):    # CPU fp32/64: the C kernel (issue 43)
            return self._gated(y, z, self.weight)
        # recomputed in the backward: three (..., d) intermediates otherwise kept
        return recomputed(self._norm, y, z, self.weight)

    def _gated(self, y, z, weight):
        """:meth:`_norm`'s value, by the fused kernel (``models.kernels.gated_norm_cpu``:
        one pass forward, one backward, keeping y, z and one float per row and group) where
        it applies, else by :meth:`_norm`; for the pieces that are already recomputed."""
        if gated_norm_cpu.applies(y, z, weight):
            return gated_norm_cpu.GatedRMSNormFn.apply(y, z, weight, self.eps, self.group_size,
                                                       False, False)
        return self._norm(y, z, weight)

    def _norm(self, y, z, weight):
        h = _atleast_f32(y) * F.silu(_atleast_f32(z))
        g = h.unflatten(-1, (-1, self.group_size))                    # (..., groups, group_size)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return (g.flatten(-2) * weight).to(y.dtype)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Mamba2: {name} must be a positive int, got {value!r}")
    return value


class Mamba2(nn.Module):
    """Mamba-2 mixer: (batch, length, d_model) -> (batch, length, d_model), causal.

    Options (mamba-ssm's defaults in brackets where they differ): d_state 64 [128],
    d_conv 4, expand 2, headdim 32 [64] (so d_model 64 gives 4 heads), ngroups 1,
    chunk_size None [256] (the chunk of the torch and mamba_ssm backends; fla fixes its own;
    None: the torch operator's tuned size for the device, 256 for mamba_ssm),
    dt_min 0.001, dt_max 0.1, dt_init_floor 1e-4, A_init_range (1, 16), bias False,
    conv_bias True, backend "auto" | "torch" | "ref" | "fla" | "cpu" | "mamba_ssm".

    ``backend`` reports the backend of the last forward (before any: the one that would
    run on the parameters' device).
    """

    def __init__(
        self, d_model: int, d_state: int = 64, d_conv: int = 4, expand: int = 2,
        headdim: int = 32, ngroups: int = 1, chunk_size: int | None = None, dt_min: float = 0.001,
        dt_max: float = 0.1, dt_init_floor: float = 1e-4,
        A_init_range: tuple[float, float] = (1.0, 16.0), bias: bool = False,
        conv_bias: bool = True, backend: str = "auto",
    ):
        super().__init__()
        check_backend(backend)
        for name, value in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv),
                            ("expand", expand), ("headdim", headdim), ("ngroups", ngroups),
                            ("chunk_size", 1 if chunk_size is None else chunk_size)):
            _positive_int(name, value)
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"Mamba2: headdim {headdim} does not divide d_inner = expand * "
                             f"d_model = {d_inner}")
        nheads = d_inner // headdim
        if nheads % ngroups:
            raise ValueError(f"Mamba2: ngroups {ngroups} does not divide nheads = "
                             f"d_inner / headdim = {nheads}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"Mamba2: need 0 < dt_min <= dt_max, got dt_min {dt_min}, "
                             f"dt_max {dt_max}")
        if not dt_init_floor > 0:
            raise ValueError(f"Mamba2: dt_init_floor must be > 0, got {dt_init_floor}")
        lo, hi = A_init_range
        if not 0 < lo <= hi:
            raise ValueError(f"Mamba2: A_init_range must satisfy 0 < low <= high, got {A_init_range}")
        if backend in ("fla", "mamba_ssm"):  # fail at build time, saying why
            ok, why = (lrb.fla_status() if backend == "fla"
                       else (lambda s: (s[0] is not None, s[1]))(mamba_ssm_status()))
            if not ok:
                raise lrb.BackendError(f"backend {backend!r} unavailable: {why}; use 'auto' or 'torch'")
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner, self.headdim, self.nheads, self.ngroups = d_inner, headdim, nheads, ngroups
        self.chunk_size = chunk_size
        self.backend_choice = backend
        self._last_backend: str | None = None
        self.conv_dim = d_inner + 2 * ngroups * d_state

        # in_proj order as mamba-ssm: [z, x, B, C, dt]
        self.in_proj = nn.Linear(d_model, d_inner + self.conv_dim + nheads, bias=bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=d_conv,
                                groups=self.conv_dim, padding=d_conv - 1, bias=conv_bias)
        # dt_bias: softplus(dt_bias) = dt ~ log-uniform in [dt_min, dt_max], floored
        dt = torch.exp(torch.rand(nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        # A_h = -a_h with a_h ~ U[A_init_range], stored as log(a_h)
        self.A_log = nn.Parameter(torch.empty(nheads).uniform_(lo, hi).log())
        self.D = nn.Parameter(torch.ones(nheads))
        # mamba-ssm's optimiser policy: no weight decay on these (workbench/train/worker.py reads it)
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.norm = GatedRMSNorm(d_inner, group_size=d_inner // ngroups)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)

    # -- backend -----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend of the last forward; before any, the one for the parameters' device."""
        if self._last_backend is not None:
            return self._last_backend
        try:
            return resolve_backend(self.backend_choice, self.A_log.device.type)
        except lrb.BackendError:  # e.g. "fla" on a model not yet moved to the GPU
            return self.backend_choice

    # -- pieces ------------------------------------------------------------------------
    def _split_in(self, u: torch.Tensor):
        """u (..., d_model) -> z (..., d_inner), xBC (..., conv_dim), dt_raw (..., nheads)."""
        return torch.split(self.in_proj(u), [self.d_inner, self.conv_dim, self.nheads], dim=-1)

    def _conv(self, xBC: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
              left: torch.Tensor | None = None) -> torch.Tensor:
        """silu(causal depthwise conv(xBC)): (b, L, channels) -> same shape, time-major, for
        any run of the conv's channels; w, bias: ``conv1d``'s rows for those channels (passed
        in, so that :func:`recomputed` reaches their gradients); ``left`` (b, d_conv - 1,
        channels), time-major: the inputs before xBC (None = zeros). The C kernel on CPU
        (as Mamba uses), else a sum of shifted products: :func:`models.common.causal_conv`."""
        return causal_conv(xBC, w, bias, left, silu=True)

    # -- recomputed pieces ---------------------------------------------------------------
    # Each piece starts from the layer input u (d_model wide) and keeps only u and its own
    # narrow inputs for the backward, recomputing its rows of in_proj there: in_proj's
    # output is 388 wide at d_model 64 against u's 64, and any view of it kept (z for the
    # gate, xBC for the conv) kept all of it: 194 MiB per layer at batch 8, L = 16384
    # (``scripts/memprobe.py mamba2 16384 --saved``).
    def _part(self, name: str, left: torch.Tensor | None = None):
        """in_proj's and conv1d's parameters for one part of in_proj's output, name in
        'z', 'x', 'BC', 'xBC', 'dt' -> [in weight, in bias, conv weight, conv bias, left]
        (rows of each; None where absent; conv entries None for z and dt). ``left``
        (b, d_conv - 1, conv_dim), time-major, is cut to the part's conv channels."""
        di, cd = self.d_inner, self.conv_dim
        lo, hi = {"z": (0, di), "x": (di, 2 * di), "BC": (2 * di, di + cd),
                  "xBC": (di, di + cd), "dt": (di + cd, di + cd + self.nheads)}[name]
        w, b = self.in_proj.weight[lo:hi], self.in_proj.bias
        part = [w, None if b is None else b[lo:hi]]
        if name in ("z", "dt"):
            return part + [None, None, None]
        c0, c1 = lo - di, hi - di                                       # conv channels
        cb = self.conv1d.bias
        return part + [self.conv1d.weight[c0:c1], None if cb is None else cb[c0:c1],
                       None if left is None else left[..., c0:c1]]

    def _proj_conv(self, h, u, w, b, cw, cb, left):
        """silu(conv(u W^T + b)): u (b, L, d_model) -> (b, L - h, channels) of the part; the
        first h steps of u are the conv's context (h = 0: ``left`` is;
        :func:`models.common.recomputed_in_slices`)."""
        return self._conv(F.linear(u, w, b), cw, cb, None if h else left)[:, h:]

    def _x_dt(self, h, u, dt, w, b, cw, cb, left):
        """The SSD's value x * dt: u (b, L, d_model), dt (b, L, nheads) ->
        (b, L - h, nheads, headdim) in >= float32 (h as in :meth:`_proj_conv`)."""
        x = self._proj_conv(h, u, w, b, cw, cb, left).unflatten(-1, (self.nheads, self.headdim))
        return _atleast_f32(x) * dt[:, h:, :, None]

    def _gate_out(self, h, y, u, wz, bz, norm_w, wo, bo):
        """out_proj(norm(y * silu(z))), z = u Wz^T + bz: y (b, L, d_inner), u (b, L, d_model)
        -> (b, L - h, d_model); position-wise (h, the slice's context steps, is 0)."""
        return F.linear(self.norm._gated(y, F.linear(u, wz, bz), norm_w), wo, bo)

    def _skip_gate_out(self, h, o, u, wx, bx, cwx, cbx, left, D, wz, bz, norm_w, wo, bo):
        """The D skip, gate, norm and out_proj: o (b, L, nheads, headdim), the SSD's output,
        u (b, L, d_model) -> (b, L - h, d_model), the steps after the first h (context for
        the conv: :func:`models.common.recomputed_in_slices`; h = 0 uses ``left``); x (the
        skip's input) recomputed from u as in :meth:`_x_dt`."""
        x = self._proj_conv(h, u, wx, bx, cwx, cbx, left)
        xf = _atleast_f32(x.unflatten(-1, (self.nheads, self.headdim)))
        y = (o[:, h:].to(xf.dtype) + D[:, None] * xf).flatten(-2).to(x.dtype)  # (b, L - h, d_inner)
        return self._gate_out(0, y, u[:, h:], wz, bz, norm_w, wo, bo)

    def _heads(self, xBC: torch.Tensor):
        """xBC (..., conv_dim) -> x (..., nheads, headdim), B, C (..., ngroups, d_state)."""
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, gn, gn], dim=-1)
        return (x.unflatten(-1, (self.nheads, self.headdim)),
                B.unflatten(-1, (self.ngroups, self.d_state)),
                C.unflatten(-1, (self.ngroups, self.d_state)))

    def _to_heads(self, BC: torch.Tensor) -> torch.Tensor:
        """(..., ngroups, d_state) -> (..., nheads, d_state): head h reads group
        h // (nheads // ngroups), as mamba-ssm. One group (the default): a broadcast view,
        no copy (copies of B and C per head were 256 MiB per layer at batch 8, L = 16384)."""
        if self.ngroups == 1:
            return BC.expand(*BC.shape[:-2], self.nheads, BC.shape[-1])
        return BC.repeat_interleave(self.nheads // self.ngroups, dim=-2)

    def _mix(self, u: torch.Tensor, conv_state: torch.Tensor | None,
             initial_state: torch.Tensor | None, want_state: bool):
        """The mixer over a chunk: u (b, L, d_model), conv_state (b, conv_dim, d_conv - 1) or
        None (zeros), initial ssm state (b, nheads, d_state, headdim) or None ->
        (out (b, L, d_model), final ssm state or None).

        What autograd keeps per layer (memprobe ``--saved``): u, B and C after the conv,
        x * dt (the operator's inputs), dt, the operator's own checkpoints and its output
        o; the conv output's x part, z and the gated norm are recomputed from u."""
        left = None if conv_state is None else conv_state.to(u.dtype).transpose(1, 2)
        k1 = self.d_conv - 1
        resolved = resolve_backend(self.backend_choice, u.device.type)
        self._last_backend = resolved
        A = -torch.exp(_atleast_f32(self.A_log))                       # (nheads,)
        D = _atleast_f32(self.D)
        if resolved != "mamba_ssm" and self._whole(u):
            return self._mix_whole(resolved, u, left, A, D, initial_state, want_state)
        w_dt, b_dt = self._part("dt")[:2]
        dt_raw = F.linear(u, w_dt, b_dt)                                 # (b, L, nheads)
        gate_out = [*self._part("z")[:2], self.norm.weight, self.out_proj.weight, self.out_proj.bias]
        if resolved == "mamba_ssm":
            x, B, C = self._heads(recomputed_in_slices(self._proj_conv, 1, k1, u,
                                                       *self._part("xBC", left)))
            fn = mamba_ssm_status()[0]
            S0 = None if initial_state is None else initial_state.transpose(-1, -2).contiguous()
            out = fn(x, dt_raw, A, B, C, chunk_size=self.chunk_size or 256, D=D, dt_bias=self.dt_bias,
                     dt_softplus=True, initial_states=S0, return_final_states=want_state)
            y, S = out if want_state else (out, None)
            if S is not None:
                S = S.transpose(-1, -2)                                 # -> (b, h, d_state, headdim)
            return recomputed_in_slices(self._gate_out, 2, 0, y.flatten(-2), u, *gate_out), S
        # each piece is computed and recomputed a slice of steps at a time, its conv with
        # d_conv - 1 steps of context, so that its intermediates live one slice at a time
        BC = recomputed_in_slices(self._proj_conv, 1, k1, u, *self._part("BC", left))
        B, C = (t.unflatten(-1, (self.ngroups, self.d_state)) for t in BC.chunk(2, dim=-1))
        dt = F.softplus(_atleast_f32(dt_raw) + _atleast_f32(self.dt_bias))  # (b, L, nheads)
        x_part = self._part("x", left)
        v = recomputed_in_slices(self._x_dt, 2, k1, u, dt, *x_part)     # (b, L, nheads, headdim)
        o, S = self._ssd(resolved, _atleast_f32(C), _atleast_f32(B), v, dt * A, initial_state,
                         want_state)
        return recomputed_in_slices(self._skip_gate_out, 2, k1, o, u, *x_part, D,
                                    *gate_out), S

    def _whole(self, u: torch.Tensor) -> bool:
        """Whether the chunk u runs :meth:`_mix_whole`: on a CPU when in_proj's output for it
        is at most WHOLE_MAX_BYTES (2 x 2048 steps at d_model 256: 19 MiB). Asked of
        :func:`models.common.take_whole`, so the estimate's probe measures the path the
        real run takes (its tiny chunks would all be whole)."""
        from models.common import take_whole

        return take_whole(u.shape[0] * u.shape[1], self.in_proj.out_features * u.element_size(),
                          WHOLE_MAX_BYTES, cpu_only=True, device=u.device)

    def _mix_whole(self, resolved: str, u, left, A, D, initial_state, want_state: bool):
        """:meth:`_mix` for a chunk small enough to keep in_proj's output (``_whole``): one
        in_proj product and one conv over all conv_dim channels, plain autograd, nothing
        recomputed. The sliced path computes the x part's projection and conv twice in the
        forward and twice more in the backward, and z once more: about 1.4x the matrix work
        of a layer and 4x the conv, most of Mamba-2's step at LM shapes (2 x 2048, d_model
        256: 52% of the step was elementwise passes and the repeated products). Same
        arithmetic otherwise (the equality tests run both)."""
        z, xBC, dt_raw = self._split_in(u)
        x, B, C = self._heads(self._conv(xBC, self.conv1d.weight, self.conv1d.bias, left))
        dt = F.softplus(_atleast_f32(dt_raw) + _atleast_f32(self.dt_bias))  # (b, L, nheads)
        xf = _atleast_f32(x)
        o, S = self._ssd(resolved, _atleast_f32(C), _atleast_f32(B), xf * dt[..., None],
                         dt * A, initial_state, want_state)
        y = (o.to(xf.dtype) + D[:, None] * xf).flatten(-2).to(x.dtype)   # (b, L, d_inner)
        return self.out_proj(self.norm(y, z)), S

    def _ssd(self, resolved: str, C, B, v, g, initial_state, want_state: bool):
        """The SSD as ``simple_gla``: C, B (b, L, ngroups, d_state), v = x * dt (b, L,
        nheads, headdim), g = dt * A (b, L, nheads) -> (o (b, L, nheads, headdim), final
        state (b, nheads, d_state, headdim) or None).

        Backend ``cpu`` under autograd runs it in segments of OP_SEGMENT_LEN steps carrying
        the state (the same recurrence; nothing recomputed): the C kernel's backward
        allocates dq and dk per head, (b, L, nheads, d_state) each, before autograd sums
        them over the heads that share B and C; whole, that is 256 MiB at batch 8,
        L = 16384 (four heads), the step's peak; per segment of 4096, 64 MiB. B and C are
        cut before they are broadcast to the heads, so each segment's sum runs at once."""
        op, _ = lrb.get_op("simple_gla", resolved, v.device.type)
        kwargs = {"chunk_size": self.chunk_size} if resolved == "torch" else {}
        L = v.shape[1]
        seg = (OP_SEGMENT_LEN if resolved == "cpu" and torch.is_grad_enabled()
               and any(t.requires_grad for t in (C, B, v, g)) else L)
        if L <= seg:
            return op(self._to_heads(C), self._to_heads(B), v, g, scale=1.0,
                      initial_state=initial_state, output_final_state=want_state, **kwargs)
        S, outs = initial_state, []
        pieces = zip(*(t.split(seg, dim=1) for t in (C, B, v, g)))
        for i, (Ci, Bi, vi, gi) in enumerate(pieces):
            last = (i + 1) * seg >= L
            o, S = op(self._to_heads(Ci), self._to_heads(Bi), vi, gi, scale=1.0,
                      initial_state=S, output_final_state=want_state or not last, **kwargs)
            outs.append(o)
        return torch.cat(outs, 1), S

    # -- full sequence -----------------------------------------------------------------
    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (batch, length, d_model) -> (batch, length, d_model)."""
        return self._mix(u, None, None, False)[0]

    def forward_with_state(self, u: torch.Tensor, state: Mamba2State) -> tuple[torch.Tensor, Mamba2State]:
        """Run a chunk u (batch, length, d_model) from ``state``; returns (out, next state).

        Chaining chunks this way equals one forward over their concatenation."""
        conv_state, ssm_state = state
        k1 = self.d_conv - 1
        w, b = self._part("xBC")[:2]                   # the conv's inputs for the next chunk
        new_conv = conv_cache(conv_state, F.linear(u[:, u.shape[1] - min(k1, u.shape[1]):], w, b))
        out, ssm_state = self._mix(u, conv_state, ssm_state, True)
        return out, (new_conv, ssm_state)

    # -- recurrent mode ----------------------------------------------------------------
    def init_state(self, batch: int) -> Mamba2State:
        """Zeros: conv (batch, conv_dim, d_conv - 1), ssm (batch, nheads, d_state, headdim)."""
        p = self.A_log
        return (torch.zeros(batch, self.conv_dim, self.d_conv - 1, device=p.device, dtype=p.dtype),
                torch.zeros(batch, self.nheads, self.d_state, self.headdim, device=p.device,
                            dtype=_atleast_f32(p).dtype))

    def step(self, u_t: torch.Tensor, state: Mamba2State) -> tuple[torch.Tensor, Mamba2State]:
        """One token: u_t (batch, d_model) -> (out_t (batch, d_model), next state).

        Without autograd (decode: ``torch.no_grad`` / ``inference_mode``) the C step
        :meth:`_fused_step` where it applies, else (and with autograd recording) the torch
        step :meth:`_torch_step`, which the tests hold it to. The next state is new tensors;
        the state passed in is not written."""
        if not torch.is_grad_enabled():
            fused = self._fused_step(u_t, state)
            if fused is not None:
                return fused
        return self._torch_step(u_t, state)

    def _fused_step(self, u_t: torch.Tensor, state: Mamba2State):
        """The decode step as in_proj, one C call (``models.kernels.mamba_step_cpu``: the
        conv window + SiLU, softplus(dt + dt_bias), the per-head decay, the SSD's one-token
        update, readout, D skip and the gated RMS norm), out_proj. On a CPU in float32 /
        float64 with backend "auto" or "cpu" (a forced "torch" or "ref" stays PyTorch
        throughout); None where it does not apply."""
        if self.backend_choice not in ("auto", "cpu"):
            return None
        mods, params = self._modules, self._parameters
        ip, cp = mods["in_proj"]._parameters, mods["conv1d"]._parameters
        op, norm = mods["out_proj"]._parameters, mods["norm"]
        nw = norm._parameters["weight"]
        conv_state, S = state
        if mamba_step_cpu.unsupported(u_t, conv_state, S, ip["weight"], ip["bias"],
                                      cp["weight"], cp["bias"], params["A_log"], params["dt_bias"],
                                      params["D"], nw, op["weight"], op["bias"]):
            return None
        o, cache2, S2 = mamba_step_cpu.mamba2_step(
            F.linear(u_t, ip["weight"], ip["bias"]), conv_state, cp["weight"], cp["bias"],
            params["dt_bias"], params["A_log"], params["D"], nw, S, ngroups=self.ngroups,
            eps=norm.eps)
        return F.linear(o, op["weight"], op["bias"]), (cache2, S2)

    def _torch_step(self, u_t: torch.Tensor, state: Mamba2State) -> tuple[torch.Tensor, Mamba2State]:
        """:meth:`step` in PyTorch ops (any device and dtype, autograd)."""
        conv_state, S = state
        z, xBC, dt_raw = self._split_in(u_t)
        window = torch.cat([conv_state.to(xBC.dtype), xBC[:, :, None]], -1)  # (b, conv_dim, d_conv)
        xBC = (window * self.conv1d.weight[:, 0, :]).sum(-1)
        if self.conv1d.bias is not None:
            xBC = xBC + self.conv1d.bias
        x, B, C = self._heads(F.silu(xBC))                               # (b, h, p), (b, g, n)
        xf, S = _atleast_f32(x), S.to(_atleast_f32(x).dtype)
        B, C = self._to_heads(_atleast_f32(B)), self._to_heads(_atleast_f32(C))  # (b, h, n)
        dt = F.softplus(_atleast_f32(dt_raw) + _atleast_f32(self.dt_bias))        # (b, h)
        dA = torch.exp(dt * -torch.exp(_atleast_f32(self.A_log)))
        S = dA[..., None, None] * S + B[..., :, None] * (dt[..., None] * xf)[..., None, :]
        y = torch.einsum("bhn,bhnp->bhp", C, S) + _atleast_f32(self.D)[:, None] * xf
        out = self.out_proj(self.norm(y.flatten(-2).to(x.dtype), z))
        return out, (window[:, :, 1:], S)

    def state_size(self) -> int:
        """Floats of recurrent state per sequence: conv buffer + SSD matrix state."""
        return self.conv_dim * (self.d_conv - 1) + self.nheads * self.d_state * self.headdim
