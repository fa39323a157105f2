"""The points of the scaling fits (workbench/results/scaling.py): which run fields may differ
within one fit (the model's size and a training-budget grid), which split the fits (every
other setting: task, task.tokenizer, seq_len, train.lr, ...), each group's label, and its
points (runs that differ only by seed are one point: mean compute, mean metric).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from workbench.results.aggregate import summarize

# Fields that make a point of a fit differ from another: the model's size (width, depth, a
# size preset, and the options a size or [sweep.match] solves, recorded as ``opt.<name>``)
# and, where a grid varies it, the training budget. Every other field of a run (task, its
# settings, sequence length, any other grid axis) separates fits instead.
SIZE_FIELDS = frozenset({"d_model", "n_layers", "size", "model.d_model", "model.n_layers", "model.size"})
SIZE_PREFIXES = ("opt.",)
NOT_SETTINGS = frozenset({"model", "seed", "run_id", "profile", "eval_set", "__metrics__", "__grid__"})


def _budget_fields() -> frozenset:
    from workbench.spec.schema import BUDGET_KEYS  # a grid over the budget moves along compute

    return frozenset(f"train.{k}" for k in BUDGET_KEYS)


def is_size_field(key: str) -> bool:
    """Whether run field ``key`` may differ between the points of one fit (see SIZE_FIELDS)."""
    return key in SIZE_FIELDS or key.startswith(SIZE_PREFIXES) or key in _budget_fields()


def run_compute(rec: dict) -> float | None:
    """A record's training compute: ``train_flops``, else flops_per_token x tokens_trained."""
    c = rec.get("train_flops")
    if c is None and rec.get("flops_per_token") is not None and rec.get("tokens_trained") is not None:
        c = rec["flops_per_token"] * rec["tokens_trained"]
    return float(c) if c is not None and c > 0 else None


def _config_key(rec: dict) -> tuple:
    """What identifies a run up to its seed (the fields that are not bookkeeping or metrics)."""
    metrics = set(rec.get("__metrics__", ()))
    skip = {"seed", "run_id", "profile", "eval_set", "__metrics__", "__grid__"} | metrics
    return tuple(sorted((k, repr(v)) for k, v in rec.items() if k not in skip))


def _settings(rec: dict) -> dict[str, Any]:
    """A record's fields that are not its model, seed, size, bookkeeping or metrics."""
    metrics = set(rec.get("__metrics__", ()))
    return {k: v for k, v in rec.items() if k not in NOT_SETTINGS and k not in metrics and not is_size_field(k)}


def split_axes(recs: Sequence[dict]) -> list[str]:
    """The settings that differ between runs of one model (task, task.tokenizer, seq_len, a
    grid axis such as train.lr, ...): one fit per value of each, never one across them.
    Ordered task, task setting, length, task parameters, the grid's keys, then the rest."""
    seen: dict[str, dict[str, set]] = {}   # model -> key -> values (repr)
    keys: dict[str, None] = {}
    for r in recs:
        s = _settings(r)
        keys.update(dict.fromkeys(s))
        seen.setdefault(str(r.get("model")), {})
    for r in recs:
        s = _settings(r)
        per = seen[str(r.get("model"))]
        for k in keys:
            per.setdefault(k, set()).add(repr(s.get(k)))
    axes = {k for per in seen.values() for k, vals in per.items() if len(vals) > 1}
    grid = list(dict.fromkeys(k for r in recs for k in r.get("__grid__", ())))

    def order(k: str) -> tuple:
        fixed = {"task": 0, "task_setting": 1, "seq_len": 2}
        if k in fixed:
            return (fixed[k], 0, k)
        if k in grid:
            return (4, grid.index(k), k)
        return (3 if k.startswith("task.") else 5, 0, k)

    return sorted(axes, key=order)


def _value(v: Any) -> str:
    if v is None:
        return "–"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _labels(keys: Sequence[tuple[str, tuple]], axes: Sequence[str]) -> dict[tuple, str]:
    """A name per (model, settings) group: the model, then only the settings that tell it
    from the other groups ('mamba · task.tokenizer=bpe'; four tasks: 'mamba · task=parity',
    not each task's parameters too). Walks ``axes`` in order, naming an axis where the groups
    that agree with this one on the axes named so far still differ in it (so names are unique)."""
    out = {}
    for key in keys:
        model, ctx = key
        vals = dict(ctx)
        cands = [dict(c) for _, c in keys]
        shown = []
        for k in axes:
            if len({repr(c.get(k)) for c in cands}) > 1:
                shown.append(k)
                cands = [c for c in cands if repr(c.get(k)) == repr(vals.get(k))]
        out[key] = model + (" · " + ", ".join(f"{k}={_value(vals.get(k))}" for k in shown) if shown else "")
    return out


def points_by_group(recs: Iterable[dict], metric: str = "loss", eval_set: str = "") -> \
        tuple[dict[tuple, list[tuple[float, float, int]]], dict[tuple, int], list[str], dict[tuple, str]]:
    """The points of each fit: ({(model, settings): [(C, L, seeds)] sorted by C}, {group: runs
    without a compute or the metric}, the axes that split the fits, {group: its label}).
    A group's runs differ only in size and seed (:func:`split_axes`); runs differing only by
    seed are one point (mean compute, mean metric). Groups in the order of their first run."""
    recs = [r for r in recs if r.get("eval_set", "") == eval_set]
    axes = split_axes(recs)
    groups: dict[tuple, dict[tuple, list[tuple[float, float]]]] = {}
    missing: dict[tuple, int] = {}
    for r in recs:
        s = _settings(r)
        key = (str(r.get("model")), tuple((k, s.get(k)) for k in axes))
        groups.setdefault(key, {})
        c, v = run_compute(r), r.get(metric)
        if c is None or v is None or not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            missing[key] = missing.get(key, 0) + 1
            continue
        groups[key].setdefault(_config_key(r), []).append((c, float(v)))
    out: dict[tuple, list[tuple[float, float, int]]] = {}
    for key, cfgs in groups.items():
        pts = [(summarize(c for c, _ in ms)["mean"], summarize(v for _, v in ms)["mean"], len(ms))
               for ms in cfgs.values()]
        out[key] = sorted(pts)
    return out, missing, axes, _labels(list(out), axes)
