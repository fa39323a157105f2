"""The linear-RNN entries' factories (models/catalog_linear_rnn.py): options written once per
group, each reaching the mixer (or the stack) under its name, with its default and its type."""
from __future__ import annotations

import inspect

import pytest

import models
from models import catalog_linear_rnn as cat
from models.linear_rnn.linear_mixers import LinearRNNMixer

NAMES = ["gla", "retnet", "linear_attention", "deltanet", "gated_deltanet", "gated_deltaproduct",
         "kda", "rwkv7"]
STACK = {p.name for p in cat.STACK}


def mixers(net):
    return [m for m in net.modules() if isinstance(m, LinearRNNMixer)]


@pytest.mark.parametrize("name", NAMES)
def test_every_option_but_the_stacks_is_the_mixers(name):
    """What the registry lists is what the mixer takes (plus the stack's four), defaults alike."""
    net = models.build(name, d_model=16, n_layers=1)
    [mixer] = mixers(net)
    takes = inspect.signature(type(mixer).__init__).parameters
    options = models.entry(name).options()
    assert STACK <= set(options)
    for key, default in options.items():
        if key in STACK:
            continue
        assert key in takes, f"{name}: option {key} is not {type(mixer).__name__}'s"
        if takes[key].default is not inspect.Parameter.empty and key not in ("expand_k", "expand_v"):
            assert takes[key].default == default, (name, key)


@pytest.mark.parametrize("name, option, value, read", [
    ("deltanet", "conv_size", 3, lambda m: m.qkv_conv1d.kernel_size),
    ("kda", "allow_neg_eigval", True, lambda m: m.allow_neg_eigval),
    ("gated_deltaproduct", "num_householder", 3, lambda m: m.num_householder),
    ("gated_deltanet", "num_v_heads", 8, lambda m: m.num_v_heads),
    ("gla", "chunk_size", 8, lambda m: m.chunk_size),
])
def test_an_option_reaches_the_mixer(name, option, value, read):
    net = models.build(name, d_model=32, n_layers=2, **{option: value})
    assert [read(m) for m in mixers(net)] == [value, value]


def test_the_stacks_options_reach_the_stack():
    net = models.build("deltanet", d_model=16, n_layers=1, channel_mixer="swiglu", dropout=0.25)
    assert any(type(m).__name__ == "GatedMLP" for m in net.modules())
    assert any(getattr(m, "p", None) == 0.25 for m in net.modules() if type(m).__name__ == "Dropout")


def test_group_options_are_typed_and_checked():
    with pytest.raises(ValueError, match="num_v_heads"):
        models.build("deltanet", d_model=16, n_layers=1, num_v_heads="8")
    with pytest.raises(TypeError, match="use_short_conv"):
        models.build("gla", d_model=16, n_layers=1, use_short_conv=False)
    models.build("deltanet", d_model=16, n_layers=1, num_v_heads=None)   # "int | None"
