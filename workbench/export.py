"""Comparison tables from the store: rows x columns of one metric, mean ± std over seeds.

Rows and columns are any run field (``model``, ``task``, ``seq_len``, ``seed``,
``d_model``, ``n_layers``, ``task.<param>``, ``opt.<option>``) or ``eval_set`` (e.g. the
test lengths of induction heads). Cells aggregate every finished run (and eval set) that
shares the row and column values. Formats: Markdown, CSV, LaTeX, JSON. The JSON form is a
list of records, one per (row, column) group: the grouping fields and every metric as
{"mean", "std", "n"}.
"""
from __future__ import annotations

import csv
import io
import json
import math
import statistics
from typing import Any, Iterable

from workbench.store import Store

METRICS = {
    "accuracy": "eval accuracy per target token",
    "sequence_accuracy": "eval whole-sequence exact match",
    "loss": "eval loss (nats per target token)",
    "eval_sequences": "sequences in the eval set (the accuracy's sample size)",
    "best_accuracy": "best eval accuracy seen during training",
    "best_at_epoch": "epoch at which the best eval accuracy was first reached",
    "step_time_ms": "median forward+backward+update time per step after warm-up (ms)",
    "inference_ms": "median no-grad forward time of one eval batch (ms)",
    "compile_s": "time of the first training step with train.compile, compilation included (s)",
    "tokens_per_s": "training tokens per second",
    "peak_mem_mb": "peak memory (GPU allocator peak, else process peak RSS) in MiB",
    "gpu_util_mean": "mean GPU utilisation sampled by NVML during the run (%)",
    "gpu_util_max": "max GPU utilisation sampled by NVML (%)",
    "gpu_mem_peak_mb": "peak GPU memory used by the device according to NVML (MiB)",
    "params": "backbone parameter count",
    "params_trainable": "parameters the optimizer updates (all of the model's that require grad)",
    "state_size": "recurrent state size (floats per sequence)",
    "wall_s": "wall time of the run (s)",
    "steps": "optimizer steps taken",
    "epochs": "epochs trained",
    "bits_per_char": "eval bits per character (char-LM)",
}
# which way is better, for highlighting the best cell (metrics not listed have no "best":
# parameter counts, steps, sample sizes)
BETTER = {
    **dict.fromkeys(("accuracy", "sequence_accuracy", "best_accuracy", "tokens_per_s"), "max"),
    **dict.fromkeys(("loss", "bits_per_char", "step_time_ms", "inference_ms", "compile_s",
                     "peak_mem_mb", "gpu_mem_peak_mb", "wall_s", "best_at_epoch"), "min"),
}
# metrics of the run as a whole live in eval set '' and apply to every eval set's row
RUN_LEVEL = {"step_time_ms", "inference_ms", "tokens_per_s", "peak_mem_mb", "gpu_util_mean",
             "gpu_util_max", "gpu_mem_peak_mb", "params", "params_trainable", "state_size", "wall_s", "steps",
             "epochs", "best_accuracy", "best_at_epoch", "best_at_step", "train_s",
             "compile_s"}


def records(store: Store, profile: str | None = None, states: Iterable[str] = ("finished",)) -> list[dict]:
    """One flat record per (run, eval set): run fields + eval_set + metric values."""
    runs = store.runs(profile=profile, states=list(states))
    res = store.results(r.id for r in runs)
    out = []
    for r in runs:
        sets = res.get(r.id, {})
        base = sets.get("", {})
        for es, vals in sorted(sets.items()):
            if es and not any(k not in RUN_LEVEL for k in vals):
                continue
            rec = {**r.fields, "run_id": r.id, "profile": r.profile, "eval_set": es}
            rec.update({k: v for k, v in base.items() if k in RUN_LEVEL})
            rec.update(vals)
            rec["__metrics__"] = sorted(set(vals) | {k for k in base if k in RUN_LEVEL})
            out.append(rec)
    return out


def _key(v: Any) -> tuple:
    # numbers sort numerically, then strings; None last
    if v is None:
        return (2, "")
    if isinstance(v, (int, float)):
        return (0, v)
    if isinstance(v, str) and v.startswith("len="):
        try:
            return (0, int(v[4:]))
        except ValueError:
            pass
    return (1, str(v))


def aggregate(values: list[float]) -> dict[str, float | int | None]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def group(recs: list[dict], by: list[str]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault(tuple(r.get(f) for f in by), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: tuple(_key(v) for v in kv[0])))


def table(recs: list[dict], metric: str, rows: list[str], cols: list[str]) -> dict:
    """{'rows': [row keys], 'cols': [col keys], 'cells': {(row, col): agg}}."""
    if "eval_set" not in rows + cols:
        recs = [r for r in recs if r.get("eval_set", "") == ""]
    cells: dict[tuple, dict] = {}
    row_keys, col_keys = [], []
    for (rk, ck), rs in _two_level(recs, rows, cols).items():
        cells[(rk, ck)] = aggregate([r.get(metric) for r in rs])
        if rk not in row_keys:
            row_keys.append(rk)
        if ck not in col_keys:
            col_keys.append(ck)
    row_keys.sort(key=lambda k: tuple(_key(v) for v in k))
    col_keys.sort(key=lambda k: tuple(_key(v) for v in k))
    return {"rows": row_keys, "cols": col_keys, "cells": cells}


