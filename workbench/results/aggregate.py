"""Records, grouping and statistics over seeds: the numbers every results table shows.

A *record* is one finished run on one eval set: the run's fields (``model``, ``task``,
``seq_len``, ``seed``, ``d_model``, ``n_layers``, ``task.<param>``, ``opt.<option>``, the
grid keys under their dotted names such as ``train.lr``, and ``task_setting``), its
``run_id`` and ``profile``, ``eval_set`` (``""`` the test set, ``"valid"`` the validation
set, ``"len=1024"`` ...) and its metric values (run-level metrics copied from eval set ""
into every eval set's record).

- :func:`summarize`: mean, sample std (ddof=1), n and the 95% confidence interval's
  half-width ``mean ± t(0.975, n-1) · std / sqrt(n)`` over the values (None where n < 2).
- :func:`group` / :func:`table`: records grouped by any keys; a table is rows x columns.
- :func:`best_over`: for each group of the table's keys, the grid point (values of the
  ``over`` keys) with the best mean selection metric on the selection split, keeping only
  that point's runs. ``select_on="validation"`` (the default) reads eval set ``"valid"``,
  ``"test"`` reads eval set ``""`` (the anchors' practice; tables then say "selected on
  test"). Missing validation results raise :class:`SelectionError`, never fall back.
- :func:`pooled_keys` / :func:`split_keys`: **like with like.** A group of records may
  differ in the seed only (and in the eval set and bookkeeping); ``pooled_keys`` names the
  run fields that still vary inside some group of the caller's keys (a profile name that
  holds two sweeps: four tasks, two tokenizers), ``split_keys`` the fewest of them that,
  added to the keys, leave every group one configuration. Tables add those as row keys
  and say so (:func:`split_note`); surfaces whose layout is fixed refuse naming the key
  (:func:`refuse_pooling`, :class:`PoolingError`).
- :func:`winners`: the cells of a column marked best. **Rule**: among the column's cells
  with n >= 2, the best mean (by the metric's direction) is marked, and so is every other
  cell that Welch's t-test (two-sided, 5%) does not find different from it (tied-best).
  Cells with n = 1 are never marked and are not compared; a column with fewer than two
  cells of n >= 2 has no winner; metrics without a direction have none.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

from workbench.results import catalogue
from workbench.results.stats import t_quantile, welch_p

ALPHA = 0.05
SPLIT_EVAL_SET = {"validation": "valid", "test": ""}  # select_on -> the eval set it reads
BOOKKEEPING = {"run_id", "profile", "eval_set", "__metrics__", "__grid__"}


# run fields that tell runs apart without making them different configurations: the seed
# is what a group averages over; the rest is bookkeeping or the eval set (a column of its own)
NOT_CONFIG = {"seed"}
# which differing key to name/add first: the task, the model's size, then the grid's axes
SPLIT_FIRST = ("task", "model", "size", "recipe", "task_setting")


class PoolingError(ValueError):
    """Runs that differ in more than the seed would be averaged together (one line naming
    the key and its values). ``keys``: the differing keys, most telling first."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


class SelectionError(ValueError):
    """best_over cannot choose: no results on the selection split, or a metric without direction."""


def records(store, profile: str | None = None, states: Iterable[str] = ("finished",)) -> list[dict]:
    """One flat record per (run, eval set): run fields + eval_set + metric values."""
    runs = store.runs(profile=profile, states=list(states))
    # a run a replay trained again because its corpus changed (info superseded_by) stands
    # for data that is gone: its numbers are not pooled with its successor's
    runs = [r for r in runs if not (r.info or {}).get("superseded_by")]
    res = store.results(r.id for r in runs)
    out = []
    for r in runs:
        sets = res.get(r.id, {})
        base = sets.get("", {})
        grid = tuple(r.spec.get("grid") or ())
        run_level = {k: v for k, v in base.items() if k in catalogue.RUN_LEVEL}
        for es, vals in sorted(sets.items()):
            if es and not any(k not in catalogue.RUN_LEVEL for k in vals):
                continue
            rec = {**r.fields, "run_id": r.id, "profile": r.profile, "eval_set": es}
            rec.update(run_level)
            rec.update(vals)
            rec["__metrics__"] = sorted(set(vals) | set(run_level))
            rec["__grid__"] = grid
            out.append(rec)
    return out


