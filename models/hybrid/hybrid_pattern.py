"""Interleaved hybrid stacks: a layer pattern of one-letter mixer codes (Jamba / Samba style).

Jamba (Lieber et al. 2024) interleaves attention and Mamba layers (1 attention : 7 Mamba)
with MLPs after each mixer; Samba (Ren et al. 2024) repeats Mamba, MLP, sliding-window
attention, MLP. Here a ``pattern`` string of codes is repeated and truncated to n_layers:
n_layers 6 with ``"MMA"`` gives M M A M M A. Each layer is a pre-norm residual mixer,
followed (``channel_mixer="swiglu"``, the default here) by a pre-norm residual SwiGLU:

    x -> for each layer i: x + mixer_i(norm x) ; x + SwiGLU_i(norm x) -> final norm

Codes (class imported lazily by module and name, so a stack only needs the modules its
pattern uses):

    A  attention            models.attention.attention.CausalSelfAttention   (no fixed-size state)
    W  sliding window attn  models.attention.sliding_window.SlidingWindowAttention
    M  mamba                models.ssm.mamba.Mamba
    2  mamba2               models.ssm.mamba2.Mamba2
    G  gla                  models.linear_rnn.linear_mixers.GatedLinearAttention
    R  retnet               models.linear_rnn.linear_mixers.MultiScaleRetention
    L  linear attention     models.linear_rnn.linear_mixers.LinearAttention
    B  based linear attn    models.linear_rnn.based.BasedLinearAttention
    D  deltanet             models.linear_rnn.delta_mixers.DeltaNet
    N  gated deltanet       models.linear_rnn.delta_mixers.GatedDeltaNet
    C  short gated conv     models.linear_rnn.based.BaseConv (Based's BaseConv)

Shared options reach the mixers that take them (by their constructor's signature):
``n_heads`` (A, W, B and the linear mixers with heads), ``window`` (W), ``pos`` (A, W),
``backend`` (every mixer with a backend). ``state_size()`` is None when an A layer is
present (attention's KV cache grows with length), else the sum over layers; a stack
without A layers is a :class:`models.ssm.mamba.RecurrentStack` (``init_state`` / ``step`` /
``forward_with_state`` / ``forward_chunked``); one with A layers decodes too
(:class:`DecodingStack`: a key/value cache per attention layer, the recurrent states beside
them, one list updated in place per token).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch.nn as nn

from models.common import ResidualStack
from models.ssm.mamba import RecurrentStack

# code -> (name, module, class)
MIXER_CODES: dict[str, tuple[str, str, str]] = {
    "A": ("attention", "models.attention.attention", "CausalSelfAttention"),
    "W": ("sliding_window", "models.attention.sliding_window", "SlidingWindowAttention"),
    "M": ("mamba", "models.ssm.mamba", "Mamba"),
    "2": ("mamba2", "models.ssm.mamba2", "Mamba2"),
    "G": ("gla", "models.linear_rnn.linear_mixers", "GatedLinearAttention"),
    "R": ("retnet", "models.linear_rnn.linear_mixers", "MultiScaleRetention"),
    "L": ("linear_attention", "models.linear_rnn.linear_mixers", "LinearAttention"),
    "B": ("based", "models.linear_rnn.based", "BasedLinearAttention"),
    "D": ("deltanet", "models.linear_rnn.delta_mixers", "DeltaNet"),
    "N": ("gated_deltanet", "models.linear_rnn.delta_mixers", "GatedDeltaNet"),
    "C": ("base_conv", "models.linear_rnn.based", "BaseConv"),
}
CODE_OF = {name: code for code, (name, _, _) in MIXER_CODES.items()}
# mixers with a fixed-size recurrent state that can be a hybrid's recurrent branch
RECURRENT_NAMES = ("mamba", "mamba2", "gla", "retnet", "linear_attention", "deltanet",
                   "gated_deltanet", "based")
# the shared option each code may receive (if its constructor takes it)
_SHARED = {
    "A": ("n_heads", "pos"),
    "W": ("n_heads", "window", "pos", "backend"),
    "B": ("n_heads", "backend"),
    "C": ("backend",),
    "M": ("backend",),
    "2": ("backend",),
}
_LINEAR_MIXER_OPTIONS = ("n_heads", "backend")


def codes_help() -> str:
    return ", ".join(f"{c} {name}" for c, (name, _, _) in MIXER_CODES.items())


def mixer_class(code: str) -> type[nn.Module]:
    """The mixer class for a code, imported now; a clear error if its module is missing."""
    if code not in MIXER_CODES:
        raise ValueError(f"unknown mixer code {code!r}; codes: {codes_help()}")
    name, module, cls = MIXER_CODES[code]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"mixer {code!r} ({name}) needs {module}.{cls}, which is not "
                         f"available here: {exc}") from exc


def expand_pattern(pattern: str, n_layers: int) -> list[str]:
    """``pattern`` repeated and truncated to n_layers codes; ValueError naming a bad letter."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern must be a non-empty string of mixer codes, got {pattern!r}; "
                         f"codes: {codes_help()}")
    for ch in pattern:
        if ch not in MIXER_CODES:
            raise ValueError(f"pattern {pattern!r}: unknown mixer code {ch!r}; codes: {codes_help()}")
    if n_layers < 1:
        raise ValueError("n_layers must be >= 1")
    return [pattern[i % len(pattern)] for i in range(n_layers)]