def best_cells(t: dict, metric: str) -> set[tuple]:
    """The (row, col) keys holding the best mean of each column of :func:`table`'s result
    (all of them on a tie); empty for metrics without a direction."""
    how = BETTER.get(metric)
    if how is None:
        return set()
    out = set()
    for ck in t["cols"]:
        means = {rk: a["mean"] for rk in t["rows"]
                 if (a := t["cells"].get((rk, ck))) and a["mean"] is not None}
        if len(means) > 1:  # a lone value is not "best" of anything
            best = (max if how == "max" else min)(means.values())
            out |= {(rk, ck) for rk, m in means.items() if m == best}
    return out


def fields_of(recs: list[dict]) -> list[str]:
    """The fields a table can be laid out by: the run fields present, then eval_set."""
    skip = {"run_id", "profile", "__metrics__", "eval_set"}
    names = [k for k in dict.fromkeys(k for r in recs for k in r) if k not in skip
             and not any(k in r.get("__metrics__", ()) for r in recs)]
    return names + ["eval_set"]


def metrics_of(recs: list[dict]) -> list[str]:
    """The metrics these records hold, known ones first in METRICS order."""
    have = {k for r in recs for k in r.get("__metrics__", ())}
    return [m for m in METRICS if m in have] + sorted(have - set(METRICS))


def _two_level(recs, rows, cols):
    out: dict[tuple, list] = {}
    for r in recs:
        rk = tuple(r.get(f) for f in rows)
        ck = tuple(r.get(f) for f in cols)
        out.setdefault((rk, ck), []).append(r)
    return out


def fmt_cell(agg: dict | None, digits: int = 3, latex: bool = False) -> str:
    if not agg or agg["mean"] is None:
        return "–" if not latex else "--"
    m, s = agg["mean"], agg["std"]
    pm = " $\\pm$ " if latex else " ± "
    return f"{m:.{digits}f}" + (f"{pm}{s:.{digits}f}" if agg["n"] > 1 else "")


def _label(fields: list[str], key: tuple) -> str:
    if len(fields) == 1:
        return "" if key[0] is None else str(key[0])
    return ", ".join(f"{f}={v}" for f, v in zip(fields, key))


def _col_header(cols: list[str], key: tuple) -> str:
    label = _label(cols, key)
    if not label:
        return "(default)" if cols == ["eval_set"] else f"{cols[0]}=–"
    if len(cols) == 1 and "=" not in label:  # 'seq_len=256'; eval sets already read 'len=256'
        return f"{cols[0]}={label}"
    return label or "(default)"


def render(recs: list[dict], metric: str, rows: list[str], cols: list[str], fmt: str,
           digits: int = 3) -> str:
    if fmt == "json":
        return json.dumps(to_json(recs, rows + cols), indent=2)
    t = table(recs, metric, rows, cols)
    corner = "/".join(rows) + " \\ " + "/".join(cols)
    header = [corner] + [_col_header(cols, c) for c in t["cols"]]
    body = [[_label(rows, rk)] + [fmt_cell(t["cells"].get((rk, ck)), digits, fmt == "latex")
                                  for ck in t["cols"]] for rk in t["rows"]]
    n_note = sorted({a["n"] for a in t["cells"].values()})
    caption = (f"{metric}: {METRICS.get(metric, metric)}; mean ± std over "
               f"{'/'.join(map(str, n_note))} run(s) per cell")
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines) + f"\n\n{caption}\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow([corner] + [_label(cols, c) for c in t["cols"]])
        for rk in t["rows"]:
            row = [_label(rows, rk)]
            for ck in t["cols"]:
                a = t["cells"].get((rk, ck)) or {"mean": None}
                row.append("" if a["mean"] is None else f"{a['mean']:.6g}")
            w.writerow(row)
        # std in a second block so each cell stays one number for spreadsheets
        w.writerow([])
        w.writerow([f"std of {metric}"] + [_label(cols, c) for c in t["cols"]])
        for rk in t["rows"]:
            w.writerow([_label(rows, rk)] + [
                "" if (a := t["cells"].get((rk, ck))) is None or a["std"] is None else f"{a['std']:.6g}"
                for ck in t["cols"]])
        return buf.getvalue()
    if fmt == "latex":
        esc = lambda s: s.replace("_", "\\_").replace("%", "\\%").replace("&", "\\&")  # noqa: E731
        lines = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * len(t["cols"]) + "}",
                 "\\toprule", " & ".join(esc(h) for h in header) + " \\\\", "\\midrule"]
        lines += [" & ".join(esc(c) if i == 0 else c for i, c in enumerate(row)) + " \\\\" for row in body]
        cap = esc(caption).replace("±", "$\\pm$")
        lines += ["\\bottomrule", "\\end{tabular}", "\\caption{" + cap + "}", "\\end{table}"]
        return "\n".join(lines) + "\n"
    raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")


def to_json(recs: list[dict], by: list[str]) -> list[dict]:
    if "eval_set" not in by:
        recs = [r for r in recs if r.get("eval_set", "") == ""]
    names = sorted({k for r in recs for k in r.get("__metrics__", ())} - set(by))
    out = []
    for key, rs in group(recs, by).items():
        rec: dict[str, Any] = dict(zip(by, key))
        for n in names:
            rec[n] = aggregate([r.get(n) for r in rs])
        rec["run_ids"] = sorted(r["run_id"] for r in rs)
        out.append(rec)
    return out
