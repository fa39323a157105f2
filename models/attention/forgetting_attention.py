"""Forgetting Attention, the Forgetting Transformer's (FoX) sequence mixer.

Lin, Nikishin, He, Courville, "Forgetting Transformer: Softmax Attention with a Forget
Gate", ICLR 2025 (code: zhixuan-lin/forgetting-transformer; fla-org/flash-linear-attention
``fla/ops/forgetting_attn``). Causal softmax attention whose logits get a data-dependent
decay bias: with a scalar forget gate per head and token, ``f_t = sigmoid(w_f . x_t + b_f)``,

    o_i = sum_{j <= i} softmax_j( scale q_i . k_j + D_ij ) v_j,
    D_ij = sum_{l = j+1}^{i} log f_l = c_i - c_j,   c_t = sum_{l <= t} log f_l.

f = 1 everywhere gives plain causal attention. No positional encoding is used (the paper's
FoX has none: the forget gate supplies recency).

Operators in fla's calling convention (q, k, v: (batch, length, heads, d_head); g: the log
forget gate, (batch, length, heads)):

- :func:`forgetting_attn_ref`: the definition, an explicit masked softmax (any dtype);
- :func:`forgetting_attn_torch`: ``scaled_dot_product_attention`` with the decay bias as an
  additive float mask (fused softmax and matmuls on a CPU);
- fla's ``parallel_forgetting_attn`` (Triton) on CUDA when installed: picked by ``auto``.

State for step-by-step inference is the KV cache plus the running sum ``c_t``: it grows
with the length (``state_size()`` is None, as for attention).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKENDS = ("auto", "torch", "ref", "fla")


def fla_status():
    """(fla's parallel_forgetting_attn, None) or (None, why it is unavailable)."""
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except Exception as e:  # not installed, or no Triton / CUDA here
        return None, f"fla's forgetting_attn cannot be imported ({type(e).__name__}: {e})"
    return parallel_forgetting_attn, None


def resolve_backend(backend: str, device_type: str) -> str:
    """The backend that runs for tensors on ``device_type``: ``auto`` is fla on CUDA when
    installed, else ``torch``; ``fla`` elsewhere or uninstalled is a ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} unknown for forgetting attention; expected one of "
                         f"{', '.join(BACKENDS)}")
    if backend == "fla" or (backend == "auto" and device_type == "cuda"):
        fn, why = fla_status() if device_type == "cuda" else (None, f"tensors on {device_type!r}, fla needs CUDA")
        if fn is not None:
            return "fla"
        if backend == "fla":
            raise ValueError(f"backend 'fla' unavailable: {why}; use 'auto' or 'torch'")
    return "torch" if backend == "auto" else backend


def _bias(g: torch.Tensor, n_query: int) -> torch.Tensor:
    """Decay bias D (batch, heads, n_query, n_key) from g (batch, n_key, heads): the queries
    are the last n_query positions; -inf above the causal diagonal."""
    c = torch.cumsum(g.float() if g.dtype in (torch.float16, torch.bfloat16) else g, dim=1)
    c = c.transpose(1, 2)                                    # (batch, heads, n_key)
    n_key = c.shape[-1]
    d = c[..., n_key - n_query:, None] - c[..., None, :]     # c_i - c_j
    i = torch.arange(n_key - n_query, n_key, device=g.device)[:, None]
    j = torch.arange(n_key, device=g.device)[None, :]
    return d.masked_fill(j > i, float("-inf"))


def forgetting_attn_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """The definition. q: (batch, n_query, heads, d_head); k, v: (batch, n_key, heads,
    d_head) with n_key >= n_query (the queries are the last n_query keys' positions);
    g: (batch, n_key, heads) log forget gates. Returns (batch, n_query, heads, d_head)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * scale + _bias(g, q.shape[1]).to(q.dtype)
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, v)


QUERY_BLOCK = 512


def forgetting_attn_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          scale: float | None = None, dropout_p: float = 0.0,
                          block: int = QUERY_BLOCK) -> torch.Tensor:
    """Same as :func:`forgetting_attn_ref` through ``scaled_dot_product_attention`` with D
    as its additive mask (shapes as there). Queries go ``block`` at a time, each against
    the keys up to its last position only: the causal half of the logits is never formed
    (half the work at long lengths) and the mask is (block x keys), not (L x L)."""
    n_query, n_key = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    c = torch.cumsum(g.float() if g.dtype in (torch.float16, torch.bfloat16) else g, dim=1).transpose(1, 2)
    out = []
    for s in range(0, n_query, block):
        e = min(s + block, n_query)
        last = n_key - n_query + e                            # keys 0 .. last-1 are visible
        i = torch.arange(n_key - n_query + s, last, device=q.device)[:, None]
        j = torch.arange(last, device=q.device)[None, :]
        d = (c[..., i[:, 0], None] - c[..., None, :last]).masked_fill(j > i, float("-inf"))
        out.append(F.scaled_dot_product_attention(qh[:, :, s:e], kh[:, :, :last], vh[:, :, :last],
                                                  attn_mask=d.to(q.dtype), dropout_p=dropout_p, scale=scale))
    return torch.cat(out, dim=2).transpose(1, 2)


