"""Which implementation of a linear-RNN operator runs: ``auto | torch | ref | fla | cpu``.

The operators are those of :mod:`models.kernels.linear_rnn_ops`' ``ALL_OPS`` (``linear_attention``,
``simple_gla``, ``gla``, ``delta_rule``, ``gated_delta_rule``, ``gated_delta_product``) and
of :mod:`models.kernels.generalized_delta` (``rwkv7``, ``kda``; their C form is
:mod:`models.kernels.generalized_delta_cpu`), all
with fla's argument convention, so one call site serves every backend. Grouped value heads
(v with a multiple of q/k's heads) run on every backend: the chunked and C forms and the
fla wrappers repeat q and k to v's heads.

- ``torch``: the chunkwise-parallel PyTorch form (CPU and GPU).
- ``cpu``:   the recurrence in C with a hand-written backward (:mod:`models.kernels.linear_rnn_cpu`;
  rwkv7 and kda: :mod:`models.kernels.generalized_delta_cpu`, 12-25x ``ref`` at L = 4096;
  built with the system C compiler on first use); CPU tensors only. The default on a CPU
  when it builds: at L = 4096 (batch 8, 4 heads of 32, two threads) forward + backward
  21-31x faster than ``ref`` and 1.8-5.3x faster than ``torch``, with 2.5-4.3x less
  memory: it keeps one state per 64 steps for the backward instead of the chunks'
  matrices (docs/RESULTS.md).
- ``ref``:   the step-by-step ``*_ref`` oracle (slow; for checking).
- ``fla``:   flash-linear-attention's Triton ``chunk_*`` kernels (the optional
  ``flash-linear-attention`` / ``fla-core`` package). CUDA tensors only: fla on a CPU is
  import-only (its kernels are Triton GPU kernels).
- ``auto``:  ``fla`` on CUDA tensors when fla imports, else ``torch``; on CPU tensors ``cpu``
  when the C kernels build, else ``torch``.

A layer resolves its backend once per forward from the device of its input (a model moved
between devices follows) and reports the resolved name as ``backend``, which the worker
records with the run and ``doctor`` prints.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from models.kernels import delta_product, linear_rnn, linear_rnn_ops

BACKENDS = ("auto", "torch", "ref", "fla", "cpu")

# our operator name -> (fla module, fla function)
_FLA_NAMES = {
    "linear_attention": ("fla.ops.linear_attn", "chunk_linear_attn"),
    "simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "gla": ("fla.ops.gla", "chunk_gla"),
    "delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
    "gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "gated_delta_product": ("fla.ops.gated_delta_product", "chunk_gated_delta_product"),
    # models.kernels.generalized_delta (C form: models.kernels.generalized_delta_cpu)
    "rwkv7": ("fla.ops.generalized_delta_rule", "chunk_dplr_delta_rule"),
    "kda": ("fla.ops.kda", "chunk_kda"),
}


class BackendError(ValueError):
    """A backend that cannot run here (named, with the reason)."""


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


@functools.lru_cache(maxsize=None)
def fla_status() -> tuple[bool, str]:
    """(usable, one line): whether flash-linear-attention imports and a CUDA GPU is present."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False, "torch missing"
    try:
        import fla  # noqa: F401
        version = getattr(fla, "__version__", "?")
    except Exception as exc:  # ImportError, or a Triton failure at import
        return False, f"flash-linear-attention not importable ({type(exc).__name__}: {exc})".split("\n")[0]
    if not torch.cuda.is_available():
        return False, f"flash-linear-attention {version} installed, but no CUDA GPU (its kernels are Triton GPU kernels)"
    return True, f"flash-linear-attention {version} on {torch.cuda.get_device_name(0)}"


def cpu_status() -> tuple[bool, str]:
    """(usable, one line): whether the C kernels of backend ``cpu`` build and load here."""
    from models.kernels import linear_rnn_cpu

    if linear_rnn_cpu.available():
        return True, "C kernels built (models/kernels/csrc)"
    return False, linear_rnn_cpu.unavailable_reason()


