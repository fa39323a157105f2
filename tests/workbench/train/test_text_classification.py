"""Tests of the text-classification task (tasks/text_classification.py), offline and small.

Every dataset and the tokenizer are made here in tmp_path: a word-level tokenizer trained
with the ``tokenizers`` library on the texts themselves (so no word is unknown and every
text has a distinct token sequence), an aclImdb-shaped folder, and CSV / JSONL files.
"""
from __future__ import annotations

import csv
import json
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

import tasks  # noqa: E402
from tasks.heads import CumulativeMeanHead, make_head  # noqa: E402
from tasks.metrics import IGNORE  # noqa: E402

NAME = "text_classification"
# (split, label) -> number of reviews; train/unsup exists in train/ only, as in aclImdb
FOLDER_COUNTS = {("train", "pos"): 4, ("train", "neg"): 3, ("train", "unsup"): 2,
                 ("test", "pos"): 2, ("test", "neg"): 3}


def review(split: str, label: str, i: int) -> str:
    # distinct words per review, lengths 4 + i tokens
    return " ".join([label, split, f"n{i}"] + ["word"] * (i + 1))


def row_text(i: int) -> str:
    return f"row r{i} says " + "more " * (i % 4)


def all_texts() -> list[str]:
    texts = [review(s, lab, i) for (s, lab), n in FOLDER_COUNTS.items() for i in range(n)]
    return texts + [row_text(i) for i in range(30)] + ["only in the jsonl", "the csv one"]


def make_tokenizer(path, specials=("<unk>", "<pad>")) -> str:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(all_texts(), trainers.WordLevelTrainer(special_tokens=list(specials)))
    tok.save(str(path))
    return str(path)


def ids_of(tokenizer_file: str, text: str) -> list[int]:
    return Tokenizer.from_file(tokenizer_file).encode(text).ids


@pytest.fixture
def tokenizer(tmp_path):
    return make_tokenizer(tmp_path / "tokenizer.json")


@pytest.fixture
def imdb(tmp_path):
    root = tmp_path / "aclImdb"
    for (split, label), n in FOLDER_COUNTS.items():
        (root / split / label).mkdir(parents=True)
        for i in range(n):
            (root / split / label / f"{i}_7.txt").write_text(review(split, label, i), "utf-8")
    return str(root)


def write_csv(path, rows, columns=("text", "label")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)
    return str(path)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


@pytest.fixture
def csv_file(tmp_path):
    labels = ["neg", "pos", "neutral"]
    return write_csv(tmp_path / "data.csv", [(row_text(i), labels[i % 3]) for i in range(20)])


def build(data_path, tokenizer, **kw):
    return tasks.build(NAME, data_path=data_path, tokenizer=tokenizer, **kw)


def decoded_rows(task, batch):
    """[(real token ids, class id)] of a batch, checking the layout of every row on the way:
    the one target sits at the last real token, pads fill the rest of the row."""
    out = []
    x, y = batch.inputs.numpy(), batch.targets.numpy()
    assert x.shape == y.shape == (len(batch), task.seq_len)
    for row, tgt in zip(x, y):
        (pos,) = np.flatnonzero(tgt != IGNORE)
        assert (row[pos + 1:] == task.pad_id).all()
        assert (row[: pos + 1] != task.pad_id).all()
        out.append((tuple(row[: pos + 1]), int(tgt[pos])))
    return out


def expected(tokenizer, split, names, limit=None):
    """{(token ids, class id)} of the folder layout's reviews of one split."""
    return {(tuple(ids_of(tokenizer, review(split, lab, i))[:limit]), names.index(lab))
            for (s, lab), n in FOLDER_COUNTS.items() if s == split and lab in names
            for i in range(n)}


