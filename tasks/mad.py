"""The MAD synthetic suite (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures"; reference generator: github.com/athms/mad-lab, ``mad/data/instances.py``).
Selective copying lives in :mod:`tasks.selective_copying`.

Written from the published token layouts; differences are listed per task. One difference
holds for all of them:

WHERE THE LOSS IS TAKEN. The MAD reference trains recall tasks as language models on the
shifted inputs (targets = next token at *every* position, including random keys and noise
that cannot be predicted) and evaluates only on the recall targets. Here training loss and
evaluation both use only the designated target positions (the tokens that are determined
by the context), so train loss and eval loss measure the same thing. Sequences are written
in the language-model reading: the target at position t is the token that follows t, so
``inputs[t + 1] == targets[t]`` wherever the next token is part of the input.

Accuracy: per target token over the target positions (MAD reports the same) and whole
sequence exact match, see :mod:`tasks.metrics`.

All MAD tasks train on a fixed set (``num_train_examples``, MAD baseline 12 800; 256 for
memorization) and test on ``num_test_examples`` (MAD: 1 280) from a disjoint seed stream,
with test sequences equal to a training sequence dropped and redrawn. The validation set
(``num_valid_examples``, default the test set's size; MAD itself has none) comes from its own
stream, with sequences equal to a training or test sequence dropped and redrawn.
"""
from __future__ import annotations

import numpy as np

from tasks.base import Task, check_bool, check_float, check_int, rng_for
from tasks.metrics import IGNORE
from tasks.registry import register


def _shifted(seqs: list[np.ndarray], masks: list[np.ndarray], seq_len: int):
    """Language-model reading of full sequences of length seq_len + 1.

    inputs = s[:-1]; targets[t] = s[t + 1] where mask[t + 1] (a recall target) else IGNORE.
    """
    s = np.stack(seqs).astype(np.int64)
    m = np.stack(masks)
    assert s.shape[1] == seq_len + 1
    return s[:, :-1], np.where(m[:, 1:], s[:, 1:], IGNORE).astype(np.int64)


class _MADTask(Task):
    fixed_train = True

    def _common(self, seq_len, vocab_size, num_train_examples, num_test_examples):
        self.seq_len = check_int("seq_len", seq_len, 2)
        self.vocab_size = check_int("vocab_size", vocab_size, 3)
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 1)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 1)
        self.num_classes = self.vocab_size

    def _noise(self, frac_noise, noise_vocab_size):
        self.frac_noise = check_float("frac_noise", frac_noise, 0.0, 1.0)
        self.noise_vocab_size = check_int("noise_vocab_size", noise_vocab_size, 0)
        if self.frac_noise > 0 and self.noise_vocab_size == 0:
            raise ValueError("noise_vocab_size must be > 0 when frac_noise > 0")


