"""The validation split of every task (issue 20, item 3): ``task.valid_set(seed)``.

For every registry task at small parameters: the validation set exists, has the documented
size, is deterministic per seed, differs across seeds and shares no example with the
training set or the test set. The training and test data are the same as before the
validation split existed (hashes frozen from the code before the change). A short real
worker run records eval set "valid" with the same metric names as the test set "", and
``num_valid_examples = 0`` records none.
"""
from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

import tasks
from helpers import SMALL_TASKS, tiny_profile_text

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

# -- small settings of every task (synthetic ones; real data in the fixture below) --------
# helpers.SMALL_TASKS, with the options that change how examples are drawn set (the split
# must hold under them too)
SYNTHETIC = {
    **SMALL_TASKS,
    "induction_heads": {**SMALL_TASKS["induction_heads"], "eval_distances": [4, 40]},
    "mad_noisy_in_context_recall": {**SMALL_TASKS["mad_noisy_in_context_recall"], "train_targets": "next_token"},
    "modular_arithmetic": {**SMALL_TASKS["modular_arithmetic"], "brackets": True},
    "permutation_composition": {**SMALL_TASKS["permutation_composition"], "group": "A5"},
}
# fixed training sets for the fresh-batch tasks, and small sequence spaces where the
# training, test and validation draws collide often (the de-duplication must work)
EXTRA = {
    "selective_copying/fixed": ("selective_copying", dict(
        seq_len=6, vocab_size=4, num_tokens_to_copy=2, num_train_examples=40,
        num_test_examples=16)),
    "induction_heads/fixed": ("induction_heads", dict(
        seq_len=8, vocab_size=4, eval_lens=[8, 16], num_train_examples=48,
        num_test_examples=16)),
    "mqar/kv-list": ("mqar", dict(seq_len=32, vocab_size=40, num_kv_pairs=[2, 4],
                                  num_train_examples=32, num_test_examples=8)),
    "mad_memorization/tiny": ("mad_memorization", dict(
        seq_len=4, vocab_size=9, num_train_examples=40, num_test_examples=30)),
    "mad_compression/tiny": ("mad_compression", dict(
        seq_len=4, vocab_size=4, num_train_examples=10, num_test_examples=10)),
    "induction_heads/tiny-fresh": ("induction_heads", dict(
        seq_len=5, vocab_size=4, eval_lens=[5], num_test_examples=20)),
}

TEXT = "".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} dogs.\n"
               for i in range(60))
WORDS = [f"w{i}" for i in range(40)]


def _row_text(i: int) -> str:
    return (" ".join(WORDS[(i * k) % 40] for k in range(1, 3 + i % 5))
            + f" w{i % 40} w{(i // 40) * 7 % 40}")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """{case name: (task name, params)} of the real-data tasks, files made here."""
    root = tmp_path_factory.mktemp("real")
    text = root / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    lm_text = root / "lm.txt"
    lm_text.write_text("".join(hashlib.sha256(str(i).encode()).hexdigest() + "\n" for i in range(60)),
                       encoding="utf-8")
    vocab = {"<unk>": 0, "<pad>": 1, **{w: i + 2 for i, w in enumerate(WORDS)},
             **{lab: 42 + i for i, lab in enumerate(["neg", "pos"])}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok_file = str(root / "tokenizer.json")
    tok.save(tok_file)
    csv = root / "data.csv"
    csv.write_text("text,label\n" + "".join(f"{_row_text(i)},{['neg', 'pos'][i % 2]}\n"
                                            for i in range(60)), encoding="utf-8")
    imdb = root / "aclImdb"
    for split, n in (("train", 30), ("test", 10)):
        for lab in ("neg", "pos"):
            (imdb / split / lab).mkdir(parents=True)
            for i in range(n):
                j = i + (0 if split == "train" else 100) + (0 if lab == "neg" else 50)
                (imdb / split / lab / f"{i}.txt").write_text(_row_text(j) + " " + lab, "utf-8")
    cifar = root / "cifar"
    cifar.mkdir()
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", 6) for i in range(1, 6)] + [("test_batch", 5)]:
        d = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
             b"labels": rng.integers(0, 10, size=n).tolist()}
        with open(cifar / name, "wb") as f:
            pickle.dump(d, f)
    return {
        "char_lm": ("char_lm", dict(path=str(text), seq_len=16, num_test_examples=8)),
        "sequential_image": ("sequential_image", dict(num_train_examples=200,
                                                      num_test_examples=50)),
        "sequential_image/all": ("sequential_image", dict()),
        "sequential_image/cifar": ("sequential_image", dict(path=str(cifar), num_test_examples=4)),
        "text_classification": ("text_classification", dict(
            data_path=str(csv), tokenizer=tok_file, seq_len=8, num_train_examples=30,
            num_test_examples=10)),
        "text_classification/folders": ("text_classification", dict(
            data_path=str(imdb), tokenizer=tok_file, seq_len=8, num_train_examples=20,
            num_test_examples=12)),
        # one document per line, split by a hash of each line; windows of different lines
        # are distinct (hex digests), as the checks below need
        "lm": ("lm", dict(source=str(lm_text), document="line", seq_len=8, valid_fraction=0.2,
                          test_fraction=0.2, num_test_examples=6)),
    }