# -- layouts, labels, target positions ----------------------------------------------------
def test_folder_layout_labels_and_last_token_targets(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=16)
    assert t.label_names == ["neg", "pos"] and t.num_classes == 2    # unsup is train-only
    assert t.vocab_size == Tokenizer.from_file(tokenizer).get_vocab_size()
    assert t.readout == "per_position" and t.fixed_train and not t.pooled
    train = decoded_rows(t, t.train_set(0))
    assert sorted(train) == sorted(expected(tokenizer, "train", t.label_names))
    test = decoded_rows(t, t.eval_sets(0)[""])
    assert sorted(test) == sorted(expected(tokenizer, "test", t.label_names))
    assert (t.num_train_examples, t.num_test_examples) == (7, 5)


def test_target_is_exactly_at_the_last_real_token(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=16)
    b = t.train_set(0)
    lengths = (b.inputs != t.pad_id).sum(1)
    positions = (b.targets != IGNORE).int().argmax(1)
    assert torch.equal(positions, lengths - 1)
    assert ((b.targets != IGNORE).sum(1) == 1).all()


def test_truncation_keeps_the_first_tokens(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=5)
    train = decoded_rows(t, t.train_set(0))
    assert sorted(train) == sorted(expected(tokenizer, "train", t.label_names, limit=5))
    short, long = review("train", "pos", 0), review("train", "pos", 3)
    assert len(ids_of(tokenizer, short)) == 4 and len(ids_of(tokenizer, long)) == 7
    x, y = t.encode([long, short], [1, 0])
    np.testing.assert_array_equal(x[0], ids_of(tokenizer, long)[:5])     # cut after 5
    np.testing.assert_array_equal(x[1, :4], ids_of(tokenizer, short))    # fits, then a pad
    assert x[1, 4] == t.pad_id
    assert y[0, 4] == 1 and y[1, 3] == 0 and (y != IGNORE).sum() == 2


def test_empty_text_is_one_pad_token(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=6)
    x, y = t.encode([""], [1])
    assert (x == t.pad_id).all() and y[0, 0] == 1 and (y[0, 1:] == IGNORE).all()


def test_csv_split_is_seeded_disjoint_and_counted(csv_file, tokenizer):
    t = build(csv_file, tokenizer, seq_len=12, num_train_examples=100, num_test_examples=5)
    assert (t.num_train_examples, t.num_test_examples) == (15, 5)     # all the rest, recorded
    assert t.params()["num_train_examples"] == 100
    train = {r for r, _ in decoded_rows(t, t.train_set(0))}
    test = {r for r, _ in decoded_rows(t, t.eval_sets(0)[""])}
    assert len(train) == 15 and len(test) == 5 and not train & test
    assert train | test == {tuple(ids_of(tokenizer, row_text(i))) for i in range(20)}
    again = build(csv_file, tokenizer, seq_len=12, num_train_examples=100, num_test_examples=5)
    assert torch.equal(again.eval_sets(0)[""].inputs, t.eval_sets(0)[""].inputs)
    assert torch.equal(again.train_set(0).inputs, t.train_set(0).inputs)
    other = {r for r, _ in decoded_rows(t, t.eval_sets(1)[""])}
    assert other != test
    small = build(csv_file, tokenizer, seq_len=12, num_train_examples=4, num_test_examples=5)
    assert len(small.train_set(0)) == 4 and small.num_train_examples == 4
    assert not {r for r, _ in decoded_rows(small, small.train_set(0))} & test


def test_string_labels_map_to_sorted_ids(csv_file, tokenizer):
    t = build(csv_file, tokenizer, seq_len=12, num_test_examples=5)
    assert t.label_names == ["neg", "neutral", "pos"]
    labels = ["neg", "pos", "neutral"]
    truth = {tuple(ids_of(tokenizer, row_text(i))): t.label_names.index(labels[i % 3])
             for i in range(20)}
    for b in (t.train_set(0), t.eval_sets(0)[""]):
        for ids, cls in decoded_rows(t, b):
            assert truth[ids] == cls


