"""The GPU one-call kit, on a machine without a GPU: scripts/gpu_store_nvml.py (a store's runs
with their NVML samples; leftover runs killed) and scripts/gpu-one-call.sh's runner (a step
with too little of the call's time left is recorded as skipped, every output file exists
from the start, the summary ends with the total)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.store import Store

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_store_nvml", ROOT / "scripts" / "gpu_store_nvml.py")
nv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nv)


def _spec_row(seed: int) -> dict:
    return dict(profile="p", model="mamba", label="mamba", task="t", seq_len=20, seed=seed,
                fields={"model": "mamba", "seq_len": 20})


def _gpu(util, used, own):
    return dict(cpu_percent=100.0, rss_mb=500.0, gpu_util=util, gpu_mem_used_mb=used,
                gpu_mem_total_mb=81559.0, gpu_name="NVIDIA H100 80GB HBM3", gpu_proc_mem_mb=own)


@pytest.fixture
def store(tmp_path):
    """Three runs: one finished with GPU samples, one running (a stand-in worker: a process
    leading its own group, as the scheduler starts them) with CPU samples only, one pending."""
    s = Store(tmp_path / "store")
    done, cpu_only, waiting = s.add_runs([_spec_row(0), _spec_row(1), _spec_row(2)])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    s.mark_started(done, worker.pid, "cuda", "gpu0")
    s.mark_started(cpu_only, worker.pid, "cuda", "gpu0")
    for t, (util, used, own) in enumerate([(20.0, 1000.0, 300.0), (60.0, 3000.0, 700.0),
                                           (40.0, 2000.0, None)]):
        s.add_system(done, _gpu(util, used, own), t=1000.0 + t)
    s.finish(done, "finished")
    s.add_system(cpu_only, {"cpu_percent": 50.0, "rss_mb": 400.0}, t=1000.0)
    yield s, (done, cpu_only, waiting), worker
    if worker.poll() is None:
        worker.kill()
    worker.wait()


def test_a_runs_nvml_samples_are_summarised(store):
    s, (done, cpu_only, _), _ = store
    row = nv.summarise(s.get(done), s.system(done))
    assert row["samples"] == 3
    assert row["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert (row["gpu_util_mean"], row["gpu_util_max"]) == (40.0, 60)
    assert (row["gpu_mem_used_max_mb"], row["gpu_mem_total_mb"]) == (3000, 81559)
    assert row["proc_mem_max_mb"] == 700          # the sample without it is left out
    assert row["state"] == "finished" and row["device"] == "cuda"
    cpu = nv.summarise(s.get(cpu_only), s.system(cpu_only))
    assert cpu["gpu_name"] == "no GPU samples" and cpu["gpu_util_max"] is None
    assert cpu["rss_max_mb"] == 400


def test_kill_unfinished_leaves_finished_runs_alone(store, capsys):
    s, (done, running, waiting), worker = store
    assert nv.main(["--store", str(s.root), "--kill-unfinished"]) == 0
    out = capsys.readouterr().out
    assert [s.get(r).state for r in (done, running, waiting)] == ["finished", "killed", "killed"]
    assert worker.wait(timeout=10) != 0           # the running run's worker was terminated
    assert f"killed run {running}" in out and f"killed run {done} " not in out
    assert "NVIDIA H100 80GB HBM3" in out and "| 3000 " in out


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
def test_one_call_skips_a_step_without_time_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PY=sys.executable, WB=f"{sys.executable} -m workbench",
               BENCH_DIR=str(tmp_path / "bench"), MAD_STORE=str(tmp_path / "mad"),
               STEPS="setup", TOTAL_S="12")   # 12 s less the 10 kept for the end: under 5 left
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-one-call.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "bench.md", "env.txt", "mad.txt", "summary.tsv", "targets.md", "tests.txt"]
    rows = [ln.split("\t") for ln in (out / "summary.tsv").read_text().splitlines()]
    assert rows[0] == ["step", "status", "exit", "seconds", "limit_s", "file"]
    assert [r[:2] for r in rows[1:]] == [["setup", "skipped"], ["total", "-"]]
    assert "setup: skipped" in (out / "env.txt").read_text()
