"""Whether a sweep may go under a profile name that the store already holds runs under
(issue 41 item 1): the TUI's sweep form asks before it launches, headless ``run`` warns.

Readers of the store group a profile's runs together, so four different tasks launched
under the form's default name ``sweep`` once came out as one row, averaged as if they
were seeds. This module says, from run specs alone (the dicts the store keeps,
``RunSpec.to_dict``), whether two sweeps are *the same sweep*, and if not, what differs.

The rule: a sweep is the same as the runs a profile already holds when each of its runs
has a *setting* (:func:`setting`) that one of the held runs has too. A run's setting is
what a profile changes only for the whole sweep:

- its kind (training, or an evaluation run),
- its task and the task's parameters (the registry's default filled in where the profile
  left one unset, so writing a default out does not count as a change),
- its training settings (``train.*``), without those that change no number
  (``NEUTRAL_TRAIN_KEYS``: checkpointing, TensorBoard, devices, sharding),
- the names of its grid axes (``[sweep.grid]``).

Left out, so that a sweep may grow under its name and a replay stays a replay: the model
(name, label, width, depth, options, size preset, recipe and the train keys that recipe
set, a matched size), the seed, the sequence length, the value at each grid axis, the task
variant's own key (its one-at-a-time change) and the budget's derived steps. Adding models,
seeds, lengths or grid values, or replaying part of a sweep, is the same sweep; a different
task, a changed task parameter (``task.tokenizer``), a changed learning rate outside a
grid or a new grid axis is not.

Nothing here decides what is queued: replay matching stays :func:`~workbench.spec.run_spec.spec_key`'s.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

from workbench.spec.run_spec import NEUTRAL_TRAIN_KEYS
from workbench.spec.schema import MAX_NAME

UNSET = "(unset)"  # how a key one side lacks is shown
SHOWN = 4  # differences named in one line; the others are counted


def _flat(prefix: str, d: Any, out: dict[str, Any]) -> None:
    if isinstance(d, dict):
        for k, v in d.items():
            _flat(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = d


def _task_defaults(task: str) -> dict[str, Any]:
    """The registry's defaults of a task's parameters ({} for a task it does not know)."""
    try:
        import tasks

        return {k: v for k, v in tasks.parameters(task).items() if v is not None and k != "seq_len"}
    except Exception:  # a task from a store written elsewhere: compare what was written
        return {}


def _normalised(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored training spec with the schema's defaults filled in (a store written by an
    earlier version lacks train keys added since); as stored when it cannot be read."""
    if spec.get("kind", "train") != "train":
        return spec
    try:
        from workbench.spec.run_spec import RunSpec

        return RunSpec.from_dict(spec).to_dict()
    except Exception:
        return spec


