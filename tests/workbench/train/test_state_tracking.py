"""State-tracking tasks (tasks/state_tracking.py, modular_arithmetic.py,
permutation_composition.py): labels against hand computations and independent oracles,
seeds, eval sets at longer lengths, refused options, and a learnability check."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import tasks
from tasks import metrics
from tasks.metrics import IGNORE
from tasks.modular_arithmetic import bracket_expression, evaluate_flat
from tasks.permutation_composition import closure, named_generators


# -- hand computations --------------------------------------------------------------
NAMES = ("parity", "cycle_navigation", "modular_arithmetic", "permutation_composition")


def test_parity_hand_examples():
    t = tasks.build("parity", seq_len=4, min_len=None, labels="running", eval_lens=[4],
                    num_test_examples=4)
    b = t.sample(64, seed=0)
    rows = {tuple(x): tuple(y) for x, y in zip(b.inputs.tolist(), b.targets.tolist())}
    # 1 0 1 1 -> running 1 1 0 1 (docstring); 0 0 0 0 -> all even; 1 1 1 1 -> 1 0 1 0
    hand = {(1, 0, 1, 1): (1, 1, 0, 1), (0, 0, 0, 0): (0, 0, 0, 0), (1, 1, 1, 1): (1, 0, 1, 0),
            (0, 1, 1, 0): (0, 1, 0, 0)}
    seen = [k for k in hand if k in rows]
    assert len(seen) >= 2, "64 draws of 16 strings should hit two of these"
    for k in seen:
        assert rows[k] == hand[k]
    # Deletang et al.'s examples (final): 1010100 -> 1, 01111 -> 0
    t = tasks.build("parity", seq_len=7, min_len=5, eval_lens=[7], num_test_examples=4)
    for bits, want in (([1, 0, 1, 0, 1, 0, 0], 1), ([0, 1, 1, 1, 1], 0)):
        x, y = t._examples(1, np.array([len(bits)]), 7, _Fixed(bits))
        assert x[0, :len(bits)].tolist() == bits and y[0, len(bits) - 1] == want
        assert (y[0, :len(bits) - 1] == IGNORE).all() and (y[0, len(bits):] == IGNORE).all()
        assert (x[0, len(bits):] == t.pad).all()


class _Fixed:
    """An rng stand-in whose integers() returns a fixed row (for hand examples)."""

    def __init__(self, row):
        self.row = np.asarray(row)

    def integers(self, low, high=None, size=None):
        return np.broadcast_to(self.row, size).copy()


def test_cycle_navigation_hand_example():
    # Deletang et al.: moves 1 -1 0 -1 -1 -> -2 = class 3 (cycle 5); tokens are move + 1
    t = tasks.build("cycle_navigation", seq_len=5, min_len=None, labels="running",
                    eval_lens=[5], num_test_examples=4)
    x, y = t._examples(1, np.array([5]), 5, _Fixed([2, 0, 1, 0, 0]))
    assert y[0].tolist() == [1, 0, 0, 4, 3]
    t = tasks.build("cycle_navigation", seq_len=4, min_len=None, cycle_length=3,
                    eval_lens=[4], num_test_examples=4)
    x, y = t._examples(1, np.array([4]), 4, _Fixed([2, 2, 2, 2]))   # four steps right mod 3
    assert y[0].tolist() == [IGNORE, IGNORE, IGNORE, 1]


def test_flat_modular_arithmetic_hand_examples():
    # Deletang et al.'s examples mod 5 (ops 0 +, 1 -, 2 *)
    cases = [([1, 2, 3], [0, 2], [1, 3, 2]),          # 1 + 2 * 3 = 7 = 2
             ([1, 1, 1], [1, 1], [1, 0, 4]),          # 1 - 1 - 1 = -1 = 4
             ([0, 1, 4, 3, 2], [2, 0, 2, 1], [0, 0, 4, 2, 0])]   # 0*1 + 4*3 - 2 = 10 = 0
    for nums, ops, running in cases:
        out = evaluate_flat(np.array([nums]), np.array([ops]), 5)
        assert out[0].tolist() == running, (nums, ops)
    # a product after a minus is subtracted whole: 4 - 2 * 3 = -2 = 3 (mod 5)
    assert evaluate_flat(np.array([[4, 2, 3]]), np.array([[1, 2]]), 5)[0, -1] == 3


def render(tokens, m):
    sym = {m: "+", m + 1: "-", m + 2: "*", m + 3: "(", m + 4: ")"}
    return " ".join(sym.get(int(t), str(int(t))) for t in tokens)


@pytest.mark.parametrize("brackets", [False, True])
def test_modular_arithmetic_labels_equal_python_eval(brackets):
    """Every generated expression, written out and evaluated by Python (same precedence,
    unary minus), gives the target: an oracle independent of the generator."""
    m = 7
    t = tasks.build("modular_arithmetic", seq_len=31, min_len=1, modulus=m, brackets=brackets,
                    operators="+-*", eval_lens=[31, 64], num_test_examples=64)
    for batch in (t.sample(200, seed=3), t.eval_sets(0)["len=64"]):
        for x, y in zip(batch.inputs.numpy(), batch.targets.numpy()):
            real = x[x != t.pad]
            last = len(real) - 1
            assert np.flatnonzero(y != IGNORE).tolist() == [last]
            assert y[last] == eval(render(real, m)) % m, render(real, m)
    if not brackets:   # even lengths give an odd expression and one PAD
        x = t.eval_sets(0)["len=64"].inputs.numpy()
        assert (x[:, 63] == t.pad).all() and (x[:, :63] != t.pad).all()


def test_modular_arithmetic_running_labels_are_prefix_values():
    m = 5
    t = tasks.build("modular_arithmetic", seq_len=15, min_len=None, modulus=m, labels="running",
                    eval_lens=[15], num_test_examples=8)
    for x, y in zip(*t.sample(50, seed=1)):
        x, y = x.numpy(), y.numpy()
        for j in range(15):
            if j % 2:
                assert y[j] == IGNORE and x[j] >= m
            else:
                assert y[j] == eval(render(x[:j + 1], m)) % m


def test_bracket_grammar_small_lengths():
    rnd = random.Random(0)
    m = 5
    for length in range(1, 30):
        tok, value = bracket_expression(length, m, "+-", rnd)
        assert len(tok) == length and value == eval(render(tok, m)) % m
    assert bracket_expression(3, m, "+-", random.Random(1))[0][0] == m + 3   # ( d )
    with pytest.raises(ValueError, match="running"):
        tasks.build("modular_arithmetic", brackets=True, labels="running")


def compose_perms(seq):
    """Running product 'x_1, then x_2, ...' as image tuples, by hand."""
    state, out = None, []
    for p in seq:
        state = p if state is None else tuple(p[state[i]] for i in range(len(p)))
        out.append(state)
    return out


def test_group_orders_and_identity_first():
    assert [len(closure(named_generators(g))) for g in ("S3", "S4", "S5", "A4", "A5", "Z6")] == \
        [6, 24, 120, 12, 60, 6]
    klein = [[1, 0, 3, 2], [2, 3, 0, 1]]
    t = tasks.build("permutation_composition", generators=klein, eval_lens=[8], seq_len=8)
    assert t.order == 4 and t.elements[0] == (0, 1, 2, 3) and t.num_classes == 4
    assert t.vocab_size == 5  # four elements + PAD
    t = tasks.build("permutation_composition", generators=klein, tokens="generators",
                    seq_len=8, eval_lens=[8])
    assert t.vocab_size == 3 and t.num_classes == 4


def test_s3_docstring_example():
    t = tasks.build("permutation_composition", group="S3", seq_len=2, eval_lens=[2],
                    num_test_examples=4)
    assert t.elements == [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    x, y = t._examples(1, np.array([2]), 2, _Fixed([1, 3]))
    assert y[0].tolist() == [1, 2]


@pytest.mark.parametrize("group,tokens", [("S5", "elements"), ("A5", "generators"),
                                          ("A5", "elements")])
def test_permutation_labels_equal_hand_composition(group, tokens):
    t = tasks.build("permutation_composition", group=group, tokens=tokens, seq_len=12,
                    eval_lens=[12, 40], num_test_examples=16)
    perms = t.elements if tokens == "elements" else named_generators(group)
    for batch in (t.sample(20, seed=5), t.eval_sets(0)["len=40"]):
        for x, y in zip(batch.inputs.tolist(), batch.targets.tolist()):
            want = [t.elements.index(s) for s in compose_perms([perms[k] for k in x])]
            assert y == want
    if group == "A5":   # every running product is even
        assert all(_even(p) for p in t.elements) and t.order == 60


def _even(p):
    inv = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return inv % 2 == 0


# -- seeds, streams, eval sets ------------------------------------------------------
BUILD = {
    "parity": {},
    "cycle_navigation": {},
    "modular_arithmetic": {"brackets": True},
    "permutation_composition": {"group": "A5"},
}


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_by_seed_and_streams_apart(name):
    a, b = tasks.build(name, **BUILD[name]), tasks.build(name, **BUILD[name])
    for x, y in ((a.train_batch(16, 3, 0), b.train_batch(16, 3, 0)), (a.sample(8, 1), b.sample(8, 1))):
        assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
    assert not torch.equal(a.train_batch(16, 3, 0).inputs, a.train_batch(16, 3, 1).inputs)
    assert not torch.equal(a.train_batch(16, 3, 0).inputs, a.train_batch(16, 4, 0).inputs)
    ea, eb = a.eval_sets(0), b.eval_sets(0)
    assert all(torch.equal(ea[k].inputs, eb[k].inputs) for k in ea)
    test_rows = {tuple(r) for r in ea[""].inputs.tolist()}
    train_rows = [tuple(r) for s in range(5) for r in a.train_batch(64, s, 0).inputs.tolist()]
    assert not test_rows & set(train_rows)          # training never equals a test row
    assert not torch.equal(ea[""].inputs, a.eval_sets(1)[""].inputs)


def test_training_avoids_every_test_row_of_its_width():
    # 64 strings of length 6; the len=6 set holds about half of them: full-length training
    # strings must avoid them as well as the "" set's
    t = tasks.build("parity", seq_len=6, min_len=2, eval_lens=[6, 12], num_test_examples=32)
    sets = t.eval_sets(0)
    test = {tuple(r) for k in ("", "len=6") for r in sets[k].inputs.tolist()}
    train = [tuple(r) for s in range(20) for r in t.train_batch(32, s, 0).inputs.tolist()]
    assert sum(1 for r in train if t.pad not in r) > 20     # full-length rows were drawn
    assert not test & set(train)


@pytest.mark.parametrize("name", NAMES)
def test_eval_sets_at_longer_lengths(name):
    t = tasks.build(name, seq_len=12, min_len=4, eval_lens=[12, 24, 48], num_test_examples=16,
                    **BUILD[name])
    sets = t.eval_sets(0)
    assert set(sets) == {"", "len=12", "len=24", "len=48"}
    for n in (12, 24, 48):
        x, y = sets[f"len={n}"].inputs.numpy(), sets[f"len={n}"].targets.numpy()
        assert x.shape == (16, n) and len(sets[f"len={n}"]) == 16
        odd = name == "modular_arithmetic" and not t.brackets and n % 2 == 0
        real = n - 1 if odd else n
        assert (x[:, :real] != t.pad).all()          # every example has the full length
        if t.labels == "final":
            assert (y[:, real - 1] != IGNORE).all() and (y[:, :real - 1] == IGNORE).all()
        else:
            assert (y[:, real - 1] != IGNORE).all()
    # the training set's real lengths cover [min_len, seq_len]
    x = t.train_batch(256, 0, 0).inputs.numpy()
    lengths = (x != t.pad).sum(1)
    assert lengths.min() <= 5 and lengths.max() >= 11 and lengths.min() >= 3
    assert t.valid_set(0).inputs.shape[1] == 12


def test_refused_options():
    with pytest.raises(TypeError, match="does not take"):
        tasks.build("parity", vocab_size=4)
    with pytest.raises(TypeError, match="does not take"):
        tasks.build("permutation_composition", modulus=5)
    with pytest.raises(ValueError, match="labels"):
        tasks.build("parity", labels="all")
    with pytest.raises(ValueError, match="min_len"):
        tasks.build("cycle_navigation", seq_len=8, min_len=9)
    with pytest.raises(ValueError, match="operators"):
        tasks.build("modular_arithmetic", operators="+/")
    with pytest.raises(ValueError, match="modulus"):
        tasks.build("modular_arithmetic", modulus=1)
    with pytest.raises(ValueError, match="either group or generators"):
        tasks.build("permutation_composition", group="A5", generators=[[1, 0]])
    with pytest.raises(ValueError, match="not a permutation"):
        tasks.build("permutation_composition", generators=[[0, 0, 1]])
    with pytest.raises(ValueError, match="same number"):
        tasks.build("permutation_composition", generators=[[1, 0], [1, 2, 0]])
    with pytest.raises(ValueError, match="S<n>"):
        tasks.build("permutation_composition", group="Q8")
    with pytest.raises(ValueError, match="at most"):
        tasks.build("permutation_composition", group="S7")
    with pytest.raises(ValueError, match="tokens"):
        tasks.build("permutation_composition", tokens="letters")


# -- learnability -------------------------------------------------------------------
def test_lstm_learns_parity_and_generalises_to_longer_strings():
    """A 1-layer LSTM learns parity from lengths 2 .. 8 and keeps it at 32 (a non-linear
    RNN tracks the state; ~2 s on one thread)."""
    from workbench.train import compose

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = tasks.build("parity", seq_len=8, min_len=2, eval_lens=[32], num_test_examples=64)
        torch.manual_seed(0)
        m = compose.build_model(t, "lstm", d_model=32, n_layers=1)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for step in range(300):
            x, y = t.train_batch(32, step, 0)
            loss = metrics.loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = {k: metrics.counts(m(b.inputs), b.targets).token_accuracy
                   for k, b in t.eval_sets(0).items()}
    finally:
        torch.set_num_threads(n)
    assert acc[""] > 0.95 and acc["len=32"] > 0.9, acc   # chance: about 0.5