def forgetting_attn(q, k, v, g, scale=None, backend: str = "auto", dropout_p: float = 0.0):
    """Dispatch to the backend ``resolve_backend`` picks (shapes as the reference)."""
    b = resolve_backend(backend, q.device.type)
    if b == "fla" and q.shape[1] == k.shape[1] and dropout_p == 0.0:
        return fla_status()[0](q, k, v, g, scale=scale)
    if b == "ref":
        return forgetting_attn_ref(q, k, v, g, scale)
    return forgetting_attn_torch(q, k, v, g, scale, dropout_p)


@dataclass
class FoXState:
    """What step-by-step inference carries: the KV cache (batch, t, heads, d_head) and the
    log forget gates so far (batch, t, heads), whose cumulative sum gives D."""
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor


class ForgettingAttention(nn.Module):
    """(batch, length, d_model) -> same; causal. Projections q, k, v, o (no bias) and the
    forget gate's Linear(d_model, n_heads) with bias."""

    def __init__(self, d_model: int, n_heads: int = 4, dropout: float = 0.0, backend: str = "auto"):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")
        resolve_backend(backend, "cpu")  # an unknown name fails here, not at the first step
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.requested, self.dropout = backend, dropout
        self.backend = "torch" if backend in ("auto", "fla") else backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.fgate = nn.Linear(d_model, n_heads, bias=True)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _project(self, x: torch.Tensor):
        b, length, _ = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.n_heads, self.d_head).unbind(2)
        return q, k, v, F.logsigmoid(self.fgate(x))            # g: (batch, length, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, g = self._project(x)
        self.backend = resolve_backend(self.requested, x.device.type)
        y = forgetting_attn(q, k, v, g, backend=self.backend,
                            dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(y.reshape(x.shape))

    def init_state(self, batch: int) -> FoXState:
        p = self.qkv.weight
        empty = p.new_zeros(batch, 0, self.n_heads, self.d_head)
        return FoXState(empty, empty.clone(), p.new_zeros(batch, 0, self.n_heads))

    def forward_with_state(self, x: torch.Tensor, state: FoXState) -> tuple[torch.Tensor, FoXState]:
        """x: (batch, length, d_model) after the positions in ``state`` -> (y, state with x's
        keys, values and gates appended)."""
        q, k, v, g = self._project(x)
        s = FoXState(torch.cat([state.k, k], 1), torch.cat([state.v, v], 1), torch.cat([state.g, g], 1))
        y = forgetting_attn_torch(q, s.k, s.v, s.g)
        return self.out_proj(y.reshape(x.shape)), s

    def step(self, x_t: torch.Tensor, state: FoXState) -> tuple[torch.Tensor, FoXState]:
        """x_t: (batch, d_model) -> (y_t (batch, d_model), next state)."""
        y, s = self.forward_with_state(x_t[:, None], state)
        return y[:, 0], s

    def state_size(self) -> None:
        return None  # the KV cache grows with the length

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, backend={self.requested!r}"
