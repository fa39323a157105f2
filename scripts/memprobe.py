"""Where a backbone's training memory goes, on CPU (docs/RESULTS.md, "Long sequences").

    python scripts/memprobe.py MODEL SEQ_LEN [--segment N] [--saved | --trace]

Default: the first training step's peak RSS above the RSS before it (batch 8, d_model 64,
2 layers, one thread) and the second step's time; --segment sets the linear-RNN operators'
SEGMENT_LEN (0: whole-sequence autograd). --saved instead counts, for ONE layer, the bytes
autograd keeps for the backward per source line under models/ (saved_tensors_hooks;
each storage counted once; what a recomputed piece keeps is listed under the line
that calls it, marked [recomputed]). --trace prints the RSS before each autograd node of
the first step's backward (a node's peak is inside it: read the next row too).
"""
from __future__ import annotations

import argparse
import collections
import gc
import inspect
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import models  # noqa: E402
import models.common  # noqa: E402
from models.kernels import linear_rnn  # noqa: E402


def _status_mib(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def step_peak(name: str, L: int) -> None:
    model = models.build(name, d_model=64, n_layers=2)
    x = torch.randn(8, L, 64)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    # the peak is taken over the FIRST step, as `bench` does: after a warm-up step the
    # allocator keeps freed memory in the process, and a second step's peak hides in it
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # resets VmHWM to the current RSS
        f.write("5")
    base = _status_mib("VmRSS")
    step()
    peak = _status_mib("VmHWM") - base
    t0 = time.perf_counter()
    step()
    dt = time.perf_counter() - t0
    print(f"{name} L={L} segment={linear_rnn.SEGMENT_LEN}: first step's peak {peak:.0f} MiB "
          f"above its start; second step {dt * 1e3:.0f} ms")


def _lines(fn) -> tuple[str, range]:
    lines, first = inspect.getsourcelines(fn)
    return inspect.getsourcefile(fn), range(first, first + len(lines))


# models.common.recomputed(_in_slices) and their autograd node: what a piece saves is listed under the
# line that called it, marked [recomputed]
RECOMPUTE_FRAMES = [_lines(models.common.recomputed), _lines(models.common.recomputed_in_slices),
                    _lines(models.common._Recompute.forward)]


def _in_recompute(f) -> bool:
    return any(f.filename == file and f.lineno in span for file, span in RECOMPUTE_FRAMES)


def saved_by_line(name: str, L: int) -> None:
    model = models.build(name, d_model=64, n_layers=1)
    x = torch.randn(8, L, 64, requires_grad=True)
    by, seen = collections.Counter(), set()
    root = str(Path(__file__).resolve().parent.parent) + "/"

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            frames = [f for f in traceback.extract_stack() if f.filename.startswith(root + "models")]
            # a recomputed piece's inputs are saved inside models.common: name its caller
            via = [f for f in frames if _in_recompute(f)]
            frames = [f for f in frames if not _in_recompute(f)]
            f = frames[-1] if frames else None
            where = f"{f.filename[len(root):]}:{f.lineno} {(f.line or '')[:60]}" if f else "?"
            where = ("[recomputed] " if via else "") + where
            by[where] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    print(f"{name} L={L}, one layer: autograd keeps {sum(by.values()) / 2**20:.0f} MiB")
    for where, n in by.most_common(14):
        print(f"  {n / 2**20:8.1f} MiB  {where}")


def backward_trace(name: str, L: int) -> None:
    """RSS (and the peak RSS so far) above the step's start before each autograd node of
    the FIRST step's backward runs (two layers, as step_peak): where the peak sits."""
    model = models.build(name, d_model=64, n_layers=2)
    x = torch.randn(8, L, 64)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # resets VmHWM to the current RSS
        f.write("5")
    base = _status_mib("VmRSS")
    loss = model(x).square().mean()
    rows, seen = [], set()

    def visit(node):                         # a prehook on every node of the graph
        if node is None or node in seen:
            return
        seen.add(node)
        node.register_prehook(lambda g, n=node: rows.append(
            (_status_mib("VmRSS") - base, _status_mib("VmHWM") - base, n.name())))
        for nxt, _ in node.next_functions:
            visit(nxt)

    sys.setrecursionlimit(100000)
    visit(loss.grad_fn)
    print(f"{name} L={L}: after the forward {_status_mib('VmRSS') - base:.0f} MiB, its peak "
          f"{_status_mib('VmHWM') - base:.0f} MiB")
    loss.backward()
    print("  node  RSS (peak so far) before it, MiB above the step's start")
    for i, (mib, hwm, what) in enumerate(rows):
        print(f"  {i:4d} {mib:6.0f} ({hwm:6.0f})  {what}")
    print(f"  after the backward {_status_mib('VmRSS') - base:.0f} ({_status_mib('VmHWM') - base:.0f})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("seq_len", type=int)
    ap.add_argument("--segment", type=int, default=None)
    ap.add_argument("--saved", action="store_true")
    ap.add_argument("--trace", action="store_true", help="RSS before each node of the backward")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.segment is not None:
        linear_rnn.SEGMENT_LEN = a.segment
    torch.manual_seed(0)
    (saved_by_line if a.saved else backward_trace if a.trace else step_peak)(a.model, a.seq_len)
