"""Measure S4-family kernel time and memory (CPU): one configuration per process.

    python -m models.ssm.bench_s4_kernels CONFIG [L]        CONFIG in CONFIGS below

Prints the median time of the kernel forward and forward+backward (d=64 channels, N=64)
and the extra peak RSS of the first forward+backward at length L (default 4096), after a
warm-up at L=64 that absorbs lazy library initialisation.  RSS is a process-wide peak, and
glibc keeps freed blocks, so for memory numbers run with MALLOC_MMAP_THRESHOLD_=131072
(large blocks then go back to the OS when freed; this slows the timings, so take times from
a run without it).
"""
from __future__ import annotations

import resource
import statistics
import sys
import time

import torch

from models.ssm.s4 import S4
from models.ssm.s4_dplr import S4DPLR
from models.ssm.s4d import S4D

H, N = 64, 64
CONFIGS = {
    "s4d_split": lambda: S4D(H, N, init="lin", kernel_mode="split"),
    "s4d_naive": lambda: S4D(H, N, init="lin", kernel_mode="naive"),
    "dplr_chunk128": lambda: S4DPLR(H, N, freq_chunk=128),
    "dplr_chunk512": lambda: S4DPLR(H, N, freq_chunk=512),
    "dplr_nochunk": lambda: S4DPLR(H, N, freq_chunk=10**9),
    "dplr_zoh": lambda: S4DPLR(H, N, disc="zoh"),
    "s4_dense": lambda: S4(H, N),
}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in CONFIGS:
        raise SystemExit(f"usage: python -m models.ssm.bench_s4_kernels {{{','.join(CONFIGS)}}} [L]")
    cfg, L = argv[0], int(argv[1]) if len(argv) > 1 else 4096
    torch.manual_seed(0)
    m = CONFIGS[cfg]()

    def fwd():
        with torch.no_grad():
            m.kernel(L)

    def fwd_bwd(length: int = L):
        m.zero_grad()
        m.kernel(length).square().sum().backward()

    fwd_bwd(64)
    base = _rss_mib()
    fwd_bwd()
    extra = _rss_mib() - base
    tf, tb = [], []
    for times, fn in ((tf, fwd), (tb, fwd_bwd)):
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    print(f"{cfg:14s} L={L} kernel fwd {1e3 * statistics.median(tf):8.1f} ms  "
          f"fwd+bwd {1e3 * statistics.median(tb):8.1f} ms  extra peak RSS {extra:6.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
