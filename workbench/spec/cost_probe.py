"""A model's cost profile, measured: build the real composed model and count what it keeps.

The resource estimate (estimate.py) needs, per run, the model's parameters, weight bytes
and the activations autograd keeps for backward, as functions of the sequence length L
and batch B (a :class:`Profile`). Activations are measured, not modelled: the real
composed model (task encoder + backbone + head) runs one forward at small lengths
(``PROBE_LENS``) and batches 1 and 2 on the CPU under
``torch.autograd.graph.saved_tensors_hooks``, summing the bytes of the distinct storages
it saves (``saved_bytes``). That gives, per length, a batch-independent part (e.g. an S4
kernel) and a per-sample part; each is fitted exactly by ``a + b L + c L^2`` through the
three lengths and evaluated at the run's length and batch. Nothing proportional to the
requested length is ever allocated. A quadratic term appears exactly where the code path
keeps an (L, L) map: ``scaled_dot_product_attention`` on the CPU takes its flash kernel
(linear memory) unless dropout is on, and on CUDA the flash/memory-efficient kernels keep
no map (with or without dropout), so for CUDA runs the probe turns attention dropout off;
an eager attention (Hugging Face GPT-Neo) keeps its map on both and is measured so. Deep
models (more than ``DIRECT_LAYERS`` layers) are probed at 2 and 4 layers and extrapolated
linearly in depth; each depth's measurement is kept for the process, so a model's 2-layer
probe serves its 2-layer runs and every deeper one. A language model's body is probed
with a small vocabulary and the real one added from its shapes, exactly
(:mod:`workbench.spec.probe_vocab`). Layers with a faster path that
keeps more only for small chunks (Mamba-2 on a CPU, the delta rules' projections) ask
``models.common.take_whole``; the probe forces it to the path the real run takes at its
batch x length and device, never the one the probe's tiny inputs would ("the small-chunk
paths" below, :func:`probe_at`).

Probes are cached per (model, options, width, depth, the task's model shape, device
kind), in memory and on disk (``~/.cache/ssm-workbench/estimate-probes.json``, invalidated
when torch or the code that decides a probe changes: models/, tasks/, this module and the
model's composition, ``_probe_sources``). The model shape is what of a task reaches the
model (vocabulary or input width, readout, classes: ``model_shape``), so task settings
that differ in data, sizes or noise share a probe: a first profile check costs one probe
per model and shape (a few tenths of a second on one thread, S4 kernels longer), later
ones none; `profile check profiles/*.toml` cold stays under 1 GB (measured: 0.9 GB, most
of it torch, scikit-learn and torch's meta-device registrations). A probe runs on one
thread (``_one_thread``) and frees what its forward kept (``saved_bytes``). Before
building a model for real the probe counts its weights on the meta device; a model over
``PROBE_MAX_WEIGHT_BYTES`` is not built and :func:`probe` raises :class:`TooBigToProbe`
with what is certain (its parameters and weight bytes).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
from dataclasses import dataclass
from typing import Any

from workbench.spec.probe_vocab import VocabSplit, counts, split_vocab

PROBE_LENS = (64, 128, 256)     # powers of two: FFT and chunked-scan sizes are exact there
DIRECT_LAYERS = 4               # deeper models are probed at 2 and 4 layers, then extrapolated
# The probe builds the real model (weights allocated and initialised) to measure what a
# forward keeps. Its weights are first counted on the meta device (no memory); beyond this
# the probe is not run, since building it could itself exhaust the machine (an embedding of
# vocab_size = 2^26 at d_model 64 is 16 GiB), and the estimate is the weights' lower bound.
PROBE_MAX_WEIGHT_BYTES = 1 << 30


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
    # the small-chunk paths' calls the probe saw (models.common.take_whole), one per kind:
    # (bytes per token, limit, cpu_only, the call's tokens per token of the batch)
    whole_calls: tuple[tuple[int, int, bool, float], ...] = ()
    # the kinds (bytes per token, limit, cpu_only) measured on their small path ("whole");
    # empty: every call measured on its sliced path
    whole: tuple[tuple[int, int, bool], ...] = ()

    def saved(self, L: int, B: int) -> float:
        return self.shared(L) + B * self.per_sample(L)

    def whole_at(self, tokens: int, device: str) -> frozenset:
        """The kinds of small-chunk call that take their small path in a run whose batch
        holds ``tokens`` tokens (batch x length) on ``device`` ("cpu" / "cuda"): each
        recorded call's own rule (models.common.whole_rule) at the run's size."""
        from models.common import whole_rule

        return frozenset((bpt, limit, cpu_only) for bpt, limit, cpu_only, per in self.whole_calls
                         if whole_rule(per * tokens, bpt, limit, cpu_only, device))

    _FITS = ("params", "trainable", "weight_bytes", "trainable_bytes", "shared", "per_sample", "largest")

    def to_dict(self) -> dict[str, Any]:
        return {**{f: [getattr(self, f).a, getattr(self, f).b, getattr(self, f).c] for f in self._FITS},
                "backend": self.backend, "can_stream": self.can_stream,
                "whole_calls": [list(c) for c in self.whole_calls], "whole": [list(k) for k in self.whole]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        return cls(*(_Fit(*d[f]) for f in cls._FITS), backend=d["backend"], can_stream=d["can_stream"],
                   whole_calls=tuple((int(b), int(m), bool(c), float(p)) for b, m, c, p in d["whole_calls"]),
                   whole=tuple((int(b), int(m), bool(c)) for b, m, c in d["whole"]))


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

    from models.registry import zero_random_fills
    from workbench.train.compose import build_model

    torch.manual_seed(0)
    # a forward keeps the same whatever the weights' values: drawing a probe's random
    # weights (a 50k-vocabulary embedding and head, 24 layers at d_model 768) was a fifth
    # of a cold `profile check profiles/*.toml`
    with zero_random_fills():
        return build_model(task, model, d_model=d_model, n_layers=n_layers, **options)


def _no_attention_dropout(m) -> None:
    """CUDA's flash / memory-efficient SDPA kernels apply dropout without an (L, L) map; the
    CPU probe would take the math path for it, so the CUDA probe runs without."""
    from models.attention.attention import CausalSelfAttention

    for mod in m.modules():
        if isinstance(mod, CausalSelfAttention):
            mod.dropout = 0.0


_ROWS: dict[str, tuple[list[tuple], str, bool, dict]] = {}


def _probe_depth(task, model: str, d_model: int, n_layers: int, options: dict[str, Any],
                 cuda: bool, whole: frozenset = frozenset()) -> tuple[list[tuple], str, bool, dict]:
    """(one row per probe length: parameters, trainable parameters, weight bytes, trainable
    bytes, shared, per-sample and largest saved bytes; the backend; whether it streams;
    the small-chunk calls seen, see :func:`_measure_depth`) of the model at this depth,
    measured once per (model, options, width, depth, model shape, device kind, small-chunk
    paths taken) in a process: a grid over depths and the two probes of a deep model share
    the depths they have in common."""
    key = json.dumps([model, options, d_model, n_layers, model_shape(task), cuda, sorted(whole)],
                     sort_keys=True, default=str)
    if key not in _ROWS:
        _ROWS[key] = _measure_depth(task, model, d_model, n_layers, options, cuda, whole)
    return _ROWS[key]


# ------------------------------------------------------------ the small-chunk paths
# Some layers take a faster path that keeps more only while a chunk is small (Mamba-2's
# _mix_whole on a CPU, the delta rules' one-matmul projections): each asks
# models.common.take_whole with its size and threshold. Every probe chunk is small (batch
# 1 and 2, L <= 256), so left alone the probe measured the small path for runs far past
# the threshold (the 125M Mamba-2 of profiles/lm-scaling-paper-gpu.toml at 32 x 2048 on
# CUDA, which takes the sliced path: 124.3 GiB estimated instead of 86.6). So the probe
# runs under models.common.whole_choices: first with every call on its sliced path,
# recording each kind of call (bytes per token, limit, cpu_only) and its tokens per token
# of the batch; the estimate then asks, per run, which kinds take their small path at the
# run's batch x length and device (Profile.whole_at), and probes again with exactly those
# on it where any do (:func:`probe_at`). Both probes are cached like any other.


def _measure_depth(task, model: str, d_model: int, n_layers: int, options: dict[str, Any],
                   cuda: bool, whole: frozenset = frozenset()) -> tuple[list[tuple], str, bool, dict]:
    """:func:`_probe_depth`'s rows, measured with the small-chunk kinds in ``whole`` on
    their small path and every other on its sliced one, and the kinds of call seen:
    {(bytes per token, limit, cpu_only): the call's tokens per token of the batch}."""
    import torch

    import models
    from models.common import whole_choices

    rows = []
    calls: dict[tuple, float] = {}
    net = None
    for L in PROBE_LENS:
        small = copy.copy(task)
        small.seq_len = L  # heads sized by the task's length (decode_from_last) follow it
        if net is None or task.readout == "decode_from_last":
            net = _build(small, model, d_model, n_layers, options)
            if cuda:
                _no_attention_dropout(net)
            net.train()
        params, trainable, wbytes, tbytes = counts(net)
        with torch.random.fork_rng():
            with whole_choices(whole) as one:
                s1, _ = saved_bytes(net, *_synthetic(small, 1, L))
            with whole_choices(whole) as two:
                s2, big2 = saved_bytes(net, *_synthetic(small, 2, L))
        _note_calls(calls, one.calls, L)
        _note_calls(calls, two.calls, 2 * L)
        rows.append((params, trainable, wbytes, tbytes, 2 * s1 - s2, s2 - s1, big2 / 2))
    return rows, models.backend(net.backbone), net.can_stream(), calls


def _note_calls(calls: dict[tuple, float], seen: list[tuple], batch_tokens: int) -> None:
    """Per kind of take_whole call in one forward over ``batch_tokens`` tokens, the largest
    share of those tokens one call saw (1.0: a layer that sees the whole batch)."""
    for tokens, bpt, limit, cpu_only in seen:
        k = (bpt, limit, cpu_only)
        calls[k] = max(calls.get(k, 0.0), tokens / batch_tokens)


def _whole_calls(calls: dict[tuple, float]) -> tuple[tuple[int, int, bool, float], ...]:
    return tuple(sorted((*k, per) for k, per in calls.items()))  # (bpt, limit, cpu_only, share)


def _fit_rows(rows: list[tuple], backend: str, can_stream: bool, calls: dict | None = None,
              whole: frozenset = frozenset()) -> Profile:
    return Profile(*(_Fit.through(list(c)) for c in zip(*rows)), backend=backend, can_stream=can_stream,
                   whole_calls=_whole_calls(calls or {}), whole=tuple(sorted(whole)))


_PROBES: dict[str, Profile] = {}


class TooBigToProbe(Exception):
    """The model's weights (counted on the meta device) exceed PROBE_MAX_WEIGHT_BYTES."""

    def __init__(self, params: int, weight_bytes: int, trainable_bytes: int):
        super().__init__(f"the model's weights alone are {weight_bytes:,} bytes")
        self.params, self.weight_bytes, self.trainable_bytes = params, weight_bytes, trainable_bytes


_TOO_BIG: dict[str, TooBigToProbe | None] = {}


_BACKBONE_WEIGHTS: dict[str, tuple[int, int, int] | None] = {}


def _sizes(net) -> tuple[int, int, int]:
    """(parameters, bytes of parameters and buffers, bytes of trainable parameters)."""
    ps = list(net.parameters())
    return (sum(p.numel() for p in ps),
            sum(p.numel() * p.element_size() for p in ps) + sum(b.numel() * b.element_size() for b in net.buffers()),
            sum(p.numel() * p.element_size() for p in ps if p.requires_grad))


def _backbone_key(model: str, d_model: int, n_layers: int, backbone_opts: dict[str, Any]) -> str:
    return json.dumps([model, d_model, n_layers, backbone_opts], sort_keys=True, default=str)


def note_backbone(model: str, d_model: int, n_layers: int, backbone_opts: dict[str, Any], net) -> None:
    """Keep the sizes of a backbone built for counting elsewhere (the profile check builds
    every model configuration on the meta device, workbench.spec.check), so that the
    estimate's size check (:func:`_weights_on_meta`) does not build it a second time."""
    _BACKBONE_WEIGHTS.setdefault(_backbone_key(model, d_model, n_layers, backbone_opts), _sizes(net))


def _weights_on_meta(task, model: str, d_model: int, n_layers: int, options: dict[str, Any]):
    """(parameters, weight bytes, trainable bytes) of the composed model, counted without
    its real weights (models.registry.build_shapes: the CPU where small, the meta device
    where not, so nothing big is allocated), or None where that cannot be done (a pretrained model
    reads its checkpoint; a model the meta device cannot build). Decides whether to probe.
    The backbone is built once per configuration (the MAD benchmark asks for it with 17
    task shapes), the task's
    encoder and head (small) each time."""
    import models
    from tasks.heads import make_encoder, make_head
    from workbench.spec.compose_options import split_options
    from workbench.train.compose import resolve_init

    if models.entry(model).family == "pretrained":
        return None  # sized by its checkpoint on disk, and building would read it
    backbone_opts, compose_opts = split_options(options)
    key = _backbone_key(model, d_model, n_layers, backbone_opts)
    small = copy.copy(task)
    small.seq_len = PROBE_LENS[-1]
    try:
        if key not in _BACKBONE_WEIGHTS:
            _BACKBONE_WEIGHTS[key] = _sizes(models.registry.build_shapes(model, d_model=d_model,
                                                                         n_layers=n_layers, **backbone_opts))
        encoder, head = (models.registry.build_for_shapes(lambda f=f: f(small, d_model))
                         for f in (make_encoder, make_head))
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
                cuda: bool, vocab: VocabSplit | None = None, whole: frozenset = frozenset()) -> Profile:
    """The fitted profile of the composed model; deep models from their 2- and 4-layer
    probes, extrapolated linearly in depth. ``vocab``: ``task`` is probe_vocab's stand-in,
    each depth's rows get the real vocabulary added; ``whole``: kinds on their small path."""
    def fitted(depth: int) -> Profile:
        rows, backend, can_stream, calls = _probe_depth(task, model, d_model, depth, options, cuda, whole)
        rows = vocab.add(rows, PROBE_LENS) if vocab is not None else rows
        return _fit_rows(rows, backend, can_stream, calls, whole)

    if n_layers <= DIRECT_LAYERS:
        return fitted(n_layers)
    two, four = fitted(2), fitted(4)
    t = (n_layers - 2) / 2
    mixed = [getattr(two, f).mix(getattr(four, f), t) for f in Profile._FITS]
    calls: dict[tuple, float] = {}
    for bpt, limit, cpu_only, per in two.whole_calls + four.whole_calls:
        calls[(bpt, limit, cpu_only)] = max(calls.get((bpt, limit, cpu_only), 0.0), per)
    return Profile(*mixed, backend=two.backend, can_stream=two.can_stream,
                   whole_calls=_whole_calls(calls), whole=two.whole)