# ---------------------------------------------------------------------------------
# in-context recall (plain and noisy)
# ---------------------------------------------------------------------------------
def recall_vocab(vocab_size: int, multi_query: bool, noise_vocab_size: int, n_special: int = 1):
    """(keys, values, noise) token ranges as (start, stop) pairs; raises if too small."""
    ns = vocab_size - (0 if multi_query else n_special) - noise_vocab_size
    if ns < 2:
        raise ValueError(
            f"vocab_size ({vocab_size}) leaves {ns} key/value tokens after the noise "
            f"({noise_vocab_size}) and special tokens; need at least 2"
        )
    return (0, ns // 2), (ns // 2, ns), (ns, ns + noise_vocab_size)


def in_context_recall_examples(n, seq_len, vocab_size, multi_query, frac_noise,
                               noise_vocab_size, rng):
    """n in-context recall examples: inputs, targets (n, seq_len) int64.

    Layout (P = seq_len // 2 two-token motifs):
      multi_query:  [k v | noise noise] x (P-1)  k* v*
      single query: [k v | noise noise] x (P-1)  COPY k*      (target at k*: v*)
    Each body motif is noise with probability frac_noise, except one random motif that is
    always a key-value pair. Keys are uniform over the key tokens; a key's value is drawn
    uniformly from the value tokens at its first appearance and kept for the sequence. The
    probe key k* is uniform over the distinct keys shown in the body; v* is its value.
    Targets (at the key's position, predicting the value that follows): multi_query, every
    key-value pair whose key appeared in an earlier pair, and the probe; single query, the
    probe only.
    """
    (k0, k1), (v0, v1), (z0, z1) = recall_vocab(vocab_size, multi_query, noise_vocab_size)
    P, nk = seq_len // 2, k1 - k0
    body = P - 1
    rows = np.arange(n)
    keys = rng.integers(k0, k1, size=(n, body))
    kv_map = rng.integers(v0, v1, size=(n, nk))
    noise = rng.random((n, body)) < frac_noise
    if body:
        noise[rows, rng.integers(0, body, size=n)] = False   # at least one key-value pair
    noise_tok = rng.integers(z0, max(z1, z0 + 1), size=(n, body, 2))
    x = np.empty((n, seq_len), np.int64)
    y = np.full((n, seq_len), IGNORE, np.int64)
    seen = np.zeros((n, nk), bool)
    for j in range(body):
        k, is_kv = keys[:, j], ~noise[:, j]
        v = kv_map[rows, k - k0]
        x[:, 2 * j] = np.where(is_kv, k, noise_tok[:, j, 0])
        x[:, 2 * j + 1] = np.where(is_kv, v, noise_tok[:, j, 1])
        if multi_query:
            again = is_kv & seen[rows, k - k0]
            y[again, 2 * j] = v[again]
        seen[rows[is_kv], k[is_kv] - k0] = True
    # probe: uniform over the distinct keys shown (random scores, unseen masked out)
    probe = k0 + np.argmax(np.where(seen, rng.random((n, nk)), -1.0), axis=1)
    v_probe = kv_map[rows, probe - k0]
    if multi_query:
        x[:, -2], x[:, -1] = probe, v_probe
        y[:, -2] = v_probe
    else:
        x[:, -2], x[:, -1] = vocab_size - 1, probe   # copy prefix, then the probe key
        y[:, -1] = v_probe
    return x, y


TRAIN_TARGETS = ("recall", "next_token")


class _RecallBase(_MADTask):
    def __init__(self, seq_len, vocab_size, multi_query, frac_noise, noise_vocab_size,
                 num_train_examples, num_test_examples, train_targets="recall",
                 num_valid_examples=None):
        if train_targets not in TRAIN_TARGETS:
            raise ValueError(f"train_targets must be one of {', '.join(TRAIN_TARGETS)}, "
                             f"got {train_targets!r}")
        self.train_targets = train_targets
        self._common(seq_len, vocab_size, num_train_examples, num_test_examples)
        if self.seq_len % 2 or self.seq_len < 4:
            raise ValueError(f"seq_len must be even and >= 4 (key-value motifs), got {seq_len}")
        self.multi_query = check_bool("multi_query", multi_query)
        self._noise(frac_noise, noise_vocab_size)
        recall_vocab(self.vocab_size, self.multi_query, self.noise_vocab_size)
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size, multi_query=multi_query,
            frac_noise=frac_noise, noise_vocab_size=noise_vocab_size,
            num_train_examples=num_train_examples, num_test_examples=num_test_examples,
            train_targets=train_targets,
        )
        self._set_valid(num_valid_examples)

    def _generate_test(self, n, rng):
        return in_context_recall_examples(n, self.seq_len, self.vocab_size, self.multi_query,
                                          self.frac_noise, self.noise_vocab_size, rng)

    def _generate(self, n, rng):
        x, y = self._generate_test(n, rng)
        if self.train_targets == "next_token":
            # MAD's (and hybrid-model's) training: a language model on every next token,
            # unpredictable keys and noise included; evaluation stays on the recall targets
            y = np.full_like(x, IGNORE)
            y[:, :-1] = x[:, 1:]
        return x, y


_RECALL_DOC = """
    Vocabulary V (multi_query): keys [0, ns//2), values [ns//2, ns), noise [ns, ns + noise_vocab_size)
    with ns = V - noise_vocab_size; single query also reserves the copy prefix V-1.
    See :func:`in_context_recall_examples` for the layout. Differences from MAD: sequences
    are exactly seq_len tokens in both modes (MAD's multi-query sequences are seq_len - 1
    long, its final value token dropped by the shift); the probe is always the last motif;
    loss on the target positions only by default (MAD trains on all next tokens: set
    ``train_targets = "next_token"`` for that; evaluation is on the recall targets either way).
"""