def resolve(backend: str, device_type: str) -> str:
    """The backend that runs for tensors on ``device_type`` ("cpu", "cuda", ...)."""
    check_backend(backend)
    if backend == "auto":
        if device_type == "cuda":
            return "fla" if fla_status()[0] else "torch"
        return "cpu" if device_type == "cpu" and cpu_status()[0] else "torch"
    if backend == "cpu":
        if device_type != "cpu":
            raise BackendError(f"backend 'cpu' runs on CPU tensors only; these are on "
                               f"{device_type!r}: use 'auto' or 'torch'")
        ok, why = cpu_status()
        if not ok:
            raise BackendError(f"backend 'cpu' unavailable: {why}; use 'auto' or 'torch'")
    if backend == "fla":
        if device_type != "cuda":
            raise BackendError("backend 'fla' runs on CUDA tensors only (fla's kernels are "
                               f"Triton GPU kernels); these are on {device_type!r}: use 'auto' or 'torch'")
        ok, why = fla_status()
        if not ok:
            raise BackendError(f"backend 'fla' unavailable: {why}; install flash-linear-attention "
                               "(the optional extra) or use 'auto' / 'torch'")
    return backend


def _fla_op(name: str) -> Callable:
    import importlib

    module, fn_name = _FLA_NAMES[name]
    fn = getattr(importlib.import_module(module), fn_name)
    if name == "linear_attention":
        # fla normalises by default (q^T sum k); ours is the un-normalised form
        return functools.partial(fn, normalize=False)
    if name == "gated_delta_product":
        return functools.partial(_fla_delta_product, fn, _fla_op("delta_rule"),
                                 _fla_op("gated_delta_rule"))
    if name == "rwkv7":
        return _fla_dplr(fn)
    return _with_value_groups(fn)


def _with_value_groups(fn: Callable) -> Callable:
    """fla's op with q, k repeated to v's heads first (grouped value heads: not every fla
    release's kernels take more value heads than q/k heads)."""
    @functools.wraps(fn)
    def run(q, k, v, *args, **kwargs):
        q, k = linear_rnn.expand_heads(q, k, v)
        return fn(q, k, v, *args, **kwargs)
    return run


def _fla_dplr(fn: Callable) -> Callable:
    """fla's ``chunk_dplr_delta_rule`` (what its ``chunk_rwkv7`` calls) with our rwkv7's
    positional order (q, k, v, a, b, gk) passed by keyword and rwkv7's default scale 1."""
    def run(q, k, v, a, b, gk, scale=1.0, initial_state=None, output_final_state=False,
            **kwargs):
        return fn(q=q, k=k, v=v, a=a, b=b, gk=gk, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, **kwargs)
    return run


def _fla_delta_product(product_fn, delta_fn, gated_fn, q, k, v, g, beta, num_householder=None,
                       **kwargs):
    """fla's ``chunk_gated_delta_product`` where it runs (half / bfloat16 inputs, a decay g,
    one head count: it asserts all three), else fla's delta-rule kernels on the interleaved
    sequence (``delta_product.delta_product_via``), which is what its forward does."""
    n = delta_product._householder_steps(q, k, v, beta, num_householder)
    if g is not None and q.dtype in (torch.float16, torch.bfloat16) and v.shape[2] == q.shape[2]:
        return product_fn(q, k, v, g, beta, n, **kwargs)
    return delta_product.delta_product_via(delta_fn, gated_fn, q, k, v, g, beta, n, **kwargs)


def get_op(name: str, backend: str, device_type: str = "cpu") -> tuple[Callable, str]:
    """(operator, resolved backend name) for op ``name`` on ``device_type``."""
    from models.kernels import generalized_delta

    known = {**linear_rnn_ops.ALL_OPS, **generalized_delta.OPS}
    if name not in known:
        raise KeyError(f"unknown linear-RNN op {name!r}; known: {', '.join(known)}")
    if name in generalized_delta.OPS:                  # rwkv7, kda: C form in their own module
        chosen = resolve(backend, device_type)
        if chosen == "fla":
            return _fla_op(name), chosen
        if chosen == "cpu":
            from models.kernels import generalized_delta_cpu

            return generalized_delta_cpu.OPS[name], chosen
        chunked, ref = generalized_delta.OPS[name]
        return (ref if chosen == "ref" else chunked), chosen
    chosen = resolve(backend, device_type)
    chunked, ref = linear_rnn_ops.ALL_OPS[name][:2]
    if chosen == "fla":
        return _fla_op(name), chosen
    if chosen == "cpu":
        from models.kernels import linear_rnn_cpu

        return linear_rnn_cpu.OPS[name], chosen
    return (ref if chosen == "ref" else chunked), chosen
