#!/usr/bin/env python
"""Benchmark one run on 1 rank, on 2 ranks under DDP and on 2 ranks under FSDP, on the CPU
(gloo); numbers, no assertions.

Each setting runs in a fresh process (so its peak RSS is its own) as the worker runs a
queued run: rank 0 in that process, rank 1 its child (workbench/train/distributed.py).
Reported: the run's median step time (its results' ``step_time_ms``) and steps/s, the
last train loss, each rank's peak RSS (rank 0: this process's ``ru_maxrss``; rank 1: the
waited-for children's), and the parameter bytes each rank holds (all of them under DDP;
rank 0's shard under FSDP, from the run's info).

Run: ``.venv/bin/python scripts/bench-ranks.py [--d-model 512] [--layers 4] [--steps 20]``.
Results are in docs/RESULTS.md ("FSDP against DDP").
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROFILE = """
schema_version = 1
name = "bench-ranks"
[task]
name = "mad_selective_copying"
vocab_size = 16
num_tokens_to_copy = 16
num_train_examples = 2048
num_test_examples = 64
[sweep]
models = ["transformer"]
seq_lens = [{seq_len}]
seeds = [0]
[model]
d_model = {d_model}
n_layers = {layers}
[train]
steps = {steps}
batch_size = {batch}
lr = 1e-3
log_every = 1
eval_every = {steps}
device = "cpu"
{extra}
"""
# setting: (profile lines, torch threads per rank, through SSM_WORKBENCH_THREADS)
HOWS = {"1 rank": ("", 1), "1 rank, 2 threads": ("", 2), "2 ranks, ddp": ("devices = 2", 1),
        "2 ranks, fsdp": ('devices = 2\nsharding = "fsdp"', 1)}


def one(how: str, a) -> dict:
    """Run the setting ``how`` in this process; its numbers."""
    from workbench.spec.profile import expand, loads
    from workbench.store import Store
    from workbench.train import worker

    text = PROFILE.format(seq_len=a.seq_len, d_model=a.d_model, layers=a.layers, steps=a.steps,
                          batch=a.batch, extra=HOWS[how][0])
    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d) / "st")
        (rid,) = store.add_runs([expand(loads(text))[0].to_dict()])
        store.mark_started(rid, os.getpid(), "cpu", "cpu0")
        worker.run(str(store.root), rid)
        r = store.get(rid)
        res = store.results([rid])[rid][""]
        loss = [m["value"] for m in store.metrics(rid) if m["split"] == "train" and m["name"] == "loss"]
        kib = 1024 if sys.platform != "darwin" else 1
        fs = r.info.get("fsdp") or {}
        whole = r.info["params_total"] * 4
        return {"how": how, "state": r.state, "step_ms": res["step_time_ms"], "loss": loss[-1],
                "threads": r.info.get("torch_threads"),
                "rss0_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 2**20,
                "rss1_mib": (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 2**20
                             if "2 ranks" in how else None),
                "param_mib_rank": fs.get("param_bytes_rank0", whole) / 2**20, "param_mib": whole / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a.one, a)), flush=True)
        return 0
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    rows = []
    for how in HOWS:
        env = {**os.environ, "SSM_WORKBENCH_THREADS": str(HOWS[how][1])}
        out = subprocess.run([sys.executable, __file__, "--one", how, *sys.argv[1:]], capture_output=True,
                             text=True, env=env)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(line[7:]))
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("| how | torch threads | step (ms) | steps/s | last loss | params held per rank (MiB) | "
          "peak RSS rank 0 (MiB) | peak RSS rank 1 (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rss1 = f"{r['rss1_mib']:.0f}" if r["rss1_mib"] is not None else "-"
        print(f"| {r['how']} | {r['threads']} | {r['step_ms']:.0f} | {1000 / r['step_ms']:.2f} | {r['loss']:.6f} | "
              f"{r['param_mib_rank']:.1f} of {r['param_mib']:.1f} | {r['rss0_mib']:.0f} | {rss1} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