@register
class MADInContextRecall(_RecallBase):
    name = "mad_in_context_recall"
    description = (
        "MAD in-context recall: key-value pairs with keys and values from disjoint vocab "
        "halves; predict a key's value wherever the key reappears (multi_query) or at the end."
    )
    __doc__ = description + _RECALL_DOC

    def __init__(self, seq_len: int = 128, vocab_size: int = 16, multi_query: bool = True,
                 frac_noise: float = 0.0, noise_vocab_size: int = 0,
                 num_train_examples: int = 12_800, num_test_examples: int = 1_280,
                 train_targets: str = "recall", num_valid_examples: int | None = None):
        super().__init__(seq_len, vocab_size, multi_query, frac_noise, noise_vocab_size,
                         num_train_examples, num_test_examples, train_targets,
                         num_valid_examples)


@register
class MADNoisyInContextRecall(_RecallBase):
    name = "mad_noisy_in_context_recall"
    description = (
        "MAD noisy in-context recall: in-context recall where a fraction frac_noise of the "
        "motifs are pairs of noise tokens from a separate noise vocabulary (no targets there)."
    )
    __doc__ = description + _RECALL_DOC

    def __init__(self, seq_len: int = 128, vocab_size: int = 32, multi_query: bool = True,
                 frac_noise: float = 0.2, noise_vocab_size: int = 16,
                 num_train_examples: int = 12_800, num_test_examples: int = 1_280,
                 train_targets: str = "recall", num_valid_examples: int | None = None):
        super().__init__(seq_len, vocab_size, multi_query, frac_noise, noise_vocab_size,
                         num_train_examples, num_test_examples, train_targets,
                         num_valid_examples)


