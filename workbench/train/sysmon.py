"""System measurements: NVML (GPU utilisation and memory) where a driver exists, otherwise
CPU utilisation and process memory (psutil).

``pynvml`` comes from the ``nvidia-ml-py`` distribution (not the deprecated ``pynvml`` shim).
NVML numbers GPUs physically; a worker pinned with ``CUDA_VISIBLE_DEVICES=i`` samples GPU i.
"""
from __future__ import annotations

import os
import resource
import sys
import threading
from typing import Any

import psutil

def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB.

    Linux: ``VmHWM`` from /proc/self/status, the high-water mark of this program's own
    memory. Not ``ru_maxrss``: the kernel carries the RSS of the parent at fork/exec into
    it, so a worker started from a 800 MiB process reports >= 800 MiB whatever it used
    (measured: a child that touched 10 MiB read 811 MiB). Elsewhere ``ru_maxrss`` (bytes
    on macOS, KiB otherwise)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Set the peak RSS (``VmHWM``) back to the current RSS, so that :func:`peak_rss_mib`
    measures from now on (Linux: writing 5 to /proc/self/clear_refs). False where that
    cannot be done; the peak then counts from the process's start."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_nvml_lock = threading.Lock()
_nvml_state: dict[str, Any] = {"init": None, "why": ""}


def _nvml():
    """The pynvml module, initialised, or None (with the reason kept for nvml_status)."""
    with _nvml_lock:
        if _nvml_state["init"] is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                if pynvml.nvmlDeviceGetCount() < 1:
                    raise RuntimeError("driver reports no devices")
                _nvml_state["init"] = pynvml
            except Exception as e:  # no library, no driver, no device: all mean "no GPU here"
                _nvml_state["init"] = False
                _nvml_state["why"] = f"{type(e).__name__}: {e}"
        return _nvml_state["init"] or None


def gpu_available() -> bool:
    return _nvml() is not None


def nvml_status() -> str:
    nv = _nvml()
    if nv is None:
        return f"no NVIDIA GPU found (NVML: {_nvml_state['why']})"
    n = nv.nvmlDeviceGetCount()
    return f"NVML: {n} GPU(s), driver {nv.nvmlSystemGetDriverVersion()}"


def gpu_count() -> int:
    nv = _nvml()
    return int(nv.nvmlDeviceGetCount()) if nv else 0


def _visible_index() -> int:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(vis) if vis.isdigit() else 0


def _proc_gpu_mem_mb(nv, handle, pids: set[int]) -> float | None:
    """GPU memory (MiB) NVML attributes to ``pids`` on this device; None when NVML lists none
    of them (no CUDA context yet, or a container whose pids NVML does not see) or does not
    report per-process memory."""
    used, seen = 0, False
    for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        mem = getattr(proc, "usedGpuMemory", None)
        if getattr(proc, "pid", None) in pids and mem is not None:
            used, seen = used + int(mem), True
    return used / 2**20 if seen else None


def sample(pid: int | None = None, gpu_index: int | None = None) -> dict[str, Any]:
    """One sample: cpu_percent and rss_mb of ``pid`` (default: this process, with children),
    plus gpu_util (%), gpu_mem_used_mb, gpu_mem_total_mb and gpu_name when NVML works, and
    gpu_proc_mem_mb, the device memory of ``pid`` (with children) alone, when NVML lists it."""
    out: dict[str, Any] = {}
    pids = {pid or os.getpid()}
    try:
        p = psutil.Process(pid or os.getpid())
        procs = [p] + p.children(recursive=True)
        pids.update(q.pid for q in procs)
        out["cpu_percent"] = sum(_cpu(q) for q in procs)
        out["rss_mb"] = sum(_rss(q) for q in procs) / 2**20
    except psutil.Error:
        pass
    nv = _nvml()
    if nv is not None:
        try:
            h = nv.nvmlDeviceGetHandleByIndex(_visible_index() if gpu_index is None else gpu_index)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            name = nv.nvmlDeviceGetName(h)
            out.update(
                gpu_util=float(util.gpu), gpu_mem_used_mb=mem.used / 2**20,
                gpu_mem_total_mb=mem.total / 2**20,
                gpu_name=name.decode() if isinstance(name, bytes) else str(name),
            )
        except Exception:
            pass
        else:
            try:
                own = _proc_gpu_mem_mb(nv, h, pids)
                if own is not None:
                    out["gpu_proc_mem_mb"] = own
            except Exception:  # per-process numbers are optional (some drivers, MIG)
                pass
    return out


_cpu_seen: dict[int, psutil.Process] = {}


def _cpu(p: psutil.Process) -> float:
    # cpu_percent needs the same Process object across calls to measure an interval
    q = _cpu_seen.setdefault(p.pid, p)
    try:
        return q.cpu_percent(None)
    except psutil.Error:
        return 0.0


def _rss(p: psutil.Process) -> float:
    try:
        return float(p.memory_info().rss)
    except psutil.Error:
        return 0.0


class Sampler(threading.Thread):
    """Background thread: calls ``sink(sample())`` every ``interval`` seconds until
    :meth:`stop` (and at once first with ``at_start``, so even a short run has a sample).
    Keeps the GPU-utilisation and memory samples (the worker reports their mean and max and
    carries them through checkpoints) and CPU percentages. A sampling or sink error never
    ends the thread: it goes to ``on_error(exc)`` when given, else is dropped."""

    def __init__(self, sink, interval: float = 1.0, on_error=None, at_start: bool = False):
        super().__init__(daemon=True, name="sysmon")
        self.sink, self.interval, self.on_error, self.at_start = sink, interval, on_error, at_start
        self._stop_event = threading.Event()
        self.gpu_util: list[float] = []
        self.gpu_mem: list[float] = []
        self.cpu: list[float] = []

    def run(self) -> None:
        first = self.at_start
        while first or not self._stop_event.wait(self.interval):
            first = False
            try:
                s = sample()
                if s.get("gpu_util") is not None:
                    self.gpu_util.append(s["gpu_util"])
                    self.gpu_mem.append(s["gpu_mem_used_mb"])
                if s.get("cpu_percent") is not None:
                    self.cpu.append(s["cpu_percent"])
                self.sink(s)
            except Exception as e:  # a sampling hiccup must never take the run down
                if self.on_error is not None:
                    try:
                        self.on_error(e)
                    except Exception:
                        pass

    def stop(self) -> None:
        self._stop_event.set()

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called (the thread may still be finishing a sample)."""
        return self._stop_event.is_set()
