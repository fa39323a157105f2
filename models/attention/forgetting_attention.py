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
- :func:`forgetting_attn_step_ref`: the same one query at a time against the KV cache, as
  decoding runs it (the step-by-step reference the fast forms are timed against);
- :func:`forgetting_attn_torch`: PyTorch's fused causal ``scaled_dot_product_attention``
  with the decay folded into one extra head channel (the shift trick below);
- ``cpu``: :mod:`models.kernels.forgetting_attn_cpu`, a flash-style C kernel with a
  hand-written backward (``auto`` on a CPU when it builds; else ``torch``);
- fla's ``parallel_forgetting_attn`` (Triton) on CUDA when installed: picked by ``auto``.

The shift trick. For a fixed query i, c_i is one constant over its keys and softmax ignores
a per-row shift, so softmax_j(s_ij + c_i - c_j) = softmax_j(s_ij - c_j): only a per-KEY bias
-c_j remains, and q'_i = [q_i, 1/scale], k'_j = [k_j, -c_j] give scale q'_i . k'_j =
scale q_i . k_j - c_j. Plain causal attention on (q', k', [v, 0]) is FoX exactly, and
autograd reaches c (so the gates) through k'. In float32 the rounding error of -c_j is
eps |c_j|, and |c| grows with the position (up to L |log f|): so the queries go in blocks,
each with c re-centred at its first position (k'_j = [k_j, c_s - c_j], from a float64 c)
against the keys up to its end under a lower-right causal mask: the pairs that carry weight
then have |c_s - c_j| of one block's decay, and the others (far back) weigh ~exp(-|bias|).

State for step-by-step inference is the KV cache plus the running sum ``c_t``
(:class:`FoXCache`: preallocated and grown in chunks like the Transformer's KVCache, with
its ``CacheFull`` past a limit): it grows with the length (``state_size()`` is None, as for
attention). A decoding step is one query against the cached keys with the bias c_t - c_j.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.attention.attention import CACHE_CHUNK, CacheFull

BACKENDS = ("auto", "torch", "cpu", "ref", "fla")


def fla_status():
    """(fla's parallel_forgetting_attn, None) or (None, why it is unavailable)."""
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except Exception as e:  # not installed, or no Triton / CUDA here
        return None, f"fla's forgetting_attn cannot be imported ({type(e).__name__}: {e})"
    return parallel_forgetting_attn, None


def cpu_status() -> str:
    """"" when the C kernel (backend ``cpu``) is built and loads, else why not."""
    from models.kernels import forgetting_attn_cpu
    return forgetting_attn_cpu.load()[1]


def resolve_backend(backend: str, device_type: str) -> str:
    """The backend that runs for tensors on ``device_type``: ``auto`` is fla on CUDA when
    installed, the C kernel on a CPU when it builds, else ``torch``; ``fla`` or ``cpu``
    where they cannot run is a ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} unknown for forgetting attention; expected one of "
                         f"{', '.join(BACKENDS)}")
    if backend == "fla" or (backend == "auto" and device_type == "cuda"):
        fn, why = fla_status() if device_type == "cuda" else (None, f"tensors on {device_type!r}, fla needs CUDA")
        if fn is not None:
            return "fla"
        if backend == "fla":
            raise ValueError(f"backend 'fla' unavailable: {why}; use 'auto' or 'torch'")
    if backend == "cpu" or (backend == "auto" and device_type == "cpu"):
        why = f"tensors on {device_type!r}, the kernel runs on the CPU" if device_type != "cpu" else cpu_status()
        if not why:
            return "cpu"
        if backend == "cpu":
            raise ValueError(f"backend 'cpu' unavailable: {why}; use 'auto' or 'torch'")
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


def forgetting_attn_step_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             scale: float | None = None) -> torch.Tensor:
    """One query at a time against the keys up to its position, as decoding with a KV
    cache runs (shapes as :func:`forgetting_attn_ref`): the step-by-step reference."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    off = k.shape[1] - q.shape[1]
    c = torch.cumsum(g, dim=1).transpose(1, 2)                    # (batch, heads, n_key)
    # heads first once: a step's keys kh[:, :, :p+1] are then a view autograd saves as is
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    out = []
    for r in range(q.shape[1]):
        p = off + r
        logits = (kh[:, :, :p + 1] @ qh[:, :, r, :, None])[..., 0] * scale \
            + (c[..., p:p + 1] - c[..., :p + 1])                  # + c_p - c_j
        out.append((torch.softmax(logits, dim=-1)[:, :, None] @ vh[:, :, :p + 1])[:, :, 0])
    return torch.stack(out, dim=1)


QUERY_BLOCK = 256


def forgetting_attn_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          scale: float | None = None, dropout_p: float = 0.0,
                          block: int = QUERY_BLOCK) -> torch.Tensor:
    """Same as :func:`forgetting_attn_ref` by the shift trick (module doc): fused causal
    ``scaled_dot_product_attention`` on q' = [q, 1/scale], k' = [k, c_s - c_j], v' = [v, 0],
    ``block`` queries at a time, c re-centred at each block's first position s (float64
    cumulative sum). The first block of a full sequence is square (``is_causal``); the
    others see the keys up to their end under a lower-right causal mask. Shapes as there."""
    n_query, n_key, d = q.shape[1], k.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    off = n_key - n_query                                         # position of query 0
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    c = torch.cumsum(g.to(torch.float64), dim=1).transpose(1, 2)  # (batch, heads, n_key)
    q1 = torch.cat([qh, qh.new_full((*qh.shape[:-1], 1), 1.0 / scale)], dim=-1)
    v1 = F.pad(vh, (0, 1))
    out = []
    for s in range(0, n_query, block):
        e = min(s + block, n_query)
        first, last = off + s, off + e                            # keys 0 .. last-1 are visible
        bias = (c[..., first:first + 1] - c[..., :last]).to(q.dtype)[..., None]   # c_s - c_j
        k1 = torch.cat([kh[:, :, :last], bias], dim=-1)
        if first == 0:                                            # square: plain causal
            o = F.scaled_dot_product_attention(q1[:, :, s:e], k1, v1[:, :, :last], is_causal=True,
                                               dropout_p=dropout_p, scale=scale)
        else:
            i = torch.arange(first, last, device=q.device)[:, None]
            mask = torch.zeros(e - s, last, dtype=q.dtype, device=q.device).masked_fill(
                torch.arange(last, device=q.device)[None, :] > i, float("-inf"))
            o = F.scaled_dot_product_attention(q1[:, :, s:e], k1, v1[:, :, :last], attn_mask=mask,
                                               dropout_p=dropout_p, scale=scale)
        out.append(o[..., :d])
    return torch.cat(out, dim=2).transpose(1, 2)


