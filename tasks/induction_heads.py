"""Induction heads (Olsson et al. 2022; the H3 and Mamba papers' synthetic, Mamba Table 2).

Vocabulary V: ordinary tokens 0..V-2, trigger token V-1. A sequence of ``seq_len`` tokens:

    x_0 ... x_{p-1}  TRIGGER  c  x_{p+2} ... x_{L-2}  TRIGGER
                     ^ p

All other tokens are uniform over the ordinary tokens, so the trigger appears exactly twice:
once early followed by the token ``c`` to copy, and at the last position. Where the first
trigger goes is the parameter ``trigger`` (the Mamba paper does not say; its reproductions
differ, and accuracy at long lengths depends on the distance from it to the end):

- ``"first_half"`` (default): p uniform in [0, L//2 - 1), so the distance to the end is
  L/2 .. L-1;
- ``"anywhere"``: p uniform in [0, L - 2), any position that leaves room for ``c``;
- ``"prefix:K"``: p uniform in [0, K) (capped at L - 2): the first K positions.
The only target is at the last position: ``c``. Loss and accuracy are taken there only
(token accuracy = sequence accuracy = fraction of sequences whose last prediction is ``c``).
The answer is recoverable only by finding the earlier trigger and reading its successor.

Length generalisation (Mamba paper: train at 256, test at 2^6 .. 2^20): ``eval_sets``
returns one set per length in ``eval_lens``, keyed ``"len=N"``, plus ``""`` for the training
length. Long sequences are evaluated with few examples: at length N the set holds
``min(num_test_examples, max(1, eval_token_budget // N))`` sequences (the default budget
gives 4 sequences at 2^20), because 2^20-token sequences run with streaming inference.
Every length uses its own test seed stream. Training draws fresh batches every step
(``num_train_examples = 0``) or uses a fixed set.

Distance sets: accuracy depends on how far back the first trigger is (its distance D to
the last position, ``L - 1 - p``) more than on the total length (issue 10). Each D in
``eval_distances`` adds a set keyed ``"dist=D"`` whose every sequence has its first trigger
exactly D positions before the end: at the training length where that fits
(D <= seq_len - 2, so the distance alone varies), else at length D + 2 (one token before
the trigger). Sizes follow the same token budget; own seed stream per distance.
"""
from __future__ import annotations

import numpy as np

from tasks.base import TEST_STREAM, Task, check_int, check_int_list, rng_for
from tasks.metrics import IGNORE
from tasks.registry import register

DEFAULT_EVAL_LENS = tuple(2 ** k for k in range(6, 12))  # 64 .. 2048; profiles go to 2^20


TRIGGER_PLACEMENTS = ("first_half", "anywhere", "prefix:K")


def check_trigger(trigger) -> str:
    """``trigger`` validated: "first_half", "anywhere" or "prefix:K" with K >= 1."""
    if trigger in ("first_half", "anywhere"):
        return trigger
    if isinstance(trigger, str) and trigger.startswith("prefix:"):
        k = trigger[len("prefix:"):]
        if k.isdigit() and int(k) >= 1:
            return trigger
    raise ValueError(f"trigger must be one of {', '.join(TRIGGER_PLACEMENTS)} (K >= 1), "
                     f"got {trigger!r}")