def grid_keys(recs: Iterable[dict]) -> list[str]:
    """The grid keys (dotted, in the profiles' file order) of the records' runs: what
    :func:`best_over` takes the best over by default. Task parameters and model options are
    run fields too (``task.vocab_size``, ``opt.n_heads``) but only the grid's keys vary by
    design within a task setting."""
    return list(dict.fromkeys(k for r in recs for k in r.get("__grid__", ())))


def sort_key(v: Any) -> tuple:
    """Numbers numerically, then strings ('len=64' by its number); None last."""
    if v is None:
        return (2, 0, "")
    if isinstance(v, bool):
        return (1, 0, str(v))
    if isinstance(v, (int, float)):
        return (0, v, "")
    if isinstance(v, str) and "=" in v:
        head, _, num = v.partition("=")
        try:
            return (0, float(num), head)
        except ValueError:
            pass
    return (1, 0, str(v))


def _clean(values: Iterable) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not math.isnan(v)]


def summarize(values: Iterable, ci: bool = True) -> dict[str, Any]:
    """{'mean', 'std', 'n', 'ci95'} of the numbers among ``values`` (None and NaN left out).
    std is the sample std (ddof=1) and ci95 the half-width of the 95% Student-t interval;
    both None for n < 2 (one run says nothing about the spread)."""
    vals = _clean(values)
    n = len(vals)
    if not n:
        return {"mean": None, "std": None, "n": 0, "ci95": None}
    mean = statistics.fmean(vals)
    if n < 2:
        return {"mean": mean, "std": None, "n": 1, "ci95": None}
    std = statistics.stdev(vals)
    half = t_quantile(0.975, n - 1) * std / math.sqrt(n) if ci else None
    return {"mean": mean, "std": std, "n": n, "ci95": half}


def _hashable(v: Any) -> Any:
    """A value usable in a group key: lists as tuples, dicts as their JSON (a grid value
    may be a list, e.g. a hybrid's layer pattern, and such a key may be laid out)."""
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return _ident(v)
    return v


def group(recs: list[dict], by: list[str]) -> dict[tuple, list[dict]]:
    """Records by their values of ``by``, keys sorted (numbers numerically)."""
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault(tuple(_hashable(r.get(f)) for f in by), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: tuple(sort_key(v) for v in kv[0])))


def on_eval_set(recs: list[dict], keys: list[str]) -> list[dict]:
    """The test set's records unless the layout has eval_set as a key."""
    return recs if "eval_set" in keys else [r for r in recs if r.get("eval_set", "") == ""]


def table(recs: list[dict], metric: str, rows: list[str], cols: list[str]) -> dict:
    """{'rows': [row keys], 'cols': [col keys], 'cells': {(row, col): summary}}."""
    recs = on_eval_set(recs, rows + cols)
    cells: dict[tuple, dict] = {}
    for (rk, ck), rs in _two_level(recs, rows, cols):
        cells[(rk, ck)] = with_stderr(summarize(r.get(metric) for r in rs), rs, metric)
    row_keys = sorted({rk for rk, _ in cells}, key=lambda k: tuple(sort_key(v) for v in k))
    col_keys = sorted({ck for _, ck in cells}, key=lambda k: tuple(sort_key(v) for v in k))
    return {"rows": row_keys, "cols": col_keys, "cells": cells, "evaluation": is_evaluation(recs)}


def is_evaluation(recs: list[dict]) -> bool:
    """Whether every record is an evaluation run's (lm-eval's numbers, one run per model and
    task: their spread is lm-eval's standard error, not a std over seeds)."""
    from workbench.spec.eval_spec import TASK

    return bool(recs) and all(r.get("task") == TASK for r in recs)


def with_stderr(summary: dict[str, Any], rs: list[dict], metric: str) -> dict[str, Any]:
    """``summary`` (of one cell) with ``stderr``: the standard error its one run stored
    beside the metric (lm-eval's ``<metric>_stderr``), when the cell is one run that has one;
    a cell of several runs keeps its std over them."""
    vals = [r.get(metric) for r in rs if r.get(metric) is not None]
    if summary["n"] == 1 and len(vals) == 1:
        se = _clean(r.get(f"{metric}_stderr") for r in rs if r.get(metric) is not None)
        if se:
            return {**summary, "stderr": se[0]}
    return summary


def _two_level(recs, rows, cols):
    out: dict[tuple, list] = {}
    for r in recs:
        out.setdefault((tuple(_hashable(r.get(f)) for f in rows), tuple(_hashable(r.get(f)) for f in cols)),
                       []).append(r)
    return out.items()


