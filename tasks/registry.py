"""The task registry: tasks built by name with validated parameters."""
from __future__ import annotations

import inspect
from typing import Any

from tasks.base import Task

_REGISTRY: dict[str, type[Task]] = {}


class UnknownTaskError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register(cls: type[Task]) -> type[Task]:
    if not cls.name or not cls.description or "\n" in cls.description.strip():
        raise ValueError(f"{cls.__name__} needs a name and a one-line description")
    from tasks.base import READOUTS
    if cls.readout not in READOUTS or cls.pooled != (cls.readout == "pooled"):
        raise ValueError(f"{cls.__name__}: readout must be one of {READOUTS}, "
                         "and pooled exactly when readout == 'pooled'")
    if cls.name in _REGISTRY:
        raise ValueError(f"task {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def task_class(name: str) -> type[Task]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTaskError(
            f"unknown task {name!r}; known tasks: {', '.join(sorted(_REGISTRY))}"
        ) from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    return task_class(name).description.strip()


def parameters(name: str) -> dict[str, Any]:
    """The task's parameters with their defaults (None where required)."""
    sig = inspect.signature(task_class(name).__init__)
    return {
        p.name: (None if p.default is inspect.Parameter.empty else p.default)
        for p in list(sig.parameters.values())[1:]
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


def check_params(name: str, params: dict[str, Any]) -> None:
    allowed = parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(
            f"task {name!r} does not take parameter(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(allowed))}"
        )


def build(name: str, **params: Any) -> Task:
    check_params(name, params)
    return task_class(name)(**params)
