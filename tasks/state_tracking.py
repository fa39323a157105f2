"""State-tracking tasks: the shared frame, parity and cycle navigation.

State tracking asks a model to carry a finite state through a sequence: the answer at a
position depends on every earlier token, and no fixed window suffices. Linear RNNs whose
transitions have only non-negative eigenvalues provably cannot do it at arbitrary length
(Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through Negative
Eigenvalues", ICLR; Merrill et al. 2024, "The Illusion of State in State-Space Models");
the tasks here are the ones those papers and Deletang et al. 2023 ("Neural Networks and
the Chomsky Hierarchy", ICLR) train on short sequences and test on long ones.

The frame every state-tracking task shares (:class:`StateTrackingTask`):

- The input is a token sequence (``vocab_size`` = the task's symbols + one PAD token, the
  last id). Each example has a *real length* n; positions n .. seq_len-1 hold PAD and have
  no target.
- ``labels = "final"``: one target, at the last real position n-1: the state after the
  whole sequence (Deletang et al.: one output per string). ``labels = "running"``: a
  target at every position where the state is defined (for most tasks every position;
  for modular arithmetic the positions holding a number): the state after the prefix
  ending there (jopetty/word-problem's scan; a stronger training signal).
- Loss and accuracy are taken at the targets only (:mod:`tasks.metrics`): token accuracy
  = fraction of targets right; sequence accuracy = sequences whose every target is right
  (for ``"final"`` the two coincide).
- Training lengths: ``min_len = None`` trains at exactly ``seq_len``; ``min_len = m``
  draws each training example's real length uniformly from [m, seq_len] (Grazzi et al. /
  xLSTM's formal-language setup: lengths 3 .. 40, padded to the context) and pads it.
- Length generalisation: ``eval_sets`` returns ``""`` (the training distribution, on the
  test stream) and one set per length N in ``eval_lens``, keyed ``"len=N"``, whose every
  example has real length exactly N (Deletang et al. evaluate each length separately), with
  ``num_test_examples`` examples and its own test seed stream. Train and test never share
  a seed stream (tasks/base.py); training rows that equal a test row of the training
  width (``""``, and ``len=seq_len``) are redrawn.

Subclasses implement ``_symbols(n, length, rng) -> (tokens, states, mask)``: tokens
(n, length) in [0, n_symbols), the state after each prefix (n, length), and where the state
is defined (n, length) bool; the frame pads, places targets and builds the eval sets.
"""
from __future__ import annotations

import numpy as np

from tasks.base import TEST_STREAM, Task, check_int, check_int_list, rng_for
from tasks.metrics import IGNORE
from tasks.registry import register

LABELS = ("final", "running")
DEFAULT_EVAL_LENS = (40, 64, 128, 256)   # Grazzi et al.: trained 3 .. 40, tested 40 .. 256


class StateTrackingTask(Task):
    """Shared frame (see the module docstring); not registered itself."""

    readout = "per_position"
    running_ok: bool = True   # False where a prefix has no state (bracketed expressions)

    def _init_frame(self, seq_len, min_len, labels, eval_lens, num_train_examples,
                    num_test_examples, n_symbols: int, num_classes: int,
                    min_allowed: int = 1) -> None:
        """Validate the shared parameters and set the sizes; ``_params`` is started here."""
        self.seq_len = check_int("seq_len", seq_len, min_allowed)
        self.min_len = self.seq_len if min_len is None else check_int("min_len", min_len, min_allowed)
        if self.min_len > self.seq_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= seq_len ({self.seq_len})")
        if labels not in LABELS:
            raise ValueError(f"labels must be one of {', '.join(LABELS)}, got {labels!r}")
        if labels == "running" and not self.running_ok:
            raise ValueError(f"task {self.name}: labels = 'running' is not defined here "
                             "(a prefix has no value); use labels = 'final'")
        self.labels = labels
        self.eval_lens = check_int_list("eval_lens", eval_lens, min_allowed)
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 0)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 1)
        self.fixed_train = self.num_train_examples > 0
        self.n_symbols = n_symbols
        self.pad = n_symbols                  # the last id
        self.vocab_size = n_symbols + 1
        self.num_classes = num_classes
        self._params = dict(seq_len=seq_len, min_len=min_len, labels=labels,
                            eval_lens=list(self.eval_lens),
                            num_train_examples=num_train_examples,
                            num_test_examples=num_test_examples)

    # -- subclass hook --------------------------------------------------------------
    def _symbols(self, n: int, length: int, rng: np.random.Generator):
        """n examples of real length ``length``: tokens, states (n, length) int64 and a
        bool mask (n, length) of the positions where the state is defined."""
        raise NotImplementedError

    def _real_length(self, length: int) -> int:
        """The real length an example drawn at ``length`` has (modular arithmetic without
        brackets needs an odd length: one less)."""
        return length

    # -- the frame --------------------------------------------------------------------
    def _examples(self, n: int, lengths: np.ndarray, width: int, rng: np.random.Generator):
        """n examples with real lengths ``lengths`` (n,), padded to ``width``."""
        x = np.full((n, width), self.pad, np.int64)
        y = np.full((n, width), IGNORE, np.int64)
        for length in np.unique(lengths):
            rows = np.flatnonzero(lengths == length)
            tok, states, mask = self._symbols(len(rows), int(length), rng)
            real = tok.shape[1]                   # may be one less (odd-length expressions)
            x[rows, :real] = tok
            if self.labels == "running":
                y[rows, :real] = np.where(mask, states, IGNORE)
            else:
                y[rows, real - 1] = states[:, -1]
        return x, y

    def _generate(self, n, rng):
        lengths = rng.integers(self.min_len, self.seq_len + 1, size=n)
        return self._examples(n, lengths, self.seq_len, rng)

    def eval_sets(self, seed):
        sets = super().eval_sets(seed)         # "" = the training distribution
        for length in self.eval_lens:
            if length == self.seq_len and self.min_len == self.seq_len:
                sets[f"len={length}"] = sets[""]
                continue
            rng = rng_for(seed, TEST_STREAM, 1, length)
            n = self.num_test_examples
            x, y = self._examples(n, np.full(n, length), length, rng)
            sets[f"len={length}"] = self._to_batch(x, y)
        return sets


