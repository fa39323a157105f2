"""Every keyword option of every registry entry has a one-line meaning in
models/option_help.py (issue 42 item 5: mixer-specific options such as ``num_householder``
showed only ``name = default`` in the sweep form), so a new option cannot ship without one;
no line there is stale (an option no entry takes) or too long for the form's one line."""
from __future__ import annotations

import models
from models import option_help
from models.registry import ModelEntry


def test_every_registry_option_has_a_line():
    missing = option_help.undocumented()
    assert missing == [], f"options without a line in models/option_help.py: {missing}"
    for name in models.names():  # (and each line is the one option_help gives)
        for key in models.entry(name).options():
            assert option_help.option_help(name, key).strip()


def test_a_new_undocumented_option_is_caught(monkeypatch):
    """An entry whose factory grows an option nobody explained fails the check above."""
    def factory(d_model: int, n_layers: int, n_heads: int = 4, wobble_factor: float = 0.5):
        raise AssertionError("never built")

    from models import registry
    monkeypatch.setitem(registry._REGISTRY, "zz_probe", ModelEntry("zz_probe", "probe", factory, "ssm", "torch"))
    assert option_help.undocumented() == ["zz_probe.wobble_factor"]  # n_heads is a shared name


def test_no_stale_or_long_lines():
    taken = {(n, k) for n in models.names() for k in models.entry(n).options()}
    names = {k for _, k in taken}
    assert set(option_help.HELP) <= names, set(option_help.HELP) - names
    assert set(option_help.FOR_ENTRY) <= taken, set(option_help.FOR_ENTRY) - taken
    long = [v for v in [*option_help.HELP.values(), *option_help.FOR_ENTRY.values()] if len(v) > option_help.MAX_LEN]
    assert long == []


def test_an_entrys_own_meaning_wins_over_the_shared_one():
    assert "BaseConv" in option_help.option_help("based", "pattern")
    assert "Mamba" in option_help.option_help("interleaved", "pattern")
    assert option_help.option_help("h3_s4", "shift_size") == option_help.option_help("h3", "shift_size")
    assert option_help.option_help("mamba", "d_conv") == option_help.HELP["d_conv"]
