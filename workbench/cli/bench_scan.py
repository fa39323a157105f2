"""``ssm-workbench bench --scan-backends``: the selective scan alone (S6's kernel as Mamba calls
it), one row per (backend, length), and its speed-up over the first backend listed."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.cli.bench_args import Run


def measure_scan(spec: dict[str, Any]) -> dict[str, Any]:
    """The selective scan alone, one backend and length, on random inputs (see module doc)."""
    import torch
    from models.kernels import selective_scan as ss
    from workbench.train.measure import pick_device, timed_with_peak

    device = pick_device(spec["device"], "--device")
    g = torch.Generator(device=device).manual_seed(spec.get("seed", 0))
    batch, dim, N, L = spec["batch"], 2 * spec["d_model"], 16, spec["seq_len"]

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).requires_grad_()

    inputs = dict(u=r(batch, dim, L), delta=r(batch, dim, L, scale=0.5),
                  A=(-torch.arange(1, N + 1, device=device).float().repeat(dim, 1)).requires_grad_(),
                  B=r(batch, N, L), C=r(batch, N, L), D=r(dim), z=r(batch, dim, L),
                  delta_bias=r(dim, scale=0.1))
    weight = torch.randn(batch, dim, L, generator=g, device=device)
    backend = ss.choose_backend(spec["backend"], device)

    def train_step():
        out = ss.selective_scan_fn(**inputs, delta_softplus=True, backend=backend)
        torch.autograd.grad((out * weight).sum(), list(inputs.values()))

    def forward():
        with torch.no_grad():
            ss.selective_scan_fn(**inputs, delta_softplus=True, backend=backend)

    train_ms, peak, fwd_ms = timed_with_peak(train_step, forward, spec["repeats"], spec["warmup"], device)
    return {"kernel": "selective_scan", "seq_len": L, "backend": backend,
            "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
            "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "dim": dim,
            "state": N, "threads": torch.get_num_threads()}


def scan_rows(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """--scan-backends: every (backend, length) measured by ``run(spec, timeout)``; x_first
    against the first backend's time."""
    rows = []
    for backend in args.scan_backends or []:
        for L in args.seq_lens:
            spec = dict(kind="scan", backend=backend, seq_len=L, batch=args.batch,
                        d_model=args.d_model, repeats=args.repeats, warmup=args.warmup,
                        device=args.device, threads=args.threads)
            res = run(spec, args.timeout)
            rows.append(res if "error" not in res else
                             {"kernel": "selective_scan", "seq_len": L, "backend": backend, **res})
            print(f"  measured scan[{backend}] L={L}", file=sys.stderr, flush=True)
    first = {r["seq_len"]: r.get("fwd_bwd_ms") for r in rows if r["backend"] == rows[0]["backend"]} if rows else {}
    for r in rows:
        if r.get("fwd_bwd_ms") and first.get(r["seq_len"]):
            r["x_first"] = round(first[r["seq_len"]] / r["fwd_bwd_ms"], 1)
    return rows
