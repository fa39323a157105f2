"""The task contract.

A task is built by name with parameters (``tasks.build(name, **params)``) and yields
``(inputs, targets)`` batches with ``targets == IGNORE (-100)`` wherever no loss is taken.
Everything is generated from explicit seeds (``numpy.random.default_rng``): no global
random state, so the same parameters and seed give the same data on every machine.

Seed streams (``rng_for(seed, *stream)``), never shared between train and test:

- ``train_set(seed)``            -> (seed, TRAIN)
- ``train_batch(bs, step, seed)`` -> (seed, TRAIN, 2, step)
- ``sample(bs, seed)``           -> (seed, TRAIN, 1)
- ``eval_sets(seed)``            -> (seed, TEST, ...)
- ``valid_set(seed)``            -> (seed, VALID)

(Streams 2 and 3 are taken: MAD memorization's fact map and the real-data splits.)

The validation set (``valid_set``, ``num_valid_examples`` examples, a parameter of every
task) is what a grid is selected on, so the test set is never peeked at. Generated tasks
draw it from the test distribution (``_generate_test``) on its own stream, and drop and
redraw rows whose inputs equal a test input (any evaluation set at the training length) or,
with a fixed training set, a training input (:meth:`Task._valid_arrays`); training and test
data are exactly what they were without it. With fresh training batches, the batches are not
filtered against the validation set (that would change the training data of every existing
run): in a tiny sequence space a training draw can equal a validation example by chance, as
any two random draws can. Real-data tasks carve it out of their training data by seed
(see their docstrings). The default size is the test set's for generated tasks.

Where train and test sequences could coincide (small vocabularies, short sequences), they
are kept apart explicitly, so a memorised training example cannot count as a test success:

- fixed training set (``fixed_train``): test examples whose inputs equal a training
  example's inputs are dropped and replaced by further draws from the test stream
  (:meth:`Task._dedup_against_train`);
- fresh batches (``train_batch``) and ``sample``: rows whose inputs equal a test example's
  inputs (at the training length) are redrawn (:meth:`Task._avoid_test`).

What the worker needs to put a model around a backbone:

- ``vocab_size`` (int) for token inputs, or ``input_dim`` (int) for continuous features;
- ``num_classes``: logits per position (or per sequence when ``pooled``);
- ``readout``: how the head reads the backbone output (``tasks.heads.make_head`` builds it):
  ``"per_position"`` (a linear layer at every position), ``"pooled"`` (mean over positions,
  one label per sequence; ``pooled`` is True exactly then) or ``"decode_from_last"`` (MAD
  compression: the last position's output is decoded into one prediction per position by an
  MLP with position embeddings; a per-position head would let the model copy its input)
  or ``"cumulative_mean"`` (logits at position t from the mean of the outputs 0..t: mean
  pooling over a prefix, with per-position targets; text classification with ``pool = "mean"``);
- ``augment_batch(batch, step, seed)``: call on every training batch (identity unless the
  task has augmentations, e.g. CIFAR crops/flips);
- ``extra_metrics(counts)``: task-specific numbers derived from the eval counts (e.g.
  bits per character for the character LM); ``{}`` for most tasks.

Accuracy is defined once, in :mod:`tasks.metrics`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable

import numpy as np
import torch

from tasks.metrics import IGNORE, AccuracyCounts

TRAIN_STREAM = 0
TEST_STREAM = 1
VALID_STREAM = 4   # 2 and 3 are used (MAD memorization's fact map, real-data splits)

READOUTS = ("per_position", "pooled", "decode_from_last", "cumulative_mean")


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """An independent generator for (seed, stream...): streams never overlap."""
    return np.random.default_rng([int(seed), *map(int, stream)])


# -- parameter checks shared by all tasks -------------------------------------------
# Every integer parameter ends up in numpy int64 arrays, torch long tensors or the store's
# INTEGER columns: beyond 2^63 - 1 it overflows there (an OverflowError deep inside a model
# build or a generator), so it is refused here, by name.
INT64_MAX = 2**63 - 1


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    if abs(value) > INT64_MAX:
        raise ValueError(f"{name} must fit a 64-bit integer (at most 2^63 - 1 = {INT64_MAX}), got {value}")
    return value


def check_float(name: str, value, low: float, high: float, high_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    ok = low <= value < high if high_open else low <= value <= high
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_int_list(name: str, value, minimum: int) -> tuple[int, ...]:
    """An int or a non-empty list of ints -> sorted tuple without duplicates."""
    items = [value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise ValueError(f"{name} must be an integer or a list of integers, got {value!r}")
    items = [check_int(name, v, minimum) for v in items]
    if not items:
        raise ValueError(f"{name} must not be empty")
    return tuple(sorted(set(items)))


@dataclass
class Batch:
    inputs: torch.Tensor   # long (batch, length) tokens, or float (batch, length, input_dim)
    targets: torch.Tensor  # long (batch, length) or (batch,) when pooled; IGNORE = no loss

    def __iter__(self):  # allows ``inputs, targets = batch``
        yield self.inputs
        yield self.targets

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


class Task:
    """Base class. Subclasses set the attributes in ``__init__`` and implement ``_generate``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    readout: ClassVar[str] = "per_position"

    # set by subclasses in __init__
    seq_len: int
    vocab_size: int | None = None
    input_dim: int | None = None
    num_classes: int = 0
    pooled: bool = False
    # fixed_train: a finite training set of num_train_examples (trained in epochs);
    # otherwise fresh batches are drawn for every step.
    fixed_train: bool = False
    num_train_examples: int = 0
    num_test_examples: int = 256
    num_valid_examples: int = 0   # set by _set_valid from the task's parameter

    def params(self) -> dict:
        """The parameters this task was built with (for records and profiles)."""
        return dict(self._params)

    # -- hooks with defaults ----------------------------------------------------------
    def extra_metrics(self, counts: AccuracyCounts, batch: "Batch | None" = None) -> dict[str, float]:
        """Task-specific numbers from summed eval counts over ``batch`` (the evaluated set,
        for what the counts alone lack, e.g. the bytes an LM's eval text covers); default none."""
        return {}

    def augment_batch(self, batch: Batch, step: int, seed: int) -> Batch:
        """Training-time augmentation of one batch (identity unless the task has some)."""
        return batch

    # -- generation -------------------------------------------------------------
    def _generate(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n examples from ``rng``: (inputs, targets) numpy arrays."""
        raise NotImplementedError

    def _generate_test(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Test examples; differs from ``_generate`` only where the task says so."""
        return self._generate(n, rng)

    def sample(self, batch_size: int, seed: int = 0) -> Batch:
        """A batch from the training distribution, determined by ``seed``."""
        x, y = self._avoid_test(batch_size, rng_for(seed, TRAIN_STREAM, 1), seed)
        return self._to_batch(x, y)

    def train_set(self, seed: int) -> Batch:
        """The fixed training set (only when ``fixed_train``)."""
        if not self.fixed_train:
            raise RuntimeError(f"task {self.name} draws fresh batches; it has no fixed train set")
        x, y = self._train_arrays(seed)
        return self._to_batch(x, y)

    def train_batch(self, batch_size: int, step: int, seed: int) -> Batch:
        """Fresh training batch for ``step`` (fresh-batch mode)."""
        x, y = self._avoid_test(batch_size, rng_for(seed, TRAIN_STREAM, 2, step), seed)
        return self._to_batch(x, y)

    def eval_sets(self, seed: int) -> dict[str, Batch]:
        """Named evaluation sets; ``""`` is the default one. Disjoint from training data."""
        x, y = self._test_arrays(self.num_test_examples, rng_for(seed, TEST_STREAM), seed)
        return {"": self._to_batch(x, y)}

    def valid_set(self, seed: int) -> Batch:
        """The validation set: ``num_valid_examples`` examples (fewer only where the
        de-duplication runs out of distinct sequences), disjoint from the test set and the
        fixed training set; empty when ``num_valid_examples == 0``."""
        x, y = self._valid_arrays(seed)
        return self._to_batch(x, y)

    # -- helpers ----------------------------------------------------------------
    def _set_valid(self, num_valid_examples, default: int | None = None) -> None:
        """Validate and record the ``num_valid_examples`` parameter (None = ``default``,
        else the test set's size); call at the end of ``__init__``, after ``_params``."""
        if num_valid_examples is None:
            self.num_valid_examples = self.num_test_examples if default is None else default
        else:
            self.num_valid_examples = check_int("num_valid_examples", num_valid_examples, 0)
        self._params["num_valid_examples"] = num_valid_examples

    def _valid_arrays(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Validation examples from (seed, VALID), test distribution; rows whose inputs equal
        an evaluation input at the training length, or a fixed-training input, are redrawn."""
        n = self.num_valid_examples
        rng = rng_for(seed, VALID_STREAM)
        if n == 0:
            return self._generate_test(0, rng)
        seen = {row.tobytes() for b in self.eval_sets(seed).values()
                if b.inputs.shape[1] == self.seq_len
                for row in np.ascontiguousarray(b.inputs.numpy())}
        if self.fixed_train:
            seen |= {row.tobytes() for row in np.ascontiguousarray(self._train_arrays(seed)[0])}
        return self._draw_avoiding(n, rng, seen, self._generate_test)

    def _draw_avoiding(self, n, rng, seen: set[bytes], gen, max_rounds: int = 20, drawn=None):
        """n examples of ``gen`` from ``rng`` whose input rows are not in ``seen``; fewer
        only when ``max_rounds`` draws find no more (never padded with seen rows).
        ``drawn``: the first draw (x, y), where the caller has made it already."""
        x, y = gen(n, rng) if drawn is None else drawn
        keep_x, keep_y, have = [], [], 0
        for _ in range(max_rounds):
            mask = np.array([row.tobytes() not in seen for row in np.ascontiguousarray(x)], bool)
            keep_x.append(x[mask][: n - have])
            keep_y.append(y[mask][: n - have])
            have += len(keep_x[-1])
            if have >= n:
                break
            x, y = gen(n - have, rng)
        return np.concatenate(keep_x), np.concatenate(keep_y)

    def _train_arrays(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        cache = self.__dict__.setdefault("_train_cache", {})
        if seed not in cache:
            cache.clear()  # keep one seed's set only
            cache[seed] = self._generate(self.num_train_examples, rng_for(seed, TRAIN_STREAM))
        return cache[seed]

    def _hash_sets(self, seed: int) -> list[Batch]:
        """The test batches training data must avoid (default: all evaluation sets)."""
        return list(self.eval_sets(seed).values())

    def _test_hashes(self, seed: int) -> set[bytes]:
        """Input rows (as bytes) of the evaluation sets at the training length."""
        cache = self.__dict__.setdefault("_test_hash_cache", {})
        if seed not in cache:
            cache.clear()
            cache[seed] = {
                row.tobytes()
                for b in self._hash_sets(seed) if b.inputs.shape[1] == self.seq_len
                for row in b.inputs.numpy()
            }
        return cache[seed]

    def _avoid_test(self, n: int, rng: np.random.Generator, seed: int, max_rounds: int = 50):
        """n training examples from ``rng``; rows equal to a test input are redrawn."""
        x, y = self._generate(n, rng)
        test = self._test_hashes(seed)
        for _ in range(max_rounds):
            bad = np.array([row.tobytes() in test for row in np.ascontiguousarray(x)], bool)
            if not bad.any():
                return x, y
            x2, y2 = self._generate(int(bad.sum()), rng)
            x[bad], y[bad] = x2, y2
        raise RuntimeError(f"task {self.name}: cannot draw training data disjoint from the "
                           "test set; the sequence space is too small for this test set")

    def _test_arrays(self, n: int, rng: np.random.Generator, seed: int, gen=None):
        """n test examples from ``rng``, de-duplicated against the fixed training set."""
        gen = gen or self._generate_test
        x, y = gen(n, rng)
        if not self.fixed_train:
            return x, y
        return self._dedup_against_train(x, y, n, rng, seed, gen)

    def _dedup_against_train(self, x, y, n, rng, seed, gen, max_rounds: int = 20):
        """Drop test rows whose inputs equal a training row's inputs; top up from ``rng``.

        Where the space of sequences is small (e.g. short MAD memorization sequences), the
        test set may end up smaller than asked after ``max_rounds``; it is never padded with
        training examples.
        """
        tx, _ = self._train_arrays(seed)
        seen = {row.tobytes() for row in np.ascontiguousarray(tx)}
        return self._draw_avoiding(n, rng, seen, gen, max_rounds, drawn=(x, y))

    def _to_batch(self, x: np.ndarray, y: np.ndarray) -> Batch:
        inputs = torch.as_tensor(x)
        inputs = inputs.float() if self.input_dim else inputs.long()
        return Batch(inputs, torch.as_tensor(y).long())


__all__ = [
    "Task", "Batch", "IGNORE", "rng_for", "TRAIN_STREAM", "TEST_STREAM", "VALID_STREAM",
    "READOUTS",
    "check_int", "check_float", "check_bool", "check_int_list",
]