def test_integer_labels_sort_as_numbers(tmp_path, tokenizer):
    rows = [{"text": row_text(i), "label": [10, 2, 7][i % 3]} for i in range(9)]
    t = build(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, seq_len=12,
              num_test_examples=3)
    assert t.label_names == [2, 7, 10]
    as_csv = write_csv(tmp_path / "d.csv", [(r["text"], r["label"]) for r in rows])
    assert build(as_csv, tokenizer, seq_len=12, num_test_examples=3).label_names == [2, 7, 10]
    for ids, cls in decoded_rows(t, t.train_set(0)):
        i = next(i for i in range(9) if tuple(ids_of(tokenizer, row_text(i))) == ids)
        assert t.label_names[cls] == rows[i]["label"]


def test_jsonl_with_other_columns_and_split_files(tmp_path, tokenizer):
    rows = [{"review": row_text(i), "sentiment": i % 2, "id": i} for i in range(10)]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    t = build(f, tokenizer, seq_len=12, text_column="review", label_column="sentiment",
              num_test_examples=4)
    assert len(t.train_set(0)) == 6 and len(t.eval_sets(0)[""]) == 4
    folder = tmp_path / "pair"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"text": row_text(i), "label": "a" if i % 2 else "b"}
                                         for i in range(8)])
    write_csv(folder / "test.csv", [(row_text(i), "b") for i in range(8, 11)])
    p = build(str(folder), tokenizer, seq_len=12)
    assert p.label_names == ["a", "b"] and p.layout == "files"
    assert (p.num_train_examples, p.num_test_examples) == (8, 3)
    assert {c for _, c in decoded_rows(p, p.eval_sets(0)[""])} == {1}


def test_folder_subsets_are_seeded(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=16, num_train_examples=3, num_test_examples=2)
    a, b = decoded_rows(t, t.train_set(0)), decoded_rows(t, t.train_set(0))
    assert a == b and len(a) == 3 and len(set(a)) == 3
    assert set(a) <= expected(tokenizer, "train", t.label_names)
    draws = {tuple(decoded_rows(t, t.train_set(s))) for s in range(6)}
    assert len(draws) > 1
    assert len(t.eval_sets(0)[""]) == 2


def test_test_rows_equal_to_training_rows_are_dropped(tmp_path, tokenizer):
    rows = [(row_text(i), i % 2) for i in range(6)] + [(row_text(0), 0)] * 6
    t = build(write_csv(tmp_path / "dup.csv", rows), tokenizer, seq_len=12,
              num_test_examples=6)
    train = {r for r, _ in decoded_rows(t, t.train_set(0))}
    test = decoded_rows(t, t.eval_sets(0)[""])
    assert len(test) < 6 and not {r for r, _ in test} & train


def test_sample_and_train_batch_draw_training_rows_only(csv_file, tokenizer):
    t = build(csv_file, tokenizer, seq_len=12, num_test_examples=5)
    train = set(decoded_rows(t, t.train_set(0)))
    for b in (t.sample(32, 0), t.train_batch(32, 3, 0)):
        assert set(decoded_rows(t, b)) <= train
    assert not torch.equal(t.train_batch(32, 0, 0).inputs, t.train_batch(32, 1, 0).inputs)


