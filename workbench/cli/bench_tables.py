"""The bench command's tables: each measurement's columns, and rows as Markdown, CSV or JSON."""
from __future__ import annotations

import csv
import io
import json
from typing import Any

from workbench.cli.bench_generate import GENERATE_COLUMNS

COLUMNS = ["model", "seq_len", "backend", "params", "fwd_bwd_ms", "infer_ms", "train_tok_s", "peak_mib"]
SCAN_COLUMNS = ["kernel", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_first"]
OP_COLUMNS = ["op", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_ref"]
ESTIMATE_COLUMNS = ["family", "model", "seq_len", "batch", "est_mib", "measured_mib", "ratio"]
STREAM_COLUMNS = ["model", "tokens", "mode", "chunk_len", "backend", "seconds", "tok_s", "peak_rss_mib", "extra_mib"]
# --format json's keys, and the tables' order
SECTIONS = ["runs", "scan", "ops", "stream", "estimate", "triton_compile", "generate"]


def format_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "md") -> str:
    """Markdown or CSV table of ``rows`` (dicts) over ``columns`` (plus errors, if any)."""
    cols = list(columns) + (["error"] if any("error" in r for r in rows) else [])
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _section_columns(section: str) -> list[str]:
    if section == "triton_compile":
        from models.kernels.triton_aot import COLUMNS as AOT_COLUMNS
        return AOT_COLUMNS
    return {"runs": COLUMNS, "scan": SCAN_COLUMNS, "ops": OP_COLUMNS, "stream": STREAM_COLUMNS,
            "estimate": ESTIMATE_COLUMNS, "generate": GENERATE_COLUMNS}[section]


def render(sections: dict[str, list[dict[str, Any]]], fmt: str) -> str:
    """``sections`` (SECTIONS -> rows) as one JSON object (fmt json), or one table per
    section that has rows, in SECTIONS' order, a blank line between them."""
    if fmt == "json":
        return json.dumps({name: sections.get(name, []) for name in SECTIONS}, indent=1)
    return "\n\n".join(format_table(sections[name], _section_columns(name), fmt)
                       for name in SECTIONS if sections.get(name))
