"""Time and memory measurement: the one implementation the worker and ``ssm-workbench bench``
share.

- :class:`StepClock`: per-step times with no host synchronisation inside a step (CUDA
  timing events read at log points; ``perf_counter`` on CPU).
- :func:`median_ms`: the median wall time of a callable after untimed warm-up calls,
  synchronised on CUDA (the worker's inference time, bench's every figure).
- :func:`peak_memory_mb`: the run's peak so far (allocator peak on GPU, the process's own
  peak RSS on CPU); :class:`ExtraPeak`: what a piece of work added above the memory held
  when it started (bench's ``peak_mib``).
- :func:`timed_with_peak`: a training step's median time and extra peak, then a forward's
  median time.
"""
from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any, Callable

import torch

from workbench.train import sysmon


def pick_device(want: str, option: str = "device") -> torch.device:
    """``auto`` (CUDA when torch sees it), ``cpu`` or ``cuda``; a ValueError naming
    ``option`` when CUDA is asked for and there is none."""
    if want not in ("auto", "cpu", "cuda"):
        raise ValueError(f"{option} = {want!r}: expected auto, cpu or cuda")
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError(f"{option} is 'cuda' but torch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Per-step times without host synchronisation inside a step.

    On CUDA a pair of timing events is recorded around each step and read only in
    :meth:`collect` (at log points and at the end); on CPU ``time.perf_counter`` (the work
    is done when the call returns). ``times`` holds seconds per step, in step order.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: list[float] = []
        self._pending: list[tuple[Any, Any]] = []
        self._start: Any = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
        else:
            self.times.append(time.perf_counter() - self._start)

    def collect(self) -> list[float]:
        """Resolve the recorded events (one wait for the last); returns ``times``."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.times.extend(a.elapsed_time(b) / 1000 for a, b in self._pending)
            self._pending.clear()
        return self.times


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int, device: torch.device) -> float:
    """Median milliseconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones,
    each call synchronised (its queued device work counts)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rss_mib() -> float:
    """This process's resident set size now, in MiB (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import psutil
        return psutil.Process().memory_info().rss / 2**20


def peak_memory_mb(device: torch.device) -> float:
    """Allocator peak on GPU; this process's own peak RSS on CPU (sysmon.peak_rss_mib)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return sysmon.peak_rss_mib()


class ExtraPeak:
    """The peak memory (MiB) that work done after construction added above what was held
    then. CUDA: the allocator's peak minus the bytes allocated at the start (peak stats
    reset); CPU: the process's own peak RSS, reset to the current RSS where the OS allows
    (``sysmon.reset_peak_rss``), minus that RSS, so a transient of building the model
    before it does not count. Garbage is collected first: memory the collector
    freed during the work would lower the RSS under the baseline and hide that much of
    the work's peak. Memory the C heap
    holds free but resident is reused without raising the RSS: measure in a fresh process
    (``bench`` does) for a peak that counts every byte. ``rss_before`` is that CPU baseline
    (taken on both)."""

    def __init__(self, device: torch.device):
        self.device = device
        sync(device)
        self.base = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
        gc.collect()
        sysmon.reset_peak_rss()
        self.rss_before = rss_mib()

    def mib(self) -> float:
        if self.device.type == "cuda":
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        return sysmon.peak_rss_mib() - self.rss_before


def timed_with_peak(train_step: Callable[[], Any], forward: Callable[[], Any], repeats: int,
                    warmup: int, device: torch.device) -> tuple[float, float, float]:
    """(train ms, extra peak MiB, forward ms): median times (:func:`median_ms`); the peak
    is the training step's (:class:`ExtraPeak`), measured before the forward runs."""
    peak = ExtraPeak(device)
    train_ms = median_ms(train_step, repeats, warmup, device)
    extra = peak.mib()
    return train_ms, extra, median_ms(forward, repeats, warmup, device)
