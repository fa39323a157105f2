"""lm-eval task names, checked before anything runs.

An evaluation names lm-evaluation-harness tasks (``lambada_openai``, ``hellaswag``) and
folders of the user's own (lm-eval YAML with local data files). A misspelt name used to fail
only inside the run, after the model had loaded; :func:`unknown_tasks` finds it up front, for
``profile check``, ``run FILE`` (and ``--dry-run``), ``eval`` and ``eval --dry-run``:

- the names come from lm-eval's own :class:`lm_eval.tasks.TaskManager` (the task, group and
  tag names of its locally indexed YAML files; nothing is fetched), and from a TaskManager over
  the include folders alone;
- indexing lm-eval's ~15,000 task files takes 10-50 s on a small CPU, so the names of its
  own tasks are kept on disk (``$XDG_CACHE_HOME/ssm-workbench/lm-eval-tasks.json``), stamped
  with lm-eval's version, folder and the folder's modification time; the include folders
  (small, and edited by the user) are indexed every time, and first: when they hold every
  name, lm-eval's own are not needed;
- an unknown name is reported with its closest known names (:mod:`difflib`);
- without lm-eval installed nothing can be checked: :func:`skipped` says so and how to
  install the extra.
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
from pathlib import Path

INSTALL = "pip install 'ssm-workbench[eval]' (or pip install 'lm-eval>=0.4')"


def installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def skipped() -> str | None:
    """Why task names cannot be checked here (one line), or None when they can."""
    if installed():
        return None
    return f"lm-eval task names not checked: lm-eval is not installed ({INSTALL})"


def _tasks_dir() -> Path:
    spec = importlib.util.find_spec("lm_eval")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "?"


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ssm-workbench" / "lm-eval-tasks.json"


def _stamp() -> str:
    folder = _tasks_dir()
    try:
        mtime = folder.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return f"{_version()}|{folder}|{mtime}"


def default_names() -> frozenset[str]:
    """lm-eval's own task, group and tag names (its TaskManager's ``all_tasks``), from the
    disk cache when its stamp is current, else indexed (10-50 s) and cached."""
    path, stamp = cache_path(), _stamp()
    try:
        data = json.loads(path.read_text())
        if data.get("stamp") == stamp and isinstance(data.get("names"), list):
            return frozenset(data["names"])
    except (OSError, ValueError):
        pass
    from lm_eval.tasks import TaskManager

    names = sorted(TaskManager().all_tasks)
    try:  # a cache that cannot be written costs the next check the indexing, nothing more
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"stamp": stamp, "names": names}))
        os.replace(tmp, path)
    except OSError:
        pass
    return frozenset(names)


def folder_names(include: list[str]) -> frozenset[str]:
    """The task, group and tag names of the include folders alone (lm-eval's TaskManager
    over them, without its own tasks)."""
    if not include:
        return frozenset()
    from lm_eval.tasks import TaskManager

    return frozenset(TaskManager(include_path=list(include), include_defaults=False).all_tasks)


def closest(name: str, known) -> list[str]:
    """Up to three known names nearest ``name`` (difflib's ratio >= 0.6, case ignored)."""
    by_lower: dict[str, str] = {}
    for k in sorted(known):
        by_lower.setdefault(k.lower(), k)
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)]


def unknown_tasks(tasks: list[str], include: list[str]) -> dict[str, list[str]]:
    """Each name of ``tasks`` that neither lm-eval nor the include folders know, with its
    closest known names; {} when all are known. lm-eval must be installed (:func:`skipped`)."""
    local = folder_names(include)
    missing = [t for t in tasks if t not in local]
    if not missing:
        return {}
    known = local | default_names()
    return {t: closest(t, known) for t in missing if t not in known}


def describe(unknown: dict[str, list[str]], include: list[str]) -> str:
    """One line: each unknown name with its closest known ones, and where they were looked for."""
    parts = [f"{t!r} (closest: {', '.join(near)})" if near else f"{t!r} (no close name)"
             for t, near in unknown.items()]
    if include:
        where = (f"known neither to lm-eval {_version()} (its tasks, groups and tags) nor to the task "
                 f"folder{'s' if len(include) > 1 else ''} {', '.join(map(str, include))}")
    else:
        where = f"not a task, group or tag of lm-eval {_version()} (tasks of your own: give their folder as include)"
    return f"unknown lm-eval task{'s' if len(unknown) > 1 else ''} {'; '.join(parts)}: {where}"
