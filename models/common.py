"""Pieces shared by every backbone: norms and the pre-norm residual stack.

Every backbone in the registry is, unless a documented option says otherwise,

    x -> [x + mixer_i(norm_i(x)) for i in 1..n_layers] -> final norm

where ``mixer_i`` maps (batch, length, d_model) -> (batch, length, d_model) causally.

Also here, for the families to share: :func:`recomputed` (non-reentrant activation
checkpointing: only a piece's inputs are kept for the backward) and
:func:`recomputed_in_slices` (the same, computed a slice of steps at a time in the forward
and again in the backward, so a wide piece's intermediates exist one slice at a time), and
:func:`causal_conv`, the short causal depthwise conv of Mamba-2 and the delta rules, and
:func:`take_whole`, the one rule by which a layer takes its small-chunk path (which the
resource estimate's probe records and forces: :class:`whole_choices`).
"""
from __future__ import annotations

import contextvars
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def recomputed(fn: Callable, *args):
    """fn(*args) -> one tensor, keeping only ``args`` for the backward and recomputing fn's
    intermediates there when autograd records; else plain fn(*args).

    For cheap, wide pieces (norms, gates, short convolutions): each keeps one or two
    (batch, length, width) intermediates that at batch 8, L = 16384 cost 32-130 MiB per
    layer (``scripts/memprobe.py --saved``), against one more elementwise pass in the
    backward. fn must be deterministic (no dropout) and take every tensor it needs a
    gradient for (parameters included) as an argument: gradients reach ``args`` only.
    (Not torch.utils.checkpoint: its first call costs ~1 s and ~120 MiB of imports.)"""
    if _records(args):
        return _Recompute.apply(fn, None, *args)
    return fn(*args)


SLICE_LEN = 1024   # steps per slice of recomputed_in_slices (its forward and its backward)


def recomputed_in_slices(fn: Callable, n_timed: int, halo: int, *args):
    """fn(0, *args) -> one tensor (batch, L, ...), kept and recomputed as :func:`recomputed`
    does, but computed SLICE_LEN steps at a time, in the forward and again in the
    backward, so fn's intermediates (a gated norm's five or six (batch, L, width) tensors:
    300-600 MiB per layer at batch 8, L = 16384) live one slice at a time.

    The first ``n_timed`` args are per-step tensors (batch, L, ...); the rest (parameters,
    a conv's left context, ...) are passed whole. For the slice of steps [s, e) fn is
    called as ``fn(h, *sliced)`` with the per-step args' steps [s - h, e), h = min(halo, s)
    steps of context before the slice, and must return the output's steps [s, e) only:
    halo 0 for position-wise pieces, d_conv - 1 for a causal conv (whose left context, an
    arg, applies when h = 0, at the start of the sequence). Gradients are the same sums
    as :func:`recomputed`'s, added up over the slices."""
    if _records(args):
        return _Recompute.apply(fn, (n_timed, halo), *args)
    return _sliced_call(fn, n_timed, halo, args)


def _slices(L: int, halo: int):
    """(a, s, e) per slice [s, e) of SLICE_LEN steps, a = s - min(halo, s): its context."""
    for s in range(0, L, SLICE_LEN):
        yield max(0, s - halo), s, min(L, s + SLICE_LEN)


def _sliced_call(fn, n_timed, halo, args):
    """fn(0, *args), computed SLICE_LEN steps at a time into one output (batch, L, ...):
    the forward's intermediates live one slice at a time too."""
    L = args[0].shape[1]
    if L <= SLICE_LEN:
        return fn(0, *args)
    out = None
    for a, s, e in _slices(L, halo):
        part = fn(s - a, *(arg[:, a:e] if i < n_timed else arg for i, arg in enumerate(args)))
        if out is None:
            out = part.new_empty(part.shape[0], L, *part.shape[2:])
        out[:, s:e] = part
    return out


def _records(args) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args)


class _Recompute(torch.autograd.Function):
    """The autograd node of :func:`recomputed` (slices None) and
    :func:`recomputed_in_slices` (slices (n_timed, halo)): the forward runs fn without
    recording and saves its tensor arguments; the backward runs fn again with recording
    and backpropagates through that copy, whole or slice by slice."""

    @staticmethod
    def forward(ctx, fn, slices, *args):
        ctx.fn, ctx.slices = fn, slices
        ctx.is_tensor = [isinstance(a, torch.Tensor) for a in args]
        ctx.others = [None if t else a for a, t in zip(args, ctx.is_tensor)]
        ctx.save_for_backward(*(a for a, t in zip(args, ctx.is_tensor) if t))
        return fn(*args) if slices is None else _sliced_call(fn, *slices, args)

    @staticmethod
    def backward(ctx, grad):
        saved = iter(ctx.saved_tensors)
        needs = ctx.needs_input_grad[2:]
        args = [next(saved).detach() if t else other for t, other in zip(ctx.is_tensor, ctx.others)]
        if ctx.slices is None:
            args = [a.requires_grad_(need) if t else a
                    for a, t, need in zip(args, ctx.is_tensor, needs)]
            leaves = [a for a, need in zip(args, needs) if need]
            with torch.enable_grad():
                out = ctx.fn(*args)
                found = iter(torch.autograd.grad(vjp_loss((out,), (grad,)), leaves,
                                                 allow_unused=True))
            return (None, None, *(next(found) if need else None for need in needs))
        return (None, None, *_sliced_vjp(ctx.fn, *ctx.slices, args, needs, grad))