def _accepts(cls: type, name: str) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def make_mixer(code: str, d_model: int, shared: dict[str, Any],
               extra: dict[str, Any] | None = None) -> nn.Module:
    """Build the mixer of ``code`` at width d_model.

    ``shared``: options every layer is offered (n_heads, window, pos, backend); each reaches
    the mixers whose constructor takes it. ``extra``: options for this mixer only, passed
    as given (a constructor that does not take one raises TypeError)."""
    cls = mixer_class(code)
    kwargs: dict[str, Any] = {}
    for key in _SHARED.get(code, _LINEAR_MIXER_OPTIONS):
        if key not in shared:
            continue
        if _accepts(cls, key):
            kwargs[key] = shared[key]
        elif key == "n_heads" and _accepts(cls, "num_heads"):
            kwargs["num_heads"] = shared[key]
    kwargs.update(extra or {})
    return cls(d_model, **kwargs)


def init_mixer_state(mixer: nn.Module, batch: int, capacity: int = 0, limit: int | None = None):
    """A mixer's empty decoding state: an attention layer's key/value cache (room for
    ``capacity`` positions now, at most ``limit``), any other mixer's ``init_state(batch)``."""
    from models.attention.attention import CausalSelfAttention

    if isinstance(mixer, CausalSelfAttention):
        return mixer.init_state(batch, capacity, limit)
    return mixer.init_state(batch)


class DecodingStack:
    """``init_state`` / ``forward_with_state`` / ``step`` for a ResidualStack whose layers mix
    attention (a key/value cache that grows) with recurrent mixers (a fixed-size state):
    the state is one list, an entry per layer, updated in place by one pass over the
    layers per token (models.attention.transformer.stack_step). RoPE positions continue
    from each attention cache's length; chaining chunks equals one forward pass."""

    def init_state(self, batch: int, capacity: int = 0) -> list:
        return [init_mixer_state(layer.mixer, batch, capacity) for layer in self.layers]

    def forward_with_state(self, x, state: list):
        """x: (batch, length, d_model) after the positions in ``state`` -> (y, state)."""
        from models.attention.transformer import stack_step
        return stack_step(self, x, state, "forward_with_state")

    def step(self, x_t, state: list):
        """One token x_t: (batch, d_model) -> (y_t (batch, d_model), state one token on)."""
        from models.attention.transformer import stack_step
        return stack_step(self, x_t, state, "step")


class InterleavedStack(DecodingStack, ResidualStack):
    """Pre-norm residual stack whose layer i runs the mixer of ``layout[i]``.

    (batch, length, d_model) -> (batch, length, d_model), causal. ``layout``: the expanded
    pattern (list of codes), also as the string ``self.pattern_layout``. Decodes token by
    token (:class:`DecodingStack`), attention layers with a key/value cache."""

    def __init__(self, d_model: int, n_layers: int, pattern: str = "MMA", n_heads: int = 4,
                 window: int = 64, pos: str = "rope", channel_mixer: str = "swiglu",
                 mlp_mult: float = 2.0, norm: str = "rms", dropout: float = 0.0,
                 backend: str = "auto", mixer_options: dict[str, dict[str, Any]] | None = None):
        """``mixer_options``: per-code constructor options, e.g. {"C": {"kernel_size": 3}}."""
        layout = expand_pattern(pattern, n_layers)
        shared = dict(n_heads=n_heads, window=window, pos=pos, backend=backend)
        per_code = dict(mixer_options or {})
        super().__init__(
            d_model, n_layers,
            lambda i: make_mixer(layout[i], d_model, shared, per_code.get(layout[i])),
            norm=norm, dropout=dropout, channel_mixer=channel_mixer, mlp_mult=mlp_mult,
        )
        self.pattern = pattern
        self.layout = layout
        self.pattern_layout = "".join(layout)


class RecurrentInterleavedStack(RecurrentStack, InterleavedStack):
    """An :class:`InterleavedStack` without attention layers: every mixer has a fixed-size
    state, so the stack has ``init_state`` / ``step`` / ``forward_with_state`` /
    ``forward_chunked`` (from :class:`models.ssm.mamba.RecurrentStack`, first in the
    order of bases; the constructor is InterleavedStack's)."""


def build_interleaved(d_model: int, n_layers: int, pattern: str = "MMA", **options: Any
                      ) -> InterleavedStack:
    """An :class:`InterleavedStack`, recurrent (:class:`RecurrentInterleavedStack`) when the
    expanded pattern has no A layer. ``options``: those of InterleavedStack."""
    layout = expand_pattern(pattern, n_layers)
    cls = InterleavedStack if "A" in layout else RecurrentInterleavedStack
    return cls(d_model, n_layers, pattern=pattern, **options)


def make_recurrent(name: str, d_model: int, backend: str = "auto",
                   options: dict[str, Any] | None = None,
                   defaults: dict[str, Any] | None = None) -> nn.Module:
    """A recurrent mixer by name (``RECURRENT_NAMES``), for hybrids' recurrent branches.

    ``backend`` reaches it if its constructor takes one. ``options`` (e.g. the hybrid
    entry's d_state / d_conv / expand) are passed only where they differ from
    ``defaults`` (the entry's defaults), so each kind otherwise keeps its own defaults; a
    changed option the mixer does not take is a ValueError naming both."""
    if name not in RECURRENT_NAMES:
        raise ValueError(f"unknown recurrent mixer {name!r}; expected one of "
                         f"{', '.join(RECURRENT_NAMES)}")
    cls = mixer_class(CODE_OF[name])
    kwargs: dict[str, Any] = {}
    if _accepts(cls, "backend"):
        kwargs["backend"] = backend
    defaults = defaults or {}
    for key, value in (options or {}).items():
        if key in defaults and value == defaults[key]:
            continue
        if not _accepts(cls, key):
            raise ValueError(f"option {key}={value!r} does not apply to recurrent={name!r} "
                             f"({cls.__name__} takes no {key})")
        kwargs[key] = value
    return cls(d_model, **kwargs)
