"""Timings of the linear-RNN operators (``python -m models.kernels.linear_rnn_bench --bench |
--tune-chunks``): forward + backward of each chunked form against its ``*_ref`` twin, and
the chunk size per operator on this machine (``linear_rnn.CPU_CHUNK_SIZE``). The table with
the workbench's other measurements is ``ssm-workbench bench --ops``."""
from __future__ import annotations

import torch

from models.kernels import linear_rnn as lr
from models.kernels.linear_rnn_ops import make_inputs


def _bench(lengths=(1024, 4096), batch=8, heads=4, dim=32, repeats=5, ref_max_len=None):
    """Print the best (min) forward+backward ms, ref vs chunked, float32 (the issue's table;
    min, not median: the shared CPU is often loaded by other jobs);
    log-gates uniform in (-0.5, 0), initial state in, final state out. The last rows force
    gla's sub-chunked form (what strongly negative gates take)."""
    import time

    torch.manual_seed(0)
    rows = []
    cases = [(n, n, True) for n in lr.OPS] + [("gla (sub-chunked form)", "gla", False)]
    for label_, name, factorised in cases:
        fast, ref = lr.OPS[name][:2]
        lr.GLA_FACTORISED = factorised
        for L in lengths:
            args = make_inputs(name, batch, L, heads, dim, dim, torch.float32,
                               gate_range=(-0.5, 0.0))
            S0 = torch.randn(batch, heads, dim, dim, requires_grad=True)

            def step(fn):
                o, s = fn(*args, initial_state=S0, output_final_state=True)
                (o.square().sum() + s.square().sum()).backward()

            times = {}
            for label, fn in (("chunked", fast), ("ref", ref)):
                if label == "ref" and ref_max_len is not None and L > ref_max_len:
                    times[label] = float("nan")
                    continue
                step(fn)                                         # warm-up
                ts = []
                for _ in range(2 if label == "ref" else repeats):
                    t0 = time.perf_counter()
                    step(fn)
                    ts.append(time.perf_counter() - t0)
                times[label] = min(ts) * 1e3
            rows.append((label_, L, times["ref"], times["chunked"]))
            print(f"| {label_} | {L} | {times['ref']:.0f} | {times['chunked']:.1f} | "
                  f"{times['ref'] / times['chunked']:.0f}x |", flush=True)
    lr.GLA_FACTORISED = True
    return rows


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description="linear-RNN operators: ref vs chunked timings")
    p.add_argument("--bench", action="store_true", help="print the fwd+bwd table")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--ref-max-len", type=int, default=None,
                   help="skip the (slow) ref above this length")
    p.add_argument("--tune-chunks", action="store_true",
                   help="print chunked fwd+bwd ms per chunk size (16, 32, 64), interleaved")
    a = p.parse_args()
    if a.tune_chunks:
        import time

        print(f"batch 8, 4 heads of 32, float32, {torch.get_num_threads()} threads; best of 3 "
              "fwd+bwd ms per chunk size, sizes interleaved so that load hits them alike")
        print("| op | L | C=16 | C=32 | C=64 |\n|---|---|---|---|---|")
        for name, (fast, *_rest) in lr.OPS.items():
            for L in a.lengths:
                args = make_inputs(name, 8, L, 4, 32, 32, torch.float32, gate_range=(-0.5, 0.0))
                S0 = torch.randn(8, 4, 32, 32, requires_grad=True)
                best = {C: float("inf") for C in (16, 32, 64)}
                for _ in range(3):
                    for C in best:
                        t0 = time.perf_counter()
                        o, s = fast(*args, initial_state=S0, output_final_state=True, chunk_size=C)
                        (o.square().sum() + s.square().sum()).backward()
                        best[C] = min(best[C], (time.perf_counter() - t0) * 1e3)
                print(f"| {name} | {L} | " + " | ".join(f"{t:.0f}" for t in best.values()) + " |",
                      flush=True)
    elif a.bench:
        print(f"batch 8, 4 heads of 32, float32, {torch.get_num_threads()} threads; "
              "best fwd+bwd ms (ref: of 2 runs, chunked: of 5)")
        print("| op | L | ref ms | chunked ms | speed-up |\n|---|---|---|---|---|")
        _bench(a.lengths, ref_max_len=a.ref_max_len)
    else:
        p.print_help()


if __name__ == "__main__":
    main()