def _sliced_vjp(fn, n_timed, halo, args, needs, grad):
    """The vector-Jacobian product of fn(0, *args) with ``grad`` (batch, L, ...), computed
    over slices of SLICE_LEN steps (see :func:`recomputed_in_slices`) -> one grad per arg
    (None where not needed)."""
    L = grad.shape[1]
    total = [None] * len(args)
    for i in range(n_timed):                # per-step grads: each slice adds its rows
        if needs[i]:
            total[i] = torch.zeros_like(args[i])
    whole = [a.requires_grad_(need) if i >= n_timed and isinstance(a, torch.Tensor) else a
             for i, (a, need) in enumerate(zip(args, needs))]
    for a, s, e in _slices(L, halo):
        part = [arg[:, a:e].requires_grad_(need) if i < n_timed else arg
                for i, (arg, need) in enumerate(zip(whole, needs))]
        leaves = [x for x, need in zip(part, needs) if need]
        with torch.enable_grad():
            out = fn(s - a, *part)
            found = iter(torch.autograd.grad(vjp_loss((out,), (grad[:, s:e],)), leaves,
                                             allow_unused=True))
        for i, need in enumerate(needs):
            g = next(found) if need else None
            if g is None:
                continue
            if i < n_timed:
                total[i][:, a:e] += g
            else:
                total[i] = g if total[i] is None else total[i] + g
    return total


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                left: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """act(causal depthwise conv(x)), time-major: x (b, L, D) -> (b, L, D), contiguous.

        out[b, t] = act(bias + sum_j weight[:, 0, j] * x[b, t - (k - 1) + j]),  act = SiLU
        (``silu``) or the identity; weight (D, 1, k) as ``nn.Conv1d(D, D, k, groups=D)``;
        bias (D,) or None; left (b, k - 1, D): the inputs before t = 0 (None: zeros).

    The short conv of Mamba-2 and the delta-rule mixers. On CPU in float32 / float64 the
    workbench's C kernel (``models.kernels.cpu_kernels.CausalConv1dCPU``) when it builds;
    otherwise a sum of k shifted products (any device and dtype). Not PyTorch's conv1d: its
    depthwise backward on CPU took 32 s at b8 L4096 x 256 channels against 0.6 s for the C
    kernel and 2.8 s for the shifted sum (loaded 2-core CPU)."""
    from models.kernels import cpu_kernels   # lazily: the norms need no kernel module

    if x.shape[1] == 0:                      # an empty chunk
        return x.clone()
    if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and cpu_kernels.available()):
        return cpu_kernels.CausalConv1dCPU.apply(x, weight, bias, left, silu)
    b, L, D = x.shape
    k = weight.shape[-1]
    prev = x.new_zeros(b, k - 1, D) if left is None else left.to(x.dtype)
    xp = torch.cat([prev, x], 1)                                       # (b, k - 1 + L, D)
    y = xp[:, k - 1:] * weight[:, 0, k - 1]
    for j in range(k - 1):
        y = y + xp[:, j:j + L] * weight[:, 0, j]
    y = y if bias is None else y + bias
    return torch.nn.functional.silu(y) if silu else y