# ---------------------------------------------------------------------------------
# fuzzy in-context recall
# ---------------------------------------------------------------------------------
def fuzzy_recall_example(seq_len, vocab_size, k_motif_size, v_motif_size, multi_query,
                         frac_noise, noise_vocab_size, fixed_key_size, rng):
    """One fuzzy recall example: (seq of length seq_len + 1, target mask of the same length).

    Keys are motifs of 1..k_motif_size distinct key tokens (always k_motif_size when
    ``fixed_key_size``, MAD's test setting), values motifs of 1..v_motif_size distinct value
    tokens. A probe pair is placed at a random point of the body, and repeated at the end
    (after the copy prefix in single-query mode); the body is front-padded with the pad token.
    """
    n_special = 1 if multi_query else 2          # pad (and copy prefix)
    pad = vocab_size - 1 if multi_query else vocab_size - 2
    ns = vocab_size - n_special - noise_vocab_size
    key_toks = np.arange(0, ns // 2)
    val_toks = np.arange(ns // 2, ns)
    noise_toks = np.arange(ns, ns + noise_vocab_size)

    def motif(tokens, size):
        return tuple(int(t) for t in rng.permutation(tokens)[:size])

    def key_size():
        return k_motif_size if fixed_key_size else int(rng.integers(1, k_motif_size + 1))

    k_probe = motif(key_toks, key_size())
    v_probe = motif(val_toks, int(rng.integers(1, v_motif_size + 1)))
    probe_len = len(k_probe) + len(v_probe)
    stop = seq_len - probe_len - (k_motif_size + v_motif_size)
    # the body's motif starts are 0 = l_0 < l_1 < ... < l_last < stop with gaps of at most
    # k_motif_size + v_motif_size, so a probe_at up to stop - that gap is always reached
    probe_at = int(rng.integers(0, max(stop - k_motif_size - v_motif_size, 0) + 1))
    seq: list[int] = []
    mask: list[bool] = []
    kv_map: dict[tuple, tuple] = {k_probe: v_probe}
    shown: set[tuple] = set()
    probe_added = False
    while len(seq) < stop:
        if len(seq) >= probe_at and not probe_added:
            seq += k_probe + v_probe
            mask += [False] * probe_len
            shown.add(k_probe)
            probe_added = True
            continue
        ks, vs = key_size(), int(rng.integers(1, v_motif_size + 1))
        if frac_noise > 0 and rng.random() < frac_noise:
            seq += [int(t) for t in rng.choice(noise_toks, size=ks + vs)]
            mask += [False] * (ks + vs)
            continue
        k = motif(key_toks, ks)
        if k == k_probe:
            probe_added = True
        v = kv_map.setdefault(k, motif(val_toks, vs))
        seq += k + v
        mask += [False] * len(k) + [multi_query and k in shown] * len(v)
        shown.add(k)
    tail = ([] if multi_query else [vocab_size - 1]) + list(k_probe) + list(v_probe)
    seq += tail
    mask += [False] * (len(tail) - len(v_probe)) + [True] * len(v_probe)
    n_pad = seq_len + 1 - len(seq)
    assert n_pad >= 0
    return np.array([pad] * n_pad + seq), np.array([False] * n_pad + mask)


@register
class MADFuzzyInContextRecall(_MADTask):
    """Fuzzy in-context recall. Vocabulary V: pad V-1 (multi_query) or copy prefix V-1 and pad
    V-2 (single query); of the remaining ns = V - specials - noise_vocab_size tokens keys are
    [0, ns//2), values [ns//2, ns), then the noise tokens. Keys and values are motifs of
    several adjacent tokens whose size varies (1..k_motif_size, 1..v_motif_size); at test time
    keys always have k_motif_size tokens (as in MAD). Targets are every token of a value
    motif whose key appeared before (multi_query) and the final probe value's tokens.
    Differences from MAD: loss on target positions only; the probe position is drawn so that
    the probe is always in the body (MAD can miss it when its random index lies past the end
    of the body, leaving the final query unanswerable).
    """

    name = "mad_fuzzy_in_context_recall"
    description = (
        "MAD fuzzy in-context recall: keys and values are motifs of variable numbers of tokens; "
        "predict every value token of a key shown before (multi_query) and of the final probe."
    )

    def __init__(self, seq_len: int = 128, vocab_size: int = 16, k_motif_size: int = 3,
                 v_motif_size: int = 3, multi_query: bool = True, frac_noise: float = 0.0,
                 noise_vocab_size: int = 0, num_train_examples: int = 12_800,
                 num_test_examples: int = 1_280, num_valid_examples: int | None = None):
        self._common(seq_len, vocab_size, num_train_examples, num_test_examples)
        self.k_motif_size = check_int("k_motif_size", k_motif_size, 1)
        self.v_motif_size = check_int("v_motif_size", v_motif_size, 1)
        self.multi_query = check_bool("multi_query", multi_query)
        self._noise(frac_noise, noise_vocab_size)
        ns = self.vocab_size - (1 if self.multi_query else 2) - self.noise_vocab_size
        if ns // 2 < self.k_motif_size or ns - ns // 2 < self.v_motif_size:
            raise ValueError(
                f"vocab_size ({vocab_size}) too small: {ns // 2} key and {ns - ns // 2} value "
                f"tokens cannot form motifs of {k_motif_size} / {v_motif_size} distinct tokens"
            )
        need = 2 * (self.k_motif_size + self.v_motif_size) + 2
        if self.seq_len < need:
            raise ValueError(f"seq_len must be >= {need} for these motif sizes, got {seq_len}")
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size, k_motif_size=k_motif_size,
            v_motif_size=v_motif_size, multi_query=multi_query, frac_noise=frac_noise,
            noise_vocab_size=noise_vocab_size, num_train_examples=num_train_examples,
            num_test_examples=num_test_examples,
        )
        self._set_valid(num_valid_examples)

    def _examples(self, n, rng, fixed_key_size):
        pairs = [fuzzy_recall_example(self.seq_len, self.vocab_size, self.k_motif_size,
                                      self.v_motif_size, self.multi_query, self.frac_noise,
                                      self.noise_vocab_size, fixed_key_size, rng)
                 for _ in range(n)]
        if not pairs:
            e = np.empty((0, self.seq_len), np.int64)
            return e, e.copy()
        return _shifted([p[0] for p in pairs], [p[1] for p in pairs], self.seq_len)

    def _generate(self, n, rng):
        return self._examples(n, rng, fixed_key_size=False)

    def _generate_test(self, n, rng):
        return self._examples(n, rng, fixed_key_size=True)


# ---------------------------------------------------------------------------------
# memorization
# ---------------------------------------------------------------------------------
@register
class MADMemorization(_MADTask):
    """Memorization. Vocabulary V: insert token V-1; keys [0, ns//2), values [ns//2, ns) with
    ns = V - 1. A fixed key->value bijection (between the first min(#keys, #values) of each,
    shuffled) is drawn from the run seed's own stream, identical for train and test, so it
    can only be learned into the weights. A sequence is seq_len // 2 pairs ``k INSERT``,
    keys uniform with replacement; the target at each INSERT position is the key's value
    (MAD takes the loss there too). Test sequences are new orderings of the same facts.
    """

    name = "mad_memorization"
    description = (
        "MAD memorization: pairs 'key INSERT' over a fixed key-value map that is the same in "
        "every sequence; predict the key's value at each INSERT position."
    )

    def __init__(self, seq_len: int = 32, vocab_size: int = 256, num_train_examples: int = 256,
                 num_test_examples: int = 1_280, num_valid_examples: int | None = None):
        self._common(seq_len, vocab_size, num_train_examples, num_test_examples)
        if self.seq_len % 2:
            raise ValueError(f"seq_len must be even (key/insert pairs), got {seq_len}")
        self._params = dict(seq_len=seq_len, vocab_size=vocab_size,
                            num_train_examples=num_train_examples,
                            num_test_examples=num_test_examples)
        self._set_valid(num_valid_examples)
        self._map_seed: int | None = None

    def kv_map(self, seed: int) -> dict[int, int]:
        ns = self.vocab_size - 1
        rng = rng_for(seed, 2)                         # its own stream: not train, not test
        keys = rng.permutation(np.arange(0, ns // 2))
        values = rng.permutation(np.arange(ns // 2, ns))
        return {int(k): int(v) for k, v in zip(keys, values)}

    def _prepare(self, seed):
        m = self.kv_map(seed)
        self._keys = np.array(sorted(m))
        self._lookup = np.full(self.vocab_size, -1, np.int64)
        self._lookup[self._keys] = [m[k] for k in self._keys]

    def sample(self, batch_size, seed=0):
        self._prepare(seed)
        return super().sample(batch_size, seed)

    def train_set(self, seed):
        self._prepare(seed)
        return super().train_set(seed)

    def train_batch(self, batch_size, step, seed):
        self._prepare(seed)
        return super().train_batch(batch_size, step, seed)

    def eval_sets(self, seed):
        self._prepare(seed)
        return super().eval_sets(seed)

    def valid_set(self, seed):
        self._prepare(seed)
        return super().valid_set(seed)

    def _train_arrays(self, seed):
        self._prepare(seed)
        return super()._train_arrays(seed)

    def _generate(self, n, rng):
        P = self.seq_len // 2
        k = self._keys[rng.integers(0, len(self._keys), size=(n, P))]
        x = np.empty((n, self.seq_len), np.int64)
        x[:, 0::2], x[:, 1::2] = k, self.vocab_size - 1
        y = np.full((n, self.seq_len), IGNORE, np.int64)
        y[:, 1::2] = self._lookup[k]
        return x, y


# ---------------------------------------------------------------------------------
# compression
# ---------------------------------------------------------------------------------
@register
class MADCompression(_MADTask):
    """Compression. Vocabulary V: compression token V-1, data tokens [0, V-1). Inputs are
    seq_len - 1 uniform data tokens followed by the compression token. ``readout =
    "decode_from_last"``: the backbone's output at the last (compression) position is the
    only thing the head sees; an MLP with position embeddings decodes it into a prediction
    for every position (MAD's AutoEncoder with global_pool='last'). Targets: the data token
    at each of the first seq_len - 1 positions; the compression token itself has no target
    (MAD's reference also scores it, a free point). A per-position head would make this task
    trivial (copy the input), so the worker must honour ``readout``.
    """

    name = "mad_compression"
    description = (
        "MAD compression: a random sequence then a compression token; the whole sequence must "
        "be decoded from the last position's output alone (readout decode_from_last)."
    )
    readout = "decode_from_last"

    def __init__(self, seq_len: int = 32, vocab_size: int = 16,
                 num_train_examples: int = 12_800, num_test_examples: int = 1_280,
                 num_valid_examples: int | None = None):
        self._common(seq_len, vocab_size, num_train_examples, num_test_examples)
        self._params = dict(seq_len=seq_len, vocab_size=vocab_size,
                            num_train_examples=num_train_examples,
                            num_test_examples=num_test_examples)
        self._set_valid(num_valid_examples)

    def _generate(self, n, rng):
        x = rng.integers(0, self.vocab_size - 1, size=(n, self.seq_len))
        x[:, -1] = self.vocab_size - 1
        y = x.copy()
        y[:, -1] = IGNORE
        return x.astype(np.int64), y.astype(np.int64)
