"""Comparison tables from the store: rows x columns of metrics, mean ± std over seeds.

Rows and columns are any run field (``model``, ``task``, ``seq_len``, ``seed``,
``d_model``, ``n_layers``, ``task.<param>``, ``opt.<option>``, a grid key such as
``train.lr``, ``task_setting``) or ``eval_set`` (e.g. the test lengths of induction
heads). Cells aggregate every finished run (and eval set) that shares the row and column
values; the numbers come from :mod:`workbench.results` (catalogue and aggregation).

Like with like: a cell averages runs that differ in the seed only. Run fields the rows and
columns leave varying inside a cell (a profile name holding four tasks or two tokenizers,
a grid key neither laid out nor taken the best over) become extra row keys, said in one
line (``task varies within cells: added as a row key``: on stderr by the CLI, in the
caption of Markdown and LaTeX), and a column's best cells are compared only among rows
with the same values of those keys.

- several metrics: one table per metric (Markdown, LaTeX), one long CSV with a ``metric``
  column, one JSON list with every requested metric;
- ``best_over`` grid keys: per table cell, only the runs of the grid point with the best
  mean selection metric on the validation set (``select_on="validation"``, eval set
  "valid") or on the test set (``"test"``; every table then says "selected on test"), the
  chosen points listed under the table;
- the best cells of a column are marked (bold) by the Welch rule of
  :func:`workbench.results.aggregate.winners`: the best mean and every cell not
  significantly worse than it (two-sided Welch's t-test, 5%); cells of one run never;
- counts (parameters, steps, eval sequences) print as integers; a cell of one run shows
  "(n=1)" instead of a spread.

Files are written whole or not at all (:func:`write_atomic`, also for figures and the
report): a full disk gives one line (:class:`CannotWrite`), never a 0-byte file.

Formats: Markdown, CSV (long format: one line per cell and metric with its fields, mean,
std, n, ci95 and ``winner``, the same verdict as the Markdown's bold), LaTeX, JSON (one
record per (row, column) group: the grouping fields and each metric as
{"mean", "std", "n", "ci95"}, plus "selected" with best_over).
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Callable

from workbench.results import aggregate as agg
from workbench.store import is_disk_full
from workbench.results import catalogue
from workbench.results.aggregate import (  # noqa: F401  (re-exported: older code imports them here)
    SelectionError, best_cells, fields_of, group, metrics_of, records, table,
)

# older names, now views of the catalogue
METRICS = catalogue.DESCRIPTIONS
BETTER = catalogue.BETTER
RUN_LEVEL = catalogue.RUN_LEVEL
FORMATS = ("md", "csv", "latex", "json")
WINNER_RULE = ("bold: best mean of its column and every cell not significantly different from it "
               "(Welch's t-test, two-sided, 5%); cells of one run are never marked")


def aggregate(values: list) -> dict[str, Any]:
    """Mean, std, n, ci95 of the values (see :func:`workbench.results.aggregate.summarize`)."""
    return agg.summarize(values)


def fmt_cell(a: dict | None, digits: int = 3, latex: bool = False, count: bool = False,
             mark_single: bool = False) -> str:
    """'0.812 ± 0.013'; counts as integers ('256'); one run: the mean, with '(n=1)' when
    ``mark_single``, or with the standard error it stored (lm-eval's), '0.600 ± 0.245', and
    then '(stderr)' when ``mark_single``; no value: a dash."""
    if not a or a["mean"] is None:
        return "--" if latex else "–"
    m, s, n = a["mean"], a.get("std"), a["n"]
    pm = " $\\pm$ " if latex else " ± "
    if n == 1 and a.get("stderr") is not None and not count:  # one lm-eval run: its standard error
        return f"{m:.{digits}f}{pm}{a['stderr']:.{digits}f}" + (" (stderr)" if mark_single else "")
    if count:
        if not s and float(m).is_integer():
            text = f"{int(m)}"
        else:
            text = f"{m:.1f}" + (f"{pm}{s:.1f}" if n > 1 else "")
    else:
        text = f"{m:.{digits}f}" + (f"{pm}{s:.{digits}f}" if n > 1 and s is not None else "")
    if n == 1 and mark_single:
        text += " (n=1)"
    return text


def _label(fields: list[str], key: tuple) -> str:
    if len(fields) == 1:
        return "" if key[0] is None else str(key[0])
    return ", ".join(f"{f}={v}" for f, v in zip(fields, key))


def _col_header(cols: list[str], key: tuple) -> str:
    if not cols:
        return "all"
    label = _label(cols, key)
    if not label:
        return "(default)" if cols == ["eval_set"] else f"{cols[0]}=–"
    if len(cols) == 1 and "=" not in label:  # 'seq_len=256'; eval sets already read 'len=256'
        return f"{cols[0]}={label}"
    return label


# the metric `export` shows when none is named, as the TUI's Results tab opens a profile: a
# profile of language models (task lm) on bits per byte (it compares tokenizers, where loss
# in nats per token and next-token accuracy do not), others on accuracy (lm-eval's acc)
LM_DEFAULT_METRICS = ("bits_per_byte", "perplexity", "loss")
DEFAULT_METRICS = ("accuracy", "acc", "perplexity", "loss")


def default_metric(recs: list[dict]) -> str:
    """The first of :data:`LM_DEFAULT_METRICS` (every record an lm run's) or
    :data:`DEFAULT_METRICS` that a record holds, else the first per-eval-set metric held
    (an evaluation of tasks of one's own: bits_per_byte, word_perplexity), else accuracy."""
    held = {m for r in recs for m in r.get("__metrics__", ()) if r.get(m) is not None}
    lm = bool(recs) and all(r.get("task") == "lm" for r in recs)
    for m in LM_DEFAULT_METRICS if lm else DEFAULT_METRICS:
        if m in held:
            return m
    own = sorted(m for m in held if not m.endswith("_stderr") and not (catalogue.get(m) and catalogue.get(m).run_level))
    return own[0] if own else "accuracy"


def default_cols(recs: list[dict]) -> list[str]:
    """The columns when none are named: the sequence length, or for evaluation runs (no
    length, results per lm-eval task) the eval set."""
    if any(r.get("seq_len") is not None for r in recs) or not any(r.get("eval_set") for r in recs):
        return ["seq_len"]
    return ["eval_set"]


def default_select_metric(metrics: list[str]) -> str:
    """The selection metric when none is named: the first requested per-eval-set metric with
    a direction (accuracy, loss, ...), else accuracy."""
    for m in metrics:
        c = catalogue.get(m)
        if c and c.better and not c.run_level:
            return m
    return "accuracy"


def build(recs: list[dict], metrics: list[str], rows: list[str], cols: list[str],
          best_over: list[str] | None = None, select_on: str = "validation",
          select_metric: str | None = None) -> dict:
    """Everything the formats print: {'tables': [{'metric', 'table', 'best'}], 'records'
    (after selection), 'choices', 'select_on', 'select_metric', 'best_over', 'rows' (the
    row keys laid out: ``rows`` and then 'added'), 'added'}.

    Like with like: run fields other than the seed that vary inside a cell (a profile name
    holding four tasks, two tokenizers, a grid axis neither laid out nor selected over)
    are added as row keys (:func:`workbench.results.aggregate.split_keys`), listed in
    'added' and said by :func:`workbench.results.aggregate.split_note`. The ``best_over``
    keys may vary (they are chosen among): the keys are found within each grid point, so
    each added key also splits the selection, and checked again after it."""
    choices: list[dict] = []
    sel_metric = None
    over = list(best_over or [])
    added = agg.split_keys(recs, rows + cols + over)
    rows = list(rows) + added
    if best_over:
        sel_metric = select_metric or default_select_metric(metrics)
        recs, choices = agg.best_over(recs, best_over, sel_metric, rows + cols, select_on)
        more = agg.split_keys(recs, rows + cols)  # after selection: one point per cell
        added += more
        rows += more
    tables = []
    for m in metrics:
        t = table(recs, m, rows, cols)
        tables.append({"metric": m, "table": t, "best": _best_within(t, m, len(rows) - len(added))})
    return {"tables": tables, "records": recs, "choices": choices, "select_on": select_on,
            "select_metric": sel_metric, "best_over": list(best_over or []), "rows": rows,
            "added": added}


def _best_within(t: dict, metric: str, asked: int) -> set[tuple]:
    """:func:`best_cells`, compared only among rows that agree on the added row keys (those
    after the first ``asked``): a column's best parity cell is not beaten by a cycle
    navigation cell."""
    if not t["rows"] or asked >= len(t["rows"][0]):
        return best_cells(t, metric)
    out: set[tuple] = set()
    for part in dict.fromkeys(rk[asked:] for rk in t["rows"]):
        sub = {**t, "rows": [rk for rk in t["rows"] if rk[asked:] == part]}
        out |= best_cells(sub, metric)
    return out


def _selection_note(b: dict) -> str:
    if not b["best_over"]:
        return ""
    split = "selected on test (eval set '')" if b["select_on"] == "test" else \
        "selected on validation (eval set 'valid')"
    return (f"best over {', '.join(b['best_over'])}: per cell, the grid point with the best mean "
            f"{b['select_metric']}, {split}; the cell shows that point's test numbers")


def spread_text(t: dict) -> str:
    """What a table's '±' is: lm-eval's standard error for evaluation runs (one run per cell),
    else the std over the cells' runs ('mean ± std over 1/3 run(s) per cell')."""
    if t.get("evaluation"):
        return "one evaluation run per cell, ± lm-eval's standard error (where the metric has one)"
    ns = sorted({a["n"] for a in t["cells"].values() if a and a.get("mean") is not None})
    return f"mean ± std over {'/'.join(map(str, ns))} run(s) per cell"


def _caption(metric: str, t: dict, b: dict) -> str:
    text = f"{metric}: {catalogue.describe(metric)}; {spread_text(t)}"
    if catalogue.better(metric) and not t.get("evaluation"):  # one run a cell: none is ever marked
        text += f"; {WINNER_RULE}"
    note = _selection_note(b)
    split = agg.split_note(b.get("added") or [])
    return text + (f"; {note}" if note else "") + (f"; {split}" if split else "")


def _choice_rows(b: dict, rows: list[str], cols: list[str]) -> tuple[list[str], list[list[str]]]:
    by = [k for k in rows + cols if k != "eval_set" and k not in b["best_over"]]
    split = "test" if b["select_on"] == "test" else "validation"
    header = by + b["best_over"] + [f"{b['select_metric']} on {split}", "grid points"]
    body = [[str(c.get(k)) for k in by] + [str(c["chosen"][k]) for k in b["best_over"]]
            + [f"{c['mean']:.4g} (n={c['n']})", str(c["candidates"])] for c in b["choices"]]
    return header, body


def _grid(t: dict, metric: str, rows: list[str], cols: list[str], digits: int, latex: bool,
          best: set, bold) -> tuple[list[str], list[list[str]]]:
    corner = "/".join(rows) + " \\ " + "/".join(cols) if cols else "/".join(rows)
    shown = shown_cols(t)
    header = [corner] + [_col_header(cols, c) for c in shown]
    count = catalogue.is_count(metric)
    body = []
    for rk in t["rows"]:
        row = [_label(rows, rk)]
        for ck in shown:
            text = fmt_cell(t["cells"].get((rk, ck)), digits, latex, count, mark_single=True)
            row.append(bold(text) if (rk, ck) in best else text)
        body.append(row)
    return header, body


def shown_cols(t: dict) -> list[tuple]:
    """The table's columns that hold a number for its metric (an evaluation's tasks: acc on
    lambada and piqa, perplexity on lambada only; its run-level eval set '' has neither), or
    all of them when none does (as the TUI's Results tab lays them out)."""
    return [ck for ck in t["cols"] if any((t["cells"].get((rk, ck)) or {}).get("mean") is not None
                                          for rk in t["rows"])] or t["cols"]


def _md(b: dict, rows, cols, digits) -> str:
    out = []
    for tb in b["tables"]:
        header, body = _grid(tb["table"], tb["metric"], rows, cols, digits, False, tb["best"],
                             lambda s: f"**{s}**")
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        out.append("\n".join(lines) + f"\n\n{_caption(tb['metric'], tb['table'], b)}\n")
    if b["choices"]:
        header, body = _choice_rows(b, rows, cols)
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        split = "test" if b["select_on"] == "test" else "validation"
        out.append(f"Chosen grid points (selected on {split}):\n\n" + "\n".join(lines) + "\n")
    return "\n".join(out)


def _tex_escape(s: str) -> str:
    out = s.replace("\\", "\\textbackslash{}")
    for ch in "_%&#${}":
        out = out.replace(ch, "\\" + ch)
    return out.replace("~", "\\textasciitilde{}").replace("^", "\\textasciicircum{}").replace(
        "\\textbackslash\\{\\}", "\\textbackslash{}")


def _latex(b: dict, rows, cols, digits) -> str:
    out = []
    for tb in b["tables"]:
        header, body = _grid(tb["table"], tb["metric"], rows, cols, digits, True, tb["best"],
                             lambda s: "\\textbf{" + s + "}")
        lines = ["\\begin{table}[t]", "\\centering",
                 "\\begin{tabular}{l" + "c" * (len(header) - 1) + "}", "\\toprule",
                 " & ".join(_tex_escape(h) for h in header) + " \\\\", "\\midrule"]
        lines += [" & ".join(_tex_escape(c) if i == 0 else c for i, c in enumerate(row)) + " \\\\"
                  for row in body]
        cap = _tex_escape(_caption(tb["metric"], tb["table"], b)).replace("±", "$\\pm$")
        lines += ["\\bottomrule", "\\end{tabular}", "\\caption{" + cap + "}", "\\end{table}"]
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _csv(b: dict, rows, cols) -> str:
    """Long format, loadable as it is (``pandas.read_csv``): one line per (metric, row, column)
    cell that has runs, with the row and column fields in their own columns, then
    ``metric, mean, std, n, ci95`` and ``winner`` (true/false: the cell is marked best by
    the Welch rule, as the Markdown bolds it). With best_over, ``selected_on``,
    ``select_metric`` and each chosen grid key (its dotted name) follow. std and ci95 are
    empty for a cell of one run (n = 1 says nothing about the spread)."""
    keys = list(rows) + [c for c in cols if c not in rows]
    by = [k for k in rows + cols if k != "eval_set" and k not in b["best_over"]]
    chosen = {tuple(c.get(k) for k in by): c["chosen"] for c in b["choices"]}
    header = keys + ["metric", "mean", "std", "n", "ci95", "winner"]
    if b["best_over"]:
        header += ["selected_on", "select_metric"] + list(b["best_over"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for tb in b["tables"]:
        t = tb["table"]
        for rk in t["rows"]:
            for ck in t["cols"]:
                a = t["cells"].get((rk, ck))
                if not a or not a["n"]:
                    continue
                fields = dict(zip(cols, ck)) | dict(zip(rows, rk))
                line = ["" if fields.get(k) is None else str(fields[k]) for k in keys]
                line += [tb["metric"], _num(a["mean"]), _num(a["std"]), str(a["n"]), _num(a["ci95"]),
                         "true" if (rk, ck) in tb["best"] else "false"]
                if b["best_over"]:
                    c = chosen.get(tuple(fields.get(k) for k in by), {})
                    line += ["test" if b["select_on"] == "test" else "validation", b["select_metric"]]
                    line += ["" if c.get(k) is None else str(c[k]) for k in b["best_over"]]
                w.writerow(line)
    return buf.getvalue()


def to_json(recs: list[dict], by: list[str], metrics: list[str] | None = None,
            choices: list[dict] | None = None, best_over: list[str] | None = None) -> list[dict]:
    """One record per group of ``by`` that holds a value of some metric: its fields, each
    metric (all the records hold when ``metrics`` is None) as {"mean", "std", "n", "ci95"}
    (and "stderr", a one-run group's stored standard error: lm-eval's), the run ids, and with
    best_over the grid point chosen for the group ("selected")."""
    recs = agg.on_eval_set(recs, by)
    names = metrics if metrics else sorted({k for r in recs for k in r.get("__metrics__", ())} - set(by))
    sel_by = [k for k in by if k != "eval_set" and k not in (best_over or [])]
    chosen = {tuple(c.get(k) for k in sel_by): c for c in choices or []}
    out = []
    for key, rs in group(recs, by).items():
        rec: dict[str, Any] = dict(zip(by, key))
        for n in names:
            rec[n] = agg.with_stderr(agg.summarize(r.get(n) for r in rs), rs, n)
        if names and not any(rec[n]["n"] for n in names):
            continue  # no value of any metric asked for (an evaluation's run-level eval set ''): no record
        rec["run_ids"] = sorted(r["run_id"] for r in rs)
        c = chosen.get(tuple(rec.get(k) for k in sel_by))
        if c:
            rec["selected"] = {"on": c["select_on"], "metric": c["metric"], "chosen": c["chosen"],
                               "mean": c["mean"], "n": c["n"], "grid_points": c["candidates"]}
        out.append(rec)
    return out


def render(recs: list[dict], metric: str | list[str], rows: list[str], cols: list[str], fmt: str,
           digits: int = 3, best_over: list[str] | None = None, select_on: str = "validation",
           select_metric: str | None = None, json_all: bool = False) -> str:
    """The table(s) of ``metric`` (a name or a list) in ``fmt``. JSON holds the requested
    metrics, or every metric the records hold with ``json_all``. Raises ValueError
    (SelectionError) for a bad format or a selection that cannot be made."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")
    metrics = [metric] if isinstance(metric, str) else list(metric)
    b = build(recs, metrics, rows, cols, best_over, select_on, select_metric)
    return render_built(b, cols, fmt, digits, json_all)


def render_built(b: dict, cols: list[str], fmt: str, digits: int = 3, json_all: bool = False) -> str:
    """:func:`render` of :func:`build`'s result (whose 'added' a caller may say first)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")
    rows = b["rows"]  # with the keys that vary within the asked-for cells (b["added"])
    metrics = [tb["metric"] for tb in b["tables"]]
    if fmt == "json":
        return json.dumps(to_json(b["records"], rows + cols, None if json_all else metrics,
                                  b["choices"], b["best_over"]), indent=2)
    if fmt == "md":
        return _md(b, rows, cols, digits)
    if fmt == "csv":
        return _csv(b, rows, cols)
    return _latex(b, rows, cols, digits)


# --------------------------------------------------------------------------- writing files
class CannotWrite(Exception):
    """A result file (table, figure, report) could not be written; the message is one line
    naming the file and why (a full disk said as such), and nothing was left in its place."""


def write_atomic(path: str | Path, data: str | Callable[[Path], None]) -> Path:
    """Write ``path`` whole or not at all: ``data`` (text, or a function writing to the path
    it is given, e.g. a figure's savefig) goes to a temporary file beside it that is then
    renamed over it. On any OSError the temporary file is removed and :class:`CannotWrite`
    raised: a full disk must not leave a 0-byte table or figure that looks like a result,
    nor a half-written one over the previous good file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            data(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CannotWrite(cannot_write_text(path, e)) from None
    return path


def cannot_write_text(path: str | Path, e: OSError) -> str:
    """'cannot write FILE: disk full (No space left on device); nothing was written'."""
    why = f"disk full ({e.strerror or e})" if is_disk_full(e) else (e.strerror or str(e))
    return f"cannot write {path}: {why}; nothing was written"