def winners(cells: dict[Any, dict], metric: str, alpha: float = ALPHA) -> set:
    """The keys of ``cells`` (summaries of one column) marked best by the rule in the
    module docstring: the best mean among cells with n >= 2 and every cell Welch's test
    cannot tell from it at ``alpha``."""
    how = catalogue.better(metric)
    if how is None:
        return set()
    cand = {k: a for k, a in cells.items() if a and a["mean"] is not None and a["n"] >= 2}
    if len(cand) < 2:
        return set()
    pick = max if how == "max" else min
    best = pick(cand, key=lambda k: cand[k]["mean"])
    b = cand[best]
    out = {best}
    for k, a in cand.items():
        if k != best and welch_p(b["mean"], b["std"], b["n"], a["mean"], a["std"], a["n"]) >= alpha:
            out.add(k)
    return out


def best_cells(t: dict, metric: str, alpha: float = ALPHA) -> set[tuple]:
    """The (row, col) keys of :func:`table`'s result marked best in each column (:func:`winners`)."""
    out: set[tuple] = set()
    for ck in t["cols"]:
        out |= {(rk, ck) for rk in winners({rk: t["cells"].get((rk, ck)) for rk in t["rows"]},
                                             metric, alpha)}
    return out


def best_over(recs: list[dict], over: list[str], metric: str, by: list[str],
              select_on: str = "validation") -> tuple[list[dict], list[dict]]:
    """Keep, per group of ``by`` (the table's keys, eval_set excluded), only the runs of the
    grid point (values of ``over``) whose mean ``metric`` on the selection split is best.

    Returns (the kept records, all eval sets; one choice per group:
    ``{**group fields, 'chosen': {key: value}, 'select_on', 'metric', 'mean', 'n'}``).
    Raises SelectionError when a group has no result of ``metric`` on the selection split
    (for validation: no eval set "valid") or ``metric`` has no direction."""
    if select_on not in SPLIT_EVAL_SET:
        raise SelectionError(f"select_on must be validation or test, not {select_on!r}")
    how = catalogue.better(metric)
    if how is None:
        raise SelectionError(f"cannot select on {metric!r}: it has no better direction")
    missing = [k for k in over if not any(k in r for r in recs)]
    if missing:
        known = sorted({k for r in recs for k in r} - BOOKKEEPING
                       - {m for r in recs for m in r.get("__metrics__", ())})
        raise SelectionError(f"--best-over: no run has field {missing[0]!r}; fields: {', '.join(known)}")
    by = [k for k in by if k != "eval_set" and k not in over]
    split = SPLIT_EVAL_SET[select_on]
    kept, choices = [], []
    for gkey, rs in group(recs, by).items():
        sel = [r for r in rs if r.get("eval_set", "") == split and r.get(metric) is not None]
        where = ", ".join(f"{k}={v}" for k, v in zip(by, gkey)) or "all runs"
        if not sel:
            if select_on == "validation":
                raise SelectionError(
                    f"no validation results (eval set 'valid') of {metric} for {where}: these runs "
                    "predate the validation split; rerun them, or pass --select-on test "
                    "(selection on the test set)")
            raise SelectionError(f"no test results of {metric} for {where}")
        points = {pk: summarize((r.get(metric) for r in ps), ci=False)
                  for pk, ps in group(sel, over).items()}
        pick = max if how == "max" else min
        chosen = pick(points, key=lambda pk: points[pk]["mean"])
        ids = {r["run_id"] for r in rs if tuple(_hashable(r.get(k)) for k in over) == chosen}
        kept += [r for r in rs if r["run_id"] in ids]
        choices.append({**dict(zip(by, gkey)), "chosen": dict(zip(over, chosen)),
                        "select_on": select_on, "metric": metric,
                        "mean": points[chosen]["mean"], "n": points[chosen]["n"],
                        "candidates": len(points)})
    return kept, choices


def _ident(v: Any) -> str:
    """A hashable, type-keeping identity of a field value (1 and 1.0 and '1' stay apart,
    lists and dicts by content)."""
    import json

    return json.dumps(v, sort_keys=True, default=str)


def config_keys(recs: Iterable[dict]) -> list[str]:
    """The run fields that make a configuration: every field of the records but the seed,
    bookkeeping (run id, profile, eval set) and metrics (values measured, run-level ones
    such as params and flops included), in the records' field order."""
    recs = list(recs)
    metrics = {m for r in recs for m in r.get("__metrics__", ())}
    return [k for k in dict.fromkeys(k for r in recs for k in r)
            if k not in BOOKKEEPING and k not in metrics and k not in NOT_CONFIG]


