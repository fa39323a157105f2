"""The sweep form's model options pane: under the model picker, the keyword options of every
picked model, one line each with its name, default and a one-line description (issue 42
item 5: the form listed no model's options, so ``allow_neg_eigval``, heads or head size
were known only from the README).

The options and defaults are the registry's (``models.entry(name).options()``: the
factory's keyword parameters, what ``model options`` in the form accepts); each option's
one-line meaning is :func:`models.option_help.option_help`'s, which has a line for every
option of every entry (tests/models/test_model_option_help.py), so a mixer's own options
(``num_householder``, ``A_floor``, ...) are explained too, not shown as name = default only.

The pane is a Static: it takes no focus (Tab skips it) and is hidden while no model is
picked, so the form looks as it did before any pick.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.widgets import Static

import models
from models import option_help

_WIDTH = option_help.MAX_LEN  # one line each, even in a narrow form (longer is cut)


def describe_option(model: str, option: str) -> str:
    """One line on ``option`` of ``model`` (models/option_help.py); "" where none is written."""
    text = option_help.option_help(model, option)
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