# -- the pad id ----------------------------------------------------------------------------
def test_pad_id_choice(tmp_path, imdb):
    plain = make_tokenizer(tmp_path / "plain.json")
    assert build(imdb, plain).pad_id == Tokenizer.from_file(plain).token_to_id("<pad>")
    eos = make_tokenizer(tmp_path / "eos.json", ("<unk>", "<pad>", "<|endoftext|>"))
    assert build(imdb, eos).pad_id == Tokenizer.from_file(eos).token_to_id("<|endoftext|>")
    bare = make_tokenizer(tmp_path / "bare.json", ("<unk>",))
    assert build(imdb, bare).pad_id == 0
    configured = Tokenizer.from_file(plain)
    configured.enable_padding(pad_id=3, pad_token=configured.id_to_token(3), length=12)
    configured.enable_truncation(max_length=3)
    configured.save(str(tmp_path / "padded.json"))
    t = build(imdb, str(tmp_path / "padded.json"), seq_len=16)
    assert t.pad_id == 3
    # the file's own padding (to 12) and truncation (to 3) are switched off: same rows as
    # without them
    assert sorted(decoded_rows(t, t.train_set(0))) == \
        sorted(expected(plain, "train", t.label_names))
    saved = tmp_path / "saved"                   # a save_pretrained directory
    saved.mkdir()
    make_tokenizer(saved / "tokenizer.json", ("<unk>", "<pad>", "<|endoftext|>", "[PAD]"))
    (saved / "tokenizer_config.json").write_text(json.dumps({"pad_token": "[PAD]"}))
    assert build(imdb, str(saved)).pad_id == 3


# -- mean pooling --------------------------------------------------------------------------
def test_mean_pool_head_is_the_masked_mean_at_the_target(imdb, tokenizer):
    t = build(imdb, tokenizer, seq_len=16, pool="mean")
    assert t.readout == "cumulative_mean" and not t.pooled
    assert tasks.task_class(NAME).readout == "per_position"   # the class keeps the default
    torch.manual_seed(0)
    head = make_head(t, 8)
    assert isinstance(head, CumulativeMeanHead)
    b = t.train_set(0)
    h = torch.randn(len(b), t.seq_len, 8)
    logits = head(h)
    assert logits.shape == (len(b), t.seq_len, t.num_classes)
    mask = (b.inputs != t.pad_id).float()[..., None]
    pooled = head.out((h * mask).sum(1) / mask.sum(1))
    at_target = logits[b.targets != IGNORE]
    torch.testing.assert_close(at_target, pooled, rtol=1e-5, atol=1e-5)
    h2 = h.clone()
    h2[mask[..., 0] == 0] = 100.0                              # padding must not matter
    torch.testing.assert_close(head(h2)[b.targets != IGNORE], at_target)


def test_last_pool_head_is_per_position(imdb, tokenizer):
    head = make_head(build(imdb, tokenizer, seq_len=16), 8)
    assert type(head) is torch.nn.Linear and head.out_features == 2


