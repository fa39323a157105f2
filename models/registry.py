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

import inspect
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


def check_options(name: str, options: dict[str, Any]) -> None:
    """Raise TypeError naming every option the model does not take."""
    allowed = entry(name).options()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"model {name!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(allowed)) or '(none)'}"
        )


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
