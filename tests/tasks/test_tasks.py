"""Property tests of the task generators (CPU, small sizes, hypothesis max_examples small).

For every generator: shapes, token ranges, the targets are recoverable from the inputs,
no answer leaks into positions where it must not be, determinism per seed, different seeds
differ, train and test disjoint, and every documented parameter changes what it should.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from helpers import SMALL_TASKS as SMALL  # every synthetic task's small settings
from tasks.metrics import IGNORE

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**31 - 1)


def np_batch(b):
    return b.inputs.numpy(), b.targets.numpy()


SYNTHETIC = sorted(SMALL)


def test_every_synthetic_task_is_covered():
    # tested in test_tasks_real_data.py, test_text_classification.py and test_lm_task.py
    real = {"char_lm", "lm", "sequential_image", "text_classification"}
    assert set(tasks.names()) == set(SYNTHETIC) | real


def build(name, **over):
    return tasks.build(name, **{**SMALL[name], **over})


def train_data(t, seed):
    return t.train_set(seed) if t.fixed_train else t.train_batch(32, 0, seed)


# ---------------------------------------------------------------------------------------
# the contract, for every synthetic task
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SYNTHETIC)
def test_shapes_ranges_and_description(name):
    t = build(name)
    assert tasks.describe(name) and "\n" not in tasks.describe(name)
    x, y = np_batch(t.sample(8, seed=3))
    assert x.shape == y.shape == (8, t.seq_len)
    assert x.dtype == np.int64 and y.dtype == np.int64
    assert 0 <= x.min() and x.max() < t.vocab_size
    tgt = y[y != IGNORE]
    assert len(tgt) > 0 and 0 <= tgt.min() and tgt.max() < t.num_classes
    for key, b in t.eval_sets(0).items():
        ex, ey = np_batch(b)
        assert ex.shape == ey.shape and ex.shape[0] >= 1
        assert (ey != IGNORE).any(axis=1).all(), f"{name}[{key}]: a test row without target"


@pytest.mark.parametrize("name", SYNTHETIC)
def test_deterministic_per_seed_and_seeds_differ(name):
    t1, t2 = build(name), build(name)
    for a, b in [(t1.sample(8, 5), t2.sample(8, 5)), (train_data(t1, 5), train_data(t2, 5))]:
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    e1, e2 = t1.eval_sets(5), t2.eval_sets(5)
    assert e1.keys() == e2.keys()
    for k in e1:
        assert torch.equal(e1[k].inputs, e2[k].inputs)
        assert torch.equal(e1[k].targets, e2[k].targets)
    assert not torch.equal(t1.sample(8, 5).inputs, t1.sample(8, 6).inputs)
    assert not torch.equal(train_data(t1, 5).inputs, train_data(t1, 6).inputs)
    assert not torch.equal(t1.eval_sets(5)[""].inputs, t1.eval_sets(6)[""].inputs)
    if not t1.fixed_train:  # fresh batches: every step differs
        assert not torch.equal(t1.train_batch(8, 0, 5).inputs, t1.train_batch(8, 1, 5).inputs)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_train_and_test_disjoint(name):
    t = build(name)
    train = {r.tobytes() for r in train_data(t, 0).inputs.numpy()}
    train |= {r.tobytes() for r in t.sample(32, 0).inputs.numpy()}
    for key, b in t.eval_sets(0).items():
        if b.inputs.shape[1] != t.seq_len:
            continue
        assert not any(r.tobytes() in train for r in b.inputs.numpy()), key


def test_fixed_test_set_drops_examples_seen_in_training():
    # memorization at seq_len 2 over 3 keys: only 3 distinct sequences exist, so without
    # de-duplication the test set would repeat training sequences
    t = tasks.build("mad_memorization", seq_len=2, vocab_size=8, num_train_examples=16,
                    num_test_examples=8)
    train = {r.tobytes() for r in t.train_set(0).inputs.numpy()}
    test = t.eval_sets(0)[""].inputs.numpy()
    assert len(test) < 8
    assert not any(r.tobytes() in train for r in test)
    big = tasks.build("mad_memorization", seq_len=16, vocab_size=64, num_train_examples=16,
                      num_test_examples=8)
    assert len(big.eval_sets(0)[""]) == 8     # topped up when collisions are rare


@pytest.mark.parametrize("name", SYNTHETIC)
def test_unknown_and_bad_parameters(name):
    with pytest.raises(TypeError, match="not_a_param"):
        tasks.build(name, not_a_param=1)
    with pytest.raises(TypeError, match="not_a_param"):
        tasks.check_params(name, {"not_a_param": 1})
    if "vocab_size" in tasks.parameters(name):   # state-tracking tasks fix their vocabulary
        with pytest.raises(ValueError):
            build(name, vocab_size=2)
    with pytest.raises(ValueError):
        build(name, seq_len=-1)
    with pytest.raises(ValueError):
        build(name, num_test_examples=0)
    with pytest.raises(ValueError):
        build(name, seq_len="64")


# every documented parameter: a changed value that must change the data (or its shape).
# If a generator ignored the parameter, the fingerprints below would be equal.
CHANGES = {
    "selective_copying": dict(seq_len=30, vocab_size=12, num_tokens_to_copy=5,
                              num_train_examples=40, num_test_examples=12),
    "copying": dict(seq_len=30, vocab_size=12, num_tokens_to_copy=5,
                    num_train_examples=40, num_test_examples=12),
    "mad_selective_copying": dict(seq_len=30, vocab_size=12, num_tokens_to_copy=5,
                                  num_train_examples=40, num_test_examples=12,
                                  placement="uniform"),
    "mad_copying": dict(seq_len=30, vocab_size=12, num_tokens_to_copy=5,
                        num_train_examples=40, num_test_examples=12),
    "induction_heads": dict(seq_len=48, vocab_size=12, eval_lens=[16, 128],
                            num_train_examples=40, num_test_examples=4,
                            eval_token_budget=1024, trigger="anywhere", eval_distances=[8, 100]),
    "mqar": dict(seq_len=40, vocab_size=64, num_kv_pairs=[2, 4], power_a=1.0,
                 num_train_examples=40, num_test_examples=12),
    "mad_in_context_recall": dict(seq_len=40, vocab_size=24, multi_query=False,
                                  frac_noise=0.3, noise_vocab_size=0, num_train_examples=40,
                                  num_test_examples=12, train_targets="next_token"),
    "mad_noisy_in_context_recall": dict(seq_len=40, vocab_size=40, multi_query=False,
                                        frac_noise=0.6, noise_vocab_size=8,
                                        num_train_examples=40, num_test_examples=12,
                                        train_targets="next_token"),
    "mad_fuzzy_in_context_recall": dict(seq_len=56, vocab_size=20, k_motif_size=2,
                                        v_motif_size=2, multi_query=False, frac_noise=0.3,
                                        noise_vocab_size=0, num_train_examples=40,
                                        num_test_examples=12),
    "mad_memorization": dict(seq_len=20, vocab_size=32, num_train_examples=40,
                             num_test_examples=12),
    "mad_compression": dict(seq_len=20, vocab_size=12, num_train_examples=40,
                            num_test_examples=12),
    "parity": dict(seq_len=12, min_len=6, labels="running", eval_lens=[12, 20],
                   num_train_examples=40, num_test_examples=12),
    "cycle_navigation": dict(seq_len=12, min_len=6, cycle_length=3, labels="running",
                             eval_lens=[12, 20], num_train_examples=40, num_test_examples=12),
    "modular_arithmetic": dict(seq_len=13, min_len=5, modulus=7, brackets=True, operators="+",
                               labels="running", eval_lens=[13, 21], num_train_examples=40,
                               num_test_examples=12),
    "permutation_composition": dict(seq_len=10, min_len=4, group="A4",
                                    generators=[[1, 0, 2], [0, 2, 1]], tokens="generators",
                                    labels="final", eval_lens=[10, 20], num_train_examples=40,
                                    num_test_examples=12),
}


# every task's validation size (issue 20): it changes the validation set only
for _changes in CHANGES.values():
    _changes["num_valid_examples"] = 5


def fingerprint(t):
    tr = train_data(t, 0)
    parts = [t.seq_len, t.vocab_size, t.num_classes, t.fixed_train, tuple(tr.inputs.shape),
             tr.inputs.numpy().tobytes(), tr.targets.numpy().tobytes()]
    for k, b in sorted(t.eval_sets(0).items()):
        parts += [k, tuple(b.inputs.shape), b.inputs.numpy().tobytes(),
                  b.targets.numpy().tobytes()]
    v = t.valid_set(0)
    parts += ["valid", tuple(v.inputs.shape), v.inputs.numpy().tobytes()]
    return parts


@pytest.mark.parametrize("name,param", [(n, p) for n in SYNTHETIC for p in CHANGES[n]])
def test_each_parameter_is_used(name, param):
    assert set(CHANGES[name]) == set(tasks.parameters(name)), "a parameter lacks a test"
    base = SMALL[name]
    base_fp = fingerprint(tasks.build(name, **base))
    changed = tasks.build(name, **{**base, param: CHANGES[name][param]})
    assert changed.params()[param] == CHANGES[name][param] or param == "eval_lens"
    assert fingerprint(changed) != base_fp


# ---------------------------------------------------------------------------------------
# copying: paper and MAD format, selective and fixed spacing (one generator)
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(L=st.integers(1, 40), M=st.integers(2, 8), V=st.integers(6, 20), seed=seeds,
       selective=st.booleans())
def test_paper_copying_layout(L, M, V, seed, selective):
    name = "selective_copying" if selective else "copying"
    t = tasks.build(name, seq_len=L, num_tokens_to_copy=M, vocab_size=V, num_test_examples=4)
    assert t.seq_len == L + 2 * M
    x, y = np_batch(t.sample(16, seed))
    region, tail = x[:, : L + M], x[:, L + M:]
    assert (tail == V - 1).all()                          # markers at the answer positions
    assert (y[:, : L + M] == IGNORE).all()                # targets only at the markers
    answer = y[:, L + M:]
    assert ((answer >= 1) & (answer <= V - 2)).all()      # data tokens, never noise/marker
    for r in range(16):
        data = region[r][region[r] != 0]                  # the copied tokens, in order
        np.testing.assert_array_equal(data, answer[r])
        assert (region[r] != V - 1).all()
    if not selective:
        np.testing.assert_array_equal(region[:, :M], answer)
    elif L >= 4:
        first = np.all(region[:, :M] != 0, axis=1)
        assert not first.all()                            # data not always at the start


@SETTINGS
@given(M=st.integers(2, 6), extra=st.integers(0, 20), V=st.integers(6, 20), seed=seeds,
       selective=st.booleans())
def test_mad_copying_layout(M, extra, V, seed, selective):
    L = 2 * M + 1 + extra
    name = "mad_selective_copying" if selective else "mad_copying"
    t = tasks.build(name, seq_len=L, num_tokens_to_copy=M, vocab_size=V,
                    num_train_examples=4, num_test_examples=4)
    x, y = np_batch(t.sample(16, seed))
    assert x.shape == (16, L)
    blank, copy = V - 2, V - 1
    assert (x[:, L - M - 1] == copy).all() and (x[:, L - M:] == blank).all()
    assert (y[:, : L - M] == IGNORE).all()
    for r in range(16):
        body = x[r, : L - M - 1]
        np.testing.assert_array_equal(body[body != blank], y[r, L - M:])
    if not selective:
        np.testing.assert_array_equal(x[:, :M], y[:, L - M:])
    elif extra >= 4:
        assert not np.all(x[:, :M] != blank, axis=1).all()


def test_recall_next_token_training_keeps_recall_evaluation():
    kw = dict(seq_len=32, vocab_size=16, num_train_examples=64, num_test_examples=16)
    lm = tasks.build("mad_in_context_recall", train_targets="next_token", **kw)
    plain = tasks.build("mad_in_context_recall", **kw)
    x, y = np_batch(lm.train_set(0))
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])      # every next token is a target
    assert (y[:, -1] == IGNORE).all()
    px, _ = np_batch(plain.train_set(0))
    np.testing.assert_array_equal(x, px)                    # same sequences
    for a, b in zip(np_batch(lm.eval_sets(0)[""]), np_batch(plain.eval_sets(0)[""])):
        np.testing.assert_array_equal(a, b)                 # evaluation: recall targets only
    with pytest.raises(ValueError, match="train_targets"):
        tasks.build("mad_in_context_recall", train_targets="all", **kw)


def test_induction_heads_distance_sets():
    t = tasks.build("induction_heads", seq_len=32, vocab_size=8, eval_lens=[32],
                    num_test_examples=16, eval_distances=[5, 30, 100])
    sets = t.eval_sets(0)
    assert {"dist=5", "dist=30", "dist=100"} <= set(sets)
    for d, length in ((5, 32), (30, 32), (100, 102)):
        x, y = np_batch(sets[f"dist={d}"])
        assert x.shape == (16, length)
        trig = 7
        first = np.argmax(x == trig, axis=1)
        assert (first == length - 1 - d).all()                    # exactly d before the end
        assert ((x == trig).sum(1) == 2).all()                    # trigger twice, as always
        np.testing.assert_array_equal(y[:, -1], x[np.arange(16), first + 1])
    with pytest.raises(ValueError, match="eval_distances"):
        tasks.build("induction_heads", seq_len=32, eval_distances=[1])


@pytest.mark.parametrize("placement", ["mad", "uniform"])
def test_mad_selective_copying_placement(placement):
    M, L = 5, 20
    t = tasks.build("mad_selective_copying", seq_len=L, num_tokens_to_copy=M, vocab_size=16,
                    num_train_examples=4, num_test_examples=4, placement=placement)
    x, _ = np_batch(t.sample(4000, 0))
    region = x[:, : L - M - 1]
    is_data = region != 14
    last_is_data = is_data[:, -1].mean()
    if placement == "mad":
        assert last_is_data == 1.0      # mad-lab: the last data token precedes the copy token
        # and the gaps follow np.insert at uniform indices in [0, M): simulate that rule
        rng = np.random.default_rng(1)
        ref = np.zeros(L - M - 1)
        for _ in range(4000):
            row = np.insert(np.ones(M), rng.integers(0, M, L - 2 * M - 1), 0)
            ref += row
        np.testing.assert_allclose(is_data.mean(0), ref / 4000, atol=0.03)
    else:
        assert abs(last_is_data - M / (L - M - 1)) < 0.03   # uniform subset: P = M / region
    assert is_data.sum(1).min() == M


def test_mad_selective_copying_rejects_unknown_placement():
    with pytest.raises(ValueError, match="placement"):
        tasks.build("mad_selective_copying", seq_len=20, num_tokens_to_copy=5, placement="end")


def test_copying_formats_share_one_generator():
    from tasks import selective_copying as sc
    assert all(issubclass(c, sc._CopyingBase) for c in
               (sc.SelectiveCopying, sc.Copying, sc.MADSelectiveCopying, sc.MADCopying))


# ---------------------------------------------------------------------------------------
# induction heads
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(L=st.integers(8, 80), V=st.integers(5, 20), seed=seeds)
def test_induction_heads_layout(L, V, seed):
    t = tasks.build("induction_heads", seq_len=L, vocab_size=V, eval_lens=[8],
                    num_test_examples=4)
    x, y = np_batch(t.sample(16, seed))
    trig = V - 1
    assert (y[:, :-1] == IGNORE).all() and (y[:, -1] != IGNORE).all()
    for r in range(16):
        pos = np.flatnonzero(x[r] == trig)
        assert len(pos) == 2 and pos[1] == L - 1          # once early, once at the end
        assert pos[0] < max(L // 2 - 1, 1)
        assert y[r, -1] == x[r, pos[0] + 1] != trig       # the token after the trigger


@SETTINGS
@given(L=st.integers(8, 80), V=st.integers(5, 20), seed=seeds,
       trigger=st.sampled_from(["first_half", "anywhere", "prefix:1", "prefix:5", "prefix:500"]))
def test_induction_heads_trigger_placement(L, V, seed, trigger):
    """Wherever the first trigger goes, the sequence keeps its form; it stays within its range."""
    t = tasks.build("induction_heads", seq_len=L, vocab_size=V, eval_lens=[8, 2 * L],
                    num_test_examples=4, trigger=trigger)

    def bound(n):  # exclusive upper bound of the first trigger's position at length n
        if trigger == "first_half":
            return max(n // 2 - 1, 1)
        if trigger == "anywhere":
            return n - 2
        return min(int(trigger.partition(":")[2]), n - 2)

    for x, y in [np_batch(t.sample(32, seed)), np_batch(t.eval_sets(seed)[f"len={2 * L}"])]:
        n = x.shape[1]
        for r in range(len(x)):
            pos = np.flatnonzero(x[r] == V - 1)
            assert len(pos) == 2 and pos[1] == n - 1
            assert 0 <= pos[0] < bound(n)
            assert y[r, -1] == x[r, pos[0] + 1] != V - 1


def test_induction_heads_trigger_ranges_are_used():
    """'anywhere' reaches the second half; 'prefix:K' stays in the first K; bad values fail."""
    def firsts(trigger):
        t = tasks.build("induction_heads", seq_len=64, vocab_size=8, trigger=trigger, eval_lens=[64])
        x, _ = np_batch(t.sample(512, 0))
        return np.array([np.flatnonzero(r == 7)[0] for r in x])

    assert firsts("first_half").max() < 31
    assert firsts("anywhere").max() > 50 and firsts("anywhere").min() < 5
    assert firsts("prefix:10").max() == 9
    assert tasks.build("induction_heads", trigger="prefix:4").params()["trigger"] == "prefix:4"
    for bad in ("middle", "prefix:0", "prefix:x", 3):
        with pytest.raises(ValueError, match="trigger must be one of"):
            tasks.build("induction_heads", trigger=bad)


def test_induction_heads_eval_lengths():
    t = tasks.build("induction_heads", seq_len=32, vocab_size=8, eval_lens=[16, 32, 1024],
                    num_test_examples=16, eval_token_budget=4096)
    sets = t.eval_sets(0)
    assert set(sets) == {"", "len=16", "len=32", "len=1024"}
    assert sets["len=32"] is sets[""]
    assert sets["len=16"].inputs.shape == (16, 16)
    assert sets["len=1024"].inputs.shape == (4, 1024)     # the token budget caps long sets
    x, y = np_batch(sets["len=1024"])
    assert (y[:, -1] == [r[np.flatnonzero(r == 7)[0] + 1] for r in x]).all()


# ---------------------------------------------------------------------------------------
# MQAR
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(D=st.integers(1, 6), extra=st.integers(0, 16), V=st.integers(16, 64), seed=seeds)
def test_mqar_values_are_those_paired_with_the_queried_keys(D, extra, V, seed):
    L = 4 * D + 2 * extra
    t = tasks.build("mqar", seq_len=L, vocab_size=V, num_kv_pairs=D)
    x, y = np_batch(t.sample(16, seed))
    half = V // 2
    for r in range(16):
        keys, vals = x[r, 0:2 * D:2], x[r, 1:2 * D:2]
        assert ((keys >= 1) & (keys < half)).all() and ((vals >= half) & (vals < V)).all()
        assert len(set(keys)) == D and len(set(vals)) == D
        pairs = dict(zip(keys, vals))
        q = np.flatnonzero(y[r] != IGNORE)
        assert len(q) == D and (q >= 2 * D).all() and ((q - 2 * D) % 2 == 0).all()
        assert sorted(x[r, q]) == sorted(keys)            # each key queried once
        assert all(y[r, p] == pairs[x[r, p]] for p in q)
        assert (y[r, : 2 * D] == IGNORE).all()


def test_mqar_power_law_prefers_short_gaps():
    near = tasks.build("mqar", seq_len=256, vocab_size=64, num_kv_pairs=4, power_a=0.01)
    flat = tasks.build("mqar", seq_len=256, vocab_size=64, num_kv_pairs=4, power_a=1.0)
    pos = [np.flatnonzero(t.sample(256, 0).targets.numpy() != IGNORE).mean() for t in (near, flat)]
    assert pos[0] < pos[1] - 20


def test_mqar_mixed_pairs_sliced_eval():
    t = tasks.build("mqar", seq_len=32, vocab_size=40, num_kv_pairs=[2, 4, 8],
                    num_test_examples=10)
    sets = t.eval_sets(0)
    assert set(sets) == {"", "kv=2", "kv=4", "kv=8"}
    for D in (2, 4, 8):
        assert ((sets[f"kv={D}"].targets != IGNORE).sum(1) == D).all()
    assert len(sets[""]) == 30
    counts = (t.sample(300, 0).targets != IGNORE).sum(1).tolist()
    assert set(counts) == {2, 4, 8}                       # training mixes the three


# ---------------------------------------------------------------------------------------
# MAD in-context recall (plain and noisy)
# ---------------------------------------------------------------------------------------
def check_recall(x, y, V, multi_query, noise_vocab_size):
    ns = V - (0 if multi_query else 1) - noise_vocab_size
    for r in range(len(x)):
        s = x[r]
        P = len(s) // 2
        last_value = {}
        body = P - 1
        for j in range(body):
            k, v = s[2 * j], s[2 * j + 1]
            is_kv = k < ns // 2
            if not is_kv:   # noise motif: both tokens noise, no targets
                assert ns <= k < ns + noise_vocab_size and ns <= v < ns + noise_vocab_size
                assert y[r, 2 * j] == IGNORE and y[r, 2 * j + 1] == IGNORE
                continue
            assert ns // 2 <= v < ns
            if k in last_value:
                assert last_value[k] == v                  # a key keeps its value
                assert y[r, 2 * j] == (v if multi_query else IGNORE)
            else:
                assert y[r, 2 * j] == IGNORE               # first sight: not recoverable
            assert y[r, 2 * j + 1] == IGNORE
            last_value[k] = v
        if multi_query:
            k, v = s[-2], s[-1]
            assert y[r, -2] == v == last_value[k] and y[r, -1] == IGNORE
        else:
            assert s[-2] == V - 1 and y[r, -1] == last_value[s[-1]]
            assert (y[r, :-1] == IGNORE).all()


@SETTINGS
@given(P=st.integers(4, 24), V=st.integers(4, 24), noise=st.integers(0, 6),
       frac=st.sampled_from([0.0, 0.3, 0.8]), mq=st.booleans(), seed=seeds)
def test_in_context_recall_targets_recoverable(P, V, noise, frac, mq, seed):
    V = V + noise + 1
    if frac > 0 and noise == 0:
        noise = 1
        V += 1
    t = tasks.build("mad_noisy_in_context_recall", seq_len=2 * P, vocab_size=V, multi_query=mq,
                    frac_noise=frac, noise_vocab_size=noise, num_train_examples=4,
                    num_test_examples=4)
    x, y = np_batch(t.sample(16, seed))
    check_recall(x, y, V, mq, noise)


def test_noise_fraction_is_honoured():
    t = tasks.build("mad_noisy_in_context_recall", seq_len=256, vocab_size=32, frac_noise=0.4,
                    noise_vocab_size=16)
    x = t.sample(64, 0).inputs.numpy()
    frac = (x[:, 0:-2:2] >= 16).mean()
    assert abs(frac - 0.4) < 0.03


# ---------------------------------------------------------------------------------------
# fuzzy in-context recall
# ---------------------------------------------------------------------------------------
def find(seq, sub, before):
    n = len(sub)
    return any(list(seq[i:i + n]) == list(sub) for i in range(0, before - n + 1))


@SETTINGS
@given(k=st.integers(1, 3), v=st.integers(1, 3), extra=st.integers(0, 30), seed=seeds,
       mq=st.booleans())
def test_fuzzy_recall_values_follow_an_earlier_copy_of_their_key(k, v, extra, seed, mq):
    V = 2 * max(k, v) + 4
    L = 2 * (k + v) + 2 + extra
    t = tasks.build("mad_fuzzy_in_context_recall", seq_len=L, vocab_size=V, k_motif_size=k,
                    v_motif_size=v, multi_query=mq, num_train_examples=4, num_test_examples=4)
    # test set: keys always have k tokens, so the key before a value run is known
    x, y = np_batch(t.eval_sets(seed)[""])
    ns = V - (1 if mq else 2)
    for r in range(len(x)):
        s = np.append(x[r], y[r, -1])                     # full sequence (last token = target)
        tpos = np.flatnonzero(y[r] != IGNORE) + 1         # positions in s of target tokens
        assert len(tpos) and tpos[-1] == L
        assert all(ns // 2 <= s[p] < ns for p in tpos)    # only value tokens are targets
        runs = np.split(tpos, np.flatnonzero(np.diff(tpos) > 1) + 1)
        if not mq:
            assert len(runs) == 1 and s[runs[0][0] - k - 1] == V - 1
        for run in runs:
            key = s[run[0] - k: run[0]]
            assert all(tok < ns // 2 for tok in key)
            assert find(s, list(key) + list(s[run]), run[0] - k)


def test_fuzzy_training_keys_vary_in_size():
    t = tasks.build("mad_fuzzy_in_context_recall", **{**SMALL["mad_fuzzy_in_context_recall"],
                                                      "noise_vocab_size": 0})
    a = t.train_set(0).inputs.numpy()
    b = t.eval_sets(0)[""].inputs.numpy()
    assert not np.array_equal(a[: len(b)], b)
    # a train sequence with key runs of different lengths exists (keys are < ns // 2 = 7)
    runs = set()
    for row in a:
        is_key = row < 7
        edges = np.flatnonzero(np.diff(np.r_[0, is_key.astype(int), 0]))
        runs |= set((edges[1::2] - edges[0::2]).tolist())
    assert {1, 2, 3} <= runs


# ---------------------------------------------------------------------------------------
# memorization and compression
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(P=st.integers(1, 12), V=st.integers(4, 80), seed=seeds)
def test_memorization_one_fixed_map(P, V, seed):
    t = tasks.build("mad_memorization", seq_len=2 * P, vocab_size=V, num_train_examples=8,
                    num_test_examples=4)
    tr, te = np_batch(t.train_set(seed)), np_batch(t.eval_sets(seed)[""])
    m = t.kv_map(seed)
    for x, y in (tr, te):
        assert (x[:, 1::2] == V - 1).all() and (y[:, 0::2] == IGNORE).all()
        assert all(y[r, 2 * j + 1] == m[x[r, 2 * j]] for r in range(len(x)) for j in range(P))
    assert len(set(m.values())) == len(m)


def test_memorization_map_depends_on_seed():
    t = tasks.build("mad_memorization")
    assert t.kv_map(0) != t.kv_map(1)


def test_compression_layout_and_readout():
    t = build("mad_compression")
    assert t.readout == "decode_from_last"
    x, y = np_batch(t.sample(8, 0))
    assert (x[:, -1] == t.vocab_size - 1).all() and (x[:, :-1] < t.vocab_size - 1).all()
    np.testing.assert_array_equal(y[:, :-1], x[:, :-1])
    assert (y[:, -1] == IGNORE).all()


def test_heads_follow_readout():
    from tasks.heads import make_encoder, make_head
    h = torch.randn(3, 16, 8)
    comp = make_head(build("mad_compression"), 8)
    out = comp(h)
    assert out.shape == (3, 16, 8)
    h2 = h.clone()
    h2[:, :-1] = torch.randn(3, 15, 8)                 # only the last position may matter
    assert torch.allclose(comp(h2), out)
    h2[:, -1] = torch.randn(3, 8)
    assert not torch.allclose(comp(h2), out)
    assert make_head(build("mqar"), 8)(h).shape == (3, 16, 40)
    img = tasks.build("sequential_image", num_test_examples=100)
    assert make_head(img, 8)(h).shape == (3, 10)
    assert isinstance(make_encoder(img, 8), torch.nn.Linear)
    assert isinstance(make_encoder(build("mqar"), 8), torch.nn.Embedding)