def setting(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of one run's spec that a sweep shares between all its runs (see the module
    docstring), flat: ``{"kind": "train", "task": "parity", "task.vocab_size": 2,
    "train.lr": 0.001, ..., "grid": "train.lr"}``."""
    spec = _normalised(spec)
    kind = spec.get("kind", "train")
    if kind != "train":  # an evaluation run: its own kind, compared by kind alone here
        return {"kind": kind}
    grid = sorted((spec.get("grid") or {}).keys())
    varied = set(grid)
    ts = spec.get("task_setting")
    if isinstance(ts, str) and "=" in ts:  # a task variant: its own key is its change
        varied.add("task." + ts.split("=", 1)[0])
    recipe = spec.get("recipe") or {}
    varied |= set((recipe.get("keys") or {}) if isinstance(recipe, dict) else ())
    task = spec.get("task")
    out: dict[str, Any] = {"kind": kind, "task": task}
    params = {**_task_defaults(str(task)), **(spec.get("task_params") or {})}
    params.pop("seq_len", None)
    _flat("task", params, out)
    _flat("train", {k: v for k, v in (spec.get("train") or {}).items() if k not in NEUTRAL_TRAIN_KEYS}, out)
    out = {k: v for k, v in out.items()
           if k in ("kind", "task") or not any(k == g or k.startswith(g + ".") for g in varied)}
    out["grid"] = ", ".join(grid) if grid else "(none)"
    return out


def _key(s: dict[str, Any]) -> str:
    return json.dumps(s, sort_keys=True, default=str)


def _show(v: Any) -> str:
    if v is UNSET:
        return UNSET
    return v if isinstance(v, str) else json.dumps(v, default=str)


def differences(new: Iterable[dict[str, Any]], held: Iterable[dict[str, Any]]) -> list[str]:
    """What differs between a sweep's run specs (``new``) and the runs a profile already
    holds (``held``), as ``"task cycle_navigation vs parity"`` (this sweep's value first,
    then the store's), each key once; [] when they are the same sweep (or nothing is held).
    For each setting of the new sweep the store lacks, the held setting nearest to it
    (fewest keys apart) is the one compared."""
    held_settings = {_key(s): s for s in map(setting, held)}
    if not held_settings:
        return []
    out: list[str] = []
    seen: set[str] = set()
    for s in {_key(s): s for s in map(setting, new)}.values():
        if _key(s) in held_settings:
            continue

        def apart(h: dict[str, Any]) -> list[str]:
            # a key that is a grid axis on one side is named once, by the grid line
            axes = {a for x in (s, h) for a in str(x.get("grid", "")).split(", ")}
            keys = [k for k in list(s) + [k for k in h if k not in s]
                    if k == "grid" or not any(k == a or k.startswith(a + ".") for a in axes)]
            return [k for k in keys if _key({"v": s.get(k, UNSET)}) != _key({"v": h.get(k, UNSET)})]

        near = min(held_settings.values(), key=lambda h: len(apart(h)))
        keys = apart(near)
        if "task" in keys:  # another task: its parameters are another task's, not a change
            keys = [k for k in keys if not k.startswith("task.")]
        for k in keys:
            line = f"{k} {_show(s.get(k, UNSET))} vs {_show(near.get(k, UNSET))}"
            if line not in seen:
                seen.add(line)
                out.append(line)
    return out


def one_line(diffs: list[str], shown: int = SHOWN) -> str:
    """The differences in one line: the first ``shown`` and how many more."""
    more = f"; and {len(diffs) - shown} more" if len(diffs) > shown else ""
    return "; ".join(diffs[:shown]) + more


def name_base(text: str) -> str:
    """A profile name made of ``text`` (a task's name): characters a profile name may not
    hold become '-', at most MAX_NAME characters less room for a ``-N`` suffix."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._") or "sweep"
    if not base[0].isalnum():
        base = "s" + base
    return base[:MAX_NAME - 5]


def fresh_name(base: str, new: list[dict[str, Any]], held_under: Callable[[str], list[dict[str, Any]]],
               avoid: Iterable[str] = ()) -> str:
    """The first of ``base``, ``base-2``, ``base-3``, ... under which the store holds no
    run, or only runs of this same sweep (launching there then replays it: its finished
    runs are skipped). ``held_under(name)``: the specs of the runs held under a name.
    ``avoid``: names never proposed (the one the user is being asked about)."""
    base = name_base(base)
    avoid = set(avoid)
    for i in range(1, 10_000):
        name = base if i == 1 else f"{base}-{i}"
        if name in avoid:
            continue
        held = held_under(name)
        if not held or not differences(new, held):
            return name
    raise ValueError(f"no free profile name from {base!r}")  # 10,000 sweeps of one task


def proposal_base(new: list[dict[str, Any]], held: list[dict[str, Any]], name: str) -> str:
    """Where a fresh name starts when ``name`` holds another sweep: the task's name when
    the tasks differ (``parity`` then ``cycle_navigation``), else ``name`` itself (the same
    task with other settings: ``tiny-2``)."""
    tasks_new = {s.get("task") for s in new}
    tasks_held = {s.get("task") for s in held}
    if tasks_new <= tasks_held:
        return name
    first = next((s.get("task") for s in new if s.get("task") not in tasks_held), None)
    return str(first or name)
