"""Train / valid / test by document: a deterministic hash of each document's key.

A document goes whole to one split, so no text is both trained on and evaluated on, and
the assignment depends only on the document itself: the same on every machine, for every
tokenizer, and unchanged for the other documents when one is added or removed (the rule
of hash-split corpora such as C4's validation carving). Identical documents share a key
and therefore a split. ``u = blake2b(key) / 2**64``; ``u < test`` is test, ``u < test +
valid`` valid, the rest train.

One exception: a key that is a :class:`PinnedKey` names its split itself. The slices of a
single text file cut by position (tasks/lm/sources.py, ``document = "position"``: the
first ``1 - valid - test`` of its bytes train, the next ``valid`` valid, the last ``test``
test, as nanoGPT cuts its one ``input.txt``) are such documents: their split is where they
lie in the file, not a hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

SPLITS = ("train", "valid", "test")


class PinnedKey(bytes):
    """A document key whose split is given (``.split``), not drawn from its hash."""

    split: str

    def __new__(cls, value: bytes, split: str):
        if split not in SPLITS:
            raise ValueError(f"lm: a pinned split is one of {', '.join(SPLITS)}, got {split!r}")
        key = super().__new__(cls, value)
        key.split = split
        return key


@dataclass(frozen=True)
class SplitRule:
    valid_fraction: float
    test_fraction: float

    def __post_init__(self) -> None:
        for name in ("valid_fraction", "test_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"lm: {name} must be a number in (0, 1), got {v!r}")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ValueError("lm: valid_fraction + test_fraction must leave documents to train on")

    def identity(self) -> dict:
        return {"rule": "blake2b-64-of-document-key", "valid": self.valid_fraction,
                "test": self.test_fraction}

    def of(self, key: bytes) -> str:
        if isinstance(key, PinnedKey):
            return key.split
        u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2.0 ** 64
        if u < self.test_fraction:
            return "test"
        if u < self.test_fraction + self.valid_fraction:
            return "valid"
        return "train"
