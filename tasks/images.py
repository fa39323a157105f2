"""Sequential image classification: scikit-learn digits (default) or CIFAR-10 (``path``).

- digits (no ``path``): ``sklearn.datasets.load_digits`` (1 797 images, 8x8, 16 grey levels,
  10 classes; ships with scikit-learn, no download). An image is a sequence of 64 pixels in
  row-major order, ``input_dim = 1``, values scaled to [0, 1]. The split is a seeded
  permutation: ``num_test_examples`` (default 360, i.e. 20%) test images, the rest (or
  ``num_train_examples`` of them) training images. Test images whose pixels equal a training
  image's are dropped (the digits set holds a few exact duplicates), so the test set may be
  a few images smaller than asked.
- CIFAR-10 (``path`` = a directory in the standard python-pickle layout: ``data_batch_1`` ..
  ``data_batch_5``, ``test_batch``; or a Hugging Face Hub dataset id such as
  ``uoft-cs/cifar10``, read with ``datasets`` through the standard cache, tasks/hub_data.py:
  its ``train`` / ``test`` splits, an ``img`` or ``image`` column of 32x32 RGB images and a
  ``label`` column): the official 50 000 / 10 000 split. Pixels are scaled to
  [0, 1] and normalised per channel with the usual CIFAR-10 mean / std; an image becomes 64
  non-overlapping 4x4 patches in row-major patch order, each flattened (row, column,
  channel) into 48 values: ``input_dim = 48``. ``augment = true`` applies, per training
  batch (``augment_batch``), a random crop of the 4-pixel zero-padded image and a random
  horizontal flip (p = 0.5), seeded by (seed, step).

Validation (``valid_set``): carved out of the training images by seed, never a test
image. The training images of a seed are the first ones of a seeded permutation of the
training pool (digits: the images left after the test split; CIFAR-10: its 50 000 training
images); the validation images are the ``num_valid_examples`` images that follow them in the
same permutation, so no image is in both. By default (``None``) it uses only images that
training does not use: min(``num_test_examples``, pool - training images), which is 0 when
training uses the whole pool (``num_train_examples = 0``, the default), so the training
set never changes by default. An explicit ``num_valid_examples`` takes that many (at most
pool - 1) and, where the pool is too small for both, shrinks the training set to make
room. Digits: validation images whose pixels equal a training or test image are dropped,
so it may be a few smaller.

Readout ``pooled``: one label per sequence, the head mean-pools the backbone output over
positions and classifies. Accuracy is plain (micro) accuracy over test images; some
published tables on sequential CIFAR use the same, none of the ones we reproduce use
macro-averaged accuracy.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from models import hub
from tasks import hub_data
from tasks.base import TRAIN_STREAM, Batch, Task, check_bool, check_int, rng_for
from tasks.registry import register

CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
PATCH = 4


def to_patches(images: np.ndarray | torch.Tensor, patch: int = PATCH):
    """(n, H, W, C) -> (n, (H/p)(W/p), p*p*C), row-major over patches, (row, col, ch) inside."""
    n, H, W, C = images.shape
    x = images.reshape(n, H // patch, patch, W // patch, patch, C)
    x = x.transpose(2, 3) if isinstance(x, torch.Tensor) else x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (H // patch) * (W // patch), patch * patch * C)


def from_patches(x: torch.Tensor, H: int = 32, W: int = 32, C: int = 3, patch: int = PATCH):
    """Inverse of :func:`to_patches` for a torch tensor (n, L, p*p*C) -> (n, H, W, C)."""
    n = x.shape[0]
    x = x.reshape(n, H // patch, W // patch, patch, patch, C).transpose(2, 3)
    return x.reshape(n, H, W, C)


def load_cifar10(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, test_x, test_y); x uint8 (n, 32, 32, 3)."""
    def read(name):
        f = os.path.join(path, name)
        if not os.path.isfile(f):
            raise ValueError(f"CIFAR-10 directory {path!r} lacks {name} (expected the python "
                             "pickle layout: data_batch_1..5, test_batch)")
        with open(f, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return x, np.asarray(d[b"labels"], np.int64)

    parts = [read(f"data_batch_{i}") for i in range(1, 6)]
    tx, ty = read("test_batch")
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), tx, ty)


