"""Every registry entry's reported ``state_size()`` equals the state its streaming step carries.

The registry's convention (models/registry.py): ``state_size()`` is the number of floats of
recurrent state per sequence needed for step-by-step inference, summed over layers, or None
where the state grows with the length. Conv caches and counters are state (they travel
between steps); a complex number is two floats (models/ssm/s4d.py). So the measured size is the
sum over every tensor the streaming path hands back, per batch element, of numel (times 2
for complex dtypes).

Each entry is built tiny (d_model 32, 2 layers, float32, CPU) and stepped over one shared
short input; entries with a ``forward_with_state`` chunk path are also checked on it.
Entries that report no size or have no streaming path are skipped, with the reason
(``pytest -rs`` lists them). Issue 35, item 3.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import models

D_MODEL, N_LAYERS, BATCH, LENGTH = 32, 2, 2, 5

# Option variants whose state has a different shape than the defaults (grouped value heads,
# Mamba-3's MIMO and real state, a longer Householder product), checked beside the defaults.
VARIANTS = {
    "mamba3[mimo2,real]": ("mamba3", {"mimo_rank": 2, "complex_state": False, "d_state": 16}),
    "gated_deltanet[num_v_heads=8]": ("gated_deltanet", {"num_v_heads": 8}),
    "gated_deltaproduct[householder=3,num_v_heads=8]":
        ("gated_deltaproduct", {"num_householder": 3, "num_v_heads": 8}),
    "deltanet[no_short_conv]": ("deltanet", {"use_short_conv": False}),

    "s4d[init=real]": ("s4d", {"init": "real"}),
}

def _case(case: str, name: str, options: dict):
    return pytest.param(case, name, options, id=case)


CASES = [_case(n, n, {}) for n in models.names()] + \
    [_case(k, n, o) for k, (n, o) in VARIANTS.items()]


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    """The one input every case streams: (BATCH, LENGTH, D_MODEL)."""
    return torch.randn(BATCH, LENGTH, D_MODEL, generator=torch.Generator().manual_seed(0))


def _leaves(state):
    """Every tensor in a state (nested lists / tuples / dicts / dataclasses / NamedTuples)."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for v in state.values():
            yield from _leaves(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _leaves(v)
    elif dataclasses.is_dataclass(state):
        for f in dataclasses.fields(state):
            yield from _leaves(getattr(state, f.name))
    elif state is not None:
        raise TypeError(f"state holds a {type(state).__name__}, not a tensor: "
                        "it cannot be counted or batched")


def carried_size(state, batch: int) -> int:
    """Floats per sequence held by ``state``; every tensor must be batched on dim 0."""
    total = 0
    for t in _leaves(state):
        assert t.dim() >= 1 and t.shape[0] == batch, \
            f"state tensor of shape {tuple(t.shape)} is not per sequence (batch {batch})"
        total += t.numel() * (2 if t.is_complex() else 1)
    assert total % batch == 0
    return total // batch


def _build(name: str, options: dict):
    entry = models.entry(name)
    required = [k for k, v in entry.options().items() if v is None and k not in options
                and k in ("path", "gptneo_path", "mamba_path")]
    if required:
        pytest.skip(f"{name}: needs pretrained weights on disk ({', '.join(required)})")
    torch.manual_seed(0)
    return models.build(name, d_model=D_MODEL, n_layers=N_LAYERS, **options).float().eval()


@pytest.mark.parametrize("case,name,options", CASES)
def test_reported_state_size_matches_carried_state(case, name, options, x):
    net = _build(name, options)
    reported = models.state_size(net)
    if reported is None:
        pytest.skip(f"{case}: reports no state size (state_size() is None: no fixed-size state)")
    if not (callable(getattr(net, "init_state", None)) and callable(getattr(net, "step", None))):
        pytest.skip(f"{case}: reports {reported} but has no streaming path "
                    f"({type(net).__name__} has no init_state / step)")
    try:
        state = net.init_state(BATCH)
    except NotImplementedError as e:
        pytest.skip(f"{case}: reports {reported} but has no streaming path ({e})")

    with torch.no_grad():
        assert carried_size(state, BATCH) == reported, f"{case}: initial state"
        for t in range(LENGTH):
            y, state = net.step(x[:, t], state)
        assert y.shape == (BATCH, D_MODEL)
        assert carried_size(state, BATCH) == reported, \
            f"{case}: reports {reported}, step carries {carried_size(state, BATCH)}"
        if callable(getattr(net, "forward_with_state", None)):
            _, chunk_state = net.forward_with_state(x, net.init_state(BATCH))
            assert carried_size(chunk_state, BATCH) == reported, \
                f"{case}: reports {reported}, forward_with_state carries " \
                f"{carried_size(chunk_state, BATCH)}"


def test_carried_size_counts_complex_as_two_and_rejects_unbatched():
    """The counter itself: complex = 2 floats, nested containers walked, shared tensors refused."""
    s = [(torch.zeros(3, 4), torch.zeros(3, 2, dtype=torch.complex64)), {"n": torch.zeros(3)}]
    assert carried_size(s, 3) == 4 + 4 + 1
    with pytest.raises(AssertionError):
        carried_size([torch.zeros(5, 4)], 3)
