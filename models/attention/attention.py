"""Causal multi-head self-attention and the position encodings it uses.

Positions (``pos``):

- ``"absolute"``: sinusoidal positions (Vaswani et al. 2017) added to the *input* of the
  network once; handled by the backbone (``models.attention.transformer``), not inside attention.
  :func:`sinusoidal_positions` builds them.
- ``"rope"``: rotary embedding (Su et al. 2021, RoFormer). Channel pair i of q and k at
  position n is rotated by the angle n * theta_i, theta_i = base^(-2i/d_head). Then
  q_m . k_n = Re[sum_i q_i conj(k_i) e^{i (m - n) theta_i}] depends on m - n only.
- ``"xpos"``: RoPE times an exponential decay (Sun et al. 2022, "A Length-Extrapolatable
  Transformer"): pair i of q at position n is further scaled by zeta_i^(n / scale_base) and
  of k by zeta_i^(-n / scale_base), with zeta_i = (i / (d_head/2) + gamma) / (1 + gamma),
  gamma = 0.4, scale_base = 512. In q_m . k_n the scales multiply to zeta_i^((m - n) /
  scale_base): still a function of m - n only, and < 1 for m > n (distant keys decay).
- ``"none"``: no positions inside attention.

The causal mask is always applied (``scaled_dot_product_attention(is_causal=True)``):
xPos only rescales q and k before the product, so it needs no custom mask.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION_POSITIONS = ("rope", "xpos", "none")


def sinusoidal_positions(
    length: int, d: int, offset: int = 0, device=None, dtype=torch.float32
) -> torch.Tensor:
    """Sinusoidal absolute positions, (length, d).

    PE[n, 2i] = sin(n / 10000^(2i/d)), PE[n, 2i+1] = cos(n / 10000^(2i/d)). An odd d gets
    one extra sine channel.
    """
    n = torch.arange(offset, offset + length, device=device, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, device=device, dtype=torch.float64)
    angle = n * torch.exp(-math.log(10000.0) * i / d)          # (length, ceil(d/2))
    pe = torch.zeros(length, d, device=device, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe.to(dtype)


class Rotary(nn.Module):
    """RoPE, optionally with the xPos decay, applied to q or k of shape (..., length, d_head).

    Channel pairs are (x[..., j], x[..., j + d_head/2]) for j < d_head/2 (the "half-split"
    layout); which channels are paired does not matter for the maths, only consistency.
    """

    def __init__(self, d_head: int, base: float = 10000.0, xpos: bool = False,
                 gamma: float = 0.4, scale_base: float = 512.0):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {d_head}")
        half = d_head // 2
        i = torch.arange(half, dtype=torch.float64)
        # theta_i = base^(-2i / d_head)
        self.register_buffer("theta", base ** (-2.0 * i / d_head), persistent=False)
        # zeta_i = (i / (d_head/2) + gamma) / (1 + gamma), in (gamma/(1+gamma), 1)
        self.register_buffer("zeta", (i / half + gamma) / (1.0 + gamma), persistent=False)
        self.xpos = xpos
        self.scale_base = scale_base

    def forward(self, x: torch.Tensor, positions: torch.Tensor, is_key: bool = False,
                centre: float = 0.0) -> torch.Tensor:
        """x: (..., length, d_head); positions: (length,) integers -> same shape as x.

        ``centre`` is subtracted from the positions in the xPos scale only: it multiplies q
        by zeta^(-centre/s) and k by zeta^(+centre/s), which cancels in every q . k, and keeps
        zeta^(+-n/s) near 1 on long sequences (zeta^(-4096/512) is already ~2e4).
        """
        pos = positions.to(torch.float64)[:, None]                 # (length, 1)
        angle = pos * self.theta                                   # (length, half)
        cos = torch.cos(angle).to(x.dtype)
        sin = torch.sin(angle).to(x.dtype)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        # (x1 + i x2) * e^{i angle}
        r1 = x1 * cos - x2 * sin
        r2 = x1 * sin + x2 * cos
        if self.xpos:
            sign = -1.0 if is_key else 1.0
            scale = (self.zeta ** (sign * (pos - centre) / self.scale_base)).to(x.dtype)
            r1, r2 = r1 * scale, r2 * scale
        return torch.cat([r1, r2], dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: (batch, length, d_model) -> same shape.

    ``pos`` in {"rope", "xpos", "none"} says what happens to q and k; absolute positions are
    added outside (see module docstring). Output at t depends only on inputs at <= t.
    """

    backend = "torch"

    def __init__(self, d_model: int, n_heads: int = 4, pos: str = "rope", dropout: float = 0.0,
                 bias: bool = False, rope_base: float = 10000.0, xpos_scale_base: float = 512.0,
                 xpos_gamma: float = 0.4, scale: float | None = None):
        """``scale``: factor on q.k before the softmax; None = 1/sqrt(d_head). GPT-Neo
        uses 1.0 (Hugging Face's GPTNeoSelfAttention does not scale its scores)."""
        super().__init__()
        if scale is not None and not scale > 0:
            raise ValueError(f"attention scale must be > 0, got {scale!r}")
        self.scale = scale
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(
                f"n_heads={n_heads} must be >= 1 and divide d_model={d_model} "
                f"(each head gets d_model / n_heads channels)"
            )
        if pos not in ATTENTION_POSITIONS:
            raise ValueError(f"unknown attention positions {pos!r}; expected one of "
                             f"{', '.join(ATTENTION_POSITIONS)}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.pos = pos
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = (
            Rotary(self.d_head, rope_base, xpos=(pos == "xpos"), gamma=xpos_gamma,
                   scale_base=xpos_scale_base)
            if pos in ("rope", "xpos") else None
        )

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model).

        ``offset`` is the position of x[:, 0] (positions offset .. offset+length-1); with
        RoPE / xPos the output does not depend on it (only differences of positions enter).
        """
        b, length, _ = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.n_heads, self.d_head).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))           # (batch, heads, length, d_head)
        if self.rotary is not None:
            positions = torch.arange(offset, offset + length, device=x.device)
            centre = offset + length / 2
            q = self.rotary(q, positions, is_key=False, centre=centre)
            k = self.rotary(k, positions, is_key=True, centre=centre)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
        )                                                          # (batch, heads, length, d_head)
        y = y.transpose(1, 2).reshape(b, length, self.d_model)
        return self.out_proj(y)

    def state_size(self) -> None:
        # The KV cache grows with the sequence: no fixed-size recurrent state.
        return None

    # -- decoding with a key/value cache -------------------------------------------------
    def init_state(self, batch: int, capacity: int = 0, limit: int | None = None) -> "KVCache":
        """An empty :class:`KVCache` for ``batch`` sequences, room for ``capacity`` positions
        now (it grows in chunks of CACHE_CHUNK as it fills), never more than ``limit``."""
        p = self.qkv.weight
        return KVCache(batch, self.n_heads, self.d_head, capacity, p.device, p.dtype, limit)

    def forward_with_state(self, x: torch.Tensor, cache: "KVCache") -> tuple[torch.Tensor, "KVCache"]:
        """x: (batch, length, d_model), the positions after the ``cache.length`` already
        cached -> (y (batch, length, d_model), the cache with x's keys and values added).

        Equal to :meth:`forward` over the whole sequence, restricted to x's positions. The
        cache is updated in place (its buffers are preallocated) and returned. xPos's
        centre is fixed by the first chunk (its middle, as :meth:`forward` takes it): every
        later query and key is scaled about the same centre, so it cancels in q . k."""
        b, length, _ = x.shape
        n = cache.length
        q, k, v = self.qkv(x).view(b, length, 3, self.n_heads, self.d_head).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))           # (batch, heads, length, d_head)
        if self.rotary is not None:
            if cache.centre is None:
                cache.centre = n + length / 2
            positions = torch.arange(n, n + length, device=x.device)
            q = self.rotary(q, positions, is_key=False, centre=cache.centre)
            k = self.rotary(k, positions, is_key=True, centre=cache.centre)
        keys, values = cache.append(k, v)                          # (batch, heads, n + length, d_head)
        if n == 0:         # the prompt: the same call as forward's
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        elif length == 1:  # one new token sees every cached key: no mask
            y = F.scaled_dot_product_attention(q, keys, values, scale=self.scale)
        else:              # a chunk after cached positions: query i sees keys <= n + i
            mask = (torch.arange(n + length, device=x.device)[None, :]
                    <= torch.arange(n, n + length, device=x.device)[:, None])
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        y = y.transpose(1, 2).reshape(b, length, self.d_model)
        return self.out_proj(y), cache

    def step(self, x_t: torch.Tensor, cache: "KVCache | StaticKV") -> tuple[torch.Tensor, "KVCache | StaticKV"]:
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), the cache one longer)."""
        if isinstance(cache, StaticKV):
            return self._static_step(x_t, cache), cache
        y, cache = self.forward_with_state(x_t[:, None, :], cache)
        return y[:, 0], cache

    def _static_step(self, x_t: torch.Tensor, cache: "StaticKV") -> torch.Tensor:
        """:meth:`step` on a :class:`StaticKV`: the same arithmetic with the position a
        tensor, written in place, and the query masked to the filled slots, so no shape
        and no Python value depends on the position (what a CUDA graph needs)."""
        b = x_t.shape[0]
        q, k, v = self.qkv(x_t).view(b, 3, self.n_heads, self.d_head, 1).unbind(1)
        q, k, v = (t.transpose(2, 3) for t in (q, k, v))           # (batch, heads, 1, d_head)
        if self.rotary is not None:
            q = self.rotary(q, cache.length, is_key=False, centre=cache.centre)
            k = self.rotary(k, cache.length, is_key=True, centre=cache.centre)
        cache.k.index_copy_(2, cache.length, k)
        cache.v.index_copy_(2, cache.length, v)
        seen = (torch.arange(cache.k.shape[2], device=x_t.device) <= cache.length)[None]   # (1, capacity)
        y = F.scaled_dot_product_attention(q, cache.k, cache.v, attn_mask=seen, scale=self.scale)
        cache.length.add_(1)
        return self.out_proj(y.reshape(b, self.d_model))


CACHE_CHUNK = 256   # positions a KVCache grows by (rounded up to) when it is full


class CacheFull(ValueError):
    """A KV cache asked to hold more positions than its limit; the message is one line."""


class KVCache:
    """One attention layer's keys and values so far, for decoding token by token.

    ``k``, ``v``: preallocated (batch, heads, capacity, d_head) buffers; positions
    0 .. ``length``-1 hold the keys (after RoPE / xPos) and values seen. A full buffer is
    replaced by one rounded up to the next multiple of CACHE_CHUNK positions (one copy
    every CACHE_CHUNK tokens, not a ``torch.cat`` per token). ``limit`` (None: none) is
    the most positions it may hold (a position table's length): past it :meth:`append`
    raises :class:`CacheFull`. ``centre`` is the xPos centre fixed by the first chunk.
    """

    __slots__ = ("k", "v", "length", "limit", "centre")

    def __init__(self, batch: int, heads: int, d_head: int, capacity: int = 0, device=None,
                 dtype=None, limit: int | None = None):
        capacity = min(capacity, limit) if limit is not None else capacity
        self.k = torch.zeros(batch, heads, capacity, d_head, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length, self.limit, self.centre = 0, limit, None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add (batch, heads, L, d_head) keys and values after the cached ones -> views of
        all keys and values so far, (batch, heads, length, d_head)."""
        n, L = self.length, k.shape[2]
        need = n + L
        if self.limit is not None and need > self.limit:
            raise CacheFull(f"the key/value cache holds at most {self.limit:,} positions (max_len): "
                            f"{n:,} cached + {L:,} new = {need:,}")
        if need > self.k.shape[2]:
            cap = -(-need // CACHE_CHUNK) * CACHE_CHUNK
            cap = min(cap, self.limit) if self.limit is not None else cap
            k_new = self.k.new_zeros(*self.k.shape[:2], cap, self.k.shape[3])
            v_new = torch.zeros_like(k_new)
            k_new[:, :, :n] = self.k[:, :, :n]
            v_new[:, :, :n] = self.v[:, :, :n]
            self.k, self.v = k_new, v_new
        self.k[:, :, n:need] = k
        self.v[:, :, n:need] = v
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values held, (batch, heads, length, d_head) each (views)."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def nbytes(self) -> int:
        """Bytes of the keys and values held (the positions filled, not the buffer's spare room)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


class StaticKV(NamedTuple):
    """One attention layer's keys and values in buffers of a fixed size, for decoding
    through a CUDA graph (``workbench.train.decode.graphed_step``): every field a tensor
    whose shape never changes, the position included, so one captured step replays for
    every token.

    ``k``, ``v``: (batch, heads, capacity, d_head), slots 0 .. length-1 filled;
    ``length``: (1,) long, the next slot; ``centre``: () float64, xPos's centre (0 without
    xPos). Built from a :class:`KVCache` by :func:`static_kv`. A step attends over all
    ``capacity`` slots with the empty ones masked, so it costs the capacity, not the length
    (HF's StaticCache trades the same way); it cannot grow, and a step past ``capacity``
    fails (an index error on a CPU, a device assert on CUDA): the caller sizes it for the
    tokens it will generate."""

    k: torch.Tensor
    v: torch.Tensor
    length: torch.Tensor
    centre: torch.Tensor


def static_kv(cache: KVCache, capacity: int) -> StaticKV:
    """``cache``'s keys and values copied into a :class:`StaticKV` with room for
    ``capacity`` positions in all (at least the cached ones; at most its limit)."""
    n = cache.length
    if capacity < n or (cache.limit is not None and capacity > cache.limit):
        raise CacheFull(f"a static key/value cache of {capacity:,} positions cannot hold the {n:,} cached"
                        + (f" within the limit of {cache.limit:,}" if cache.limit is not None else ""))
    k = cache.k.new_zeros(*cache.k.shape[:2], capacity, cache.k.shape[3])
    v = torch.zeros_like(k)
    k[:, :, :n], v[:, :, :n] = cache.tensors()
    device = cache.k.device
    return StaticKV(k, v, torch.tensor([n], device=device),
                    torch.tensor(float(cache.centre or 0.0), dtype=torch.float64, device=device))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d, mult*d) -> GELU -> Linear(mult*d, d)."""

    backend = "torch"

    def __init__(self, d_model: int, mult: int = 4, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, mult * d_model)
        self.fc2 = nn.Linear(mult * d_model, d_model)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> same shape; no mixing across positions."""
        return self.fc2(self.drop(F.gelu(self.fc1(x))))

    # stateless in decoding: the same map per position (for the Transformer's per-layer chain)
    def init_state(self, batch: int, *_, **__) -> tuple:
        return ()

    def forward_with_state(self, x: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        return self(x), state

    def step(self, x_t: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        return self(x_t), state

    def state_size(self) -> int:
        return 0
