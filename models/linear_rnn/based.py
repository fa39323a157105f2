"""Based (Arora et al. 2024, "Simple linear attention language models balance the
recall-throughput tradeoff"): linear attention with a 2nd-order Taylor feature map, and
the short gated convolution (BaseConv) that Based stacks with it.

Structure after HazyResearch/zoology (``zoology/mixers/based.py``,
``zoology/mixers/feature_maps/taylor.py``, ``zoology/mixers/base_conv.py``); the code is
this project's own.

Taylor feature map (zoology's ``TaylorExp.forward``), for x in R^f (f = ``feature_dim``):

    phi(x) = [ 1,  x / f^(1/4),  vec(x x^T) / (sqrt(2) sqrt(f)) ]    in R^(1 + f + f^2)

so phi(q) . phi(k) = 1 + q.k / sqrt(f) + (q.k)^2 / (2 f), the 2nd-order Taylor expansion of
exp(q.k / sqrt(f)). It is >= 1/2 for every q, k (= 1/2 + (1 + s)^2 / 2, s = q.k / sqrt(f)),
so the normaliser below is never 0. The full outer product is kept (f^2 entries, not the
f(f+1)/2 of zoology's memory-saving variant): expanded size 1 + f + f^2 = 273 for f = 16.

BasedLinearAttention(x), x: (batch, length, d_model), H heads, head_dim = d_model / H:

    q, k = proj_q(x), proj_k(x)          (batch, length, H, f)      no bias
    v    = proj_v(x)                      (batch, length, H, head_dim)
    y_t  = sum_{s<=t} (phi(q_t).phi(k_s)) v_s / (sum_{s<=t} phi(q_t).phi(k_s) + eps)
    out  = proj_o(y)                      (batch, length, d_model)

Numerator and denominator come from ONE call of the linear-attention operator
(``models.kernels.linear_rnn.linear_attention`` through ``get_op``, scale 1) on the values
with a column of ones appended: its state is [S | z], S = sum phi(k_s) v_s^T and
z = sum phi(k_s).

Recurrent state per layer: ``(S (batch, H, F, head_dim), z (batch, H, F))``, F = 1 + f + f^2,
so ``state_size() = H * F * (head_dim + 1)`` (zoology's ``Based.state_size`` counts the
same two terms).

Backends: ``torch`` (chunked), ``ref`` (step-by-step oracle), ``fla``. fla's chunk kernels
take key dims <= 256 only, so with F > 256 (the default f = 16 gives 273) ``auto`` runs
``torch`` and ``fla`` is refused at construction.

BaseConv (zoology's ``BaseConv`` with a short kernel): y = conv(u) * proj(u) + u, conv a
causal depthwise Conv1d of ``kernel_size`` (3 in zoology's MQAR configs) with bias, proj a
Linear with bias; the "+ u" is zoology's (inside the stack's pre-norm residual, as there).
Its state is the last kernel_size - 1 inputs: ``state_size() = d_model * (kernel_size - 1)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.kernels.linear_rnn_backends import BackendError, check_backend, get_op, resolve

FLA_MAX_KEY_DIM = 256  # fla's chunk kernels assert key dim <= 256

BasedState = tuple[torch.Tensor, torch.Tensor]  # (S (b, H, F, head_dim), z (b, H, F))


def taylor_expanded_dim(feature_dim: int) -> int:
    """Size of phi(x) for x in R^feature_dim: 1 + f + f^2."""
    return 1 + feature_dim + feature_dim ** 2


def taylor_feature_map(x: torch.Tensor) -> torch.Tensor:
    """2nd-order Taylor features of exp: x (..., f) -> (..., 1 + f + f^2); see module doc."""
    f = x.shape[-1]
    x2 = (x[..., :, None] * x[..., None, :]).flatten(-2)             # (..., f*f), x_i x_j
    return torch.cat([torch.ones_like(x[..., :1]), x / f ** 0.25,
                      x2 / (math.sqrt(2.0) * math.sqrt(f))], dim=-1)


class BasedLinearAttention(nn.Module):
    """Taylor-feature linear attention, normalised: (batch, length, d_model) -> same shape."""

    def __init__(self, d_model: int, n_heads: int = 1, feature_dim: int = 16,
                 eps: float = 1e-12, backend: str = "auto"):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")
        if isinstance(feature_dim, bool) or not isinstance(feature_dim, int) or feature_dim < 1:
            raise ValueError(f"feature_dim must be an integer >= 1, got {feature_dim!r}")
        check_backend(backend)
        self.expanded_dim = taylor_expanded_dim(feature_dim)
        if backend == "fla" and self.expanded_dim > FLA_MAX_KEY_DIM:
            raise BackendError(f"backend 'fla' takes key dims <= {FLA_MAX_KEY_DIM}; Based's "
                               f"Taylor features have {self.expanded_dim} (feature_dim="
                               f"{feature_dim}): use feature_dim <= 15 or backend 'torch'")
        self.d_model, self.n_heads, self.feature_dim = d_model, n_heads, feature_dim
        self.head_dim = d_model // n_heads
        self.eps = eps
        self.backend_choice = backend
        self.proj_q = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.proj_k = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.proj_v = nn.Linear(d_model, d_model, bias=False)
        self.proj_o = nn.Linear(d_model, d_model, bias=False)
        self.backend = self._resolve(self.proj_q.weight.device.type)

    def _resolve(self, device_type: str) -> str:
        chosen = self.backend_choice
        if chosen == "auto" and device_type == "cuda" and self.expanded_dim > FLA_MAX_KEY_DIM:
            chosen = "torch"  # fla cannot take these key dims
        return resolve(chosen, device_type)

    # -- state ---------------------------------------------------------------------------
    def init_state(self, batch: int) -> BasedState:
        p = self.proj_q.weight
        H, Fd = self.n_heads, self.expanded_dim
        return (torch.zeros(batch, H, Fd, self.head_dim, device=p.device, dtype=p.dtype),
                torch.zeros(batch, H, Fd, device=p.device, dtype=p.dtype))

    def state_size(self) -> int:
        return self.n_heads * self.expanded_dim * (self.head_dim + 1)

    # -- the layer -------------------------------------------------------------------------
    def forward_with_state(self, x: torch.Tensor, state: BasedState | None
                           ) -> tuple[torch.Tensor, BasedState]:
        """x: (batch, length, d_model) after ``state`` (None: from zeros) -> (y, next state)."""
        b, L, _ = x.shape
        H, f, dv = self.n_heads, self.feature_dim, self.head_dim
        phi_q = taylor_feature_map(self.proj_q(x).view(b, L, H, f))   # (b, L, H, F)
        phi_k = taylor_feature_map(self.proj_k(x).view(b, L, H, f))
        v = self.proj_v(x).view(b, L, H, dv)
        # the appended ones column makes the operator return the normaliser too
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)      # (b, L, H, dv + 1)
        s0 = None if state is None else torch.cat([state[0], state[1][..., None]], dim=-1)
        name = self._resolve(x.device.type)
        op, self.backend = get_op("linear_attention", name, x.device.type)
        o, s = op(phi_q, phi_k, v1, scale=1.0, initial_state=s0, output_final_state=True)
        y = o[..., :dv] / (o[..., dv:] + self.eps)                    # (b, L, H, dv)
        y = self.proj_o(y.reshape(b, L, self.d_model))
        return y, (s[..., :dv], s[..., dv])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model), causal."""
        return self.forward_with_state(x, None)[0]

    def step(self, x_t: torch.Tensor, state: BasedState) -> tuple[torch.Tensor, BasedState]:
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), next state)."""
        y, state = self.forward_with_state(x_t[:, None, :], state)
        return y[:, 0], state

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, feature_dim={self.feature_dim}"
                f" (expanded {self.expanded_dim})")


class BaseConv(nn.Module):
    """Short gated convolution y = conv(u) * proj(u) + u: (batch, length, d_model) -> same."""

    backend = "torch"

    def __init__(self, d_model: int, kernel_size: int = 3, backend: str = "auto"):
        super().__init__()
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1:
            raise ValueError(f"kernel_size must be an integer >= 1, got {kernel_size!r}")
        check_backend(backend)  # accepted for a uniform signature; PyTorch's conv1d runs
        self.d_model, self.kernel_size = d_model, kernel_size
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model, bias=True)
        self.projection = nn.Linear(d_model, d_model)

    def init_state(self, batch: int) -> tuple[torch.Tensor]:
        p = self.projection.weight
        return (torch.zeros(batch, self.d_model, self.kernel_size - 1, device=p.device, dtype=p.dtype),)

    def state_size(self) -> int:
        return self.d_model * (self.kernel_size - 1)

    def forward_with_state(self, u: torch.Tensor, state: tuple[torch.Tensor] | None
                           ) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
        """u: (batch, length, d_model) after ``state`` (the previous k - 1 inputs, channels
        first) -> (y, next state)."""
        u_bdl = u.transpose(1, 2)                                     # (b, d, L)
        k1 = self.kernel_size - 1
        left = (u_bdl.new_zeros(u.shape[0], self.d_model, k1) if state is None
                else state[0].to(u.dtype))
        full = torch.cat([left, u_bdl], dim=-1)                       # (b, d, k1 + L)
        u_conv = F.conv1d(full, self.conv.weight, self.conv.bias, groups=self.d_model)
        y = u_conv.transpose(1, 2) * self.projection(u) + u
        return y, (full[..., full.shape[-1] - k1:],)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.forward_with_state(u, None)[0]

    def step(self, u_t: torch.Tensor, state: tuple[torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
        y, state = self.forward_with_state(u_t[:, None, :], state)
        return y[:, 0], state