# -- training ---------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["last", "mean"])
def test_tiny_model_trains(imdb, tokenizer, pool):
    from tasks.metrics import loss
    from workbench.train.compose import build_model

    t = build(imdb, tokenizer, seq_len=8, pool=pool)
    torch.manual_seed(0)
    model = build_model(t, "lstm", d_model=16, n_layers=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = t.train_set(0)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        value = loss(model(x), y)
        value.backward()
        opt.step()
        losses.append(value.item())
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


# -- errors --------------------------------------------------------------------------------
def test_bad_paths_name_the_path(tmp_path, imdb, tokenizer, csv_file):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="nowhere.*expected an aclImdb"):
        build(missing, tokenizer)
    os.rename(os.path.join(imdb, "test", "neg"), str(tmp_path / "moved"))
    with pytest.raises(ValueError, match=r"missing: .*test/neg"):
        build(imdb, tokenizer)
    os.rename(str(tmp_path / "moved"), os.path.join(imdb, "test", "neg"))
    for f in os.listdir(os.path.join(imdb, "train", "pos")):
        os.remove(os.path.join(imdb, "train", "pos", f))
    with pytest.raises(ValueError, match=r"train/pos.*no \.txt files"):
        build(imdb, tokenizer)
    lonely = tmp_path / "lonely"
    (lonely / "train" / "pos").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"lonely/test.* is missing"):
        build(str(lonely), tokenizer)
    with pytest.raises(ValueError, match=r"data\.csv.*no column 'review'"):
        build(csv_file, tokenizer, text_column="review")
    with pytest.raises(ValueError, match=r"data\.csv.*no column 'y'"):
        build(csv_file, tokenizer, label_column="y")
    empty = write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(ValueError, match="empty.csv.*no examples"):
        build(empty, tokenizer)
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="blank.jsonl.*no examples"):
        build(str(tmp_path / "blank.jsonl"), tokenizer)
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl.*line 2"):
        build(str(tmp_path / "bad.jsonl"), tokenizer)
    one = write_csv(tmp_path / "one.csv", [("a good film", "pos")])
    with pytest.raises(ValueError, match="one.csv.*at least 2"):
        build(one, tokenizer)
    same = write_csv(tmp_path / "same.csv", [("a good film", "pos"), ("a bad film", "pos")])
    with pytest.raises(ValueError, match="same.csv.*single value in column 'label'"):
        build(same, tokenizer)
    unlabelled = write_csv(tmp_path / "blank_label.csv", [("a good film", "pos"), ("a", "")])
    with pytest.raises(ValueError, match="blank_label.csv.*row 2.*empty 'label'"):
        build(unlabelled, tokenizer)
    (tmp_path / "data.txt").write_text("hello")
    with pytest.raises(ValueError, match="data.txt.*neither .csv nor .jsonl"):
        build(str(tmp_path / "data.txt"), tokenizer)
    pair = tmp_path / "pair"
    pair.mkdir()
    write_csv(pair / "train.csv", [("a good film", "pos"), ("a bad film", "neg")])
    with pytest.raises(ValueError, match="pair.*no test file"):
        build(str(pair), tokenizer)
    write_csv(pair / "test.csv", [("a good film", "great")])
    with pytest.raises(ValueError, match="test.csv.*'great'"):
        build(str(pair), tokenizer)


def test_bad_tokenizer_and_parameters(tmp_path, imdb, tokenizer):
    with pytest.raises(ValueError, match="no tokenizer file.*absent.json"):
        build(imdb, str(tmp_path / "absent.json"))
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match=r"ckpt/tokenizer\.json.*save_pretrained"):
        build(imdb, str(tmp_path / "ckpt"))
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="broken.json"):
        build(imdb, str(tmp_path / "broken.json"))
    with pytest.raises(ValueError, match="tokenizer"):
        tasks.build(NAME, data_path=imdb)
    with pytest.raises(ValueError, match="data_path"):
        tasks.build(NAME, tokenizer=tokenizer)
    for bad in (dict(pool="max"), dict(seq_len=0), dict(num_train_examples=0),
                dict(num_test_examples=0), dict(seq_len="64"), dict(text_column="")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build(imdb, tokenizer, **bad)
    with pytest.raises(TypeError, match="vocab_size"):
        build(imdb, tokenizer, vocab_size=10)


def test_missing_tokenizers_library_names_the_extra(monkeypatch, imdb, tokenizer):
    monkeypatch.setitem(sys.modules, "tokenizers", None)   # import now fails
    with pytest.raises(ImportError, match=r"ssm-workbench\[pretrained\]"):
        build(imdb, tokenizer)


def test_registered_with_documented_parameters():
    assert NAME in tasks.names() and "\n" not in tasks.describe(NAME)
    assert tasks.parameters(NAME) == {
        "data_path": None, "tokenizer": None, "seq_len": 512, "text_column": "text",
        "label_column": "label", "num_train_examples": 20000, "num_test_examples": 1000,
        "pool": "last", "num_valid_examples": None}


def test_a_test_set_made_only_of_training_duplicates_is_an_error(tmp_path, tokenizer):
    path = tmp_path / "same.csv"
    write_csv(path, [("the same review", "pos" if i % 2 else "neg") for i in range(10)])
    task = build(str(path), tokenizer, num_train_examples=6, num_test_examples=4)
    with pytest.raises(ValueError, match="every test example .* is also a training example"):
        task.eval_sets(0)