def cases(real):
    out = {name: (name, params) for name, params in SYNTHETIC.items()}
    out.update(EXTRA)
    out.update(real)
    return out


def train_data(t, seed):
    """The training examples a run sees: the fixed set, or a few fresh batches + sample."""
    if t.fixed_train:
        return [t.train_set(seed)]
    return [t.sample(8, seed), *(t.train_batch(8, step, seed) for step in range(3))]


def data_hash(t, seed) -> str:
    """sha256 of the training and test data of ``t`` at ``seed`` (shapes, inputs, targets)."""
    h = hashlib.sha256()
    batches = [("train", b) for b in train_data(t, seed)]
    batches += sorted(t.eval_sets(seed).items(), key=lambda kv: kv[0])
    for key, b in batches:
        h.update(repr((key, tuple(b.inputs.shape), tuple(b.targets.shape))).encode())
        h.update(b.inputs.numpy().tobytes())
        h.update(b.targets.numpy().tobytes())
    return h.hexdigest()[:16]


def test_all_cases_cover_the_registry(real):
    assert {name for name, _ in cases(real).values()} == set(tasks.names())

# hashes of the training and test data (seeds 0, 1) computed with the code BEFORE the
# validation split was added: the split must leave both unchanged
FROZEN = {
    'selective_copying': ('1f255a89c24189a3', '1fb6cf1e1bd11311'),
    'copying': ('f6553471c395ed01', 'eaf920af868cb3b3'),
    'mad_selective_copying': ('c0b4eba4ebdf7de0', '120546f87c38356a'),
    'mad_copying': ('e38174ff77b5b1e5', '6ff48436a8126681'),
    'induction_heads': ('45288ae950427ce3', '57439e17f54dc3f1'),
    'mqar': ('dce7176493882497', 'ebef3d32c1d62e15'),
    'mad_in_context_recall': ('d5a739aca748ca5f', '9b77ef8028af57ea'),
    'mad_noisy_in_context_recall': ('d51c5b3651a6dba8', '0c3e999e9dc41092'),
    'mad_fuzzy_in_context_recall': ('684cfc616640dd9a', 'faf06c606605f9b5'),
    'mad_memorization': ('6daac30d69993020', '0c3bc2a28836af4b'),
    'mad_compression': ('8137239a206b3cc0', '844d8f3acdde58eb'),
    'selective_copying/fixed': ('ef927d23b3422471', 'd77d049bb1890b2f'),
    'induction_heads/fixed': ('37dd01c65ed9ef53', 'c012d972c2ccd30f'),
    'mqar/kv-list': ('9a5141dfab00c45d', 'c149abb24c8767d5'),
    'mad_memorization/tiny': ('b3d2f668cec33367', '1b2fabbc91603f3c'),
    'mad_compression/tiny': ('eeb017c4b537a19b', 'fb341a05d9eefe15'),
    'induction_heads/tiny-fresh': ('189d02b5c65079e8', '7445daacbb8835d2'),
    'char_lm': ('f1f19d7cca968a8a', '432bff8ce26238db'),
    'sequential_image': ('04b0aeea6b78721d', '6ad4543c8b461628'),
    'sequential_image/all': ('f5ccd59042ce548f', '214bd1d3d1497690'),
    'sequential_image/cifar': ('5c4e58b5e56432bf', '5c4e58b5e56432bf'),
    'text_classification': ('ce3add3f44baab08', '49ffba985b6120e8'),
    'text_classification/folders': ('1f54c7b818621927', '0b1dadf0083af6e8'),
    'lm': ('caaba4da6933c232', '61685912d7711797'),   # frozen when the task was added
    # frozen when the tasks were added (issue 35)
    'parity': ('c60bb4f357f62ba8', '2eb9845144464a03'),
    'cycle_navigation': ('28383d3c1e05d873', 'ee2a4e661de6d9b1'),
    'modular_arithmetic': ('569454fa70c2621d', '74998d51b1cd9114'),
    'permutation_composition': ('dc98feeca67f0185', 'd197c9eb4f591b55'),
}