def forgetting_attn(q, k, v, g, scale=None, backend: str = "auto", dropout_p: float = 0.0):
    """Dispatch to the backend ``resolve_backend`` picks (shapes as the reference). The C
    kernel has no dropout: a training step with dropout goes to ``torch``."""
    b = resolve_backend(backend, q.device.type)
    if b == "fla" and q.shape[1] == k.shape[1] and dropout_p == 0.0:
        return fla_status()[0](q, k, v, g, scale=scale)
    if b == "ref":
        return forgetting_attn_ref(q, k, v, g, scale)
    if b == "cpu" and dropout_p == 0.0:
        from models.kernels.forgetting_attn_cpu import forgetting_attn_cpu, unsupported
        if not unsupported(q):
            return forgetting_attn_cpu(q, k, v, g, scale)
    return forgetting_attn_torch(q, k, v, g, scale, dropout_p)


class FoXCache:
    """One Forgetting Attention layer's decoding state: its keys, values and the running
    sum of its log forget gates so far, preallocated and grown as the Transformer's
    :class:`~models.attention.attention.KVCache` is (one copy every CACHE_CHUNK positions,
    not a ``torch.cat`` per token), with the same :class:`CacheFull` past ``limit``.

    ``k``, ``v``: (batch, heads, capacity, d_head), positions 0 .. ``length``-1 filled;
    ``c``: (batch, heads, capacity) float64, c_t = sum_{l <= t} log f_l (the decay bias of
    query i and key j is c_i - c_j; float64 as :func:`forgetting_attn_torch` sums it, since
    |c| grows with the position while the differences that carry weight stay small)."""

    __slots__ = ("k", "v", "c", "length", "limit")

    def __init__(self, batch: int, heads: int, d_head: int, capacity: int = 0, device=None,
                 dtype=None, limit: int | None = None):
        capacity = min(capacity, limit) if limit is not None else capacity
        self.k = torch.zeros(batch, heads, capacity, d_head, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.c = torch.zeros(batch, heads, capacity, device=device, dtype=torch.float64)
        self.length, self.limit = 0, limit

    def append(self, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor):
        """Add (batch, heads, L, d_head) keys and values and (batch, heads, L) log gates
        after the cached ones -> views of all keys, values and running sums so far."""
        n, L = self.length, k.shape[2]
        need = n + L
        if self.limit is not None and need > self.limit:
            raise CacheFull(f"the forgetting attention cache holds at most {self.limit:,} positions: "
                            f"{n:,} cached + {L:,} new = {need:,}")
        if need > self.k.shape[2]:
            cap = -(-need // CACHE_CHUNK) * CACHE_CHUNK
            cap = min(cap, self.limit) if self.limit is not None else cap
            grown = [t.new_zeros(*t.shape[:2], cap, *t.shape[3:]) for t in (self.k, self.v, self.c)]
            for new, old in zip(grown, (self.k, self.v, self.c)):
                new[:, :, :n] = old[:, :, :n]
            self.k, self.v, self.c = grown
        self.k[:, :, n:need] = k
        self.v[:, :, n:need] = v
        c = torch.cumsum(g.to(torch.float64), dim=-1)
        if n:
            c = c + self.c[:, :, n - 1:n]
        self.c[:, :, n:need] = c
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need], self.c[:, :, :need]

    def nbytes(self) -> int:
        """Bytes of the positions filled (keys, values and running sums)."""
        n = self.length
        return sum(t[:, :, :n].numel() * t.element_size() for t in (self.k, self.v, self.c))


class ForgettingAttention(nn.Module):
    """(batch, length, d_model) -> same; causal. Projections q, k, v, o (no bias) and the
    forget gate's Linear(d_model, n_heads) with bias."""

    def __init__(self, d_model: int, n_heads: int = 4, dropout: float = 0.0, backend: str = "auto"):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be >= 1 and divide d_model={d_model}")
        # an unknown name fails here, not at the first step; the backend a CPU would use
        self.backend = resolve_backend(backend, "cpu")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.requested, self.dropout = backend, dropout
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

    def init_state(self, batch: int, capacity: int = 0, limit: int | None = None) -> FoXCache:
        """An empty :class:`FoXCache` for ``batch`` sequences: room for ``capacity``
        positions now (grown in chunks as it fills), never more than ``limit``."""
        p = self.qkv.weight
        return FoXCache(batch, self.n_heads, self.d_head, capacity, p.device, p.dtype, limit)

    def forward_with_state(self, x: torch.Tensor, cache: FoXCache) -> tuple[torch.Tensor, FoXCache]:
        """x: (batch, length, d_model) after the positions in ``cache`` -> (y, the cache with
        x's keys, values and gates added in place). The first chunk (a prompt) runs the
        layer's own operator, as :meth:`forward` does; a later chunk or token attends to
        the cached keys under the bias c_i - c_j (-inf above the causal diagonal) through
        ``scaled_dot_product_attention``: one query per token against the cache, no copy of it."""
        b, L, _ = x.shape
        q, k, v, g = self._project(x)
        n = cache.length
        keys, values, c = cache.append(k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2))
        if n == 0:
            y = forgetting_attn(q, k, v, g, backend=resolve_backend(self.requested, x.device.type))
            return self.out_proj(y.reshape(x.shape)), cache
        bias = c[:, :, n:, None] - c[:, :, None, :]                 # (batch, heads, L, n + L): c_i - c_j
        if L > 1:   # a chunk after cached positions: query i sees keys <= n + i
            above = (torch.arange(n + L, device=x.device)[None, :]
                     > torch.arange(n, n + L, device=x.device)[:, None])
            bias = bias.masked_fill(above, float("-inf"))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=bias.to(q.dtype))
        return self.out_proj(y.transpose(1, 2).reshape(x.shape)), cache

    def step(self, x_t: torch.Tensor, cache: FoXCache) -> tuple[torch.Tensor, FoXCache]:
        """x_t: (batch, d_model) -> (y_t (batch, d_model), the cache one position longer)."""
        y, cache = self.forward_with_state(x_t[:, None], cache)
        return y[:, 0], cache

    def state_size(self) -> None:
        return None  # the KV cache grows with the length

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, backend={self.requested!r}"


