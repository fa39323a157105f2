"""Sequence-model backbones, built by name.

>>> import models
>>> m = models.build("mamba", d_model=64, n_layers=2)
>>> y = m(x)            # x: float (batch, length, d_model) -> same shape, causal

See ``models.registry`` for the contract every entry follows. Compute accounting:
``models.flops(name, seq_len=, d_model=, n_layers=, **options)`` -> training FLOPs per token
and parameter counts (``models.compute``: the formulas and their conventions).
"""
from models.registry import (  # noqa: F401  (public API)
    ModelEntry,
    OptionError,
    UnknownModelError,
    backend,
    build,
    check_options,
    describe,
    entry,
    names,
    param_count,
    register,
    state_size,
)

# Catalogue modules register their entries on import. Each owns its own file so that
# the zoo can grow without edits to a shared list.
from models import catalog_s6  # noqa: F401,E402  S6 / Mamba family
from models import catalog_zoo  # noqa: F401,E402  everything else
from models import catalog_s4  # noqa: F401,E402
from models import catalog_pretrained  # noqa: F401,E402  checkpoints from local folders
from models import catalog_mamba2  # noqa: F401,E402  Mamba-2 (SSD)
from models import catalog_linear_rnn  # noqa: F401,E402  GLA, RetNet, linear attention, DeltaNet, Gated DeltaNet


def flops(name: str, seq_len: int, d_model: int = 64, n_layers: int = 2, **options):
    """Training FLOPs per token (forward + backward) of entry ``name`` at ``seq_len``, with its
    parameter counts (``.params``): a ``models.compute.FlopCount``; see ``models.compute``
    for the conventions. (Imported on use: ``python -m models.compute`` runs it as a script.)"""
    from models.compute import flops as _flops
    return _flops(name, seq_len, d_model=d_model, n_layers=n_layers, **options)


def __getattr__(name: str):
    if name in ("FlopCount", "ParamCount", "param_counts"):
        import models.compute
        return getattr(models.compute, name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