# the documented default size of each case's validation set
DEFAULT_VALID = {
    **{case: params["num_test_examples"] for case, params in SYNTHETIC.items()},
    **{case: params["num_test_examples"] for case, (_, params) in EXTRA.items()},
    "char_lm": 0,                        # any other value shrinks the training text
    "sequential_image": 50,              # min(test 50, pool 1437 - 200 training images)
    "sequential_image/all": 0,           # training uses the whole pool
    "sequential_image/cifar": 0,         # idem (all 30 training images)
    "text_classification": 10,           # min(test 10, 50 rows - 30 training rows)
    "text_classification/folders": 12,   # min(test 12, 60 training files - 20)
    "lm": 6,                             # the test set's size, from the valid split's documents
}
# cases whose validation set is asked for explicitly (the default is empty), and the cases
# whose sequence space is so small that the de-duplication may leave fewer examples
EXPLICIT = {"char_lm": 3, "sequential_image/all": 100, "sequential_image/cifar": 5,
            "text_classification": 25}
TINY = {"mad_memorization/tiny", "mad_compression/tiny", "induction_heads/tiny-fresh",
        "selective_copying/fixed", "induction_heads/fixed",
        # state tracking trains from length 3 or 4: few distinct short sequences
        "parity", "cycle_navigation", "modular_arithmetic"}
# the same validation windows for every seed (documented: the end of the training text)
SEED_FREE = {"char_lm", "lm"}   # lm: fixed windows of the valid split, for every seed
ALL = sorted(FROZEN)


def rows(batch) -> set[bytes]:
    x = np.ascontiguousarray(batch.inputs.numpy())
    return {r.tobytes() for r in x}


def test_all_cases_are_frozen_and_sized(real):
    assert set(cases(real)) == set(FROZEN) == set(DEFAULT_VALID)


@pytest.mark.parametrize("case", ALL)
def test_train_and_test_data_are_unchanged(real, case):
    name, params = cases(real)[case]
    t = tasks.build(name, **params)
    assert (data_hash(t, 0), data_hash(t, 1)) == FROZEN[case]
    assert t.num_valid_examples == DEFAULT_VALID[case]
    assert len(t.valid_set(0)) <= t.num_valid_examples   # the default set costs no training data