def load_cifar10_hub(value: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, test_x, test_y) of a Hub dataset laid out as CIFAR-10; x uint8
    (n, 32, 32, 3)."""
    what = "CIFAR-10 dataset"
    ds = hub_data.load(value, what=what)
    out = []
    for split in ("train", "test"):
        part = hub_data.split_of(ds, (split,), value, what)
        column = next((c for c in ("img", "image") if c in part.column_names), None)
        if column is None or "label" not in part.column_names:
            raise ValueError(f"sequential_image: {value} needs an 'img' or 'image' column and a 'label' "
                             f"column (columns: {', '.join(part.column_names)})")
        x = np.stack([np.asarray(im.convert("RGB"), np.uint8) for im in part[column]])
        if x.shape[1:] != (32, 32, 3):
            raise ValueError(f"sequential_image: {value} holds {x.shape[1]}x{x.shape[2]} images; "
                             "CIFAR-10 is 32x32")
        out += [x, np.asarray(part["label"], np.int64)]
    return out[0], out[1], out[2], out[3]


@register
class SequentialImage(Task):
    name = "sequential_image"
    description = (
        "Sequential image classification: sklearn digits as 64 pixels (default), or CIFAR-10 "
        "from path as 64 4x4 patches; mean-pooled head, one label per image."
    )
    readout = "pooled"
    pooled = True
    fixed_train = True

    def __init__(self, path: str | None = None, augment: bool = False,
                 num_train_examples: int = 0, num_test_examples: int | None = None,
                 num_valid_examples: int | None = None):
        self.path = path
        self.augment = check_bool("augment", augment)
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 0)
        self.num_classes = 10
        if path is None:
            if self.augment:
                raise ValueError("augment applies to CIFAR-10 only (flips and crops change "
                                 "what a digit is)")
            from sklearn.datasets import load_digits
            d = load_digits()
            self._x = (d.images.astype(np.float32) / 16.0)[:, :, :, None]   # (n, 8, 8, 1)
            self._y = d.target.astype(np.int64)
            self.num_test_examples = check_int(
                "num_test_examples", 360 if num_test_examples is None else num_test_examples,
                1, len(self._y) - 1)
            self.seq_len, self.input_dim = 64, 1
        else:
            if hub.is_hub_id(path):
                tx, ty, vx, vy = load_cifar10_hub(path)
            elif not isinstance(path, str) or not os.path.isdir(path):
                raise ValueError(f"sequential_image: path {path!r} is not a directory (nor a "
                                 "Hugging Face Hub dataset id)")
            else:
                tx, ty, vx, vy = load_cifar10(path)
            self._cifar = (tx, ty, vx, vy)
            self.num_test_examples = check_int(
                "num_test_examples", len(vy) if num_test_examples is None else num_test_examples,
                1, len(vy))
            self.seq_len, self.input_dim = 64, PATCH * PATCH * 3
        self._params = dict(path=path, augment=augment, num_train_examples=num_train_examples,
                            num_test_examples=num_test_examples,
                            num_valid_examples=num_valid_examples)
        # the training pool: what the training and validation images are drawn from
        pool = len(self._y) - self.num_test_examples if path is None else len(self._cifar[1])
        n_train = min(self.num_train_examples or pool, pool)
        if num_valid_examples is None:
            self.num_valid_examples = min(self.num_test_examples, pool - n_train)
        else:
            self.num_valid_examples = check_int("num_valid_examples", num_valid_examples, 0,
                                                pool - 1)
        self._n_train = min(n_train, pool - self.num_valid_examples)

    # -- data -----------------------------------------------------------------------
    def _encode(self, images: np.ndarray) -> np.ndarray:
        if self.path is None:
            return images.reshape(len(images), 64, 1)
        x = (images.astype(np.float32) / 255.0 - CIFAR_MEAN) / CIFAR_STD
        return to_patches(x)

    def _split(self, seed: int):
        """(train_idx, test_idx) into the digits arrays, or CIFAR's own split."""
        if self.path is None:
            perm = rng_for(seed, 3).permutation(len(self._y))
            test, train = perm[: self.num_test_examples], perm[self.num_test_examples:]
            seen = {self._x[i].tobytes() for i in train}
            test = np.array([i for i in test if self._x[i].tobytes() not in seen], np.int64)
        else:
            train = rng_for(seed, 3).permutation(len(self._cifar[1]))
            test = np.arange(self.num_test_examples)
        return np.sort(train[: self._n_train]), test

    def _valid_idx(self, seed: int) -> np.ndarray:
        """Indices of the validation images (into the digits arrays or CIFAR's training
        images): the ones after the training images in the seed's pool permutation."""
        stop = self._n_train + self.num_valid_examples
        if self.path is None:
            valid = rng_for(seed, 3).permutation(len(self._y))[self.num_test_examples:]
            valid = valid[self._n_train: stop]
            train, test = self._split(seed)
            seen = {self._x[i].tobytes() for i in (*train, *test)}
            valid = np.array([i for i in valid if self._x[i].tobytes() not in seen], np.int64)
        else:
            valid = rng_for(seed, 3).permutation(len(self._cifar[1]))[self._n_train: stop]
        return np.sort(valid)

    def valid_set(self, seed):
        return self.sample_indices(self._valid_idx(seed))

    def train_set(self, seed):
        train, _ = self._split(seed)
        if self.path is None:
            return self._to_batch(self._encode(self._x[train]), self._y[train])
        tx, ty, _, _ = self._cifar
        return self._to_batch(self._encode(tx[train]), ty[train])

    def eval_sets(self, seed):
        _, test = self._split(seed)
        if self.path is None:
            return {"": self._to_batch(self._encode(self._x[test]), self._y[test])}
        _, _, vx, vy = self._cifar
        return {"": self._to_batch(self._encode(vx[test]), vy[test])}

    def sample(self, batch_size, seed=0):
        # draw from this seed's training split only
        train, _ = self._split(seed)
        rng = rng_for(seed, TRAIN_STREAM, 1)
        idx = train[rng.integers(0, len(train), size=batch_size)]
        if self.path is None:
            return self._to_batch(self._encode(self._x[idx]), self._y[idx])
        tx, ty, _, _ = self._cifar
        return self._to_batch(self._encode(tx[idx]), ty[idx])

    def train_batch(self, batch_size, step, seed):
        train, _ = self._split(seed)
        rng = rng_for(seed, TRAIN_STREAM, 2, step)
        idx = train[rng.integers(0, len(train), size=batch_size)]
        b = self.sample_indices(idx)
        return self.augment_batch(b, step, seed)

    def sample_indices(self, idx) -> Batch:
        if self.path is None:
            return self._to_batch(self._encode(self._x[idx]), self._y[idx])
        tx, ty, _, _ = self._cifar
        return self._to_batch(self._encode(tx[idx]), ty[idx])

    # -- augmentation -----------------------------------------------------------------
    def augment_batch(self, batch: Batch, step: int, seed: int) -> Batch:
        """Random 4-pixel-padded crop + horizontal flip per image (CIFAR, augment=True)."""
        if not self.augment:
            return batch
        rng = rng_for(seed, TRAIN_STREAM, 3, step)
        n = len(batch)
        img = from_patches(batch.inputs)                           # (n, 32, 32, 3)
        padded = torch.nn.functional.pad(img, (0, 0, 4, 4, 4, 4))  # zero = channel mean
        dy, dx = rng.integers(0, 9, size=n), rng.integers(0, 9, size=n)
        flip = rng.random(n) < 0.5
        out = torch.empty_like(img)
        for i in range(n):
            crop = padded[i, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
            out[i] = crop.flip(1) if flip[i] else crop
        return Batch(to_patches(out), batch.targets)
