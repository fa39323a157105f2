"""The model registry: backbones built by name with keyword options.

A backbone maps float ``(batch, length, d_model)`` to ``(batch, length, d_model)`` and is
causal (output at t depends only on inputs at positions <= t). Every entry carries a
one-line description. Built modules expose:

- ``backend`` (str): which kernel implementation runs (e.g. ``"torch"``, ``"cuda"``,
  ``"ref"``, ``"native"``); recorded with each run.
- ``state_size()`` -> int | None: floats of recurrent state per sequence needed for
  step-by-step inference, or None where the model has no fixed-size state (attention).

Entries are added with :func:`register` by catalogue modules that ``models/__init__``
imports. Options are validated against the factory's signature, so an unknown option is an
error naming the option and the model instead of being silently dropped.
"""
from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch.nn as nn


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    factory: Callable[..., nn.Module]  # factory(d_model=, n_layers=, **options)
    family: str = ""                   # e.g. "ssm", "attention", "rnn", "hybrid"
    init: str = "torch"                # default init scheme (models.init_schemes), see register

    def options(self) -> dict[str, Any]:
        """Keyword options the factory takes beyond d_model / n_layers, with defaults."""
        out: dict[str, Any] = {}
        for p in inspect.signature(self.factory).parameters.values():
            if p.name in ("d_model", "n_layers") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            out[p.name] = None if p.default is inspect.Parameter.empty else p.default
        return out


_REGISTRY: dict[str, ModelEntry] = {}


class UnknownModelError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; say it plainly
        return str(self.args[0])


def register(name: str, description: str, family: str = "", init: str = "torch"):
    """Decorator: register ``factory(d_model, n_layers, **options) -> nn.Module``.

    ``init`` is the init scheme (``models.init_schemes``) a composed model gets unless the
    profile says otherwise: the one the model's reference implementation uses.
    """
    from models.init_schemes import check_scheme

    if "\n" in description:
        raise ValueError("model descriptions are one line")
    check_scheme(init)

    def deco(factory: Callable[..., nn.Module]):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = ModelEntry(name, description, factory, family, init)
        return factory

    return deco


def entry(name: str) -> ModelEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}"
        ) from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    return entry(name).description


class OptionError(ValueError):
    """An option value of the wrong type or out of range; names the model and the option."""

    def __init__(self, model: str, option: str, value: Any, expected: str):
        super().__init__(f"model {model!r}: option {option} = {value!r}: expected {expected}")
        self.model, self.option, self.value, self.expected = model, option, value, expected


# Ranges checked before a factory runs, by option name (the names mean the same in every
# entry). Without them a negative size or dropout reaches torch, which either fails with
# a message about some internal tensor or, worse, builds a model that trains wrongly.
_POSITIVE_INT = {"d_state", "d_conv", "expand", "n_heads", "max_len", "l_max",
                 "emb_dim", "filter_width", "short_width", "order", "lora_r", "freq_chunk",
                 "d_inner", "dt_rank", "mamba_per_block", "shift_size", "num_householder",
                 "num_v_heads"}
_PROBABILITY = {"dropout", "lora_dropout"}  # [0, 1): a dropout of 1 zeroes every activation
# mlp_mult is an int for some entries (transformer) and a float for others (the SwiGLU
# channel mixer): its annotation picks the type, this set the range
_POSITIVE_FLOAT = {"dt_min", "dt_max", "dt_init_floor", "mult", "attn_scale", "lora_alpha",
                   "mlp_mult"}


def _option_kind(p: inspect.Parameter) -> tuple[str | None, bool]:
    """(int / float / bool / str / list or None when unknown, whether None is allowed), from
    the factory's annotation (a string: catalogues use postponed annotations), else from
    the type of its default."""
    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    parts = [a.strip() for a in ann.split("|")] if ann and p.annotation is not inspect.Parameter.empty else []
    kinds = [a for a in parts if a in ("int", "float", "bool", "str", "list")]
    if kinds:
        return kinds[0], "None" in parts
    d = p.default
    for t in (bool, int, float, str, list):  # bool before int: True is an int to Python
        if isinstance(d, t):
            return t.__name__, False
    return None, True


def _check_value(model: str, option: str, value: Any, kind: str | None, nullable: bool) -> None:
    def bad(expected: str):
        raise OptionError(model, option, value, expected)

    if value is None:
        if not nullable:
            bad(f"a value ({kind or 'not none'})")
        return
    if option == "dt_rank" and value == "auto":  # dt_rank is "auto" or a positive integer
        return
    if option == "dt_rank":
        kind = "int"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "int" or option in _POSITIVE_INT:
        positive = option in _POSITIVE_INT or option in _POSITIVE_FLOAT
        if not is_int:
            bad("an integer > 0" if positive else "an integer")
        if positive and value <= 0:
            bad("an integer > 0")
    elif kind == "float":
        if not (is_int or isinstance(value, float)) or not math.isfinite(value):
            bad("a finite number")
        if option in _PROBABILITY and not 0 <= value < 1:
            bad("a probability in [0, 1)")
        if option in _POSITIVE_FLOAT and not value > 0:
            bad("a number > 0")
    elif kind == "bool" and not isinstance(value, bool):
        bad("true or false")
    elif kind == "str" and not isinstance(value, str):
        bad("a string")
    elif kind == "list" and not isinstance(value, list):
        bad("a list")