def _frame_kwargs(seq_len, min_len, labels, eval_lens, num_train_examples, num_test_examples):
    return dict(seq_len=seq_len, min_len=min_len, labels=labels, eval_lens=eval_lens,
                num_train_examples=num_train_examples, num_test_examples=num_test_examples)


@register
class Parity(StateTrackingTask):
    """Parity (Deletang et al. 2023, ``tasks/regular/parity_check.py``; Grazzi et al. 2025).

    Input: a uniform random bit string (tokens 0 and 1; PAD = 2). The state after a prefix
    is the number of 1s in it modulo 2 (0 = even). ``labels = "final"`` (default, as
    Deletang et al.: class 1 iff the whole string holds an odd number of 1s) puts the one
    target at the last bit; ``"running"`` the running parity at every bit.
    Example: ``1 0 1 1`` -> running ``1 1 0 1``, final ``1``.
    """

    name = "parity"
    description = ("Parity: a random bit string; the target is the number of 1s modulo 2, at the "
                   "last bit (labels=final) or after every prefix (labels=running).")

    def __init__(self, seq_len: int = 40, min_len: int | None = 3, labels: str = "final",
                 eval_lens: list[int] = DEFAULT_EVAL_LENS, num_train_examples: int = 0,
                 num_test_examples: int = 256, num_valid_examples: int | None = None):
        self._init_frame(**_frame_kwargs(seq_len, min_len, labels, eval_lens,
                                         num_train_examples, num_test_examples),
                         n_symbols=2, num_classes=2)
        self._set_valid(num_valid_examples)

    def _symbols(self, n, length, rng):
        bits = rng.integers(0, 2, size=(n, length))
        return bits, np.cumsum(bits, axis=1) % 2, np.ones_like(bits, bool)


@register
class CycleNavigation(StateTrackingTask):
    """Cycle navigation (Deletang et al. 2023, ``tasks/regular/cycle_navigation.py``).

    An agent starts at position 0 on a cycle of ``cycle_length`` positions (default 5, as
    there). Input: uniform random actions, token a in {0, 1, 2} moving by a - 1 (0 = one
    step left, 1 = stay, 2 = one step right; PAD = 3). The state after a prefix is the
    agent's position: (sum of moves) mod ``cycle_length``. ``labels = "final"`` (default,
    as Deletang et al.) targets the final position at the last action; ``"running"`` every
    position. Example (cycle 5): ``2 0 1 0 0`` = moves +1 -1 0 -1 -1 -> running
    ``1 0 0 4 3``, final ``3`` (Deletang et al.'s docstring example, class 3).
    """

    name = "cycle_navigation"
    description = ("Cycle navigation: moves -1/0/+1 on a cycle of cycle_length positions from 0; the "
                   "target is the final (or running) position.")

    def __init__(self, seq_len: int = 40, min_len: int | None = 3, cycle_length: int = 5,
                 labels: str = "final", eval_lens: list[int] = DEFAULT_EVAL_LENS,
                 num_train_examples: int = 0, num_test_examples: int = 256,
                 num_valid_examples: int | None = None):
        self.cycle_length = check_int("cycle_length", cycle_length, 2)
        self._init_frame(**_frame_kwargs(seq_len, min_len, labels, eval_lens,
                                         num_train_examples, num_test_examples),
                         n_symbols=3, num_classes=self.cycle_length)
        self._params["cycle_length"] = cycle_length
        self._set_valid(num_valid_examples)

    def _symbols(self, n, length, rng):
        actions = rng.integers(0, 3, size=(n, length))
        return actions, np.cumsum(actions - 1, axis=1) % self.cycle_length, np.ones_like(actions, bool)
