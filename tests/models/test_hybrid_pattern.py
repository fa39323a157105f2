"""Interleaved hybrids (models/hybrid/hybrid_pattern.py, entry ``interleaved``) and the ``hybrid``
entry's ``recurrent`` option."""
from __future__ import annotations

import importlib

import pytest
import torch

import models
from helpers import run_steps
from models.attention.attention import CausalSelfAttention
from models.hybrid.hybrid_pattern import (MIXER_CODES, RECURRENT_NAMES, CODE_OF, InterleavedStack,
                                   RecurrentInterleavedStack, expand_pattern)
from models.ssm.mamba import Mamba, RecurrentStack

D = 16


def _available(code: str) -> bool:
    _, module, cls = MIXER_CODES[code]
    try:
        return hasattr(importlib.import_module(module), cls)
    except ImportError:
        return False


def _need(code: str):
    if not _available(code):
        name, module, cls = MIXER_CODES[code]
        pytest.skip(f"{module}.{cls} ({name}) is not in this checkout yet")


def test_pattern_repeats_and_truncates():
    assert expand_pattern("MMA", 6) == list("MMAMMA")
    assert expand_pattern("MMA", 4) == list("MMAM")
    assert expand_pattern("MWMA", 2) == list("MW")


def test_layout_puts_each_mixer_class_at_its_layer():
    m = models.build("interleaved", d_model=D, n_layers=6, pattern="MMA", n_heads=2)
    kinds = [type(layer.mixer) for layer in m.layers]
    assert kinds == [Mamba, Mamba, CausalSelfAttention] * 2
    assert m.pattern_layout == "MMAMMA"
    assert m.mlps is not None and len(m.mlps) == 6          # SwiGLU after every mixer


@pytest.mark.parametrize("code", sorted(MIXER_CODES))
def test_every_code_builds_its_class(code):
    _need(code)
    _, module, cls = MIXER_CODES[code]
    m = models.build("interleaved", d_model=D, n_layers=2, pattern=code + "M", n_heads=2)
    assert type(m.layers[0].mixer) is getattr(importlib.import_module(module), cls)
    assert type(m.layers[1].mixer) is Mamba
    y = m(torch.randn(2, 9, D))
    assert y.shape == (2, 9, D) and torch.isfinite(y).all()


def test_shared_options_reach_the_mixers_that_take_them():
    m = models.build("interleaved", d_model=D, n_layers=3, pattern="WBA", n_heads=2, window=5,
                     pos="none", backend="ref")
    w, b, a = (layer.mixer for layer in m.layers)
    assert (w.n_heads, w.window, w.pos, w.backend) == (2, 5, "none", "ref")
    assert (b.n_heads, b.backend) == (2, "ref")
    assert (a.n_heads, a.pos) == (2, "none")


def test_unknown_letter_is_an_error_naming_it_and_the_codes():
    with pytest.raises(ValueError, match=r"unknown mixer code 'X'.*A attention.*W sliding_window"):
        models.build("interleaved", d_model=D, n_layers=2, pattern="MXA")
    with pytest.raises(ValueError, match="non-empty"):
        models.build("interleaved", d_model=D, n_layers=2, pattern="")


def test_state_size_none_with_attention_else_the_sum():
    with_a = models.build("interleaved", d_model=D, n_layers=3, pattern="MMA")
    assert with_a.state_size() is None
    assert isinstance(with_a, InterleavedStack) and not isinstance(with_a, RecurrentStack)
    assert not hasattr(with_a, "forward_chunked")
    # a pattern with A that n_layers truncates away is recurrent
    cut = models.build("interleaved", d_model=D, n_layers=2, pattern="MMA")
    assert isinstance(cut, RecurrentInterleavedStack)
    rec = models.build("interleaved", d_model=D, n_layers=4, pattern="MWB", n_heads=2, window=3)
    assert isinstance(rec, RecurrentInterleavedStack) and isinstance(rec, RecurrentStack)
    assert rec.state_size() == sum(layer.mixer.state_size() for layer in rec.layers)
    state = rec.init_state(2)
    assert rec.state_size() == sum(t.numel() for s in state for t in s) // 2


@pytest.mark.parametrize("pattern", ["MWB", "2GR", "LDN"])
def test_recurrent_patterns_stream_like_forward(pattern):
    for code in pattern:
        _need(code)
    torch.manual_seed(0)
    m = models.build("interleaved", d_model=D, n_layers=len(pattern), pattern=pattern,
                     n_heads=2, window=4, backend="torch").double()
    x = torch.randn(2, 13, D, dtype=torch.float64)
    y = m(x)
    torch.testing.assert_close(m.forward_chunked(x, 5), y, rtol=0, atol=1e-10)
    torch.testing.assert_close(run_steps(m, x), y, rtol=0, atol=1e-10)


# -- hybrid(recurrent=...) ----------------------------------------------------------------
@pytest.mark.parametrize("recurrent", RECURRENT_NAMES)
def test_hybrid_recurrent_branch_kind(recurrent):
    code = CODE_OF[recurrent]
    _need(code)
    _, module, cls = MIXER_CODES[code]
    torch.manual_seed(0)
    m = models.build("hybrid", d_model=D, n_layers=1, n_heads=2, recurrent=recurrent).double()
    block = m.layers[0].mixer
    assert type(block.recurrent_branch[0].mixer) is getattr(importlib.import_module(module), cls)
    x = torch.randn(2, 12, D, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 6, D, dtype=torch.float64)
    torch.testing.assert_close(m(x2)[:, :6], y[:, :6], rtol=0, atol=1e-10)   # causal
    assert m.state_size() is None and isinstance(m.backend, str)


def test_hybrid_mamba_options_only_where_they_apply():
    _need("G")
    models.build("hybrid", d_model=D, n_layers=1, n_heads=2, recurrent="gla")     # defaults: fine
    with pytest.raises(ValueError, match="d_state.*gla"):
        models.build("hybrid", d_model=D, n_layers=1, n_heads=2, recurrent="gla", d_state=8)
    m = models.build("hybrid", d_model=D, n_layers=1, n_heads=2, d_state=8)
    assert m.layers[0].mixer.mamba_branch[0].mixer.d_state == 8


def test_hybrid_unknown_recurrent_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'lstm'.*mamba, mamba2"):
        models.build("hybrid", d_model=D, n_layers=1, recurrent="lstm")
