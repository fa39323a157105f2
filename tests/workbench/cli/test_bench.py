"""`ssm-workbench bench`: a tiny end-to-end run, and the pieces it is made of."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import bench

TINY = ["--seq-lens", "32", "--batch", "2", "--d-model", "8", "--n-layers", "1",
        "--repeats", "1", "--warmup", "0"]


def parse_md(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1]) <= {"|", "-"}
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_main_markdown_table_compares_scan_backends(capsys):
    # measured in fresh processes (`--one`), as the command does: the one test of that path here
    rc = bench.main(["--models", "mamba", "--backend", "ref,torch", *TINY])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = parse_md(out)
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["model"], r["seq_len"], r["backend"]) for r in rows] == [
        ("mamba[ref]", "32", "ref"), ("mamba[torch]", "32", "torch")]
    for r in rows:
        assert int(r["params"]) > 0
        assert float(r["fwd_bwd_ms"]) > 0 and float(r["infer_ms"]) > 0
        assert int(r["train_tok_s"]) > 0
        assert float(r["peak_mib"]) >= 0
    assert rows[0]["params"] == rows[1]["params"]


def test_main_json_stream_only(capsys, bench_in_process):
    rc = bench.main(["--stream-tokens", "300", "--stream-chunk", "64", "--d-model", "8",
                     "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["runs"] == []  # --stream-tokens alone skips the training table
    (row,) = doc["stream"]
    assert set(bench.STREAM_COLUMNS) <= set(row)
    assert row["tokens"] == 300 and row["mode"] == "chunked" and row["finite"]
    assert row["seconds"] >= 0 and row["peak_rss_mib"] > 0  # 300 tokens can take under 5 ms (0.0 s)


def test_main_scan_kernel_table_only(capsys, bench_in_process):
    """--scan-backends alone: one row per (backend, length), speed-up over the first backend."""
    rc = bench.main(["--scan-backends", "ref,torch", "--seq-lens", "16,24", "--batch", "1",
                     "--d-model", "4", "--repeats", "1", "--warmup", "0", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["runs"] == [] and doc["stream"] == []
    rows = doc["scan"]
    assert [(r["backend"], r["seq_len"]) for r in rows] == [
        ("ref", 16), ("ref", 24), ("torch", 16), ("torch", 24)]
    assert all(set(bench.SCAN_COLUMNS) <= set(r) for r in rows)
    assert rows[0]["x_first"] == 1.0 and rows[0]["dim"] == 8
    # x_first is rounded to 0.1 from the rounded times
    assert rows[2]["x_first"] == pytest.approx(rows[0]["fwd_bwd_ms"] / rows[2]["fwd_bwd_ms"], abs=0.051)


def test_measure_one_in_process():
    spec = dict(kind="train", model="s6", label="s6", options={"backend": "torch"}, seq_len=16,
                batch=2, d_model=8, n_layers=1, repeats=2, warmup=1, device="cpu")
    row = bench.measure_one(spec)
    assert set(bench.COLUMNS) <= set(row)
    assert row["backend"] == "torch"
    # fwd_bwd_ms is rounded to 0.01 ms in the row, tokens/s from the unrounded time
    assert row["train_tok_s"] == pytest.approx(2 * 16 / (row["fwd_bwd_ms"] / 1e3), rel=0.01)


def test_measure_stream_step_mode_in_process():
    spec = dict(kind="stream", model="mamba", options={}, tokens=20, chunk_len=8, mode="step",
                d_model=8, n_layers=2, device="cpu")
    row = bench.measure_stream(spec)
    assert row["chunk_len"] == 1 and row["tokens"] == 20 and row["finite"]


def test_plan_expands_models_backends_and_lengths():
    args = bench.build_parser().parse_args(
        ["--models", "mamba,s6", "--backend", "ref,torch", "--seq-lens", "8,16", "--opt", "d_state=4"])
    specs = bench.plan(args)
    assert [(s["label"], s["seq_len"]) for s in specs] == [
        (m, L) for m in ("mamba[ref]", "mamba[torch]", "s6[ref]", "s6[torch]") for L in (8, 16)]
    assert all(s["options"]["d_state"] == 4 for s in specs)


def test_plan_rejects_unknown_models_and_options():
    parse = bench.build_parser().parse_args
    with pytest.raises(KeyError, match="unknown model"):
        bench.plan(parse(["--models", "mamba,nosuchmodel"]))
    with pytest.raises(SystemExit, match="nosuchoption"):
        bench.plan(parse(["--models", "mamba", "--opt", "nosuchoption=1"]))
    with pytest.raises(SystemExit):
        parse(["--seq-lens", "0"])


def test_format_table_csv_and_errors():
    rows = [{"model": "a", "seq_len": 8, "backend": "torch", "params": 1, "fwd_bwd_ms": 1.5,
             "infer_ms": 1.0, "train_tok_s": 10, "peak_mib": 2.0},
            {"model": "b", "seq_len": 8, "backend": "", "error": "exit 1: boom"}]
    csv_text = bench.format_table(rows, bench.COLUMNS, "csv")
    assert csv_text.splitlines()[0] == ",".join(bench.COLUMNS + ["error"])
    assert csv_text.splitlines()[2].endswith("exit 1: boom")
    md = parse_md(bench.format_table(rows, bench.COLUMNS, "md"))
    assert md[0]["fwd_bwd_ms"] == "1.5" and md[1]["error"] == "exit 1: boom"


def test_a_childs_peak_memory_is_its_own_not_its_parents():
    """ru_maxrss carries the parent's RSS across fork/exec (Linux), so a worker or bench
    process started from a big parent (the TUI, pytest, a scheduler) would report at least
    the parent's size as its own peak. sysmon.peak_rss_mib reads the child's own VmHWM."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the inherited ru_maxrss is a Linux behaviour")
    big = bytearray(600 * 2**20)
    for i in range(0, len(big), 4096):  # touch every page: 600 MiB resident in the parent
        big[i] = 1
    code = ("from workbench.train.sysmon import peak_rss_mib, reset_peak_rss; "
            "print(peak_rss_mib()); print(reset_peak_rss())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[3])).stdout.split()
    del big
    assert float(out[0]) < 300, f"child reports {out[0]} MiB: the parent's 600 MiB leaked into its peak"
    assert out[1] == "True"


def test_main_ops_table_compares_each_backend_with_ref(capsys, bench_in_process):
    """--ops: one row per (op, length, backend); x_ref is ref's time over the row's; the
    ref is skipped above --ref-max-len (no x_ref there)."""
    rc = bench.main(["--ops", "delta_rule,gla", "--seq-lens", "16,24", "--batch", "1",
                     "--heads", "1", "--head-dim", "4", "--repeats", "1", "--warmup", "0",
                     "--ref-max-len", "16", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["runs"] == [] and doc["scan"] == []
    rows = doc["ops"]
    assert [(r["op"], r["seq_len"], r["backend"]) for r in rows] == [
        ("delta_rule", 16, "ref"), ("delta_rule", 16, "torch"), ("delta_rule", 24, "torch"),
        ("gla", 16, "ref"), ("gla", 16, "torch"), ("gla", 24, "torch")]
    assert all(set(bench.OP_COLUMNS) - {"x_ref"} <= set(r) for r in rows)
    assert rows[0]["x_ref"] == 1.0 and "x_ref" not in rows[2]
    assert rows[1]["x_ref"] == pytest.approx(rows[0]["fwd_bwd_ms"] / rows[1]["fwd_bwd_ms"], abs=0.051)
    assert rows[0]["heads"] == 1 and rows[0]["head_dim"] == 4


def test_main_ops_rejects_unknown_ops_and_backends():
    with pytest.raises(SystemExit, match="unknown operator.*nope"):
        bench.main(["--ops", "nope", "--seq-lens", "8"])
    with pytest.raises(SystemExit, match="unknown cuda"):
        bench.main(["--ops", "gla", "--op-backends", "cuda", "--seq-lens", "8"])
