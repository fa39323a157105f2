"""The bench command's tables: each measurement's columns, and rows as Markdown, CSV or JSON."""
from __future__ import annotations

import csv
import io
import json
from typing import Any

from workbench.cli.bench_generate import GENERATE_COLUMNS, GENERATE_MATCH_COLUMNS

COLUMNS = ["model", "seq_len", "backend", "params", "fwd_bwd_ms", "infer_ms", "train_tok_s", "peak_mib"]
# bench --match: the solved sizes beside the measurement; `matched` is the solver's count
# (non-embedding parameters, or state floats per sequence), `match_err_%` its distance from
# the target; a finer knob the solver needed (d_state, expand_v, mlp_mult) gets a column too
MATCH_COLUMNS = ["model", "seq_len", "backend", "d_model", "n_layers", "params", "matched", "match_err_%",
                 "fwd_bwd_ms", "infer_ms", "train_tok_s", "peak_mib"]
MATCH_KNOBS = ("d_state", "expand_v", "mlp_mult")
SCAN_COLUMNS = ["kernel", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_first"]
OP_COLUMNS = ["op", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_ref"]
ESTIMATE_COLUMNS = ["family", "model", "seq_len", "batch", "est_mib", "measured_mib", "ratio"]
STREAM_COLUMNS = ["model", "tokens", "mode", "chunk_len", "backend", "seconds", "tok_s", "peak_rss_mib", "extra_mib"]
# --format json's keys, and the tables' order
SECTIONS = ["runs", "scan", "ops", "stream", "estimate", "triton_compile", "generate"]


def _cell(v: Any) -> str:
    """A Markdown cell: the value as Python writes it, a long float (a solved expand_v of
    104 / 59) to 6 significant digits; CSV and JSON keep the exact value."""
    text = str(v)
    return f"{v:.6g}" if isinstance(v, float) and len(text) > 10 else text


def format_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "md") -> str:
    """Markdown or CSV table of ``rows`` (dicts) over ``columns`` (plus errors, if any)."""
    cols = list(columns) + (["error"] if any("error" in r for r in rows) else [])
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cells = [[_cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def runs_columns(rows: list[dict[str, Any]], plain: list[str] = COLUMNS,
                 matched: list[str] = MATCH_COLUMNS) -> list[str]:
    """The training-step table's columns: COLUMNS, or under ``--match`` (rows carrying
    ``matched``) MATCH_COLUMNS with a column for each finer knob some row was solved at
    (``plain`` / ``matched``: another table's, as --generate's)."""
    if not any("matched" in r for r in rows):
        return plain
    knobs = [k for k in MATCH_KNOBS if any(k in r for r in rows)]
    at = matched.index("n_layers") + 1
    return matched[:at] + knobs + matched[at:]


def generate_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The generation table's columns: GENERATE_COLUMNS, or under ``--match``
    GENERATE_MATCH_COLUMNS with the finer knobs, as :func:`runs_columns`."""
    return runs_columns(rows, GENERATE_COLUMNS, GENERATE_MATCH_COLUMNS)


def match_notes(match: tuple[str, int] | None, refused: list[dict[str, str]]) -> list[str]:
    """The lines under a --match table: the target, then each model the solver refused with
    its reason, one line each."""
    if match is None:
        return []
    target, value = match
    what = "non-embedding parameters" if target == "params" else "state floats per sequence"
    lines = [f"matched: {target} = {value:,} ({what}), within 2%, by workbench.spec.match"]
    lines += [f"not matched: {r['model']}: {r['reason']}" for r in refused]
    return lines


def _section_columns(section: str, rows: list[dict[str, Any]] | None = None) -> list[str]:
    if section == "runs":
        return runs_columns(rows or [])
    if section == "generate":
        return generate_columns(rows or [])
    if section == "triton_compile":
        from models.kernels.triton_aot import COLUMNS as AOT_COLUMNS
        return AOT_COLUMNS
    return {"runs": COLUMNS, "scan": SCAN_COLUMNS, "ops": OP_COLUMNS, "stream": STREAM_COLUMNS,
            "estimate": ESTIMATE_COLUMNS, "generate": GENERATE_COLUMNS}[section]


def render(sections: dict[str, list[dict[str, Any]]], fmt: str, match: tuple[str, int] | None = None,
           refused: list[dict[str, str]] | None = None) -> str:
    """``sections`` (SECTIONS -> rows) as one JSON object (fmt json), or one table per
    section that has rows, in SECTIONS' order, a blank line between them. ``match`` (bench
    --match: target, value) and ``refused`` (the models it could not size, with the
    solver's reasons): a "match" key in JSON; in Markdown, lines under the tables (CSV
    leaves them to the caller: a CSV file holds one table)."""
    refused = refused or []
    if fmt == "json":
        doc: dict[str, Any] = {name: sections.get(name, []) for name in SECTIONS}
        if match is not None:
            doc["match"] = {"target": match[0], "value": match[1], "unmatched": refused}
        return json.dumps(doc, indent=1)
    text = "\n\n".join(format_table(sections[name], _section_columns(name, sections[name]), fmt)
                       for name in SECTIONS if sections.get(name))
    notes = match_notes(match, refused) if fmt == "md" else []
    return "\n\n".join(filter(None, [text, "\n".join(notes)]))
