"""The linear-RNN family's operator table: ``ALL_OPS``, the five operators of
:mod:`models.kernels.linear_rnn` (``OPS``) and Gated DeltaProduct of
:mod:`models.kernels.delta_product` (``PRODUCT_OPS``), name -> (chunked, ref, gate, needs
beta); and :func:`make_inputs`, random arguments for any of them (tests, benchmarks).

It sits above both modules (each imports neither this one nor the other's table), so the
chain is one way: linear_rnn <- delta_product <- linear_rnn_ops.
"""
from __future__ import annotations

import torch

from models.kernels.delta_product import PRODUCT_OPS
from models.kernels.linear_rnn import OPS, _l2norm

__all__ = ["ALL_OPS", "make_inputs"]

# name -> (chunked, ref, needs g ("scalar" | "vector" | None), needs beta), as OPS
ALL_OPS = {**OPS, **PRODUCT_OPS}


def make_inputs(name, batch=2, time=37, heads=2, key_dim=8, value_dim=8, dtype=torch.float64,
                gate_range=(-1.0, 0.0), seed=0, device="cpu", requires_grad=True,
                num_householder=2, value_heads=None, beta_range=(0.0, 1.0)):
    """Random positional arguments for op ``name`` of ``ALL_OPS``: (q, k, v[, g][, beta]),
    keys L2-normalised for the delta rules, g uniform in gate_range, beta uniform in
    beta_range ((0, 2) reaches negative eigenvalues). Product ops: k, v, beta with time *
    num_householder rows. value_heads (default heads): v, g, beta's heads (grouped value
    heads when more)."""
    gen = torch.Generator().manual_seed(seed)
    _, _, gate, needs_beta = ALL_OPS[name]
    B, T, H, K, V = batch, time, heads, key_dim, value_dim
    HV = heads if value_heads is None else value_heads
    Tn = T * num_householder if name in PRODUCT_OPS else T
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, Tn, H, K, generator=gen, dtype=dtype)
    if needs_beta:
        k = _l2norm(k)
    args = [q, k, torch.randn(B, Tn, HV, V, generator=gen, dtype=dtype)]
    if gate is not None:
        shape = (B, T, HV, K) if gate == "vector" else (B, T, HV)
        lo, hi = gate_range
        args.append(lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype))
    if needs_beta:
        lo, hi = beta_range
        args.append(lo + (hi - lo) * torch.rand(B, Tn, HV, generator=gen, dtype=dtype))
    return [a.to(device).requires_grad_(requires_grad) for a in args]
