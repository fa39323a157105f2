"""Issue 18's GPU speed targets, checked against what `ssm-workbench bench` measured.

    python3 scripts/gpu_targets.py DIR

DIR holds the JSON outputs (`bench --format json`) that scripts/gpu-bench.sh writes:
scan.json (scan alone, b8, backends cuda/triton/torch, L 1024 and 4096), b64.json (train
step, b64, L 784), b8.json (train step, b8, L 4096 and 16384), stream.json (2^20 tokens)
and mad.json ({"wall_s": ...}: the shipped MAD profile's wall time). It prints every
measurement as a table, then one row per target: what was measured, the limit, and
whether it was met (or by how much it was missed). A measurement that is absent or failed
says so instead of a verdict.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# mamba-ssm's selective scan on an H100 (b8, d 128, n 16, fwd + bwd ms), measured on
# 2026-11-23 (../shared/FACTS.md): the reference when mamba-ssm is not built here
MAMBA_SSM_H100_MS = {1024: 0.47, 4096: 0.85}
CPU_MAD_WALL_S = 58.0          # the shipped MAD profile on the 2-core CPU (issue 18's text)
STREAM_LIMIT_S = 10.0


def _ok(row: dict[str, Any] | None, key: str) -> bool:
    return bool(row) and "error" not in row and row.get(key) is not None


def _verdict(value: float, limit: float) -> str:
    """'met' when value <= limit, else how many times over it is."""
    return "met" if value <= limit else f"missed ({value / limit:.2f}x the limit)"


def _find(rows: list[dict[str, Any]], **match) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _mamba_row(rows, L):
    """The Mamba row with the Triton backend (label "mamba[triton]", or "mamba" run on it)."""
    return (_find(rows, model="mamba[triton]", seq_len=L)
            or _find(rows, model="mamba", seq_len=L, backend="triton"))


def evaluate(res: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per target from the parsed JSON files (keys: scan, b64, b8, stream, mad)."""
    out: list[dict[str, str]] = []

    def add(target, measured, limit, verdict):
        out.append({"target": target, "measured": measured, "limit": limit, "verdict": verdict})

    scan = res.get("scan", {}).get("scan", [])
    for L, fallback in MAMBA_SSM_H100_MS.items():
        tri = _find(scan, backend="triton", seq_len=L)
        cuda = _find(scan, backend="cuda", seq_len=L)
        target = f"scan alone, L={L}: triton within 1.5x of mamba-ssm"
        if not _ok(tri, "fwd_bwd_ms"):
            add(target, "-", "-", f"not measured: {(tri or {}).get('error', 'no triton row')}")
            continue
        if _ok(cuda, "fwd_bwd_ms"):
            ref, ref_what = cuda["fwd_bwd_ms"], "mamba-ssm here"
        else:
            ref, ref_what = fallback, "mamba-ssm on an H100, 2026-11-23 (not built here)"
        add(target, f"{tri['fwd_bwd_ms']} ms", f"{1.5 * ref:.2f} ms (1.5 x {ref} ms, {ref_what})",
            _verdict(tri["fwd_bwd_ms"], 1.5 * ref))

    for key, L, factor, what in (("b64", 784, 1.0, "no slower than"), ("b8", 4096, 0.5, "at most half of")):
        rows = res.get(key, {}).get("runs", [])
        m, t = _mamba_row(rows, L), _find(rows, model="transformer", seq_len=L)
        target = f"train step b{key[1:]} L={L}: Mamba[triton] {what} the Transformer"
        if not (_ok(m, "fwd_bwd_ms") and _ok(t, "fwd_bwd_ms")):
            add(target, "-", "-", "not measured: " + ((m or {}).get("error") or (t or {}).get("error")
                                                       or "rows missing"))
            continue
        add(target, f"{m['fwd_bwd_ms']} vs {t['fwd_bwd_ms']} ms",
            f"{factor * t['fwd_bwd_ms']:.2f} ms", _verdict(m["fwd_bwd_ms"], factor * t["fwd_bwd_ms"]))

    rows = res.get("b8", {}).get("runs", [])
    m, t = _mamba_row(rows, 16384), _find(rows, model="transformer", seq_len=16384)
    target = "peak memory b8 L=16384: Mamba[triton] no more than the Transformer"
    if _ok(m, "peak_mib") and _ok(t, "peak_mib"):
        add(target, f"{m['peak_mib']} vs {t['peak_mib']} MiB", f"{t['peak_mib']} MiB",
            _verdict(m["peak_mib"], t["peak_mib"]))
    else:
        add(target, "-", "-", "not measured: " + ((m or {}).get("error") or (t or {}).get("error")
                                                   or "rows missing"))

    stream = (res.get("stream", {}).get("stream") or [None])[0]
    target = "2^20-token streaming evaluation"
    if _ok(stream, "seconds"):
        add(target, f"{stream['seconds']} s ({stream.get('backend', '?')})", f"{STREAM_LIMIT_S} s",
            _verdict(stream["seconds"], STREAM_LIMIT_S))
    else:
        add(target, "-", "-", f"not measured: {(stream or {}).get('error', 'no row')}")

    wall = res.get("mad", {}).get("wall_s")
    target = "shipped MAD profile's wall time: at most half the 2-core CPU's"
    if isinstance(wall, (int, float)) and res.get("mad", {}).get("exit", 0) == 0:
        add(target, f"{wall} s", f"{CPU_MAD_WALL_S / 2} s (CPU {CPU_MAD_WALL_S} s)",
            _verdict(wall, CPU_MAD_WALL_S / 2))
    else:
        add(target, "-", "-", f"not measured: {res.get('mad', {}).get('error', 'no mad.json')}")
    return out


def load(folder: Path) -> dict[str, dict[str, Any]]:
    """The JSON files of ``folder`` by stem; a file that is not JSON is reported as such."""
    res = {}
    for path in sorted(folder.glob("*.json")):
        text = path.read_text()
        start = text.find("{")          # bench prints progress on stderr only, but be lenient
        try:
            res[path.stem] = json.loads(text[start:]) if start >= 0 else {}
        except json.JSONDecodeError as exc:
            res[path.stem] = {"error": f"{path.name} is not JSON: {exc}"}
    return res


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    from workbench.cli.bench import (COLUMNS, SCAN_COLUMNS, STREAM_COLUMNS, format_table)

    res = load(Path(args[0]))
    for key, part, cols in (("scan", "scan", SCAN_COLUMNS), ("b64", "runs", COLUMNS),
                            ("b8", "runs", COLUMNS), ("stream", "stream", STREAM_COLUMNS)):
        rows = res.get(key, {}).get(part) or []
        if rows:
            print(f"## {key}\n\n{format_table(rows, cols)}\n")
    rows = evaluate(res)
    print("## Issue 18's targets\n")
    print(format_table(rows, ["target", "measured", "limit", "verdict"]))
    return 0 if all(r["verdict"] == "met" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
