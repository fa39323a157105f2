"""Permutation composition, the word problem of a finite group (Merrill, Petty & Sabharwal
2024, "The Illusion of State in State-Space Models", code jopetty/word-problem
``src/generate_data.py``; Grazzi et al. 2025 train S5 on it).

A group G of permutations of {0 .. n-1} is given by name (``"S5"``: symmetric, ``"A5"``:
alternating, ``"Z6"``: cyclic; ``S2``..``S6``, ``A3``..``A6``, ``Z2``..``Z720``) or by
``generators``, each a permutation written as the list of images ``[p(0), ..., p(n-1)]``;
G is the group they generate (closure by breadth-first search; at most ``MAX_ORDER``
elements). Its elements are numbered in lexicographic order of their image lists, so the
identity is element 0.

Input: with ``tokens = "elements"`` (default, as word-problem) each token is a uniform
random element of G (vocabulary |G| + PAD); with ``tokens = "generators"`` each token is
one generator, uniform (vocabulary = number of generators + PAD; named groups use S_n =
<(0 1), (0 1 ... n-1)>, A_n = <(0 1 k) for k = 2 .. n-1>, Z_n = <(0 1 ... n-1)>).

State: the running product, the permutation that applies x_1 first, then x_2, ...:
``s_t(i) = x_t(s_{t-1}(i))``, s_1 = x_1. The target at position t (``labels = "running"``,
default, as word-problem's scanned targets) or at the last position only (``"final"``)
is s_t's element number (|G| classes). word-problem multiplies with abstract_algebra's
``G.op(acc, x)``; the other order (``s_{t-1}(x_t(i))``) is the same task up to renaming
every element by its inverse, so what a model can learn does not depend on it.

Example (S3, elements [012, 021, 102, 120, 201, 210] = 0..5): tokens ``1 3`` = (0 2 1) then
(1 2 0): s_2(i) = x_2(x_1(i)) = [x_2(0), x_2(2), x_2(1)] = [1, 0, 2] -> running labels
``1 2``. Shared frame (training lengths, PAD, eval sets at longer lengths, where the loss
is taken): :mod:`tasks.state_tracking`.
"""
from __future__ import annotations

import re
from math import factorial

import numpy as np

from tasks.registry import register
from tasks.state_tracking import StateTrackingTask, _frame_kwargs

MAX_ORDER = 720          # S6; the Cayley table is |G|^2 int32
TOKEN_KINDS = ("elements", "generators")


def named_generators(name: str) -> list[tuple[int, ...]]:
    """Generators of ``"S<n>"``, ``"A<n>"`` or ``"Z<n>"`` as image tuples."""
    m = re.fullmatch(r"([SAZ])(\d+)", name) if isinstance(name, str) else None
    if not m:
        raise ValueError(f"group must be S<n>, A<n> or Z<n> (e.g. 'S5', 'A5'), got {name!r}")
    kind, n = m.group(1), int(m.group(2))
    order = {"S": factorial(n), "A": factorial(n) // 2, "Z": n}[kind]
    low = {"S": 2, "A": 3, "Z": 2}[kind]
    if n < low or order > MAX_ORDER:
        raise ValueError(f"group {name}: need n >= {low} and at most {MAX_ORDER} elements "
                         f"(it has {order})")
    cycle = tuple(list(range(1, n)) + [0])
    if kind == "Z":
        return [cycle]
    if kind == "S":
        return [(1, 0, *range(2, n)), cycle] if n > 2 else [(1, 0)]
    gens = []
    for k in range(2, n):                 # the 3-cycle 0 -> 1 -> k -> 0
        p = list(range(n))
        p[0], p[1], p[k] = 1, k, 0
        gens.append(tuple(p))
    return gens


def check_generators(generators) -> list[tuple[int, ...]]:
    """A non-empty list of permutations of one {0 .. n-1}, as tuples."""
    if not isinstance(generators, (list, tuple)) or not generators:
        raise ValueError(f"generators must be a non-empty list of permutations, got {generators!r}")
    out = []
    for g in generators:
        if (not isinstance(g, (list, tuple)) or not g
                or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in g)
                or sorted(int(v) for v in g) != list(range(len(g)))):
            raise ValueError(f"generator {g!r} is not a permutation of 0 .. n-1 written as its "
                             "list of images")
        out.append(tuple(int(v) for v in g))
    if len({len(g) for g in out}) != 1:
        raise ValueError("generators must all permute the same number of points")
    return out