def conv_cache(cache: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """The next cache of a causal conv of kernel k: its last k - 1 inputs, channels first.
    cache (b, D, k - 1), tail (b, T', D): the chunk's last min(T, k - 1) inputs ->
    (b, D, k - 1), contiguous (from ``cache`` where the chunk is shorter than k - 1)."""
    k1 = cache.shape[-1]
    if k1 == 0:
        return cache
    return torch.cat([cache.to(tail.dtype), tail.transpose(1, 2)], -1)[..., -k1:].contiguous()


# -- the small-chunk paths' one decision (Mamba2._whole, the delta rules' projections) ------
# A layer with a faster, more memory-hungry path for small chunks asks take_whole. The
# resource estimate probes models at tiny batches and lengths, where every chunk is small,
# and extrapolates to the real run's: left alone it measured the small path for runs that
# take the sliced one (Mamba-2 125M at 32 x 2048 on CUDA: 124.3 GiB estimated, 86.6 for
# the path it runs). So the probe runs under whole_choices: each call is recorded with
# its threshold and the path is the one the probe asks for (cost_probe: the sliced path
# first, the small one only for runs that take it).
WholeKey = tuple[int, int, bool]   # (bytes per token, limit, cpu_only): one kind of call


def whole_rule(tokens: float, bytes_per_token: int, limit: int, cpu_only: bool, device_type: str) -> bool:
    """The small-chunk rule: the path's output of ``tokens`` (batch x steps) tokens at
    ``bytes_per_token`` fits ``limit`` bytes, on a CPU where the path is ``cpu_only``.
    Also the estimate's rule for a run it has only the recorded thresholds of."""
    return (not cpu_only or device_type == "cpu") and tokens * bytes_per_token <= limit


class _WholeChoices:
    """What :func:`whole_choices` records and decides (see there)."""

    def __init__(self, whole: frozenset):
        self.whole = whole
        self.calls: list[tuple[int, int, int, bool]] = []   # (tokens, bytes/token, limit, cpu_only)


_CHOICES: contextvars.ContextVar[_WholeChoices | None] = contextvars.ContextVar(
    "models_common_whole_choices", default=None)


def take_whole(tokens: int, bytes_per_token: int, limit: int, *, cpu_only: bool, device) -> bool:
    """Whether a layer takes its small-chunk path for a chunk of ``tokens`` (batch x steps)
    whose path output is ``bytes_per_token`` a token: :func:`whole_rule` on ``device``
    (a torch.device or its name), except inside :func:`whole_choices`, which records the
    call and answers whether its kind, (bytes_per_token, limit, cpu_only), is to be whole."""
    probe = _CHOICES.get()
    if probe is not None:
        probe.calls.append((int(tokens), int(bytes_per_token), int(limit), bool(cpu_only)))
        return (int(bytes_per_token), int(limit), bool(cpu_only)) in probe.whole
    return whole_rule(tokens, bytes_per_token, limit, cpu_only, torch.device(device).type)


class whole_choices:
    """``with whole_choices(whole) as rec:`` every :func:`take_whole` call in this thread
    (and context) takes the small path exactly when its kind is in ``whole`` (a set of
    :data:`WholeKey`; empty: every call takes the sliced path), whatever its size and
    device, and is appended to ``rec.calls`` as (tokens, bytes per token, limit,
    cpu_only). For the resource estimate's probe only (workbench/spec/cost_probe.py):
    it measures the path the real run will take, not the one its tiny inputs would."""

    def __init__(self, whole=frozenset()):
        self._rec = _WholeChoices(frozenset(whole))
        self._token = None

    def __enter__(self) -> _WholeChoices:
        self._token = _CHOICES.set(self._rec)
        return self._rec

    def __exit__(self, *exc) -> None:
        _CHOICES.reset(self._token)


def vjp_loss(outputs, grads) -> torch.Tensor:
    """sum_i <outputs_i, grads_i>: a scalar whose gradient w.r.t. each output is its grad,
    so ``autograd.grad(vjp_loss(outs, grads), inputs)`` is the vector-Jacobian product.
    Not ``autograd.grad(outs, inputs, grads)``: explicit grad_outputs make torch import
    sympy (~0.4 s and ~20 MiB, once per process) to check their shapes. None grads skip."""
    terms = [(o * g).sum() for o, g in zip(outputs, grads) if g is not None]
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # half precision is normalised in float32; float32 and float64 in their own dtype
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    rms = xc.pow(2).mean(-1, keepdim=True).add(eps).rsqrt()
    return (xc * rms).to(x.dtype) * weight


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension (recomputed in the backward; a slice of
    SLICE_LEN steps at a time for (batch, length, ..., d) inputs)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from models.kernels import rms_norm_cpu   # CPU fp32/64: hand-written backward (issue 43)
        if type(self) is RMSNorm and rms_norm_cpu.applies(x, self.weight):   # not subclasses
            return rms_norm_cpu.RMSNormFn.apply(x, self.weight, self.eps)
        if x.dim() >= 3:   # (batch, length, ..., d): a slice of steps at a time (position-wise)
            return recomputed_in_slices(_rms_norm_rows, 1, 0, x, self.weight, self.eps)
        return recomputed(rms_norm, x, self.weight, self.eps)


def _rms_norm_rows(h, x, weight, eps):
    return rms_norm(x, weight, eps)


def make_norm(kind: str, d: int) -> nn.Module:
    if kind == "rms":
        return RMSNorm(d)
    if kind == "layer":
        return nn.LayerNorm(d)
    raise ValueError(f"unknown norm {kind!r}; expected 'rms' or 'layer'")


CHANNEL_MIXERS = ("none", "swiglu")


class PreNormResidual(nn.Module):
    """x + dropout(mixer(norm(x)))."""

    def __init__(self, d_model: int, mixer: nn.Module, norm: str = "rms", dropout: float = 0.0):
        super().__init__()
        self.norm = make_norm(norm, d_model)
        self.mixer = mixer
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.mixer(self.norm(x)))


