"""S6: the selective state-space layer of Mamba (Gu & Dao 2023, Section 3.2, Algorithm 2).

For an input sequence x: (batch, length, d_inner) the layer makes its SSM parameters
functions of the input ("selection"):

    B_t, C_t  = Linear_N(x_t)                       (state-size projections, in x_proj)
    delta_t   = softplus(dt_proj(Linear_R(x_t)))    (low-rank R = dt_rank; bias in dt_proj)
    A         = -exp(A_log)                          (d_inner, d_state), input-independent
    h_t = exp(delta_t A) h_{t-1} + delta_t B_t x_t,  y_t = C_t h_t + D x_t

:class:`SelectiveSSM` holds the parameters (named as in mamba-ssm's ``Mamba``: x_proj,
dt_proj, A_log, D) and the scan; :class:`S6` is the bare layer (an "inner layer" that the
gated blocks wrap), and ``models.ssm.mamba.Mamba`` adds the input projection, causal conv and
gate around the same parameters.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.kernels import selective_scan as ss


def _atleast_f32(t: torch.Tensor) -> torch.Tensor:
    """Upcast half/bfloat16 to float32 (the scan runs in >= fp32); keep float64 as is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class SelectiveSSM(nn.Module):
    """Parameters and scan of a selective SSM over ``d_inner`` channels.

    Subclasses call :meth:`_init_ssm` in their constructor. ``backend`` is the requested
    scan backend ("auto", "cuda", "triton", "cpu", "torch", "compiled", "ref"; "compiled" is opt-in,
    never picked by "auto"); the attribute ``backend`` reports the one that runs for the module's
    current device.
    """

    def _init_ssm(
        self, d_inner: int, d_state: int, dt_rank: int, dt_min: float, dt_max: float,
        dt_init_floor: float, backend: str, dt_scale: float = 1.0,
        allow_neg_eigval: bool = False,
    ) -> None:
        if backend not in ss.BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {ss.BACKENDS}")
        if backend == "cuda" and not ss.cuda_available():  # fail at build time, saying why
            raise RuntimeError(f"backend 'cuda' unavailable: {ss.cuda_unavailable_reason()}")
        if not isinstance(allow_neg_eigval, bool):
            raise ValueError(f"allow_neg_eigval must be true or false; got {allow_neg_eigval!r}")
        # the transition 2 exp(delta A) - 1 in (-1, 1) (models.kernels.selective_scan's doc)
        self.allow_neg_eigval = allow_neg_eigval
        if allow_neg_eigval and backend not in ("auto", "torch", "ref"):
            raise ValueError(f"backend {backend!r} has no negative-eigenvalue transition "
                             "(allow_neg_eigval); use 'auto', 'torch' or 'ref'")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        self.d_inner, self.d_state, self.dt_rank = d_inner, d_state, dt_rank
        self.backend_request = backend
        # x -> (dt low-rank, B, C)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        # dt_proj weight: uniform with std-like scale dt_rank^-0.5, so delta starts near its bias
        std = dt_rank ** -0.5 * dt_scale
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        # dt_proj bias: softplus(bias) = dt ~ log-uniform in [dt_min, dt_max], clamped below.
        dt = torch.exp(torch.rand(d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        inv_softplus_dt = dt + torch.log(-torch.expm1(-dt))  # softplus^{-1}(dt)
        with torch.no_grad():
            self.dt_proj.bias.copy_(inv_softplus_dt)
        self.dt_proj.bias._no_reinit = True
        self.dt_proj.weight._no_reinit = True  # its scale sets delta's spread (init_schemes "hf")
        # S4D-Real: A_n = -(n + 1), the same for every channel; stored as log(-A).
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(d_inner))
        self.D._no_weight_decay = True

    # -- backend -----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The scan backend that runs for this module's current device."""
        return ss.choose_backend(self.backend_request, ss._device_of(self.A_log),
                                 neg_eigval=getattr(self, "allow_neg_eigval", False))

    # -- full sequence -----------------------------------------------------------------
    def _ssm_params(self, x_bld: torch.Tensor):
        """x: (batch, L, d_inner) -> delta (batch, L, d_inner) without bias, B, C (batch, L, N).

        B and C are views into x_proj's output (no copies); the time-major scan reads them
        as they are.
        """
        x_dbl = self.x_proj(x_bld)                                     # (b, L, R + 2N)
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.linear(dt, self.dt_proj.weight)                      # bias: added in the scan
        return delta, B, C

    def _scan(
        self, x_bld: torch.Tensor, z_bld: torch.Tensor | None = None,
        initial_state: torch.Tensor | None = None, return_last_state: bool = False,
    ):
        """x, z: (batch, L, d_inner) -> y (batch, L, d_inner) [, last state (batch, d_inner, N)]."""
        delta, B, C = self._ssm_params(x_bld)
        A = -torch.exp(_atleast_f32(self.A_log))
        return ss.selective_scan_tm(
            x_bld, delta, A, B, C, _atleast_f32(self.D), z=z_bld,
            delta_bias=_atleast_f32(self.dt_proj.bias), delta_softplus=True,
            return_last_state=return_last_state, backend=self.backend_request,
            initial_state=initial_state, neg_eigval=self.allow_neg_eigval,
        )

    # -- one step ----------------------------------------------------------------------
    def _ssm_step(self, x_t: torch.Tensor, h: torch.Tensor):
        """x_t: (batch, d_inner), h: (batch, d_inner, N) -> y_t (batch, d_inner) with D skip, h."""
        dt, B, C = torch.split(self.x_proj(x_t), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))                           # (b, d_inner)
        A = -torch.exp(_atleast_f32(self.A_log))
        deltaA = torch.exp(delta[:, :, None] * A)                       # ZOH
        if self.allow_neg_eigval:
            deltaA = 2 * deltaA - 1                                     # in (-1, 1)
        deltaB_x = delta[:, :, None] * B[:, None, :] * x_t[:, :, None]  # Euler
        h = deltaA * h + deltaB_x
        y = torch.einsum("bdn,bn->bd", h, C) + self.D * x_t
        return y, h


