"""``ssm-workbench bench --estimate``: workbench.spec.estimate's peak memory for a training
step beside the smallest of ``--estimate-tries`` measured peaks, and their ratio."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.cli.bench_args import Run
from workbench.cli.bench_models import model_options

# --estimate's default: one model per family of the registry (pretrained needs a checkpoint
# folder, so it is left out)
ESTIMATE_MODELS = {"transformer": "attention", "mamba": "ssm", "lstm": "rnn", "gated_mlp": "mlp",
                   "hyena": "conv", "hybrid": "hybrid"}


def estimate_rows(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """--estimate: bench_estimate beside the smallest of --estimate-tries measurements."""
    if not args.estimate:
        return []
    import models
    from workbench.spec import estimate

    names = args.models or [m for m in ESTIMATE_MODELS if m in models.names()]
    rows = []
    for name in names:
        options = model_options(name, args)  # unknown model: error listing the known ones
        family = ESTIMATE_MODELS.get(name, "")
        for L in args.seq_lens:
            spec = dict(kind="train", model=name, label=name, options=options, seq_len=L,
                        batch=args.batch, d_model=args.d_model, n_layers=args.n_layers,
                        repeats=1, warmup=0, device="cpu", threads=args.threads or 1)
            row: dict[str, Any] = {"family": family, "model": name, "seq_len": L, "batch": args.batch}
            try:
                est = estimate.bench_estimate(name, options, args.d_model, args.n_layers,
                                              args.batch, L) / estimate.MiB
            except Exception as e:  # noqa: BLE001 - the table says why this row has no estimate
                rows.append({**row, "error": f"no estimate: {type(e).__name__}: {e}"})
                continue
            # CPU, one thread, a fresh process each: the estimate is of the CPU probe, and RSS
            # noise (allocator, transparent huge pages) only ever adds, so the smallest counts
            tries = [run(spec, args.timeout) for _ in range(args.estimate_tries)]
            good = [t for t in tries if "error" not in t]
            if not good:
                rows.append({**row, "est_mib": round(est, 1), "error": tries[-1]["error"]})
                continue
            measured = min(t["peak_mib"] for t in good)
            rows.append({**row, "est_mib": round(est, 1), "measured_mib": measured,
                         "ratio": round(est / measured, 2) if measured > 0 else None})
            print(f"  estimated and measured {name} L={L}", file=sys.stderr, flush=True)
    return rows