def closure(generators: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The elements of the group the generators generate, sorted (identity first)."""
    n = len(generators[0])
    identity = tuple(range(n))
    seen, frontier = {identity}, [identity]
    while frontier:
        nxt = []
        for p in frontier:
            for g in generators:
                q = tuple(g[i] for i in p)       # p, then g
                if q not in seen:
                    if len(seen) >= MAX_ORDER:
                        raise ValueError(f"the generators generate more than {MAX_ORDER} elements")
                    seen.add(q)
                    nxt.append(q)
        frontier = nxt
    return sorted(seen)


def cayley_table(elements: list[tuple[int, ...]]) -> np.ndarray:
    """table[a, b] = number of the permutation 'a, then b': i -> b(a(i)). (|G|, |G|) int32."""
    index = {p: k for k, p in enumerate(elements)}
    arr = np.array(elements)                       # (|G|, n)
    table = np.empty((len(elements), len(elements)), np.int32)
    for b, q in enumerate(elements):
        composed = np.asarray(q)[arr]              # row a: b(a(i))
        table[:, b] = [index[tuple(r)] for r in composed.tolist()]
    return table


@register
class PermutationComposition(StateTrackingTask):
    """The word problem of a permutation group; see the module docstring."""

    name = "permutation_composition"
    description = ("Permutation composition (word problem, e.g. S5/A5): a sequence of group elements; "
                   "the target is the running product's element number at each position.")

    def __init__(self, seq_len: int = 32, min_len: int | None = None, group: str | None = "S5",
                 generators: list[list[int]] | None = None, tokens: str = "elements",
                 labels: str = "running", eval_lens: list[int] = (32, 64, 128, 256),
                 num_train_examples: int = 0, num_test_examples: int = 256,
                 num_valid_examples: int | None = None):
        if generators is not None:
            if group not in (None, "S5"):
                raise ValueError("give either group or generators, not both")
            self.generators = check_generators(generators)
            self.group = None
        else:
            if group is None:
                raise ValueError("give group (e.g. 'S5') or generators")
            self.generators = named_generators(group)
            self.group = group
        if tokens not in TOKEN_KINDS:
            raise ValueError(f"tokens must be one of {', '.join(TOKEN_KINDS)}, got {tokens!r}")
        self.tokens = tokens
        self.elements = closure(self.generators)
        self.table = cayley_table(self.elements)
        index = {p: k for k, p in enumerate(self.elements)}
        # what each input token stands for, as an element number
        self.token_element = (np.arange(len(self.elements)) if tokens == "elements"
                              else np.array([index[g] for g in self.generators]))
        self._init_frame(**_frame_kwargs(seq_len, min_len, labels, eval_lens,
                                         num_train_examples, num_test_examples),
                         n_symbols=len(self.token_element), num_classes=len(self.elements))
        self._params.update(group=group, generators=generators, tokens=tokens)
        self._set_valid(num_valid_examples)

    @property
    def order(self) -> int:
        return len(self.elements)

    def _symbols(self, n, length, rng):
        tok = rng.integers(0, len(self.token_element), size=(n, length))
        elem = self.token_element[tok]
        states = np.empty((n, length), np.int64)
        s = elem[:, 0]
        states[:, 0] = s
        for t in range(1, length):
            s = self.table[s, elem[:, t]]
            states[:, t] = s
        return tok, states, np.ones((n, length), bool)
