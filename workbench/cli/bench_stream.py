"""``ssm-workbench bench --stream-tokens N``: a recurrent backbone over N tokens at batch 1,
only the recurrent state carried between chunks: wall time, tokens/s and peak RSS."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from workbench.cli.bench_args import Run


def measure_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a recurrent backbone over spec['tokens'] tokens at batch 1, state carried between chunks."""
    import torch
    import models
    from models.ssm.mamba import stream
    from workbench.train import sysmon
    from workbench.train.measure import ExtraPeak, pick_device, sync

    device = pick_device(spec["device"], "--device")
    torch.manual_seed(spec.get("seed", 0))
    model = models.build(spec["model"], d_model=spec["d_model"], n_layers=spec["n_layers"],
                         **spec["options"]).to(device).eval()
    tokens, chunk, d = spec["tokens"], spec["chunk_len"], spec["d_model"]
    gen = torch.Generator(device=device).manual_seed(1)

    def chunks():  # inputs made on the fly: a (1, 2^20, d) input alone would be 256 MiB
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            yield torch.randn(1, n, d, generator=gen, device=device)
            done += n

    checksum = 0.0
    rss = ExtraPeak(torch.device("cpu"))  # RSS (peak reset to it): state and chunks live in this process
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        if spec["mode"] == "chunked":
            for y in stream(model, chunks()):
                checksum += float(y[0, -1].sum())
        else:
            state = model.init_state(1)
            for c in chunks():
                for x_t in c.unbind(1):
                    y_t, state = model.step(x_t, state)
                checksum += float(y_t.sum())
    sync(device)
    seconds = time.perf_counter() - t0
    peak = sysmon.peak_rss_mib()
    return {
        "model": spec["model"],
        "tokens": tokens,
        "mode": spec["mode"],
        "chunk_len": chunk if spec["mode"] == "chunked" else 1,
        "backend": models.backend(model),
        "seconds": float(f"{seconds:.3g}"),  # 3 significant digits: a short stream is not 0.0 s
        "tok_s": round(tokens / seconds),
        "peak_rss_mib": round(peak, 1),
        "extra_mib": round(peak - rss.rss_before, 1),
        "finite": bool(checksum == checksum and abs(checksum) != float("inf")),
        "device": str(device),
    }


def stream_rows(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """--stream-tokens: one streamed run per --stream-model, each by ``run(spec, timeout)``."""
    rows = []
    for stream_model in (args.stream_model if args.stream_tokens else []):
        # --backend (its first entry) picks the stream's scan backend too; default auto
        stream_options = {"backend": args.backend[0]} if args.backend else {}
        spec = dict(kind="stream", model=stream_model, options=stream_options, tokens=args.stream_tokens,
                    chunk_len=args.stream_chunk, mode=args.stream_mode, d_model=args.d_model,
                    n_layers=args.n_layers, device=args.device, threads=args.threads)
        res = run(spec, args.timeout)
        rows.append(res if "error" not in res else {"model": stream_model, **res})
        print(f"  streamed {stream_model}", file=sys.stderr, flush=True)
    return rows
