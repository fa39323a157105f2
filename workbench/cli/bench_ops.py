"""``ssm-workbench bench --ops``: the operators of models.kernels alone (linear_rnn's,
generalized_delta's rwkv7 / kda, mamba3_scan's, forgetting_attention's FoX), one row per (op, length, backend), and the
speed-up over ``ref`` (see workbench.cli.bench for the inputs)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.cli.bench_args import Run


def measure_op(spec: dict[str, Any]) -> dict[str, Any]:
    """One linear-RNN operator, one backend and length, on random inputs (see module doc)."""
    import torch
    from models.kernels import linear_rnn_backends, linear_rnn_ops, mamba3_scan
    from models.kernels.delta_product import PRODUCT_OPS
    from workbench.train.measure import pick_device, timed_with_peak

    device = pick_device(spec["device"], "--device")
    batch, L, H, D = spec["batch"], spec["seq_len"], spec["heads"], spec["head_dim"]
    from models.attention import forgetting_attention as fox
    if spec["op"] in fox.OPS:   # FoX: softmax attention, no carried state; ref steps query by query
        fn, backend = fox.get_op(spec["op"], spec["backend"], device.type)
        args = fox.make_inputs(batch, L, H, D, seed=spec.get("seed", 0), device=device)

        def fox_train():
            torch.autograd.grad(fn(*args).square().sum(), args)

        def fox_forward():
            with torch.no_grad():
                fn(*args)

        train_ms, peak, fwd_ms = timed_with_peak(fox_train, fox_forward, spec["repeats"],
                                                 spec["warmup"], device)
        return {"op": spec["op"], "seq_len": L, "backend": backend,
                "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
                "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "heads": H,
                "head_dim": D, "threads": torch.get_num_threads()}
    if spec["op"] in mamba3_scan.OPS:   # Mamba-3: its own inputs and state (theta, S, k, v)
        fn, backend = mamba3_scan.get_op(spec["op"], spec["backend"], device.type)
        args, S0 = mamba3_scan.make_inputs(spec["op"], batch, L, H, D, seed=spec.get("seed", 0),
                                           device=device)

        def m3_train():
            o, S = fn(*args, initial_state=S0, output_final_state=True)
            torch.autograd.grad(o.square().sum() + S[1].square().sum(), [*args, *S0],
                                allow_unused=True)

        def m3_forward():
            with torch.no_grad():
                fn(*args, initial_state=S0, output_final_state=True)

        train_ms, peak, fwd_ms = timed_with_peak(m3_train, m3_forward, spec["repeats"],
                                                 spec["warmup"], device)
        return {"op": spec["op"], "seq_len": L, "backend": backend,
                "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
                "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "heads": H,
                "head_dim": D, "threads": torch.get_num_threads()}
    from models.kernels import generalized_delta

    fn, backend = linear_rnn_backends.get_op(spec["op"], spec["backend"], device.type)
    n = spec.get("householder", 2)
    if spec["op"] in generalized_delta.OPS:   # rwkv7, kda: their own argument lists
        args = generalized_delta.make_inputs(spec["op"], batch, L, H, D, D, torch.float32,
                                             gate_range=(-0.5, 0.0), seed=spec.get("seed", 0),
                                             device=device)
    else:
        args = linear_rnn_ops.make_inputs(spec["op"], batch, L, H, D, D, torch.float32,
                                          gate_range=(-0.5, 0.0), seed=spec.get("seed", 0),
                                          device=device, num_householder=n)
    S0 = torch.randn(batch, H, D, D, device=device, requires_grad=True)
    leaves = [*args, S0]

    def train_step():
        o, S = fn(*args, initial_state=S0, output_final_state=True)
        torch.autograd.grad(o.square().sum() + S.square().sum(), leaves)

    def forward():
        with torch.no_grad():
            fn(*args, initial_state=S0, output_final_state=True)

    train_ms, peak, fwd_ms = timed_with_peak(train_step, forward, spec["repeats"], spec["warmup"], device)
    return {"op": spec["op"], "seq_len": L, "backend": backend,
            "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
            "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "heads": H,
            "head_dim": D, "threads": torch.get_num_threads(),
            **({"householder": n} if spec["op"] in PRODUCT_OPS else {})}


def op_rows(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """--ops: every (op, length, backend) measured by ``run(spec, timeout)`` (in the CLI, a
    fresh process each); x_ref against ref's time."""
    if not args.ops:
        return []
    from models.kernels.linear_rnn_ops import ALL_OPS
    from models.kernels.linear_rnn_backends import BACKENDS
    from models.kernels.mamba3_scan import OPS as MAMBA3_OPS

    from models.kernels.generalized_delta import OPS as GD_OPS
    from models.attention.forgetting_attention import OPS as FOX_OPS

    OPS = [*ALL_OPS, *GD_OPS, *MAMBA3_OPS, *FOX_OPS]

    ops = list(OPS) if args.ops == ["all"] else args.ops
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise SystemExit(f"--ops: unknown operator(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    bad = [b for b in args.op_backends if b not in BACKENDS]
    if bad:
        raise SystemExit(f"--op-backends: unknown {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    rows = []
    for op in ops:
        ref_ms: dict[int, float] = {}
        for L in args.seq_lens:
            for backend in args.op_backends:
                if backend == "ref" and args.ref_max_len and L > args.ref_max_len:
                    continue
                spec = dict(kind="op", op=op, backend=backend, seq_len=L, batch=args.batch,
                            heads=args.heads, head_dim=args.head_dim,
                            householder=args.householder,
                            repeats=min(args.repeats, 2) if backend == "ref" else args.repeats,
                            warmup=min(args.warmup, 1) if backend == "ref" else args.warmup,
                            device=args.device, threads=args.threads)
                res = run(spec, args.timeout)
                if "error" in res:
                    res = {"op": op, "seq_len": L, "backend": backend, **res}
                elif backend == "ref":
                    ref_ms[L] = res["fwd_bwd_ms"]
                if res.get("fwd_bwd_ms") and ref_ms.get(L):
                    res["x_ref"] = round(ref_ms[L] / res["fwd_bwd_ms"], 1)
                rows.append(res)
                print(f"  measured {op}[{backend}] L={L}", file=sys.stderr, flush=True)
    return rows