def pooled_keys(recs: list[dict], by: list[str], ignore: Iterable[str] = ()) -> dict[str, list]:
    """{key: its values} for every configuration key (:func:`config_keys`, less ``by`` and
    ``ignore``) whose value differs between two records of one group of ``by``; a key one
    record lacks counts as the value None. Empty: every group differs only by seed. Keys
    in :data:`SPLIT_FIRST` order, then the grid's axes, then the records' field order."""
    skip = set(by) | set(ignore) | {"eval_set"}
    keys = [k for k in config_keys(recs) if k not in skip]
    seen: dict[str, dict[str, Any]] = {}
    for rs in group(recs, [k for k in by if k != "eval_set"]).values():
        for k in keys:
            vals = {_ident(r.get(k)): r.get(k) for r in rs}
            if len(vals) > 1:
                seen.setdefault(k, {}).update(vals)
    grid = grid_keys(recs)
    order = {k: (0, SPLIT_FIRST.index(k)) if k in SPLIT_FIRST else (1, grid.index(k)) if k in grid
             else (2, i) for i, k in enumerate(keys)}
    return {k: sorted(seen[k].values(), key=sort_key) for k in sorted(seen, key=order.__getitem__)}


def split_keys(recs: list[dict], by: list[str], ignore: Iterable[str] = ()) -> list[str]:
    """The keys to add to ``by`` so that no group pools runs that differ in more than the
    seed: the first differing key of :func:`pooled_keys`, again until none differs. Adding
    one at a time keeps the list short: once ``task`` is a key, the task's own parameters
    (``task.vocab_size``, ``task_setting``) no longer differ inside a group. ``ignore``:
    keys allowed to differ (``best_over``'s keys, chosen among before the table)."""
    added: list[str] = []
    while True:
        diff = pooled_keys(recs, list(by) + added, ignore)
        if not diff:
            return added
        added.append(next(iter(diff)))


def split_note(keys: list[str], where: str = "row") -> str:
    """The one line a table prints when it added keys: 'task varies within cells: added as
    a row key'. Empty for no keys."""
    if not keys:
        return ""
    names = ", ".join(keys)
    verb = "varies" if len(keys) == 1 else "vary"
    return (f"{names} {verb} within cells: added as {'a ' if len(keys) == 1 else ''}{where} "
            f"key{'s' if len(keys) > 1 else ''} (a cell averages over seeds only)")


def refuse_pooling(recs: list[dict], by: list[str], what: str, ignore: Iterable[str] = ()) -> None:
    """Raise :class:`PoolingError` when a group of ``by`` holds runs that differ in more
    than the seed: '<what>: runs of model=lstm, seq_len=32 differ in 'task.tokenizer'
    (bpe, bytes): ...'. For surfaces whose layout is fixed (score, report)."""
    diff = pooled_keys(recs, by, ignore)
    if not diff:
        return
    key = next(iter(diff))
    group_of = next(gk for gk, rs in group(recs, [k for k in by if k != "eval_set"]).items()
                    if len({_ident(r.get(key)) for r in rs}) > 1)
    where = ", ".join(f"{k}={v}" for k, v in zip([k for k in by if k != "eval_set"], group_of))
    vals = ", ".join("(unset)" if v is None else str(v) for v in diff[key])
    more = f" (and {', '.join(list(diff)[1:])})" if len(diff) > 1 else ""
    raise PoolingError(
        f"{what}: runs of {where or 'one group'} differ in {key!r} ({vals}){more}; averaging them "
        f"as seeds would mix different things: the profile name holds more than one sweep "
        f"(give each its own profile name, or compare them: `export --rows model,{key}`)",
        list(diff))


def fields_of(recs: list[dict]) -> list[str]:
    """The fields a table can be laid out by: the run fields present, then eval_set."""
    metrics = {m for r in recs for m in r.get("__metrics__", ())}
    names = [k for k in dict.fromkeys(k for r in recs for k in r)
             if k not in BOOKKEEPING and k not in metrics]
    return names + ["eval_set"]


def metrics_of(recs: list[dict]) -> list[str]:
    """The metrics these records hold, catalogued ones first in catalogue order."""
    have = {k for r in recs for k in r.get("__metrics__", ())}
    return [m for m in catalogue.CATALOGUE if m in have] + sorted(have - set(catalogue.CATALOGUE))
