"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology", the ``multiquery_ar``
generator of the zoology repository).

Vocabulary V: keys come from [1, V//2), values from [V//2, V) (disjoint halves; 0 is an
ordinary filler token). With D = ``num_kv_pairs`` a sequence of ``seq_len`` tokens is

    k_1 v_1 k_2 v_2 ... k_D v_D | query region (seq_len - 2D tokens)

The D keys of a sequence are distinct, and so are its D values (both drawn without
replacement). In the query region each key is queried exactly once: it is written at an
even offset 2g, where the D slots g are drawn without replacement from
[0, (seq_len - 2D) // 2) with probability proportional to g^(power_a - 1) (Zoology's power
law: short gaps more likely). Every other query-region position holds a uniform random
token from [0, V) (Zoology's ``random_non_queries``), which may by chance be a key or value
token; those positions have no target.

Targets: at the position of each query key, the value paired with it in the context (the
answer is the next token in a language-model reading, but it is never written into the
inputs). Loss and accuracy there only: token accuracy = fraction of queries answered right,
sequence accuracy = all D queries right.

``num_kv_pairs`` may be a list: each training example draws D uniformly from it, and
``eval_sets`` returns one set per D, keyed ``"kv=D"`` (``num_test_examples`` each), plus
``""`` = all of them together. Training draws fresh batches by default
(``num_train_examples = 0``; Zoology trains on a fixed set of 100 000 examples, use
``num_train_examples`` for that). Zoology needs V > seq_len; here only V//2 - 1 >= D is
required (enough distinct keys).
"""
from __future__ import annotations

import numpy as np

from tasks.base import TEST_STREAM, Task, check_float, check_int, check_int_list, rng_for
from tasks.metrics import IGNORE
from tasks.registry import register


def mqar_examples(n: int, seq_len: int, vocab_size: int, num_kv_pairs: int, power_a: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n MQAR examples with D = num_kv_pairs: inputs, targets (n, seq_len) int64."""
    D, V = num_kv_pairs, vocab_size
    half = V // 2
    # distinct keys / values per row: first D of a random permutation (argsort of iid keys)
    keys = 1 + np.argsort(rng.random((n, half - 1)), axis=1)[:, :D]
    values = half + np.argsort(rng.random((n, V - half)), axis=1)[:, :D]
    x = rng.integers(0, V, size=(n, seq_len))
    x[:, 0:2 * D:2] = keys
    x[:, 1:2 * D:2] = values
    # query slots: D of `space` without replacement, P(g) ~ g^(power_a-1) (Gumbel top-k)
    space = (seq_len - 2 * D) // 2
    logp = (power_a - 1.0) * np.log(np.arange(1, space + 1))
    gumbel = -np.log(-np.log(rng.random((n, space))))
    slots = np.argsort(-(logp + gumbel), axis=1)[:, :D]
    pos = 2 * D + 2 * slots                      # (n, D) positions of the query keys
    np.put_along_axis(x, pos, keys, axis=1)
    y = np.full((n, seq_len), IGNORE, dtype=np.int64)
    np.put_along_axis(y, pos, values, axis=1)
    return x.astype(np.int64), y


@register
class MQAR(Task):
    name = "mqar"
    description = (
        "Multi-query associative recall (Zoology): D key-value pairs, then each key queried "
        "once among random tokens; the target at each query is its value."
    )

    def __init__(self, seq_len: int = 256, vocab_size: int = 8192, num_kv_pairs=16,
                 power_a: float = 0.01, num_train_examples: int = 0,
                 num_test_examples: int = 256, num_valid_examples: int | None = None):
        self.seq_len = check_int("seq_len", seq_len, 4)
        self.vocab_size = check_int("vocab_size", vocab_size, 4)
        self.kv_list = check_int_list("num_kv_pairs", num_kv_pairs, 1)
        self.power_a = check_float("power_a", power_a, 0.0, 1.0, high_open=False)
        if self.power_a == 0.0:
            raise ValueError("power_a must be > 0")
        D = max(self.kv_list)
        if self.seq_len < 4 * D:
            raise ValueError(f"seq_len ({seq_len}) must be >= 4 * num_kv_pairs ({4 * D}) "
                             "so that every key can be queried after the context")
        if self.vocab_size // 2 - 1 < D:
            raise ValueError(f"vocab_size ({vocab_size}) too small for {D} distinct keys: "
                             f"need vocab_size // 2 - 1 >= num_kv_pairs")
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 0)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 1)
        self.fixed_train = self.num_train_examples > 0
        self.num_classes = self.vocab_size
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size,
            num_kv_pairs=num_kv_pairs if isinstance(num_kv_pairs, int) else list(self.kv_list),
            power_a=power_a, num_train_examples=num_train_examples,
            num_test_examples=num_test_examples,
        )
        self._set_valid(num_valid_examples)

    def _generate(self, n, rng):
        # each example draws its D from the list; generate per D and restore the order
        ds = rng.choice(np.asarray(self.kv_list), size=n)
        x = np.empty((n, self.seq_len), np.int64)
        y = np.empty((n, self.seq_len), np.int64)
        for D in self.kv_list:
            rows = np.flatnonzero(ds == D)
            if len(rows):
                x[rows], y[rows] = mqar_examples(len(rows), self.seq_len, self.vocab_size, D,
                                                 self.power_a, rng)
        return x, y

    def eval_sets(self, seed):
        if len(self.kv_list) == 1:
            return super().eval_sets(seed)
        sets, xs, ys = {}, [], []
        for D in self.kv_list:
            def gen(n, rng, D=D):
                return mqar_examples(n, self.seq_len, self.vocab_size, D, self.power_a, rng)
            x, y = self._test_arrays(self.num_test_examples, rng_for(seed, TEST_STREAM, D),
                                     seed, gen)
            sets[f"kv={D}"] = self._to_batch(x, y)
            xs.append(x)
            ys.append(y)
        sets[""] = self._to_batch(np.concatenate(xs), np.concatenate(ys))
        return sets
