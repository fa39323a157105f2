"""Resource estimate before launch: each run's parameter count and peak memory on its device.

A run's peak is the sum of what lives through training on its device:

- ``runtime``: what the worker holds before any model (CPU: the process with torch
  imported, ~300 MiB RSS; CUDA: the context and library workspaces outside the allocator);
- ``weights`` (parameters and buffers), ``grads`` (trainable parameters),
  ``optimizer`` (Adam/AdamW: two fp32 moments per trainable parameter);
- ``activations``: tensors autograd keeps for backward (attention maps, recurrent states
  and scan checkpoints included, whatever the model's code path keeps), plus a
  ``transient`` for backward's own temporaries;
- ``data``: the fixed training set where the worker keeps it on the device (CPU: always;
  CUDA: when it is at most ``run_spec.RESIDENT_MAX_BYTES``), the eval set on the CPU, and
  the batches in flight;
- the eval forward (no grad, ``eval_batch_size`` capped at ``EVAL_TOKENS_PER_BATCH``
  tokens) runs between training steps, when the step's activations are gone, so the peak
  takes the larger of the two, not their sum.

Activations are measured, not modelled (cost_probe.py: the real composed model runs
forwards at small lengths and batches 1 and 2, what autograd keeps is fitted by
``a + b L + c L^2`` and evaluated at the run's length and batch; probes cached in memory
and on disk; a layer's small-chunk path, e.g. Mamba-2's on a CPU, as the run takes it at
its batch x length and device: cost_probe.probe_at). A model too big to build for a probe
(cost_probe.TooBigToProbe) gets a lower bound (weights, gradients, optimizer and data:
``RunEstimate.lower_bound``), which refuses it only when even that exceeds the limit. A run whose estimate fails or is only a
lower bound within the limit has ``fits`` None ("?"), never a "yes".

Known over- and under-estimates: the CPU probe runs the CPU kernels (e.g. the C
selective scan keeps a state every 32 steps); CUDA's kernels (mamba-ssm, Triton) keep
about as much or less, so CUDA estimates err high. ``amp`` (bf16) is estimated as fp32
(high by up to 2x on activations). FFT convolutions (Hyena, and S4-family kernels at long
lengths) are estimated low: their backward's complex temporaries are larger than the
transient term allows (Hyena at b8, L = 1024: 82 MiB estimated, 137-161 MiB measured by
`bench`, 0.5-0.6; ``ssm-workbench bench --estimate`` prints the two side by side, one model
per family, and docs/RESULTS.md holds its table). Deep models (more than cost_probe.DIRECT_LAYERS
layers) are probed at 2 and 4 layers and extrapolated linearly in depth.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.spec.cost_probe import (PROBE_MAX_WEIGHT_BYTES, TooBigToProbe, probe, probe_at, probe_backbone,
                                       run_task)
from workbench.spec.run_spec import EVAL_TOKENS_PER_BATCH, RESIDENT_MAX_BYTES, STREAM_ABOVE, STREAM_CHUNK

MiB = 1 << 20
GiB = 1 << 30
CPU_RUNTIME_BYTES = 300 * MiB   # RSS of a worker process with torch imported, before its model
CUDA_RUNTIME_BYTES = 600 * MiB  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator
# backward's temporaries: gradients of the saved tensors of the layer being differentiated,
# a fraction of the activations of one layer. Compared with `bench`'s measurement by
# `ssm-workbench bench --estimate` (a benchmark: docs/RESULTS.md), not by a test.
TRANSIENT_FACTOR = 2.0


class EstimateError(Exception):
    """A run that cannot be estimated for its device (e.g. train.device = "cuda", no GPU)."""


def fmt_bytes(n: float | None) -> str:
    """Bytes in the unit that keeps 1-3 digits before the point (MiB, GiB, TiB)."""
    if n is None:
        return "?"
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / MiB:.1f} MiB"


def fmt_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


# --------------------------------------------------------------------------- devices
@dataclass
class Limit:
    """Where a run executes and how much memory it may use there (None: not checked)."""

    device: str                 # "cpu" or "cuda"
    bytes: int | None
    what: str                   # e.g. "RAM of this machine: 23.4 GiB"


def _cuda_total_bytes() -> tuple[int, str] | None:
    """The smallest visible GPU's total memory (a run may land on any of them), or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()
    # get_device_properties reads the driver's numbers without creating a context
    sizes = [(torch.cuda.get_device_properties(i).total_memory, torch.cuda.get_device_name(i))
             for i in range(n)]
    total, name = min(sizes)
    return total, name


