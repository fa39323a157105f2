"""How many CPU threads a run's worker uses.

PyTorch's intra-op threads split each operator's work between cores and join after it.
For a small model every operator is a few microseconds of work, so the fork/join costs
more than it saves, and on a machine where other processes hold the cores, threads that
spin-wait for a busy sibling make it far worse. Measured on the 2-core box of issue 32
(load ~10, `python /tmp/steptime.py`-style loop, d_model 32, 2 layers, batch 8, L 20, the
README's main job): a Transformer step took 15.8 ms on one thread and 672 ms on two; a
Mamba step 58.9 ms and 865 ms. So a run whose activations are small trains on one thread;
larger runs keep torch's default (all cores), where splitting the matmuls pays.

The rule depends only on the run's spec (never on a timing), so a resumed run makes the
same choice as the run it continues. ``OMP_NUM_THREADS`` (set by the user, or by the
scheduler when several CPU runs share the cores) and ``SSM_WORKBENCH_THREADS`` win.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

# batch x length x width of one activation at or below which a step is "small": the
# README's main job is 8 x 20 x 32 = 5,120; the form's default MQAR sweep 64 x 256 x 64
# is far above it and keeps every core.
SMALL_ACTIVATION = 1 << 16


def cpu_threads(batch_size: int, seq_len: int | None, d_model: int,
                env: Mapping[str, str] = os.environ) -> tuple[int | None, str]:
    """(threads to set, or None to keep torch's default; why) for a CPU run."""
    forced = env.get("SSM_WORKBENCH_THREADS", "").strip()
    if forced:
        try:
            n = int(forced)
        except ValueError:
            raise ValueError(f"SSM_WORKBENCH_THREADS={forced!r} is not a whole number") from None
        if n < 1:
            raise ValueError(f"SSM_WORKBENCH_THREADS={forced!r} must be at least 1")
        return n, "SSM_WORKBENCH_THREADS"
    if env.get("OMP_NUM_THREADS", "").strip():
        return None, "OMP_NUM_THREADS"
    size = batch_size * (seq_len or 1) * d_model
    if size <= SMALL_ACTIVATION:
        return 1, f"small steps ({batch_size}x{seq_len}x{d_model} <= {SMALL_ACTIVATION})"
    return None, "torch's default"