def trigger_bound(trigger: str, seq_len: int) -> int:
    """Exclusive upper bound of the first trigger's position p (p + 1 <= L - 2 holds ``c``)."""
    if trigger == "first_half":
        return max(seq_len // 2 - 1, 1)
    if trigger == "anywhere":
        return max(seq_len - 2, 1)
    return max(1, min(int(trigger[len("prefix:"):]), seq_len - 2))


def induction_examples(n: int, seq_len: int, vocab_size: int, rng: np.random.Generator,
                       trigger: str = "first_half", distance: int | None = None):
    """n induction-head examples: inputs, targets (n, seq_len) int64.

    ``distance``: put every first trigger exactly that many positions before the last
    (p = seq_len - 1 - distance; needs 2 <= distance <= seq_len - 1) instead of ``trigger``.
    """
    token = vocab_size - 1
    x = rng.integers(0, vocab_size - 1, size=(n, seq_len))
    if distance is None:
        p = rng.integers(0, trigger_bound(trigger, seq_len), size=n)
    elif 2 <= distance <= seq_len - 1:
        p = np.full(n, seq_len - 1 - distance)
    else:
        raise ValueError(f"distance {distance} needs 2 <= distance <= seq_len - 1 = {seq_len - 1}")
    rows = np.arange(n)
    x[rows, p] = token
    # x[p + 1] is already an ordinary token: it is the token to copy
    x[:, -1] = token
    y = np.full((n, seq_len), IGNORE, dtype=np.int64)
    y[:, -1] = x[rows, p + 1]
    return x.astype(np.int64), y


@register
class InductionHeads(Task):
    name = "induction_heads"
    description = (
        "Induction heads: a trigger token appears once early followed by a token to copy; the "
        "sequence ends with the trigger and the target (last position only) is the copied token."
    )

    def __init__(self, seq_len: int = 256, vocab_size: int = 16,
                 eval_lens: list[int] = DEFAULT_EVAL_LENS, num_train_examples: int = 0,
                 num_test_examples: int = 256, eval_token_budget: int = 2 ** 22,
                 trigger: str = "first_half", eval_distances: list[int] = (),
                 num_valid_examples: int | None = None):
        self.seq_len = check_int("seq_len", seq_len, 4)
        self.vocab_size = check_int("vocab_size", vocab_size, 3)
        self.eval_lens = check_int_list("eval_lens", eval_lens, 4)
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 0)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 1)
        self.eval_token_budget = check_int("eval_token_budget", eval_token_budget, 1)
        self.trigger = check_trigger(trigger)
        no_distances = eval_distances is None or (
            isinstance(eval_distances, (list, tuple)) and not eval_distances)
        self.eval_distances = [] if no_distances else list(
            check_int_list("eval_distances", eval_distances, 2))
        self.fixed_train = self.num_train_examples > 0
        self.num_classes = self.vocab_size
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size, eval_lens=list(self.eval_lens),
            num_train_examples=num_train_examples, num_test_examples=num_test_examples,
            eval_token_budget=eval_token_budget, trigger=trigger,
            eval_distances=list(self.eval_distances),
        )
        self._set_valid(num_valid_examples)

    def _generate(self, n, rng):
        return induction_examples(n, self.seq_len, self.vocab_size, rng, self.trigger)

    def eval_examples_at(self, length: int) -> int:
        """How many test sequences the set at ``length`` holds."""
        return min(self.num_test_examples, max(1, self.eval_token_budget // length))

    def _hash_sets(self, seed):
        return [super().eval_sets(seed)[""]]   # only the training length can collide

    def eval_sets(self, seed):
        sets = super().eval_sets(seed)  # "" = the training length, de-duplicated if fixed
        for length in self.eval_lens:
            if length == self.seq_len:
                sets[f"len={length}"] = sets[""]
                continue
            x, y = induction_examples(self.eval_examples_at(length), length, self.vocab_size,
                                      rng_for(seed, TEST_STREAM, 1, length), self.trigger)
            sets[f"len={length}"] = self._to_batch(x, y)
        for d in self.eval_distances:
            length = self.distance_len(d)
            x, y = induction_examples(self.eval_examples_at(length), length, self.vocab_size,
                                      rng_for(seed, TEST_STREAM, 2, d), distance=d)
            sets[f"dist={d}"] = self._to_batch(x, y)
        return sets

    def distance_len(self, distance: int) -> int:
        """Length of the sequences of eval set ``dist=distance``."""
        return self.seq_len if distance <= self.seq_len - 2 else distance + 2