def device_limit(want: str, executor: str = "local", share: int = 1) -> Limit:
    """The device a run with ``train.device = want`` gets, and its memory limit.

    ``share``: runs that share the device at once (runs_per_gpu on a GPU, --jobs on the
    CPU); each gets an equal part. Slurm runs execute on other nodes: nothing here is
    checked against this machine. Raises EstimateError for "cuda" on a machine without one.
    """
    gpu = _cuda_total_bytes() if executor != "slurm" else None
    if executor == "slurm":
        kind = "cpu" if want == "cpu" else "cuda"
        return Limit(kind, None, "not checked: the runs execute on Slurm nodes")
    if want == "cuda" and gpu is None:
        raise EstimateError("train.device is 'cuda' but there is no GPU here (torch sees no CUDA "
                            "device): set train.device = \"cpu\" or \"auto\", or run where a GPU is")
    if want == "cuda" or (want == "auto" and gpu is not None):
        total, name = gpu
        part = f", shared by {share} runs per GPU" if share > 1 else ""
        return Limit("cuda", total // share, f"GPU memory of {name}: {fmt_bytes(total)}{part}")
    import psutil

    total = psutil.virtual_memory().total
    part = f", shared by {share} concurrent runs" if share > 1 else ""
    return Limit("cpu", total // share, f"RAM of this machine: {fmt_bytes(total)}{part}")


# --------------------------------------------------------------------------- estimates
@dataclass
class RunEstimate:
    """One run's parameter count and estimated peak memory on its device."""

    model: str
    task: str
    seq_len: int | None
    seed: int
    device: str
    params: int | None = None
    parts: dict[str, float] = field(default_factory=dict)  # bytes by component
    limit: int | None = None
    limit_what: str = ""
    error: str | None = None    # why there is no estimate, or only a lower bound (the run may still work)
    lower_bound: bool = False   # parts hold what is certain (weights, optimizer, data), not activations

    @property
    def peak(self) -> float | None:
        return sum(self.parts.values()) if self.parts else None

    @property
    def fits(self) -> bool | None:
        """True when the estimate is within the limit (or nothing is checked: no limit),
        False when it exceeds it (a lower bound that exceeds it too), None when it cannot
        be told: no estimate, or a lower bound within the limit. Never True for a run the
        estimate failed on: "fits" must not read as "checked"."""
        if self.limit is None:
            return True
        if self.peak is None:
            return None
        if self.peak > self.limit:
            return False
        return None if self.lower_bound else True

    def fits_text(self) -> str:
        """The table's "fits" cell (rich markup)."""
        if self.limit is None:
            return "–"
        return {True: "yes", False: f"[red]no[/red] (> {fmt_bytes(self.limit)})", None: "[yellow]?[/yellow]"}[self.fits]

    def peak_text(self) -> str:
        """The table's "est. peak" cell: the number, a lower bound, or why there is none."""
        if self.peak is None:
            return "? (see below)"
        return f">= {fmt_bytes(self.peak)}" if self.lower_bound else fmt_bytes(self.peak)

    def breakdown(self) -> str:
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in big if v >= 0.5 * MiB)

    def refusal(self) -> str:
        """The one-line reason this run cannot fit (only when not ``fits``)."""
        at_least = "at least " if self.lower_bound else ""
        return (f"{self.model} on {self.task} L={self.seq_len} seed={self.seed}: estimated peak "
                f"{at_least}{fmt_bytes(self.peak)} on {self.device} ({self.breakdown()}) exceeds the limit "
                f"{fmt_bytes(self.limit)} ({self.limit_what})")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "task": self.task, "seq_len": self.seq_len, "seed": self.seed,
                "device": self.device, "params": self.params,
                "est_peak_mb": None if self.peak is None else round(self.peak / MiB, 1),
                "limit_mb": None if self.limit is None else round(self.limit / MiB, 1),
                "fits": self.fits, "parts_mb": {k: round(v / MiB, 1) for k, v in self.parts.items()},
                **({"lower_bound": True} if self.lower_bound else {}),
                **({"error": self.error} if self.error else {})}


