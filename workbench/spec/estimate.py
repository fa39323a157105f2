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

Activations are measured, not modelled: the real composed model (task encoder + backbone
+ head) runs one forward at small lengths (``PROBE_LENS``) and batches 1 and 2 on the
CPU under ``torch.autograd.graph.saved_tensors_hooks``, summing the bytes of the distinct
storages it saves. That gives, per length, a batch-independent part (e.g. an S4 kernel)
and a per-sample part; each is fitted exactly by ``a + b L + c L^2`` through the three
lengths and evaluated at the run's length and batch. Nothing proportional to the
requested length is ever allocated. A quadratic term appears exactly where the code path
keeps an (L, L) map: ``scaled_dot_product_attention`` on the CPU takes its flash kernel
(linear memory) unless dropout is on, and on CUDA the flash/memory-efficient kernels keep
no map (with or without dropout), so for CUDA runs the probe turns attention dropout off;
an eager attention (Hugging Face GPT-Neo) keeps its map on both and is measured so.
Probes are cached per (model, options, width, depth, the task's model shape, device
kind), in memory and on disk (``~/.cache/ssm-workbench/estimate-probes.json``, invalidated
when torch or the code of models/, tasks/ or this module changes). The model shape is what
of a task reaches the model (vocabulary or input width, readout, classes: ``model_shape``),
so task settings that differ in data, sizes or noise share a probe: a first profile check
costs one probe per model and shape (a few tenths of a second on one thread, S4 kernels
longer), later ones none; `profile check profiles/*.toml` cold stays under 1 GB (measured:
0.9 GB, most of it torch, scikit-learn and torch's meta-device registrations). A probe runs
on one thread (``_one_thread``) and frees what its forward kept (``saved_bytes``). Before
building a model for real the probe counts its weights on the meta device; a model over
``PROBE_MAX_WEIGHT_BYTES`` is not built, and its estimate is a lower bound (weights,
gradients, optimizer and data: ``RunEstimate.lower_bound``), which refuses it only when
even that exceeds the limit. A run whose estimate fails or is only a lower bound within
the limit has ``fits`` None ("?"), never a "yes".

Known over- and under-estimates: the CPU probe runs the CPU kernels (e.g. the C
selective scan keeps a state every 32 steps); CUDA's kernels (mamba-ssm, Triton) keep
about as much or less, so CUDA estimates err high. ``amp`` (bf16) is estimated as fp32
(high by up to 2x on activations). FFT convolutions (Hyena, and S4-family kernels at long
lengths) are estimated low: their backward's complex temporaries are larger than the
transient term allows (Hyena at b8, L = 1024: 82 MiB estimated, 137-161 MiB measured by
`bench`, 0.5-0.6; ``ssm-workbench bench --estimate`` prints the two side by side, one model
per family, and docs/RESULTS.md holds its table). Deep models (more than ``DIRECT_LAYERS`` layers) are
probed at 2 and 4 layers and extrapolated linearly in depth.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from workbench.spec.run_spec import EVAL_TOKENS_PER_BATCH, RESIDENT_MAX_BYTES, STREAM_ABOVE, STREAM_CHUNK

MiB = 1 << 20
GiB = 1 << 30
PROBE_LENS = (64, 128, 256)     # powers of two: FFT and chunked-scan sizes are exact there
DIRECT_LAYERS = 4               # deeper models are probed at 2 and 4 layers, then extrapolated
CPU_RUNTIME_BYTES = 300 * MiB   # RSS of a worker process with torch imported, before its model
CUDA_RUNTIME_BYTES = 600 * MiB  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator
# backward's temporaries: gradients of the saved tensors of the layer being differentiated,
# a fraction of the activations of one layer. Compared with `bench`'s measurement by
# `ssm-workbench bench --estimate` (a benchmark: docs/RESULTS.md), not by a test.
TRANSIENT_FACTOR = 2.0
# The probe builds the real model (weights allocated and initialised) to measure what a
# forward keeps. Its weights are first counted on the meta device (no memory); beyond this
# the probe is not run, since building it could itself exhaust the machine (an embedding of
# vocab_size = 2^26 at d_model 64 is 16 GiB), and the estimate is the weights' lower bound.
PROBE_MAX_WEIGHT_BYTES = 1 * GiB


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


# --------------------------------------------------------------------------- probing
@dataclass
class _Fit:
    """y(L) = a + b L + c L^2 through the probe points (c clamped at 0: no shrinking)."""

    a: float
    b: float
    c: float

    @classmethod
    def through(cls, ys: list[float], lens=PROBE_LENS) -> "_Fit":
        import numpy as np

        A = np.array([[1.0, L, L * L] for L in lens])
        a, b, c = np.linalg.solve(A, np.array(ys, dtype=float))
        if c < 1e-9 * max(1.0, abs(b)):  # linear (or rounding noise): the last two points
            c = 0.0
            b = (ys[-1] - ys[-2]) / (lens[-1] - lens[-2])
            a = ys[-1] - b * lens[-1]
        return cls(float(a), float(max(b, 0.0)), float(c))

    def __call__(self, L: float) -> float:
        return max(0.0, self.a + self.b * L + self.c * L * L)

    def mix(self, other: "_Fit", t: float) -> "_Fit":
        """self + t (other - self): linear extrapolation between two depths."""
        return _Fit(*(x + t * (y - x) for x, y in ((self.a, other.a), (self.b, other.b), (self.c, other.c))))


@dataclass
class Profile:
    """What a model costs as a function of length L and batch B (bytes, parameters)."""

    params: _Fit                # parameter count (a head with position embeddings grows with L)
    trainable: _Fit
    weight_bytes: _Fit          # parameters + buffers
    trainable_bytes: _Fit
    shared: _Fit                # saved for backward, independent of the batch
    per_sample: _Fit            # saved for backward, per sequence of the batch
    largest: _Fit               # the largest single saved tensor per sequence (eval temporaries)
    backend: str = ""
    can_stream: bool = False    # the backbone evaluates long sequences chunk by chunk

    def saved(self, L: int, B: int) -> float:
        return self.shared(L) + B * self.per_sample(L)

    _FITS = ("params", "trainable", "weight_bytes", "trainable_bytes", "shared", "per_sample", "largest")

    def to_dict(self) -> dict[str, Any]:
        return {**{f: [getattr(self, f).a, getattr(self, f).b, getattr(self, f).c] for f in self._FITS},
                "backend": self.backend, "can_stream": self.can_stream}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        return cls(*(_Fit(*d[f]) for f in cls._FITS), backend=d["backend"], can_stream=d["can_stream"])


def _synthetic(task, B: int, L: int):
    """Inputs and targets shaped like the task's, random (the values do not change memory)."""
    import torch

    g = torch.Generator().manual_seed(0)
    if getattr(task, "input_dim", None):
        x = torch.randn(B, L, task.input_dim, generator=g)
    else:
        x = torch.randint(0, task.vocab_size, (B, L), generator=g)
    shape = (B,) if task.pooled else (B, L)
    y = torch.randint(0, max(1, task.num_classes), shape, generator=g)
    return x, y


def saved_bytes(model, inputs, targets) -> tuple[int, int]:
    """(total, largest) bytes of the distinct storages one training forward (loss included)
    keeps for backward, parameters and buffers excluded (they are counted as weights).
    ``targets`` None: ``model`` is a bare backbone, trained on mean(y^2) as ``bench`` does."""
    import torch

    from tasks.metrics import loss as task_loss

    own = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[Any, int] = {}
    # The saved tensors are kept alive here, not by the graph: a pack hook that returned the
    # tensor itself would make the graph hold its own outputs (an output saved by the node
    # that made it), a cycle through C++ that Python's collector cannot see, so every
    # probe's activations leaked (8.6 GB after `profile check profiles/*.toml`). Holding
    # them in this list keeps each storage alive for the whole forward, as training would
    # (no address is reused and counted twice), and frees them all on return; nothing ever
    # unpacks, since the probe runs no backward.
    kept: list[Any] = []

    def pack(t):
        try:
            s = t.untyped_storage()
            key, size = s.data_ptr(), s.nbytes()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without one storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in own:
            seen[key] = max(seen.get(key, 0), size)
        kept.append(t)
        return len(kept) - 1

    def unpack(i):
        return kept[i]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        if targets is None:  # a bare backbone, as `bench` trains it: mean(y^2)
            model(inputs).pow(2).mean()
        else:
            task_loss(model(inputs), targets)
    kept.clear()
    return sum(seen.values()), max(seen.values(), default=0)


def _build(task, model: str, d_model: int, n_layers: int, options: dict[str, Any]):
    import torch

    from workbench.train.compose import build_model

    torch.manual_seed(0)
    return build_model(task, model, d_model=d_model, n_layers=n_layers, **options)


def _no_attention_dropout(m) -> None:
    """CUDA's flash / memory-efficient SDPA kernels apply dropout without an (L, L) map; the
    CPU probe would take the math path for it, so the CUDA probe runs without."""
    from models.attention.attention import CausalSelfAttention

    for mod in m.modules():
        if isinstance(mod, CausalSelfAttention):
            mod.dropout = 0.0


def _probe_depth(task, model: str, d_model: int, n_layers: int, options: dict[str, Any],
                 cuda: bool) -> Profile:
    import torch

    import models

    rows = []
    net = None
    for L in PROBE_LENS:
        small = copy.copy(task)
        small.seq_len = L  # heads sized by the task's length (decode_from_last) follow it
        if net is None or task.readout == "decode_from_last":
            net = _build(small, model, d_model, n_layers, options)
            if cuda:
                _no_attention_dropout(net)
            net.train()
        ps = list(net.parameters())
        tr = [p for p in ps if p.requires_grad]
        wbytes = sum(p.numel() * p.element_size() for p in ps) + sum(
            b.numel() * b.element_size() for b in net.buffers())
        with torch.random.fork_rng():
            s1, _ = saved_bytes(net, *_synthetic(small, 1, L))
            s2, big2 = saved_bytes(net, *_synthetic(small, 2, L))
        rows.append((sum(p.numel() for p in ps), sum(p.numel() for p in tr), wbytes,
                     sum(p.numel() * p.element_size() for p in tr), 2 * s1 - s2, s2 - s1, big2 / 2))
    cols = list(zip(*rows))
    fits = [_Fit.through(list(c)) for c in cols]
    return Profile(*fits, backend=models.backend(net.backbone), can_stream=net.can_stream())


_PROBES: dict[str, Profile] = {}


class TooBigToProbe(Exception):
    """The model's weights (counted on the meta device) exceed PROBE_MAX_WEIGHT_BYTES."""

    def __init__(self, params: int, weight_bytes: int, trainable_bytes: int):
        super().__init__(f"the model's weights alone are {fmt_bytes(weight_bytes)}")
        self.params, self.weight_bytes, self.trainable_bytes = params, weight_bytes, trainable_bytes


_TOO_BIG: dict[str, TooBigToProbe | None] = {}


_BACKBONE_WEIGHTS: dict[str, tuple[int, int, int] | None] = {}


def _sizes(net) -> tuple[int, int, int]:
    """(parameters, bytes of parameters and buffers, bytes of trainable parameters)."""
    ps = list(net.parameters())
    return (sum(p.numel() for p in ps),
            sum(p.numel() * p.element_size() for p in ps) + sum(b.numel() * b.element_size() for b in net.buffers()),
            sum(p.numel() * p.element_size() for p in ps if p.requires_grad))


def _weights_on_meta(task, model: str, d_model: int, n_layers: int, options: dict[str, Any]):
    """(parameters, weight bytes, trainable bytes) of the composed model, counted on the
    meta device (nothing allocated), or None where that cannot be done (a pretrained model
    reads its checkpoint; a model the meta device cannot build). Decides whether to probe.
    The backbone is built once per configuration (a meta build of a Transformer takes a
    tenth of a second; the MAD benchmark asks for it with 17 task shapes), the task's
    encoder and head (small) each time."""
    import torch

    import models
    from tasks.heads import make_encoder, make_head
    from workbench.spec.compose_options import split_options
    from workbench.train.compose import resolve_init

    if models.entry(model).family == "pretrained":
        return None  # sized by its checkpoint on disk, and building would read it
    backbone_opts, compose_opts = split_options(options)
    key = json.dumps([model, d_model, n_layers, backbone_opts], sort_keys=True, default=str)
    small = copy.copy(task)
    small.seq_len = PROBE_LENS[-1]
    try:
        if key not in _BACKBONE_WEIGHTS:
            with torch.device("meta"):
                _BACKBONE_WEIGHTS[key] = _sizes(models.build(model, d_model=d_model, n_layers=n_layers,
                                                             **backbone_opts))
        with torch.device("meta"):
            encoder, head = make_encoder(small, d_model), make_head(small, d_model)
        tied = resolve_init(small, model, **compose_opts)["tie_embeddings"]
    except Exception:  # the real probe will build it (or say why not)
        _BACKBONE_WEIGHTS.setdefault(key, None)
        return None
    if _BACKBONE_WEIGHTS[key] is None:
        return None
    # a tied head is a bias-free Linear on the embedding's own matrix: nothing of its own
    parts = [_BACKBONE_WEIGHTS[key], _sizes(encoder)] + ([] if tied else [_sizes(head)])
    return tuple(sum(x) for x in zip(*parts))


def _check_probe_size(key: str, task, spec) -> None:
    """Raise TooBigToProbe when ``spec``'s model is too big to build for a probe (once per key)."""
    if key not in _TOO_BIG:
        sizes = _weights_on_meta(task, spec.model, spec.d_model, spec.n_layers, spec.model_options)
        _TOO_BIG[key] = (TooBigToProbe(*sizes) if sizes is not None and sizes[1] > PROBE_MAX_WEIGHT_BYTES
                         else None)
    if _TOO_BIG[key] is not None:
        raise _TOO_BIG[key]


def _probe_task(task, model: str, d_model: int, n_layers: int, options: dict[str, Any],
                cuda: bool) -> Profile:
    if n_layers <= DIRECT_LAYERS:
        return _probe_depth(task, model, d_model, n_layers, options, cuda)
    two, four = (_probe_depth(task, model, d_model, d, options, cuda) for d in (2, 4))
    t = (n_layers - 2) / 2
    mixed = [getattr(two, f).mix(getattr(four, f), t) for f in Profile._FITS]
    return Profile(*mixed, backend=two.backend, can_stream=two.can_stream)


def model_shape(task) -> dict[str, Any]:
    """What of a task its composed model (and the probe's synthetic batch) depends on: the
    encoder's input (vocab_size or input_dim), the head's readout and classes. Nothing else
    of a task reaches the model: its length is the probe's own, and its data, sizes,
    noise and seeds change the data, not the model. So the MAD benchmark's 66 task
    settings need a handful of probes per model, not 66."""
    return {"readout": task.readout, "vocab_size": task.vocab_size,
            "input_dim": getattr(task, "input_dim", None), "num_classes": task.num_classes,
            "pooled": bool(task.pooled)}


def probe_key(spec, task, cuda: bool) -> str:
    """The probe cache's key: the model and its settings, and the task's model_shape."""
    return json.dumps({"model": spec.model, "options": spec.model_options, "d_model": spec.d_model,
                       "n_layers": spec.n_layers, "task": model_shape(task), "cuda": cuda},
                      sort_keys=True, default=str)


@contextlib.contextmanager
def _one_thread():
    """Probe on one intra-op thread: its tensors are tiny (batch 1 and 2, L <= 256), so
    splitting an operator costs more than it saves, and on a machine whose cores are busy
    the threads' spin-waits made a probe 30x slower (S4: 0.6 s on one thread, 19.9 s on
    two, at load 10 on 2 cores). What a forward saves does not depend on the threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def probe(spec, cuda: bool, task=None) -> Profile:
    """The (cached) cost profile of ``spec``'s composed model. The task is built with the
    run's parameters and probed at small lengths: its :func:`model_shape`, not its length
    or data, decides the encoder and head, so one probe serves every length, seed, grid
    point outside the model, and task setting of the same shape."""
    if task is None:
        task = _task(spec.task, json.dumps(spec.task_params, sort_keys=True, default=str))
    key = probe_key(spec, task, cuda)
    if key not in _PROBES:
        disk = _disk_cache()
        if key in disk:
            _PROBES[key] = Profile.from_dict(disk[key])
        else:
            _check_probe_size(key, task, spec)
            with _one_thread():
                _PROBES[key] = _probe_task(task, spec.model, spec.d_model, spec.n_layers,
                                           spec.model_options, cuda)
            disk[key] = _PROBES[key].to_dict()
            _save_disk_cache(disk)
    return _PROBES[key]


# Probes are kept on disk between commands (a probe of an S4 model costs a second or two on
# a loaded CPU), keyed by the probe and stamped with torch's version and a hash of the
# code that decides what a forward keeps (models/, tasks/ and this module): any change to
# that code starts a fresh cache.
_DISK: dict[str, Any] | None = None


def _cache_path():
    import os
    from pathlib import Path

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ssm-workbench" / "estimate-probes.json"


@functools.lru_cache(maxsize=1)
def _code_stamp() -> str:
    import hashlib
    from pathlib import Path

    import torch

    import models
    import tasks

    h = hashlib.sha256(torch.__version__.encode())
    for pkg in (models, tasks):
        for f in sorted(Path(pkg.__file__).parent.rglob("*.py")):
            h.update(f.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def _disk_cache() -> dict[str, Any]:
    global _DISK
    if _DISK is None:
        try:
            data = json.loads(_cache_path().read_text())
            _DISK = data["probes"] if data.get("stamp") == _code_stamp() else {}
        except (OSError, ValueError, KeyError, TypeError):
            _DISK = {}
    return _DISK


def _save_disk_cache(probes: dict[str, Any]) -> None:
    import os

    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"stamp": _code_stamp(), "probes": probes}))
        tmp.replace(path)  # atomic: a concurrent reader sees the old or the new file
    except OSError:
        pass  # a read-only home: probe again next time


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
    import tasks

    est = RunEstimate(spec.label, spec.task, spec.seq_len, spec.seed, limit.device,
                      limit=limit.bytes, limit_what=limit.what)
    cuda = limit.device == "cuda"
    try:
        task = _task(spec.task, json.dumps(spec.task_params, sort_keys=True, default=str))
        prof = probe(spec, cuda, task)
    except TooBigToProbe as e:  # what is certain: the weights, their gradients and moments, the data
        L = est.seq_len = spec.seq_len or task.seq_len
        est.params, est.lower_bound = e.params, True
        n = _shards(spec.train)
        est.parts = {"runtime": CUDA_RUNTIME_BYTES if cuda else CPU_RUNTIME_BYTES, "weights": e.weight_bytes / n,
                     "grads": e.trainable_bytes / n, "optimizer": 2 * e.trainable_bytes / n,
                     "data": _data_bytes(task, L, spec.train, cuda)}
        est.error = (f"activations not measured for {spec.label}: {e} (the probe builds models of at most "
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
    est.params = int(round(prof.params(L)))
    tb = prof.trainable_bytes(L)
    acts = prof.saved(L, B)
    # eval: no grad; the worker caps an eval batch at EVAL_TOKENS_PER_BATCH tokens; a forward
    # without grad holds a few of its largest tensors at a time
    eval_bs = _eval_batch(cfg, L)
    if L > STREAM_ABOVE and prof.can_stream:
        L_eval = STREAM_CHUNK
    else:
        L_eval = L
    eval_tmp = 2 * TRANSIENT_FACTOR * eval_bs * prof.largest(L_eval)
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


@functools.lru_cache(maxsize=64)
def _task(name: str, params_json: str):
    import tasks

    return tasks.build(name, **json.loads(params_json))


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
    same probe and fit as :func:`estimate_run`, so a match here checks the method."""
    import torch

    import models

    rows = []
    torch.manual_seed(0)
    net = models.build(model, d_model=d_model, n_layers=n_layers, **options)
    grads = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(0)
    for L in PROBE_LENS:
        s1, _ = saved_bytes(net, torch.randn(1, L, d_model, generator=g), None)
        s2, big2 = saved_bytes(net, torch.randn(2, L, d_model, generator=g), None)
        rows.append((2 * s1 - s2, s2 - s1, big2 / 2))
    shared, per_sample, largest = (_Fit.through(list(c)) for c in zip(*rows))
    return (grads + shared(seq_len) + batch * per_sample(seq_len)
            + TRANSIENT_FACTOR * batch * largest(seq_len))
