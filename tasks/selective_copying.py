"""Selective copying, MAD format (Poli et al. 2024, "Mechanistic Design and Scaling of
Hybrid Architectures", the MAD synthetic suite).

Token layout with vocabulary V: data tokens 0..V-3, blank token V-2, copy token V-1.
A sequence of length L holds, in order:

    [M data tokens with L-2M-1 blanks inserted at random positions] [copy] [blank x M]

The targets are IGNORE everywhere except the last M positions, where they are the M data
tokens in their original order. Loss and accuracy are taken only on those M positions.

Unlike the published generator (which draws the blank positions from numpy's unseeded
global RNG), positions come from the task's own seeded generator.
"""
from __future__ import annotations

import numpy as np

from tasks.base import Task
from tasks.metrics import IGNORE
from tasks.registry import register


def mad_copying_examples(
    n: int, seq_len: int, vocab_size: int, num_tokens_to_copy: int,
    rng: np.random.Generator, selective: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """n MAD copying examples: inputs and targets of shape (n, seq_len), int64."""
    m = num_tokens_to_copy
    blank, copy = vocab_size - 2, vocab_size - 1
    n_blank = seq_len - 2 * m - 1
    body = seq_len - m - 1  # data + blanks before the copy token
    data = rng.integers(0, vocab_size - 2, size=(n, m))
    inputs = np.full((n, seq_len), blank, dtype=np.int64)
    if selective:
        # choose which of the `body` slots hold data (kept in order); the rest are blanks
        keys = rng.random((n, body))
        slots = np.sort(np.argsort(keys, axis=1)[:, :m], axis=1)
    else:
        slots = np.broadcast_to(np.arange(m), (n, m))
    np.put_along_axis(inputs, slots, data, axis=1)
    inputs[:, body] = copy
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    targets[:, seq_len - m:] = data
    assert n_blank >= 0
    return inputs, targets


@register
class MADSelectiveCopying(Task):
    name = "mad_selective_copying"
    description = (
        "MAD selective copying: M data tokens scattered among blanks, then a copy token and "
        "M blanks; predict the data tokens in order at the last M positions (loss/accuracy "
        "there only)."
    )
    fixed_train = True

    def __init__(
        self, seq_len: int = 256, vocab_size: int = 16, num_tokens_to_copy: int = 16,
        num_train_examples: int = 800, num_test_examples: int = 256,
    ):
        if vocab_size < 3:
            raise ValueError("vocab_size must be >= 3 (blank and copy tokens are reserved)")
        if seq_len < 2 * num_tokens_to_copy + 1:
            raise ValueError(
                f"seq_len ({seq_len}) must be >= 2 * num_tokens_to_copy + 1 "
                f"({2 * num_tokens_to_copy + 1})"
            )
        if num_tokens_to_copy < 1:
            raise ValueError("num_tokens_to_copy must be >= 1")
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size, num_tokens_to_copy=num_tokens_to_copy,
            num_train_examples=num_train_examples, num_test_examples=num_test_examples,
        )
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.num_classes = vocab_size
        self.num_tokens_to_copy = num_tokens_to_copy
        self.num_train_examples = num_train_examples
        self.num_test_examples = num_test_examples

    def _generate(self, n, rng):
        return mad_copying_examples(
            n, self.seq_len, self.vocab_size, self.num_tokens_to_copy, rng, selective=True
        )