def resolve_dt_rank(dt_rank, width: int) -> int:
    """"auto" -> ceil(width / 16) (mamba-ssm uses width = d_model)."""
    if dt_rank == "auto":
        return math.ceil(width / 16)
    if isinstance(dt_rank, int) and not isinstance(dt_rank, bool) and dt_rank >= 1:
        return dt_rank
    raise ValueError(f"dt_rank must be 'auto' or a positive int, got {dt_rank!r}")


class S6(SelectiveSSM):
    """The selective SSM alone: (batch, length, d_inner) -> (batch, length, d_inner), causal.

    No input projection, convolution or gate (``models.ssm.mamba.Mamba`` adds those).
    ``dt_rank="auto"`` means ceil(d_inner / 16). State for step mode: (batch, d_inner, d_state).
    """

    def __init__(
        self, d_inner: int, d_state: int = 16, dt_rank="auto", dt_min: float = 0.001,
        dt_max: float = 0.1, dt_init_floor: float = 1e-4, backend: str = "auto",
    ):
        super().__init__()
        self._init_ssm(d_inner, d_state, resolve_dt_rank(dt_rank, d_inner), dt_min, dt_max,
                       dt_init_floor, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_inner) -> (batch, length, d_inner)."""
        return self._scan(x)

    def forward_with_state(self, x: torch.Tensor, state: torch.Tensor):
        """Continue from ``state`` (batch, d_inner, N): returns (y (batch, length, d_inner), state)."""
        return self._scan(x, initial_state=state, return_last_state=True)

    def init_state(self, batch: int) -> torch.Tensor:
        p = self.A_log
        return torch.zeros(batch, self.d_inner, self.d_state, device=p.device, dtype=p.dtype)

    def step(self, x_t: torch.Tensor, state: torch.Tensor):
        """x_t: (batch, d_inner) -> (y_t (batch, d_inner), state)."""
        return self._ssm_step(x_t, state)

    def state_size(self) -> int:
        return self.d_inner * self.d_state
