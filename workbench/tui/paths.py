"""Where the TUI writes files, and what it remembers between sessions.

Figures and tables written from the TUI (compare ``f``, Results ``f`` and ``w``) go to one
folder per profile under a single output folder: ``<store folder>/figures/`` by default,
or the ``--out`` folder the TUI was started with. The folder does not depend on where the
TUI was started, and every path is absolute so that the message naming it can be pasted
into a shell anywhere.

The TUI's small memory (the last profile path saved or loaded) lives in
``<store folder>/tui.json``; a read-only store simply forgets.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from workbench.results.figure_base import safe_stem  # matplotlib itself is imported only to draw

STATE_FILE = "tui.json"
MIXED = "compare"  # the folder of figures over runs of several profiles


def output_root(store_root: str | Path, out: str | Path | None = None) -> Path:
    """The folder under which each profile gets its own: ``out`` when given, else the
    store folder's ``figures/``; absolute, ``~`` expanded."""
    base = Path(out).expanduser() if out else Path(store_root).expanduser() / "figures"
    return base.resolve()


def profile_dir(root: str | Path, profile: str | None) -> Path:
    """``root/<profile>`` (the name made safe for a file system; ``compare`` when the
    files mix several profiles, ``profile`` None)."""
    return Path(root).expanduser().resolve() / safe_stem(profile if profile else MIXED)


def runs_dir(root: str | Path, profiles: Iterable[str]) -> Path:
    """The folder for files about runs of ``profiles``: the profile's own when they
    share one, else ``root/compare``."""
    names = set(profiles)
    return profile_dir(root, next(iter(names)) if len(names) == 1 else None)


def load_state(store_root: str | Path) -> dict[str, Any]:
    """What the TUI remembered in this store (empty when nothing, or unreadable)."""
    try:
        data = json.loads((Path(store_root) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(store_root: str | Path, **values: Any) -> bool:
    """Merge ``values`` into the remembered state; False when the store folder cannot be
    written (a read-only store): the TUI then remembers for this session only."""
    path = Path(store_root) / STATE_FILE
    state = {**load_state(store_root), **values}
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=str))
        tmp.replace(path)  # atomic: two TUIs on one store never leave half a file
    except OSError:
        return False
    return True
