"""The sweep form's model options pane: under the model picker, the keyword options of every
picked model, one line each with its name, default and a one-line description (issue 42
item 5: the form listed no model's options, so ``allow_neg_eigval``, heads or head size
were known only from the README).

The options and defaults are the registry's (``models.entry(name).options()``: the
factory's keyword parameters, what ``model options`` in the form accepts). A description
is taken from the factory's docstring where it names the option in double back-quotes
(``attn_scale``: ...), else from :data:`GLOSSARY`, the meanings of option names that many
entries share (the registry checks those names the same way in every entry); an option
neither explains is shown as name = default only.

The pane is a Static: it takes no focus (Tab skips it) and is hidden while no model is
picked, so the form looks as it did before any pick.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from rich.text import Text
from textual.widgets import Static

import models

# Option names shared by many entries, with what they mean in each of them.
GLOSSARY = {
    "n_heads": "heads per layer",
    "num_v_heads": "value heads (grouped value attention); none: n_heads",
    "headdim": "head size (channels per head)",
    "head_dim": "head size (channels per head)",
    "allow_neg_eigval": "negative state-transition eigenvalues (Grazzi et al. 2025)",
    "d_state": "state size per channel",
    "d_conv": "short causal convolution width",
    "conv_size": "short causal convolution width",
    "use_short_conv": "short causal convolution before the mixer",
    "expand": "inner width = expand * d_model",
    "expand_k": "key width = expand_k * d_model",
    "expand_v": "value width = expand_v * d_model",
    "dropout": "dropout probability",
    "backend": "kernel implementation (auto picks one that runs here)",
    "chunk_size": "chunk length of the chunked kernel; none: its default",
    "channel_mixer": "MLP after each mixer: none or swiglu",
    "mlp_mult": "MLP width = mlp_mult * d_model",
    "norm": "normalisation layer",
    "max_len": "longest sequence the positions cover",
    "window": "attention window (tokens)",
    "pos": "position encoding",
    "dt_rank": "rank of the step size projection (auto: ceil(d_model / 16))",
    "dt_min": "smallest initial step size",
    "dt_max": "largest initial step size",
}

_WIDTH = 70  # a description longer than this is cut (one line each, even in a narrow form)


def _doc_description(doc: str, option: str) -> str:
    """What ``doc`` says of ``option`` where it names it as ``option``: the text after it up to
    the end of the clause (";" or the sentence's full stop); "" where it does not."""
    flat = " ".join(doc.split())
    m = re.search(rf"``{re.escape(option)}``\s*:?\s*(.*?)(?:;|\.\s|\.$|$)", flat)
    if not m:
        return ""
    return m.group(1).replace("``", "").strip(" ,")


def describe_option(model: str, option: str) -> str:
    """One line on ``option`` of ``model``: from the factory's docstring, else the glossary,
    else ""."""
    text = _doc_description(models.entry(model).factory.__doc__ or "", option) or GLOSSARY.get(option, "")
    return text if len(text) <= _WIDTH else text[:_WIDTH - 1].rstrip() + "…"


def show_value(value: Any) -> str:
    """A default as it is typed in the form's ``model options`` (TOML-like)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def options_text(names: Iterable[str]) -> Text:
    """The pane's text for the picked models ``names``: a header per model, then one line per
    option: name = default, then its description (dim)."""
    text = Text()
    for model in names:
        options = models.entry(model).options()
        if text:
            text.append("\n")
        text.append(f"{model}", style="bold")
        text.append(f" options (model options: {model}.NAME=VALUE)" if options else ": no options",
                    style="dim")
        width = max((len(f"{k} = {show_value(v)}") for k, v in options.items()), default=0)
        for key, value in options.items():
            text.append("\n  ")
            about = describe_option(model, key)
            text.append(f"{key} = {show_value(value)}".ljust(width if about else 0))
            if about:
                text.append(f"  {about}", style="dim")
    return text


class ModelOptions(Static, can_focus=False):
    """The options of the picked models (see the module docstring); :meth:`show` sets them."""

    DEFAULT_CSS = """
    ModelOptions {
        height: auto;
        padding: 0 0 0 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.models: list[str] = []

    def on_mount(self) -> None:
        self.display = False

    def show(self, names: Iterable[str]) -> None:
        """Show the options of ``names`` (registry names); hidden when there are none."""
        names = list(names)
        if names == self.models:
            return  # unchanged: no repaint
        self.models = names
        self.update(options_text(names))
        self.display = bool(names)