@pytest.mark.parametrize("case", ALL)
def test_valid_set_is_sized_deterministic_and_disjoint(real, case):
    name, params = cases(real)[case]
    if case in EXPLICIT:
        params = {**params, "num_valid_examples": EXPLICIT[case]}
    t = tasks.build(name, **params)
    n = EXPLICIT.get(case, DEFAULT_VALID[case])
    assert t.num_valid_examples == n > 0
    v0 = t.valid_set(0)
    if case == "mad_memorization/tiny":
        # 2 pairs over 4 keys: 16 sequences, all of them in the 40 training examples; the
        # validation set is empty rather than padded with training sequences
        assert len(rows(train_data(t, 0)[0])) == 16 and len(v0) == 0
        return
    if case in TINY:
        assert 0 < len(v0) <= n
    else:
        assert len(v0) == n
    assert v0.inputs.shape[1:] == t.eval_sets(0)[""].inputs.shape[1:]
    assert v0.targets.shape[1:] == t.eval_sets(0)[""].targets.shape[1:]
    # deterministic per seed: a fresh task object gives the same set
    again = tasks.build(name, **params).valid_set(0)
    assert np.array_equal(again.inputs.numpy(), v0.inputs.numpy())
    assert np.array_equal(again.targets.numpy(), v0.targets.numpy())
    v1 = t.valid_set(1)
    same = len(v1) == len(v0) and np.array_equal(v1.inputs.numpy(), v0.inputs.numpy())
    assert same == (case in SEED_FREE)
    # disjoint from the training data and from every evaluation set of the same seed
    for seed, v in ((0, v0), (1, v1)):
        vrows = rows(v)
        # fresh training batches are not filtered against the validation set (documented in
        # tasks/base.py: it would change existing runs' data); in a tiny space they collide
        checked = train_data(t, seed) if t.fixed_train or case not in TINY else []
        for b in checked:
            assert not vrows & rows(b), f"{case}: a validation example is a training example"
        for key, b in t.eval_sets(seed).items():
            if b.inputs.shape[1:] == v.inputs.shape[1:]:
                assert not vrows & rows(b), f"{case}: a validation example is in test set {key!r}"


def test_valid_differs_from_test_by_stream_not_only_by_filtering():
    # the validation set is a draw of its own, not the test set minus something
    t = tasks.build("induction_heads", **SYNTHETIC["induction_heads"])
    assert not rows(t.valid_set(0)) & rows(t.eval_sets(0)[""])
    t = tasks.build("mqar", **SYNTHETIC["mqar"], num_valid_examples=5)
    assert len(t.valid_set(0)) == 5 and t.params()["num_valid_examples"] == 5


def test_explicit_valid_carves_from_training(real):
    name, params = real["sequential_image/all"]
    t = tasks.build(name, **params, num_valid_examples=100)
    assert len(t.train_set(0)) == 1437 - 100       # the pool minus the validation images
    name, params = real["text_classification"]
    t = tasks.build(name, **params, num_valid_examples=25)
    assert t.num_train_examples == 25               # 50 training rows: 25 train, 25 valid
    name, params = real["char_lm"]
    t = tasks.build(name, **params, num_valid_examples=3)
    assert len(t._valid) == 3 * 16 + 1
    with pytest.raises(ValueError, match="num_valid_examples"):
        tasks.build(name, **params, num_valid_examples=10_000)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_zero_gives_an_empty_valid_set(name):
    t = tasks.build(name, **SYNTHETIC[name], num_valid_examples=0)
    assert len(t.valid_set(0)) == 0
    with pytest.raises(ValueError, match="num_valid_examples must be >= 0"):
        tasks.build(name, **SYNTHETIC[name], num_valid_examples=-1)


# -- the worker records eval set "valid" ----------------------------------------------------


def _run(tmp_path, num_valid_examples):
    import os

    from workbench.train import worker
    from workbench.spec.profile import expand, loads
    from workbench.store import Store
    text = tiny_profile_text("valid", examples=(64, 16), task={"num_valid_examples": num_valid_examples}, d_model=16,
                             steps=12, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=6, log_every=6, device="cpu")
    spec = expand(loads(text))[0].to_dict()
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    worker.run(str(store.root), rid)
    assert store.get(rid).state == "finished"
    return store.results([rid])[rid]


def test_worker_records_valid_with_the_test_metrics(tmp_path):
    res = _run(tmp_path / "a", 24)
    metrics = {"accuracy", "sequence_accuracy", "loss", "eval_sequences"}
    assert metrics <= set(res[""]) and set(res["valid"]) == metrics
    assert res["valid"]["eval_sequences"] == 24 and res[""]["eval_sequences"] == 16
    # evaluating the validation set changes nothing of the run: the same test numbers
    plain = _run(tmp_path / "b", 0)
    assert "valid" not in plain
    assert {k: plain[""][k] for k in metrics} == {k: res[""][k] for k in metrics}