def check_options(name: str, options: dict[str, Any]) -> None:
    """Raise TypeError naming every option the model does not take, or :class:`OptionError`
    (a ValueError) naming the first option whose value has the wrong type or range."""
    allowed = entry(name).options()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"model {name!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(allowed)) or '(none)'}"
        )
    params = inspect.signature(entry(name).factory).parameters
    for key, value in options.items():
        _check_value(name, key, value, *_option_kind(params[key]))


def build(name: str, d_model: int = 64, n_layers: int = 2, **options: Any) -> nn.Module:
    """Build backbone ``name``: float (batch, length, d_model) -> same shape, causal."""
    check_options(name, options)
    module = entry(name).factory(d_model=d_model, n_layers=n_layers, **options)
    module.registry_name = name
    return module


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def state_size(module: nn.Module) -> int | None:
    fn = getattr(module, "state_size", None)
    return fn() if callable(fn) else None


def backend(module: nn.Module) -> str:
    return str(getattr(module, "backend", "torch"))


# --------------------------------------------------------------------------- building to count
# A model built only to be counted (parameters, state size, its options checked) needs no
# real weights. The meta device allocates nothing, but its first elementwise operation
# imports torch's meta registrations and torch._dynamo (2-5 s of a cold process, most of
# a dry run's time); a small model is built on the CPU faster than that import.
# So: the CPU while the tensors made stay under SHAPES_CPU_NUMEL elements in all (an
# init of that many floats is a few milliseconds), the meta device past it.
SHAPES_CPU_NUMEL = 1 << 22


class _OverBudget(Exception):
    """The build made more tensor elements than :data:`SHAPES_CPU_NUMEL` (internal)."""


def _factory_numel(func, args, kwargs) -> int:
    """Elements a factory call (torch.empty(3, 4), torch.zeros((3, 4)), ...) will make, told
    from its arguments before it allocates; 0 where that cannot be told."""
    import torch

    size = kwargs.get("size", args[0] if args else None)
    if isinstance(size, torch.Tensor):
        return 0
    if isinstance(size, (tuple, list, torch.Size)):
        dims = size
    elif isinstance(size, int) and func in _SIZED:
        dims = [a for a in args if isinstance(a, int)]
    else:
        return 0
    try:
        return math.prod(int(d) for d in dims)
    except (TypeError, ValueError):
        return 0


_SIZED: set = set()


def _budget_mode(limit: int):
    """A torch function mode that raises _OverBudget once the tensors made pass ``limit``
    elements: a factory's size is checked before it allocates, every result after."""
    import torch
    from torch.overrides import TorchFunctionMode

    if not _SIZED:
        _SIZED.update({torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full,
                       torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones})

    class Budget(TorchFunctionMode):
        made = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _factory_numel(func, args, kwargs) > limit - self.made:
                raise _OverBudget
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and not isinstance(out, nn.Parameter):
                self.made += out.numel()
                if self.made > limit:
                    raise _OverBudget
            return out

    return Budget()


_RANDOM_FILLS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_", "log_normal_",
                 "geometric_")
_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
          "xavier_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def zero_random_fills():
    """Inside, a random initialisation (nn.init's initialisers, a tensor's in-place random
    fill) writes zeros instead, for a model built to be counted or measured, not trained:
    its shapes, counts and what a forward keeps for backward are the same whatever the
    weights' values, and drawing them was most of a small model's build (and seconds for
    a 50k-vocabulary embedding and head). Zeros are a memset, and no NaN or denormal slows
    a forward. Computed values (S4's HiPPO matrices, dt's inverse softplus of torch.rand)
    are computed as always."""
    import torch
    import torch.nn.init as init
    from torch.overrides import TorchFunctionMode

    skip = {getattr(torch.Tensor, n) for n in _RANDOM_FILLS} | {getattr(init, n) for n in _INITS}

    class ZeroFill(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in skip:
                t = args[0] if args else kwargs["tensor"]
                with torch.no_grad():
                    return t.zero_()
            return func(*args, **kwargs)

    with ZeroFill():
        yield


def build_for_shapes(make: Callable[[], nn.Module], limit: int = SHAPES_CPU_NUMEL) -> nn.Module:
    """``make()`` built to be counted, not run: on the CPU (one thread, the global random
    state left as it was, random initialisations written as zeros) when its tensors stay under ``limit`` elements, else on the meta
    device, else (an init computing on real tensors, e.g. S4's DPLR) on the CPU without a
    limit. Parameter shapes, counts and state sizes are the same wherever it is built; an
    error of the model itself (a bad option value) is raised as the build raises it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            try:
                with _budget_mode(limit), zero_random_fills():
                    return make()
            except (_OverBudget, MemoryError):
                pass
            except RuntimeError as e:  # an allocation the system refused
                if "alloc" not in str(e).lower() and "memory" not in str(e).lower():
                    raise
            try:
                with torch.device("meta"):
                    return make()
            except (RuntimeError, NotImplementedError):  # an init computing on real tensors
                return make()
    finally:
        torch.set_num_threads(threads)


def build_shapes(name: str, d_model: int = 64, n_layers: int = 2, **options: Any) -> nn.Module:
    """:func:`build` for counting (:func:`build_for_shapes`): parameters and state size as the
    real model's, built in milliseconds where it is small and without memory where not."""
    return build_for_shapes(lambda: build(name, d_model=d_model, n_layers=n_layers, **options))
