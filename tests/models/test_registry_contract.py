"""The contract every registry entry keeps (models/registry.py), checked for EVERY entry.

Parametrized over ``models.names()`` at collection time, so an entry added by any catalogue
is covered without editing this file. Small sizes keep it CPU-cheap. For each entry, built
with default options:

- output shape (batch, length, d_model), finite;
- gradients reach every parameter (not None, finite, not all zero);
- causality: output at positions <= t unchanged when inputs after t change (float64,
  atol 1e-9; float32 with atol 1e-4 only if the entry cannot run in float64), and the
  output after t does change (a model ignoring its input would otherwise pass);
- describe() is one non-empty line; parameter count > 0; state_size() is None or an int
  >= 0 (0: a model that needs nothing from the past, e.g. the token-wise gated MLP);
  backend is a non-empty str;
- an unknown option is a TypeError naming it.

The checks are plain functions so that they are themselves tested on deliberately broken
dummies (a non-causal mixer, an unused parameter) at the bottom of this file.
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn

import models

# pretrained entries need a checkpoint folder: tests/workbench/train/test_pretrained.py runs the same checks
# on tiny checkpoints it writes
NAMES = [n for n in models.names() if models.entry(n).family != "pretrained"]
D_MODEL, N_LAYERS, BATCH, LENGTH = 16, 2, 2, 24


@functools.lru_cache(maxsize=None)
def _built(name: str) -> nn.Module:
    torch.manual_seed(0)
    return models.build(name, d_model=D_MODEL, n_layers=N_LAYERS)


def fresh(name: str) -> nn.Module:
    """A private copy, so one test's dtype or grads do not leak into another."""
    return copy.deepcopy(_built(name))


# -- the checks ---------------------------------------------------------------------------
def check_shape(m: nn.Module, d_model: int = D_MODEL) -> None:
    x = torch.randn(BATCH, LENGTH, d_model)
    y = m(x)
    assert isinstance(y, torch.Tensor), f"forward returned {type(y).__name__}, not a tensor"
    assert y.shape == (BATCH, LENGTH, d_model), f"output shape {tuple(y.shape)}"
    assert torch.isfinite(y).all(), "non-finite output"


def check_gradients(m: nn.Module, d_model: int = D_MODEL) -> None:
    m.train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, LENGTH, d_model, generator=g, requires_grad=True)
    w = torch.randn(BATCH, LENGTH, d_model, generator=g)
    m.zero_grad(set_to_none=True)
    (m(x) * w).sum().backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reaches: {', '.join(missing)}"
    bad = [n for n, p in m.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradient in: {', '.join(bad)}"
    zero = [n for n, p in m.named_parameters() if p.grad is not None and not p.grad.abs().sum() > 0]
    assert not zero, f"identically zero gradient in: {', '.join(zero)}"
    assert x.grad is not None and x.grad.abs().sum() > 0, "no gradient reaches the input"


def check_causal(m: nn.Module, d_model: int = D_MODEL) -> str:
    """Raise AssertionError if an output at position <= t moves when inputs after t change.
    Returns the dtype used ("float64", or "float32" where the entry cannot run float64)."""
    m.eval()
    try:
        m64 = copy.deepcopy(m).double()
        x = torch.randn(BATCH, LENGTH, d_model, dtype=torch.float64)
        with torch.no_grad():
            m64(x[:, :4])
        model, dtype, atol = m64, torch.float64, 1e-9
    except (RuntimeError, TypeError, NotImplementedError):
        model, dtype, atol = m, torch.float32, 1e-4
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, LENGTH, d_model, generator=g).to(dtype)
    with torch.no_grad():
        y = model(x)
        for t in (0, 5, LENGTH // 2, LENGTH - 2):
            x2 = x.clone()
            x2[:, t + 1:] = torch.randn(BATCH, LENGTH - t - 1, d_model, generator=g).to(dtype)
            y2 = model(x2)
            err = (y2[:, : t + 1] - y[:, : t + 1]).abs().max().item()
            assert err <= atol, (
                f"not causal: output at positions <= {t} moved by {err:.3g} when later inputs changed"
            )
            assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:]), (
                f"output after position {t} ignores the changed inputs"
            )
    return str(dtype).removeprefix("torch.")


# -- every entry --------------------------------------------------------------------------
def test_registry_is_not_empty():
    for expected in ("transformer", "lstm", "gated_mlp", "hybrid", "mambaformer"):
        assert expected in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_shape(name):
    check_shape(fresh(name))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter(name):
    check_gradients(fresh(name))


@pytest.mark.parametrize("name", NAMES)
def test_causal(name):
    check_causal(fresh(name))


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    desc = models.describe(name)
    assert isinstance(desc, str) and desc.strip() and "\n" not in desc and len(desc) <= 200
    m = _built(name)
    assert models.param_count(m) > 0
    s = models.state_size(m)
    assert s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 0), s
    b = models.backend(m)
    assert isinstance(b, str) and b
    assert getattr(m, "registry_name", None) == name


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_an_error_naming_it(name):
    with pytest.raises(TypeError, match="no_such_option_xyz"):
        models.build(name, d_model=D_MODEL, n_layers=N_LAYERS, no_such_option_xyz=1)


# -- the checks catch what they are meant to catch ----------------------------------------
class _Dummy(nn.Module):
    """Residual + linear mixer, optionally leaking the future or holding an unused weight."""

    def __init__(self, leak_future: bool = False, unused: bool = False):
        super().__init__()
        self.lin = nn.Linear(D_MODEL, D_MODEL)
        self.leak_future = leak_future
        if unused:
            self.unused = nn.Parameter(torch.ones(3))

    def forward(self, x):
        # causal: mean over the prefix; leaking: mean over the whole sequence
        if self.leak_future:
            ctx = x.mean(1, keepdim=True).expand_as(x)
        else:
            ctx = x.cumsum(1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return x + self.lin(ctx)


def test_checks_pass_on_a_correct_dummy():
    m = _Dummy()
    check_shape(m)
    check_gradients(m)
    assert check_causal(m) == "float64"


def test_causality_check_catches_a_non_causal_model():
    with pytest.raises(AssertionError, match="not causal"):
        check_causal(_Dummy(leak_future=True))


def test_causality_check_catches_a_model_ignoring_later_inputs():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Parameter(torch.zeros(D_MODEL))

        def forward(self, x):
            return torch.zeros_like(x) + self.b

    with pytest.raises(AssertionError, match="ignores"):
        check_causal(Constant())


def test_gradient_check_catches_an_unused_parameter():
    with pytest.raises(AssertionError, match="unused"):
        check_gradients(_Dummy(unused=True))


def test_mlp_mult_type_follows_the_entry():
    """mlp_mult is a float for the SwiGLU channel mixer and an int for the transformer's MLP;
    both must be > 0."""
    models.check_options("gla", {"mlp_mult": 2.5})
    models.check_options("transformer", {"mlp_mult": 3})
    with pytest.raises(models.OptionError, match="integer > 0"):
        models.check_options("transformer", {"mlp_mult": 2.5})
    for name in ("gla", "transformer"):
        with pytest.raises(models.OptionError, match="> 0"):
            models.check_options(name, {"mlp_mult": 0})