OPS = ("forgetting_attn",)   # bench --ops: the operator alone


def get_op(name: str, backend: str, device_type: str = "cpu"):
    """(fn(q, k, v, g) -> o, resolved backend) for bench --ops; ``ref`` is the step-by-step
    reference (:func:`forgetting_attn_step_ref`), the others as :func:`resolve_backend`."""
    if name not in OPS:
        raise KeyError(f"unknown forgetting-attention op {name!r}; known: {', '.join(OPS)}")
    if backend == "ref":
        return forgetting_attn_step_ref, "ref"
    resolved = resolve_backend(backend, device_type)
    return (lambda q, k, v, g: forgetting_attn(q, k, v, g, backend=resolved)), resolved


def make_inputs(batch: int, L: int, heads: int, dim: int, dtype=torch.float32, seed: int = 0,
                device="cpu", gate_range: tuple[float, float] = (-0.5, 0.0)) -> list[torch.Tensor]:
    """Random leaves requiring grad: q, k, v (batch, L, heads, dim) and log forget gates
    (batch, L, heads) uniform in ``gate_range``."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = gate_range
    t = [torch.randn(batch, L, heads, dim, generator=gen, dtype=dtype) for _ in range(3)]
    t.append(lo + (hi - lo) * torch.rand(batch, L, heads, generator=gen, dtype=dtype))
    return [x.to(device).requires_grad_() for x in t]