def _example_bytes(task, L: int) -> int:
    """Bytes of one example as the worker holds it: long tokens or float features, long targets."""
    x = L * task.input_dim * 4 if getattr(task, "input_dim", None) else L * 8
    return x + (8 if task.pooled else L * 8)


def _augments(task) -> bool:
    from tasks.base import Task

    return getattr(type(task), "augment_batch", None) is not Task.augment_batch


def estimate_run(spec, limit: Limit) -> RunEstimate:
    """The estimate for one RunSpec on ``limit.device``; see the module docstring."""
    est = RunEstimate(spec.label, spec.task, spec.seq_len, spec.seed, limit.device,
                      limit=limit.bytes, limit_what=limit.what)
    cuda = limit.device == "cuda"
    try:
        task = run_task(spec)
        prof = probe(spec, cuda, task)
    except TooBigToProbe as e:  # what is certain: the weights, their gradients and moments, the data
        L = est.seq_len = spec.seq_len or task.seq_len
        est.params, est.lower_bound = e.params, True
        n = _shards(spec.train)
        est.parts = {"runtime": CUDA_RUNTIME_BYTES if cuda else CPU_RUNTIME_BYTES, "weights": e.weight_bytes / n,
                     "grads": e.trainable_bytes / n, "optimizer": 2 * e.trainable_bytes / n,
                     "data": _data_bytes(task, L, spec.train, cuda)}
        est.error = (f"activations not measured for {spec.label}: the model's weights alone are "
                     f"{fmt_bytes(e.weight_bytes)} (the probe builds models of at most "
                     f"{fmt_bytes(PROBE_MAX_WEIGHT_BYTES)}), so its peak is a lower bound")
        return est
    except Exception as e:  # the run itself will report what is wrong; say why we cannot tell
        est.error = f"no estimate: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return est
    L = spec.seq_len or task.seq_len
    est.seq_len = L  # the task's own length when the sweep gives none
    cfg = spec.train
    # per device: a run on N ranks (train.devices) holds its shard's activations on each;
    # rank 0 evaluates the whole eval batch, and every rank draws the global batch (data)
    B = max(1, cfg.batch_size // (getattr(cfg, "devices", None) or 1))
    shards = _shards(cfg)
    # eval: no grad; the worker caps an eval batch at EVAL_TOKENS_PER_BATCH tokens; a forward
    # without grad holds a few of its largest tensors at a time
    eval_bs = _eval_batch(cfg, L)
    if L > STREAM_ABOVE and prof.can_stream:
        L_eval = STREAM_CHUNK
    else:
        L_eval = L
    try:  # the small-chunk paths as this run takes them, in training and in eval
        train_prof = probe_at(spec, cuda, task, B * L)
        eval_prof = probe_at(spec, cuda, task, eval_bs * L_eval)
    except Exception as e:  # noqa: BLE001 - as above: say why there is no estimate
        est.error = f"no estimate: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return est
    prof = train_prof
    est.params = int(round(prof.params(L)))
    tb = prof.trainable_bytes(L)
    acts = prof.saved(L, B)
    eval_tmp = 2 * TRANSIENT_FACTOR * eval_bs * eval_prof.largest(L_eval)
    if shards > 1:  # fsdp: rank 0 evaluates on a whole replica of the weights (sharded.py)
        eval_tmp += prof.weight_bytes(L)
    train_tmp = TRANSIENT_FACTOR * B * prof.largest(L)
    data = _data_bytes(task, L, cfg, cuda)
    est.parts = {
        "runtime": CUDA_RUNTIME_BYTES if cuda else CPU_RUNTIME_BYTES,
        "weights": prof.weight_bytes(L) / shards,
        "grads": tb / shards,
        "optimizer": 2 * tb / shards,
        "data": data,
    }
    if shards > 1:  # a block's whole weights while it runs, and the next one's, gathered ahead
        est.parts["gathered"] = 2 * prof.weight_bytes(L) / max(1, spec.n_layers)
    if acts + train_tmp >= eval_tmp:
        est.parts.update(activations=acts, transient=train_tmp)
    else:
        est.parts.update(eval=eval_tmp)
    return est


def _shards(cfg) -> int:
    """Into how many shards each device's weights, gradients and optimizer state are cut:
    train.devices under train.sharding = "fsdp" (workbench/train/sharded.py), else 1 (DDP:
    every rank holds them whole)."""
    return (getattr(cfg, "devices", None) or 1) if getattr(cfg, "sharding", None) == "fsdp" else 1


def _eval_batch(cfg, L: int) -> int:
    """The worker's eval batch: eval_batch_size (else batch_size), at most EVAL_TOKENS_PER_BATCH tokens."""
    return max(1, min(cfg.eval_batch_size or cfg.batch_size, EVAL_TOKENS_PER_BATCH // max(1, L)))


def _data_bytes(task, L: int, cfg, cuda: bool) -> float:
    """The data a run holds on its device: the training set where the worker keeps it there
    (CPU: always; CUDA: up to RESIDENT_MAX_BYTES, not augmented), the eval set (CPU), and
    the batches in flight."""
    example = _example_bytes(task, L)
    in_flight = (cfg.batch_size + _eval_batch(cfg, L)) * example
    train_set = task.num_train_examples * example if task.fixed_train else 0
    if cuda:
        return (train_set if (train_set <= RESIDENT_MAX_BYTES and not _augments(task)) else 0) + in_flight
    return train_set + (task.num_test_examples or 0) * example + in_flight



def estimate_profile(prof, share: int = 1, progress=None) -> list[RunEstimate]:
    """Estimates for every run of ``prof`` (workbench.spec.profile.Profile), in expand() order.

    ``progress(done, total)``: called after each run's estimate (a probe, where one is
    needed, is what takes time; the rest are cached). Raises EstimateError when the
    profile's device does not exist here (local executor).
    """
    from workbench.spec.expand import expand

    limit = device_limit(prof.train.device, prof.executor, share)
    specs = expand(prof)
    out = []
    for s in specs:
        out.append(estimate_run(s, limit))
        if progress is not None:
            progress(len(out), len(specs))
    return out


def share_of(prof, jobs: int | None = None, runs_per_gpu: int | None = None) -> int:
    """How many runs share one device at once under the scheduler's settings."""
    try:
        limit = device_limit(prof.train.device, prof.executor)
    except EstimateError:
        return 1
    if limit.device == "cuda":
        return max(1, runs_per_gpu or prof.runs_per_gpu or 1)
    return max(1, jobs or 1)


def too_big(estimates: list[RunEstimate]) -> list[RunEstimate]:
    """The runs that certainly cannot fit (not those that cannot be told: fits is None)."""
    return [e for e in estimates if e.fits is False]


# --------------------------------------------------------------------------- bench twin
def bench_estimate(model: str, options: dict[str, Any], d_model: int, n_layers: int,
                   batch: int, seq_len: int) -> float:
    """Bytes the estimate gives for what ``bench`` measures as ``peak_mib``: one training
    step of the bare backbone on x: (batch, seq_len, d_model) with loss mean(y^2), counted
    from just before the first forward (gradients + saved activations + backward's
    transient; weights, optimizer, data and runtime are outside that measurement). The
    same probe and fit as :func:`estimate_run` (small-chunk paths as a step of batch x
    seq_len tokens on the CPU takes them), so a match here checks the method."""
    grads, shared, per_sample, largest = probe_backbone(model, options, d_model, n_layers,
                                                        batch * seq_len)
    return (grads + shared(seq_len) + batch * per_sample(seq_len)
            + TRANSIENT_FACTOR * batch * largest(seq_len))