class GatedMLP(nn.Module):
    """The SwiGLU feed-forward (Shazeer 2020), position by position: (batch, length, d_model)
    -> same, ``W3 [(W1 x) * SiLU(W2 x)]`` with hidden width ``mult * d_model``. It lives here,
    beside the stack that puts it after each mixer (``channel_mixer="swiglu"``); the
    gated_mlp entry (models/gated_mlp.py) stacks it alone as the no-mixing control."""

    backend = "torch"

    def __init__(self, d_model: int, mult: float = 2.0, bias: bool = False):
        super().__init__()
        d_hidden = max(1, int(round(mult * d_model)))
        self.W1 = nn.Linear(d_model, d_hidden, bias=bias)   # value
        self.W2 = nn.Linear(d_model, d_hidden, bias=bias)   # gate
        self.W3 = nn.Linear(d_hidden, d_model, bias=bias)   # output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.W3(self.W1(x) * F.silu(self.W2(x)))

    def state_size(self) -> int:
        return 0  # nothing from earlier positions is needed to produce the next output


class ResidualStack(nn.Module):
    """n_layers pre-norm residual blocks and a final norm.

    ``make_mixer(i)`` builds the i-th mixer: (batch, length, d_model) -> same shape, causal.
    ``backend`` is the first mixer's ``backend`` attribute (or "torch");
    ``state_size()`` sums the mixers' ``state_size()`` (None if any mixer has none).

    ``channel_mixer="swiglu"`` follows every sequence mixer with a pre-norm residual SwiGLU
    feed-forward (:class:`GatedMLP`, hidden ``mlp_mult * d_model``), the
    Llama-style block that Mamba-2, GLA and Gated DeltaNet language models use:
    x -> x + mixer(norm x) -> x + SwiGLU(norm x). It holds no recurrent state.
    """

    def __init__(
        self, d_model: int, n_layers: int, make_mixer: Callable[[int], nn.Module],
        norm: str = "rms", dropout: float = 0.0, channel_mixer: str = "none",
        mlp_mult: float = 2.0,
    ):
        super().__init__()
        if n_layers < 1:
            raise ValueError("n_layers must be >= 1")
        if channel_mixer not in CHANNEL_MIXERS:
            raise ValueError(f"unknown channel_mixer {channel_mixer!r}; expected one of "
                             f"{', '.join(CHANNEL_MIXERS)}")
        self.d_model = d_model
        self.layers = nn.ModuleList(
            PreNormResidual(d_model, make_mixer(i), norm, dropout) for i in range(n_layers)
        )
        self.mlps = None
        if channel_mixer == "swiglu":
            self.mlps = nn.ModuleList(
                PreNormResidual(d_model, GatedMLP(d_model, mlp_mult), norm, dropout)
                for _ in range(n_layers)
            )
        self.norm_f = make_norm(norm, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model)."""
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.mlps is not None:
                x = self.mlps[i](x)
        return self.norm_f(x)

    @property
    def backend(self) -> str:
        """The mixers' backends, each once, in layer order ("torch+cpu" for Based's short
        convs and linear attention), so a run records every implementation that ran."""
        names = [str(getattr(layer.mixer, "backend", "torch")) for layer in self.layers]
        return "+".join(dict.fromkeys(names))

    def state_size(self) -> int | None:
        total = 0
        for layer in self.layers:
            fn = getattr(layer.mixer, "state_size", None)
            s = fn() if callable(fn) else None
            if s is None:
                return None
            total += s
        return total


def stack_with_state(stack: ResidualStack, x: torch.Tensor, state: list,
                     method: str = "forward_with_state") -> tuple[torch.Tensor, list]:
    """Run a ResidualStack's layers carrying each mixer's recurrent state.

    ``method`` is the mixer method called as ``method(norm(x), state_i) -> (y, state_i)``:
    ``"step"`` for one token (x: (batch, d_model)) or ``"forward_with_state"`` for a chunk
    (x: (batch, length, d_model)). Returns (final-normed output, list of new states).
    """
    new_state = []
    for i, (layer, s) in enumerate(zip(stack.layers, state)):
        y, s = getattr(layer.mixer, method)(layer.norm(x), s)
        x = x + layer.dropout(y)
        if getattr(stack, "mlps", None) is not None:  # position-wise: the same for one token or a chunk
            x = stack.mlps[i](x)
        new_state.append(s)
    return stack.norm_f(x), new_state
