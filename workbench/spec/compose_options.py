"""The three model options that belong to the composition, not the backbone
(``init_scheme``, ``init_std``, ``tie_embeddings``): their names and their checks.

Here, below both, so that checking a profile (workbench.spec.check) never imports the
composition itself (workbench.train.compose, which imports torch and builds models).
"""

from __future__ import annotations

from typing import Any

COMPOSE_OPTIONS = ("init_scheme", "init_std", "tie_embeddings")  # model options that are not the backbone's


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(backbone options, composition options) of one model's option dict."""
    backbone = {k: v for k, v in options.items() if k not in COMPOSE_OPTIONS}
    return backbone, {k: v for k, v in options.items() if k in COMPOSE_OPTIONS}


def check_compose_options(options: dict[str, Any]) -> None:
    """ValueError naming the bad value of init_scheme / init_std / tie_embeddings."""
    from models.init_schemes import check_scheme

    if options.get("init_scheme") is not None:
        check_scheme(options["init_scheme"])
    std = options.get("init_std")
    # (0, 1] as in profile.ModelSection: `not 0 < std <= 1` also refuses inf and nan
    if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float)) or not 0 < std <= 1):
        raise ValueError(f"init_std must be a number in (0, 1], got {std!r}")
    tie_opt = options.get("tie_embeddings")
    if tie_opt is not None and not isinstance(tie_opt, bool):
        raise ValueError(f"tie_embeddings must be true or false, got {tie_opt!r}")
