"""Tests of the real-data tasks: character-level LM on a text file the test writes, and
sequential images (scikit-learn digits; CIFAR-10 from a fake directory in its pickle layout)."""
from __future__ import annotations

import math
import os
import pickle

import numpy as np
import pytest
import torch

import tasks
from tasks.metrics import AccuracyCounts


def np_batch(b):
    return b.inputs.numpy(), b.targets.numpy()


# ---------------------------------------------------------------------------------------
# character LM
# ---------------------------------------------------------------------------------------
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        * 6) + "ZQXJ tail of the file, only in the test part!\n" * 3


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "input.txt"
    p.write_text(TEXT, encoding="utf-8")
    return str(p)


def test_char_lm(text_file):
    t = tasks.build("char_lm", path=text_file, seq_len=16)
    assert t.chars == sorted(set(TEXT)) and t.vocab_size == len(t.chars)
    split = int(len(TEXT) * 0.9)
    b = t.train_batch(32, 0, seed=0)
    x, y = np_batch(b)
    assert x.shape == y.shape == (32, 16)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])      # next character everywhere
    for r in range(32):
        s = t.decode(np.append(x[r], y[r, -1]))
        assert s in TEXT[:split]
    ev = t.eval_sets(0)[""]
    ex, ey = np_batch(ev)
    assert ex.shape[0] == (len(TEXT) - split - 1) // 16
    joined = t.decode(ex.reshape(-1))
    assert joined == TEXT[split: split + len(joined)]         # contiguous test windows
    assert not torch.equal(b.inputs, t.train_batch(32, 1, seed=0).inputs)
    assert torch.equal(b.inputs, t.train_batch(32, 0, seed=0).inputs)
    assert len(ev) >= 3
    assert len(tasks.build("char_lm", path=text_file, seq_len=16,
                           num_test_examples=2).eval_sets(0)[""]) == 2
    t8 = tasks.build("char_lm", path=text_file, seq_len=16, train_fraction=0.5)
    assert len(t8.eval_sets(0)[""]) > len(ev)
    assert t.extra_metrics(AccuracyCounts(token_total=10, loss_sum=10 * math.log(2) * 1.5)) \
        == {"bits_per_char": pytest.approx(1.5)}


def test_char_lm_errors(text_file, tmp_path):
    with pytest.raises(ValueError, match="path"):
        tasks.build("char_lm")
    with pytest.raises(ValueError, match="no such file"):
        tasks.build("char_lm", path=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="seq_len"):
        tasks.build("char_lm", path=text_file, seq_len=10_000)
    with pytest.raises(TypeError, match="vocab"):
        tasks.build("char_lm", path=text_file, vocab_size=10)


# ---------------------------------------------------------------------------------------
# sequential images
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return tasks.build("sequential_image")


def test_digits(digits):
    t = digits
    assert t.pooled and t.input_dim == 1 and t.seq_len == 64 and t.num_classes == 10
    tr, te = t.train_set(0), t.eval_sets(0)[""]
    assert tr.inputs.shape[1:] == (64, 1) and tr.targets.shape == (len(tr),)
    assert 350 <= len(te) <= 360 and len(tr) + 360 == 1797
    assert 0 <= float(tr.inputs.min()) and float(tr.inputs.max()) <= 1
    train = {r.tobytes() for r in tr.inputs.numpy()}
    assert not any(r.tobytes() in train for r in te.inputs.numpy())
    assert set(te.targets.tolist()) == set(range(10))
    assert not torch.equal(te.inputs, t.eval_sets(1)[""].inputs)         # seeded split
    assert torch.equal(te.inputs, t.eval_sets(0)[""].inputs)
    small = tasks.build("sequential_image", num_train_examples=100, num_test_examples=50)
    assert len(small.train_set(0)) == 100 and len(small.eval_sets(0)[""]) <= 50
    with pytest.raises(ValueError, match="augment"):
        tasks.build("sequential_image", augment=True)


@pytest.fixture
def cifar_dir(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", 6) for i in range(1, 6)] + [("test_batch", 5)]:
        d = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
             b"labels": rng.integers(0, 10, size=n).tolist()}
        with open(tmp_path / name, "wb") as f:
            pickle.dump(d, f)
    return str(tmp_path)


def test_cifar_patches_and_augmentation(cifar_dir):
    from tasks.images import CIFAR_MEAN, CIFAR_STD, from_patches, load_cifar10
    t = tasks.build("sequential_image", path=cifar_dir)
    assert t.input_dim == 48 and t.seq_len == 64
    tr, te = t.train_set(0), t.eval_sets(0)[""]
    assert tr.inputs.shape == (30, 64, 48) and te.inputs.shape == (5, 64, 48)
    # patch k holds the 4x4 block at (k // 8, k % 8), (row, col, channel) inside
    _, _, vx, vy = load_cifar10(cifar_dir)
    img = (vx[0].astype(np.float32) / 255 - CIFAR_MEAN) / CIFAR_STD
    np.testing.assert_allclose(te.inputs[0, 8 * 2 + 3].numpy(), img[8:12, 12:16].reshape(-1),
                               rtol=1e-6)
    np.testing.assert_allclose(from_patches(te.inputs)[0].numpy(), img, rtol=1e-6)
    assert te.targets.tolist() == vy.tolist()
    assert torch.equal(t.augment_batch(tr, 0, 0).inputs, tr.inputs)     # augment off
    ta = tasks.build("sequential_image", path=cifar_dir, augment=True)
    a1, a2 = ta.augment_batch(tr, 0, 0), ta.augment_batch(tr, 0, 0)
    assert torch.equal(a1.inputs, a2.inputs) and not torch.equal(a1.inputs, tr.inputs)
    assert not torch.equal(a1.inputs, ta.augment_batch(tr, 1, 0).inputs)
    assert torch.equal(a1.targets, tr.targets)


def test_image_parameters(cifar_dir):
    assert set(tasks.parameters("sequential_image")) == {
        "path", "augment", "num_train_examples", "num_test_examples", "num_valid_examples"}
    t = tasks.build("sequential_image", path=cifar_dir, num_train_examples=7, num_test_examples=3)
    assert len(t.train_set(0)) == 7 and len(t.eval_sets(0)[""]) == 3
    with pytest.raises(ValueError, match="directory"):
        tasks.build("sequential_image", path=os.path.join(cifar_dir, "nope"))
    with pytest.raises(ValueError):
        tasks.build("sequential_image", path=cifar_dir, num_test_examples=6)


def test_cifar_augmentation_is_a_padded_crop_and_flip(cifar_dir):
    from tasks.images import from_patches
    ta = tasks.build("sequential_image", path=cifar_dir, augment=True)
    tr = ta.train_set(0)
    img = from_patches(tr.inputs)
    aug = from_patches(ta.augment_batch(tr, 3, 0).inputs)
    padded = torch.nn.functional.pad(img, (0, 0, 4, 4, 4, 4))
    flips = []
    for i in range(len(img)):
        found = [f for dy in range(9) for dx in range(9) for f in (False, True)
                 if torch.equal(aug[i], (lambda c: c.flip(1) if f else c)(
                     padded[i, dy:dy + 32, dx:dx + 32]))]
        assert found, f"image {i} is not a padded crop (+flip) of its source"
        flips.append(found[0])
    assert any(flips) and not all(flips)
