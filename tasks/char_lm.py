"""Character-level language modelling on a text file the user gives (e.g. tinyshakespeare).

The file is read as UTF-8. The vocabulary is the sorted set of characters of the whole
file (as in the common nanoGPT / char-rnn Shakespeare setup, so every test character has an
id). The text is split contiguously: the first ``train_fraction`` (default 90%) of the
characters is training text, the rest test text; no window crosses the boundary.

- inputs: ``seq_len`` consecutive characters; targets: the next character at every position
  (loss and accuracy at every position).
- training: fresh batches of windows at uniformly random offsets in the training text, one
  set of offsets per step from the step's seed (``fixed_train`` is False).
- evaluation: consecutive non-overlapping windows of the test text, from its start, up to
  ``num_test_examples`` windows (``0`` = all of them). Deterministic; needs no seed.
- validation (``valid_set``): ``num_valid_examples`` consecutive non-overlapping windows cut
  from the END of the training text (its last ``num_valid_examples * seq_len + 1``
  characters, the text just before the test text); training windows then come from the
  characters before them only, so no character is both trained on and validated on. The
  default is 0 (no validation set): any other value shrinks the training text, so the
  training windows of a seed differ from those of a run without a validation set.
  Deterministic; the same for every seed.

Metrics: the stored loss is the mean cross-entropy in nats per character; ``extra_metrics``
adds ``bits_per_char = loss / ln 2`` (what char-LM papers report). Token accuracy is next-
character accuracy.
"""
from __future__ import annotations

import math
import os

import numpy as np

from tasks.base import TRAIN_STREAM, Task, check_float, check_int, rng_for
from tasks.metrics import AccuracyCounts
from tasks.registry import register


@register
class CharLM(Task):
    name = "char_lm"
    description = (
        "Character-level language modelling on a UTF-8 text file (param path), 90/10 "
        "contiguous split; next-character loss at every position, reported also in bits/char."
    )

    def __init__(self, path: str | None = None, seq_len: int = 256,
                 train_fraction: float = 0.9, num_test_examples: int = 0,
                 num_valid_examples: int = 0):
        if not path or not isinstance(path, str):
            raise ValueError("char_lm needs path = a UTF-8 text file (e.g. tinyshakespeare's "
                             "input.txt)")
        if not os.path.isfile(path):
            raise ValueError(f"char_lm: no such file {path!r} (paths are relative to where "
                             "ssm-workbench runs)")
        self.path = path
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.train_fraction = check_float("train_fraction", train_fraction, 0.0, 1.0)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 0)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.chars = sorted(set(text))
        self.vocab_size = self.num_classes = len(self.chars)
        lut = {c: i for i, c in enumerate(self.chars)}
        data = np.fromiter((lut[c] for c in text), dtype=np.int64, count=len(text))
        split = int(len(data) * self.train_fraction)
        self._train, self._test = data[:split], data[split:]
        self.num_valid_examples = check_int("num_valid_examples", num_valid_examples, 0)
        self._valid = self._train[:0]
        if self.num_valid_examples:
            # the validation text: the end of the training text, cut off from training
            cut = len(self._train) - (self.num_valid_examples * self.seq_len + 1)
            if cut < self.seq_len + 1:
                raise ValueError(
                    f"char_lm: num_valid_examples = {self.num_valid_examples} windows of "
                    f"{self.seq_len} characters leave {max(cut, 0)} training characters of "
                    f"{len(self._train)}; need at least seq_len + 1 = {self.seq_len + 1}")
            self._train, self._valid = self._train[:cut], self._train[cut:]
        for part, what in ((self._train, "training"), (self._test, "test")):
            if len(part) < self.seq_len + 1:
                raise ValueError(
                    f"char_lm: the {what} part of {path!r} has {len(part)} characters, fewer "
                    f"than seq_len + 1 = {self.seq_len + 1}"
                )
        self._params = dict(path=path, seq_len=seq_len, train_fraction=train_fraction,
                            num_test_examples=num_test_examples,
                            num_valid_examples=num_valid_examples)

    def encode(self, text: str) -> np.ndarray:
        lut = {c: i for i, c in enumerate(self.chars)}
        return np.array([lut[c] for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def extra_metrics(self, counts: AccuracyCounts, batch=None) -> dict[str, float]:
        return {"bits_per_char": counts.loss / math.log(2)}

    def _windows(self, data: np.ndarray, starts: np.ndarray):
        idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        w = data[idx]
        return w[:, :-1], w[:, 1:]

    def _generate(self, n, rng):
        starts = rng.integers(0, len(self._train) - self.seq_len, size=n)
        return self._windows(self._train, starts)

    def _avoid_test(self, n, rng, seed, max_rounds=0):
        # train windows lie in the training text; a repeated passage of the file may equal a
        # test window, as in every contiguous-split char-LM benchmark: not filtered
        return self._generate(n, rng)

    def train_batch(self, batch_size, step, seed):
        x, y = self._generate(batch_size, rng_for(seed, TRAIN_STREAM, 2, step))
        return self._to_batch(x, y)

    def eval_sets(self, seed):
        n_all = (len(self._test) - 1) // self.seq_len
        n = n_all if self.num_test_examples == 0 else min(n_all, self.num_test_examples)
        starts = np.arange(n) * self.seq_len
        x, y = self._windows(self._test, starts)
        return {"": self._to_batch(x, y)}

    def valid_set(self, seed):
        starts = np.arange(self.num_valid_examples) * self.seq_len
        x, y = self._windows(self._valid, starts)
        return self._to_batch(x, y)
