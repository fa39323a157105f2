#!/usr/bin/env python
"""Benchmark training at language-model shapes at equal parameters, checkouts side by side
(not a test: numbers, no assertions).

The shape of docs/RESULTS.md "Training at LM shapes": L = 2048, batch 2, d_model 256, one
torch thread, each family at the depth that puts it near the 4-layer Transformer's 3.16M
parameters (``LAYERS`` below). Each (checkout, model) is one ``ssm-workbench bench`` of that
model in a fresh process (forward + backward, and its peak), run through ``--rounds``
rounds that alternate the checkouts, so a change of load hits every column alike:

    git worktree add /tmp/before <commit>
    .venv/bin/python scripts/bench-lm-shapes.py --repo /tmp/before --repo . --rounds 2

Per checkout: the step time (the median over rounds of each round's median of
``--repeats``), the step and the FLOP rate as a share of the same checkout's Transformer
(FLOP rate = ``models.flops`` training FLOPs per token x tokens / step time; the FLOPs
are counted once, with this checkout's ``models``, since counting does not change with
speed work), and the peak memory (the largest over rounds). The load average is printed
with the table. The interpreter is this one; each checkout's code is its own (it runs in
the checkout, first on ``PYTHONPATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"transformer": 4, "mamba": 7, "mamba2": 7, "mamba3": 7, "gated_deltanet": 8, "kda": 10, "rwkv7": 11}
SEQ_LEN, BATCH, D_MODEL = 2048, 2, 256


def measure(repo: Path, model: str, repeats: int, timeout: float) -> dict | None:
    """One ``bench`` of ``model`` at its depth, run in ``repo``: its json row, or None."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    cmd = [sys.executable, "-m", "workbench", "bench", "--models", model, "--seq-lens", str(SEQ_LEN),
           "--batch", str(BATCH), "--d-model", str(D_MODEL), "--n-layers", str(LAYERS[model]),
           "--repeats", str(repeats), "--warmup", "1", "--threads", "1", "--device", "cpu",
           "--format", "json", "--timeout", str(int(timeout))]
    try:
        out = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return None
    try:
        rows = json.loads(out.stdout)["runs"]
    except (json.JSONDecodeError, KeyError):
        print(f"{repo} {model}: no table ({out.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None
    return rows[0] if rows and rows[0].get("fwd_bwd_ms") else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", action="append", type=Path, help="a checkout (repeatable; default: this one)")
    p.add_argument("--models", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    repos = [r.resolve() for r in (args.repo or [ROOT])]
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in LAYERS]
    if unknown:
        p.error(f"no depth for {', '.join(unknown)}; known: {', '.join(LAYERS)}")
    if "transformer" not in names:
        names.insert(0, "transformer")   # every share is of the Transformer's
    sys.path.insert(0, str(ROOT))
    import models
    flops = {m: models.flops(m, SEQ_LEN, d_model=D_MODEL, n_layers=LAYERS[m]) for m in names}
    steps: dict[tuple[Path, str], list[float]] = {}
    peaks: dict[tuple[Path, str], float] = {}
    loads = []
    for r in range(args.rounds):
        for m in names:
            for repo in repos:
                row = measure(repo, m, args.repeats, args.timeout)
                loads.append(os.getloadavg()[0])
                if row is None:
                    continue
                steps.setdefault((repo, m), []).append(row["fwd_bwd_ms"])
                peaks[(repo, m)] = max(peaks.get((repo, m), 0.0), row.get("peak_mib") or 0.0)
                print(f"round {r + 1} {repo.name or repo} {m}: {row['fwd_bwd_ms']:.0f} ms, "
                      f"peak {row.get('peak_mib')} MiB, load {loads[-1]:.1f}", file=sys.stderr, flush=True)

    def per_token(m: str) -> float:
        f = flops[m]
        return f.matmul + f.extra

    head = "| model | layers | params |" + "".join(
        f" {repo.name}: step ms | x transformer | FLOP rate | peak MiB |" for repo in repos)
    print(head)
    print("|" + "---|" * (3 + 4 * len(repos)))
    for m in names:
        cells = [m, str(LAYERS[m]), f"{flops[m].params.non_embedding / 1e6:.2f}M"]
        for repo in repos:
            s, t = steps.get((repo, m)), steps.get((repo, "transformer"))
            if not s or not t:
                cells += ["–"] * 4
                continue
            ms, tms = statistics.median(s), statistics.median(t)
            rate = (per_token(m) / ms) / (per_token("transformer") / tms)
            cells += [f"{ms:.0f}", f"{ms / tms:.2f}", f"{rate:.2f}", f"{peaks[(repo, m)]:.0f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\nREDUCED CPU run, {args.rounds} round(s) x {args.repeats} repeats, one thread, "
          f"load {min(loads):.1f}-{max(loads):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
