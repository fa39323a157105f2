"""The runs of a store with the system samples their workers recorded: the NVML panel's
numbers (GPU utilisation, device memory used / total, the run's own device memory) and the
CPU side (cpu %, RSS), one row per run, as markdown. The GPU one-call script
(scripts/gpu-one-call.sh) prints it after the shipped MAD profile's run.

    python3 scripts/gpu_store_nvml.py [--store DIR] [--profile NAME] [--kill-unfinished]

--store defaults to $SSM_WORKBENCH_STORE (the workbench's own default otherwise).
--kill-unfinished first kills the runs still pending or running (a run command stopped at
its time limit leaves its detached scheduler and workers behind), as `ssm-workbench kill`.
A run without GPU samples says so (on a machine without NVML only the CPU columns fill).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = ["id", "model", "seed", "state", "device", "backend", "wall_s", "steps", "accuracy",
           "samples", "gpu_name", "gpu_util_mean", "gpu_util_max", "gpu_mem_used_max_mb",
           "gpu_mem_total_mb", "proc_mem_max_mb", "cpu_pct_mean", "rss_max_mb"]


def _values(rows: Iterable[Any], key: str) -> list[float]:
    return [r[key] for r in rows if r[key] is not None]


def _r(x: float | None, digits: int = 0) -> float | int | None:
    if x is None:
        return None
    return round(x, digits) if digits else int(round(x))


def summarise(run: Any, samples: list[Any]) -> dict[str, Any]:
    """One row: the run's identity, wall time and last accuracy, and its samples' summary
    (mean and max utilisation, the highest memory readings, the GPU's name)."""
    util, used = _values(samples, "gpu_util"), _values(samples, "gpu_mem_used_mb")
    total, own = _values(samples, "gpu_mem_total_mb"), _values(samples, "gpu_proc_mem_mb")
    cpu, rss = _values(samples, "cpu_percent"), _values(samples, "rss_mb")
    names = [r["gpu_name"] for r in samples if r["gpu_name"]]
    wall = (run.ended - run.started) if run.started and run.ended else None
    return {
        "id": run.id, "model": run.label or run.model, "seed": run.seed, "state": run.state,
        "device": run.device or "-", "backend": run.backend or "-", "wall_s": _r(wall, 1),
        "steps": run.step, "accuracy": _r(run.last_accuracy, 3), "samples": len(samples),
        "gpu_name": names[-1] if names else "no GPU samples",
        "gpu_util_mean": _r(statistics.fmean(util), 1) if util else None,
        "gpu_util_max": _r(max(util)) if util else None,
        "gpu_mem_used_max_mb": _r(max(used)) if used else None,
        "gpu_mem_total_mb": _r(max(total)) if total else None,
        "proc_mem_max_mb": _r(max(own)) if own else None,
        "cpu_pct_mean": _r(statistics.fmean(cpu), 1) if cpu else None,
        "rss_max_mb": _r(max(rss)) if rss else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--kill-unfinished", action="store_true")
    args = ap.parse_args(argv)
    from workbench.cli.bench_tables import format_table
    from workbench.execute.launch import kill
    from workbench.store import Store

    store = Store(args.store) if args.store else Store()
    if args.kill_unfinished:
        for run in store.runs(args.profile, states=("pending", "running")):
            kill(store, run.id)
            print(f"killed run {run.id} ({run.label or run.model}, {run.state})")
    runs = store.runs(args.profile)
    if not runs:
        print(f"no runs in the store at {store.root}")
        return 1
    rows = [{k: "-" if v is None else v for k, v in summarise(r, store.system(r.id)).items()}
            for r in runs]
    print(f"## Runs and their system samples (store {store.root})\n")
    print(format_table(rows, COLUMNS))
    from workbench.train import sysmon
    print(f"\n{sysmon.nvml_status()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
