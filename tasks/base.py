"""The task contract.

A task is built by name with parameters (``tasks.build(name, **params)``) and yields
``(inputs, targets)`` batches with ``targets == IGNORE (-100)`` wherever no loss is taken.
Everything is generated from explicit seeds (``numpy.random.default_rng``): no global
random state, so the same parameters and seed give the same data on every machine.
Train and test data come from disjoint seed streams (and fixed-size sets are additionally
de-duplicated against each other where the task says so).

What the worker needs to put a model around a backbone:

- ``vocab_size`` (int) for token inputs, or ``input_dim`` (int) for continuous features;
- ``num_classes``: logits per position (or per sequence when ``pooled``);
- ``pooled``: one label per sequence; the head mean-pools over positions.

Accuracy is defined once, in :mod:`tasks.metrics`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from tasks.metrics import IGNORE

TRAIN_STREAM = 0
TEST_STREAM = 1


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """An independent generator for (seed, stream...): streams never overlap."""
    return np.random.default_rng([int(seed), *map(int, stream)])


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
    """Base class. Subclasses set the class attributes and implement ``_generate``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

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

    def params(self) -> dict:
        """The parameters this task was built with (for records and profiles)."""
        return dict(self._params)

    # -- generation -------------------------------------------------------------
    def _generate(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n examples from ``rng``: (inputs, targets) numpy arrays."""
        raise NotImplementedError

    def sample(self, batch_size: int, seed: int = 0) -> Batch:
        """A batch from the training distribution, determined by ``seed``."""
        x, y = self._generate(batch_size, rng_for(seed, TRAIN_STREAM, 1))
        return self._to_batch(x, y)

    def train_set(self, seed: int) -> Batch:
        """The fixed training set (only when ``fixed_train``)."""
        if not self.fixed_train:
            raise RuntimeError(f"task {self.name} draws fresh batches; it has no fixed train set")
        x, y = self._generate(self.num_train_examples, rng_for(seed, TRAIN_STREAM))
        return self._to_batch(x, y)

    def train_batch(self, batch_size: int, step: int, seed: int) -> Batch:
        """Fresh training batch for ``step`` (fresh-batch mode)."""
        x, y = self._generate(batch_size, rng_for(seed, TRAIN_STREAM, 2, step))
        return self._to_batch(x, y)

    def eval_sets(self, seed: int) -> dict[str, Batch]:
        """Named evaluation sets; ``""`` is the default one. Disjoint from training data."""
        x, y = self._generate(self.num_test_examples, rng_for(seed, TEST_STREAM))
        return {"": self._to_batch(x, y)}

    # -- helpers ----------------------------------------------------------------
    def _to_batch(self, x: np.ndarray, y: np.ndarray) -> Batch:
        inputs = torch.as_tensor(x)
        inputs = inputs.float() if self.input_dim else inputs.long()
        return Batch(inputs, torch.as_tensor(y).long())


__all__ = ["Task", "Batch", "IGNORE", "rng_for", "TRAIN_STREAM", "TEST_STREAM"]