def model_shape(task) -> dict[str, Any]:
    """What of a task its composed model (and the probe's synthetic batch) depends on: the
    encoder's input (vocab_size or input_dim), the head's readout and classes. Nothing else
    of a task reaches the model: its length is the probe's own, and its data, sizes,
    noise and seeds change the data, not the model. So the MAD benchmark's 66 task
    settings need a handful of probes per model, not 66."""
    return {"readout": task.readout, "vocab_size": task.vocab_size,
            "input_dim": getattr(task, "input_dim", None), "num_classes": task.num_classes,
            "pooled": bool(task.pooled)}


def probe_key(spec, task, cuda: bool, whole: frozenset = frozenset()) -> str:
    """The probe cache's key: the model and its settings, the task's model_shape, the
    device kind and the small-chunk kinds measured on their small path."""
    return json.dumps({"model": spec.model, "options": spec.model_options, "d_model": spec.d_model,
                       "n_layers": spec.n_layers, "task": model_shape(task), "cuda": cuda,
                       "whole": [list(k) for k in sorted(whole)]},
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


def probe(spec, cuda: bool, task=None, whole: frozenset = frozenset()) -> Profile:
    """The (cached) cost profile of ``spec``'s composed model. The task is built with the
    run's parameters and probed at small lengths: its :func:`model_shape`, not its length
    or data, decides the encoder and head, so one probe serves every length, seed, grid
    point outside the model, and task setting of the same shape. Every small-chunk path
    is measured sliced unless its kind is in ``whole``; a run's own choice of them is
    :func:`probe_at`'s."""
    if task is None:
        task = run_task(spec)
    whole = frozenset(whole)
    key = probe_key(spec, task, cuda, whole)
    if key not in _PROBES:
        disk = _disk_cache()
        try:
            _PROBES[key] = Profile.from_dict(disk[key])
        except (KeyError, TypeError, ValueError):   # not cached, or in an older form
            _check_probe_size(probe_key(spec, task, cuda), task, spec)
            with _one_thread():
                split = split_vocab(task, spec.model, spec.d_model, spec.model_options)
                if split is None:
                    _PROBES[key] = _probe_task(task, spec.model, spec.d_model, spec.n_layers,
                                               spec.model_options, cuda, None, whole)
                else:
                    small, options, vocab = split
                    _PROBES[key] = _probe_task(small, spec.model, spec.d_model, spec.n_layers,
                                               options, cuda, vocab, whole)
            disk[key] = _PROBES[key].to_dict()
            _save_disk_cache(disk)
    return _PROBES[key]


def probe_at(spec, cuda: bool, task, tokens: int) -> Profile:
    """The profile of ``spec``'s model as a run whose batch holds ``tokens`` tokens (batch
    x length, per device) on the device kind ``cuda`` computes it: the sliced probe where
    no small-chunk call of the model takes its small path at that size and device (see
    "the small-chunk paths"), else a probe with exactly the calls that do on it."""
    sliced = probe(spec, cuda, task)
    whole = sliced.whole_at(tokens, "cuda" if cuda else "cpu")
    return probe(spec, cuda, task, whole) if whole else sliced


# Probes are kept on disk between commands (a probe of an S4 model costs a second or two on
# a loaded CPU), keyed by the probe and stamped with torch's version and a hash of the
# code that decides what a forward keeps (``_probe_sources``) and PROBE_FORMAT (what a
# stored probe holds: 2 added the small-chunk calls and the paths measured): any change
# to either starts a fresh cache.
PROBE_FORMAT = 2
_DISK: dict[str, Any] | None = None


def _cache_path():
    import os
    from pathlib import Path

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ssm-workbench" / "estimate-probes.json"


def _probe_sources() -> list:
    """The files whose code decides a probe: models/ and tasks/ (the backbone, encoders,
    heads and loss), this module and probe_vocab (how they measure), and the composition
    of a task's model (workbench/train/compose.py, workbench/spec/compose_options.py). Not
    estimate.py: it only reads probes."""
    from pathlib import Path

    import models
    import tasks
    import workbench.train.compose as compose
    from workbench.spec import compose_options, probe_vocab

    files = [f for pkg in (models, tasks) for f in sorted(Path(pkg.__file__).parent.rglob("*.py"))]
    return files + [Path(m.__file__) for m in (compose, compose_options, probe_vocab)] + [Path(__file__)]


@functools.lru_cache(maxsize=1)
def _code_stamp() -> str:
    import hashlib

    import torch

    h = hashlib.sha256(f"{torch.__version__} format {PROBE_FORMAT}".encode())
    for f in _probe_sources():
        h.update(f.read_bytes())
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


def run_task(spec):
    """The task ``spec`` (a RunSpec) trains on, built with its parameters (cached: many runs
    of a sweep share one task setting)."""
    return _task(spec.task, json.dumps(spec.task_params, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _task(name: str, params_json: str):
    import tasks

    return tasks.build(name, **json.loads(params_json))


def probe_backbone(model: str, options: dict[str, Any], d_model: int, n_layers: int,
                   tokens: int | None = None):
    """The bare backbone's costs as ``bench`` trains it on the CPU (x: (B, L, d_model), loss
    mean(y^2)): (bytes of its trainable parameters, and fits over L of what a forward
    keeps: shared (batch-independent), per_sample, and the largest saved tensor per
    sequence), with each small-chunk path as a step of ``tokens`` (B x L) tokens takes it
    (None: every one sliced; see "the small-chunk paths")."""
    grads, prof = _backbone_profile(model, options, d_model, n_layers, frozenset())
    whole = prof.whole_at(tokens, "cpu") if tokens is not None else frozenset()
    if whole:
        grads, prof = _backbone_profile(model, options, d_model, n_layers, whole)
    return grads, prof.shared, prof.per_sample, prof.largest


def _backbone_profile(model: str, options: dict[str, Any], d_model: int, n_layers: int,
                      whole: frozenset) -> tuple[int, Profile]:
    """(bytes of the trainable parameters, the fitted profile: shared, per_sample, largest
    and the small-chunk calls) of the bare backbone, ``whole`` on their small path."""
    import torch

    import models
    from models.common import whole_choices

    rows = []
    calls: dict[tuple, float] = {}
    torch.manual_seed(0)
    net = models.build(model, d_model=d_model, n_layers=n_layers, **options)
    grads = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(0)
    for L in PROBE_LENS:
        with whole_choices(whole) as one:
            s1, _ = saved_bytes(net, torch.randn(1, L, d_model, generator=g), None)
        with whole_choices(whole) as two:
            s2, big2 = saved_bytes(net, torch.randn(2, L, d_model, generator=g), None)
        _note_calls(calls, one.calls, L)
        _note_calls(calls, two.calls, 2 * L)
        rows.append((0, 0, 0, 0, 2 * s1 - s2, s2 - s1, big2 / 2))
    return grads, _fit_rows(rows, "", False, calls, whole)

