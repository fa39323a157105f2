"""scripts/gpu_targets.py: issue 18's targets judged from `bench --format json` outputs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_targets", ROOT / "scripts" / "gpu_targets.py")
gt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gt)


def _scan(backend, L, ms):
    return {"kernel": "selective_scan", "seq_len": L, "backend": backend, "fwd_bwd_ms": ms, "fwd_ms": ms / 3}


def _run(model, L, ms, mib, backend="triton"):
    return {"model": model, "seq_len": L, "backend": backend, "fwd_bwd_ms": ms, "peak_mib": mib}


def results(**change):
    res = {
        "scan": {"scan": [_scan("cuda", 1024, 0.5), _scan("triton", 1024, 0.7),
                          _scan("cuda", 4096, 0.9), _scan("triton", 4096, 1.2)]},
        "b64": {"runs": [_run("mamba[triton]", 784, 9.0, 500), _run("transformer", 784, 10.0, 900, "")]},
        "b8": {"runs": [_run("mamba[triton]", 4096, 7.0, 300), _run("transformer", 4096, 16.0, 800, ""),
                        _run("mamba[triton]", 16384, 30.0, 1200), _run("transformer", 16384, 200.0, 1500, "")]},
        "stream": {"stream": [{"model": "mamba", "seconds": 6.5, "backend": "triton"}]},
        "mad": {"wall_s": 20, "exit": 0},
    }
    res.update(change)
    return res


def verdicts(res):
    return [r["verdict"] for r in gt.evaluate(res)]


def test_all_targets_met():
    assert verdicts(results()) == ["met"] * 7


def test_each_miss_says_by_how_much():
    res = results()
    res["scan"]["scan"][1]["fwd_bwd_ms"] = 1.5                       # 1.5 / (1.5 * 0.5) = 2x
    res["b8"]["runs"][0]["fwd_bwd_ms"] = 12.0                        # 12 / (0.5 * 16) = 1.5x
    res["b8"]["runs"][2]["peak_mib"] = 1800                          # 1800 / 1500 = 1.2x
    res["stream"]["stream"][0]["seconds"] = 12.0
    res["mad"]["wall_s"] = 58
    v = verdicts(res)
    assert v[0] == "missed (2.00x the limit)"
    assert v[1] == "met"
    assert v[3] == "missed (1.50x the limit)"
    assert v[4] == "missed (1.20x the limit)"
    assert v[5].startswith("missed") and v[6] == "missed (2.00x the limit)"


def test_without_mamba_ssm_the_scan_is_judged_against_the_h100_numbers():
    res = results(scan={"scan": [
        {"kernel": "selective_scan", "seq_len": 1024, "backend": "cuda", "error": "exit 1: no mamba_ssm"},
        _scan("triton", 1024, 0.6), _scan("triton", 4096, 1.4)]})
    rows = gt.evaluate(res)
    assert rows[0]["verdict"] == "met" and "not built here" in rows[0]["limit"]     # 0.6 <= 0.705
    assert rows[1]["verdict"].startswith("missed")                                  # 1.4 > 1.275


def test_failed_or_absent_measurements_are_not_verdicts():
    res = results(stream={"stream": [{"model": "mamba", "error": "timed out after 1800 s"}]},
                  mad={"wall_s": 3, "exit": 1, "error": "run exited 1"})
    del res["b64"]
    rows = gt.evaluate(res)
    assert rows[2]["verdict"] == "not measured: rows missing"
    assert rows[5]["verdict"] == "not measured: timed out after 1800 s"
    assert rows[6]["verdict"] == "not measured: run exited 1"


def test_main_reads_the_folder_and_exits_by_verdict(tmp_path, capsys):
    for key, value in results().items():
        (tmp_path / f"{key}.json").write_text(json.dumps(value))
    assert gt.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "## Issue 18's targets" in out and "| selective_scan" in out
    (tmp_path / "stream.json").write_text("garbage")
    assert gt.main([str(tmp_path)]) == 1
    assert gt.main([str(tmp_path / "nope")]) == 2


def test_bench_json_has_the_keys_the_targets_read(capsys, bench_in_process):
    """The evaluator reads bench's "runs", "scan" and "stream" lists: bench must still write
    them (a cheap CPU bench of a tiny LSTM, measured in this process)."""
    from workbench.cli import bench

    assert bench.main(["--models", "lstm", "--seq-lens", "8", "--batch", "1", "--repeats", "1",
                       "--warmup", "0", "--device", "cpu", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"runs", "scan", "stream"} <= set(data)
    row = data["runs"][0]
    assert {"model", "seq_len", "backend", "fwd_bwd_ms", "peak_mib"} <= set(row), row


@pytest.mark.parametrize("missing", ["scan", "b8"])
def test_a_missing_file_is_named_not_a_crash(missing):
    res = results()
    del res[missing]
    assert any(v.startswith("not measured") for v in verdicts(res))
