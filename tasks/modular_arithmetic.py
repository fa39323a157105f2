"""Modular arithmetic, with and without brackets (Deletang et al. 2023, "Neural Networks and
the Chomsky Hierarchy": ``tasks/regular/modular_arithmetic.py`` and
``tasks/dcf/modular_arithmetic_brackets.py``; Grazzi et al. 2025 train both, through
xLSTM's formal-language generators, at lengths 3 .. 40 and test at 40 .. 256).

Tokens (modulus m): 0 .. m-1 the numbers, m ``+``, m+1 ``-``, m+2 ``*``, and with
``brackets`` m+3 ``(`` and m+4 ``)``; PAD is the last id. The target is the value of the
expression modulo m (classes 0 .. m-1).

Without brackets (Deletang et al.'s "simple" task, a regular language): numbers at even
positions, binary operators at odd ones, so the real length is odd (an even length N
gives an expression of N - 1 tokens and one PAD, as Deletang et al. subtract one).
Numbers and operators are uniform; ``*`` binds tighter than ``+`` and ``-`` (``1 + 2 * 3 =
7``; Deletang et al.'s examples mod 5: ``1 + 2 * 3 = 2``, ``1 - 1 - 1 = 4``,
``0 * 1 + 4 * 3 - 2 = 0``). ``labels = "running"`` targets every number position with the
value of the expression ending there (each such prefix is a whole expression).

With brackets (a deterministic context-free language): Deletang et al.'s recursive
grammar, an expression of exactly the real length L: L = 1 ``d``, 2 ``- d``, 3 ``( d )``,
4 ``( - d )``; L >= 5 ``( A op B )`` with len(A) uniform in [1, L - 4] and len(B) = L - 3
- len(A), op uniform over ``operators``, digits uniform. Only ``labels = "final"``: a
prefix of a bracketed expression has no value.

``operators``: a string of the allowed binary operators; default ``"+-*"`` without
brackets and ``"+-"`` with (each paper's default: Deletang et al.'s brackets task and
xLSTM's use ``mult = False``). Shared frame (training lengths, PAD, eval sets at longer
lengths, where the loss is taken): :mod:`tasks.state_tracking`.
"""
from __future__ import annotations

import random

import numpy as np

from tasks.base import check_bool, check_int
from tasks.registry import register
from tasks.state_tracking import DEFAULT_EVAL_LENS, StateTrackingTask, _frame_kwargs

OPS = "+-*"


def evaluate_flat(numbers: np.ndarray, ops: np.ndarray, modulus: int) -> np.ndarray:
    """Running values of flat expressions with ``*`` before ``+``/``-``.

    numbers: (n, k+1) in [0, m); ops: (n, k) in {0: +, 1: -, 2: *}.
    Returns (n, k+1): column j = value of ``numbers[0] ops[0] ... numbers[j]`` mod m.
    """
    n, terms = numbers.shape
    closed = np.zeros(n, np.int64)          # sum of the finished additive terms
    term = numbers[:, 0] % modulus          # the current term, its sign included
    out = np.empty((n, terms), np.int64)
    out[:, 0] = term
    for j in range(1, terms):
        v, op = numbers[:, j], ops[:, j - 1]
        mul = op == 2
        closed = np.where(mul, closed, (closed + term) % modulus)
        term = np.where(mul, term * v, np.where(op == 0, v, -v)) % modulus
        out[:, j] = (closed + term) % modulus
    return out


def bracket_expression(length: int, modulus: int, ops: str, rnd: random.Random) -> tuple[list, int]:
    """One bracketed expression of exactly ``length`` tokens (Deletang et al.'s grammar):
    (token ids, value mod m). Token ids as the module docstring."""
    plus, minus, lpar, rpar = modulus, modulus + 1, modulus + 3, modulus + 4
    if length < 5:
        d = rnd.randrange(modulus)
        neg = (-d) % modulus
        return {1: ([d], d), 2: ([minus, d], neg), 3: ([lpar, d, rpar], d),
                4: ([lpar, minus, d, rpar], neg)}[length]
    left = rnd.randrange(1, length - 3)      # [1, length - 4]
    a, va = bracket_expression(left, modulus, ops, rnd)
    b, vb = bracket_expression(length - 3 - left, modulus, ops, rnd)
    op = ops[rnd.randrange(len(ops))]
    value = {"+": va + vb, "-": va - vb, "*": va * vb}[op] % modulus
    return [lpar, *a, modulus + OPS.index(op), *b, rpar], value


@register
class ModularArithmetic(StateTrackingTask):
    """Modular arithmetic with and without brackets; see the module docstring."""

    name = "modular_arithmetic"
    description = ("Modular arithmetic (Deletang et al.): an expression of numbers mod m and + - * "
                   "(optionally with brackets); the target is its value mod m at the last token.")

    def __init__(self, seq_len: int = 40, min_len: int | None = 3, modulus: int = 5,
                 brackets: bool = False, operators: str | None = None, labels: str = "final",
                 eval_lens: list[int] = DEFAULT_EVAL_LENS, num_train_examples: int = 0,
                 num_test_examples: int = 256, num_valid_examples: int | None = None):
        self.modulus = check_int("modulus", modulus, 2, 1000)
        self.brackets = check_bool("brackets", brackets)
        if operators is None:
            operators = "+-" if self.brackets else OPS
        if (not isinstance(operators, str) or not operators or set(operators) - set(OPS)
                or len(set(operators)) != len(operators)):
            raise ValueError(f"operators must be a non-empty string of distinct characters from "
                             f"'{OPS}', got {operators!r}")
        self.operators = "".join(o for o in OPS if o in operators)
        self.running_ok = not self.brackets
        self._init_frame(**_frame_kwargs(seq_len, min_len, labels, eval_lens,
                                         num_train_examples, num_test_examples),
                         n_symbols=self.modulus + (5 if self.brackets else 3),
                         num_classes=self.modulus)
        self._params.update(modulus=modulus, brackets=brackets, operators=operators)
        self._set_valid(num_valid_examples)

    def _symbols(self, n, length, rng):
        m = self.modulus
        if self.brackets:
            rnd = random.Random(int(rng.integers(2**63)))   # pure Python: recursion per node
            tokens = np.empty((n, length), np.int64)
            values = np.empty(n, np.int64)
            for i in range(n):
                tok, values[i] = bracket_expression(length, m, self.operators, rnd)
                tokens[i] = tok
            states = np.zeros((n, length), np.int64)
            states[:, -1] = values
            mask = np.zeros((n, length), bool)
            mask[:, -1] = True
            return tokens, states, mask
        real = length if length % 2 else length - 1
        k = real // 2
        numbers = rng.integers(0, m, size=(n, k + 1))
        allowed = np.array([OPS.index(o) for o in self.operators])
        ops = allowed[rng.integers(0, len(allowed), size=(n, k))]
        tokens = np.empty((n, real), np.int64)
        tokens[:, 0::2] = numbers
        tokens[:, 1::2] = m + ops
        states = np.zeros((n, real), np.int64)
        states[:, 0::2] = evaluate_flat(numbers, ops, m)
        mask = np.zeros((n, real), bool)
        mask[:, 0::2] = True
        return tokens, states, mask
