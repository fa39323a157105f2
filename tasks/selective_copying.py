"""Copying and selective copying, in two published token layouts, from one generator.

Both layouts are "M data tokens somewhere in a region, then M positions where they must be
written out in order". :func:`copying_examples` builds both; the four tasks only choose
the region length, the special tokens and whether the data positions are random.

Paper format (S4 / Mamba, Gu & Dao 2023, Fig. 2 and App. E.1; the S4 repository's copying
data loader). Vocabulary V: noise token 0, data tokens 1..V-2, marker token V-1. With
``seq_len = L`` (the number of noise positions, as in the papers) a sequence has
``L + 2M`` tokens:

    [L noise tokens with the M data tokens inserted]  [marker x M]
     \\________________ L + M positions ____________/

- ``selective_copying``: the M data positions are a uniformly random subset of the first
  L + M positions (order kept). Needs content-based selection: a time-invariant (LTI) model
  cannot know where the data are.
- ``copying``: the data occupy the first M positions (fixed spacing); solvable by a
  time-invariant convolution, the contrast the Mamba paper draws.

MAD format (Poli et al. 2024, mad-lab ``generate_copying_instance``). Vocabulary V: data
tokens 0..V-3, blank V-2, copy token V-1. A sequence has exactly ``seq_len = L`` tokens:

    [M data tokens with L-2M-1 blanks inserted] [copy] [blank x M]

- ``mad_selective_copying``: blanks inserted among the data (data order kept). With
  ``placement = "mad"`` (default) exactly as mad-lab's generator does it: each blank goes
  in front of a uniformly chosen data token (``np.insert`` at indices in [0, M)), so no
  blank ever follows the last data token, which always sits right before the copy token,
  and the gaps are multinomial. ``placement = "uniform"``: the data at a uniformly random
  ordered subset of the region (the last data token anywhere; a harder task).
- ``mad_copying``: data first, then the blanks.

Targets (both formats): IGNORE everywhere except the last M positions, whose targets are the
M data tokens in their original order. Loss and accuracy are taken only there. The model
sees all data tokens before the first target position (they lie in the region), and no
input position after the region carries a data token (markers/blanks only), so nothing of
the answer leaks into the answer positions. Token accuracy = fraction of the M copied
tokens right; sequence accuracy = all M right. (MAD reports token accuracy on these
positions as well; the Mamba paper's Table 1 reports accuracy on the copied tokens.)

Differences from the published generators: MAD draws the blank positions from numpy's
unseeded global RNG (``np.random.randint``) so its data are not reproducible; here every
draw comes from the task's seeded generator (same distribution, other numbers). Training data: a fixed set of ``num_train_examples`` examples (MAD: 12 800) or,
with ``num_train_examples = 0``, fresh batches every step (the Mamba paper's setting).
"""
from __future__ import annotations

import numpy as np

from tasks.base import Task, check_int
from tasks.metrics import IGNORE
from tasks.registry import register


def copying_examples(
    n: int, rng: np.random.Generator, *, region_len: int, num_tokens_to_copy: int,
    data_low: int, data_high: int, filler: int, separator: tuple[int, ...], tail: int,
    placement: str,
) -> tuple[np.ndarray, np.ndarray]:
    """n copying examples: inputs and targets of shape (n, region_len + len(separator) + M).

    region_len: positions holding the M data tokens among ``filler`` tokens;
    data tokens are drawn uniformly from [data_low, data_high);
    separator: tokens between region and the answer positions (MAD: the copy token);
    tail: the input token at the M answer positions (paper: marker, MAD: blank);
    placement: where the data sit in the region, in order:
      ``first``   its first M positions;
      ``uniform`` a uniformly random M-subset of its positions;
      ``mad``     mad-lab's rule: each of the region_len - M fillers is inserted in front
                  of a uniformly chosen data token, so the last data token ends the region.
    """
    m = num_tokens_to_copy
    length = region_len + len(separator) + m
    data = rng.integers(data_low, data_high, size=(n, m))
    inputs = np.full((n, length), filler, dtype=np.int64)
    if placement == "uniform":
        # a uniform random M-subset of the region per row (argsort of iid keys), kept in order
        keys = rng.random((n, region_len))
        slots = np.sort(np.argpartition(keys, m - 1, axis=1)[:, :m], axis=1) if m < region_len \
            else np.broadcast_to(np.arange(m), (n, m))
    elif placement == "mad":
        # filler j goes in front of data token idx[j]: token i is preceded by the fillers
        # with idx <= i, so it sits at (that count) + i
        idx = rng.integers(0, m, size=(n, region_len - m))
        rows = np.arange(n)[:, None]
        counts = np.bincount((rows * m + idx).ravel(), minlength=n * m).reshape(n, m)
        slots = np.cumsum(counts, axis=1) + np.arange(m)
    elif placement == "first":
        slots = np.broadcast_to(np.arange(m), (n, m))
    else:
        raise ValueError(f"unknown placement {placement!r}")
    np.put_along_axis(inputs, np.ascontiguousarray(slots), data, axis=1)
    for i, tok in enumerate(separator):
        inputs[:, region_len + i] = tok
    inputs[:, length - m:] = tail
    targets = np.full((n, length), IGNORE, dtype=np.int64)
    targets[:, length - m:] = data
    return inputs, targets


class _CopyingBase(Task):
    selective: bool = True
    paper_format: bool = True

    def __init__(self, seq_len, vocab_size, num_tokens_to_copy, num_train_examples,
                 num_test_examples, placement: str | None = None, num_valid_examples=None):
        self.placement = placement or ("uniform" if self.selective else "first")
        self.num_tokens_to_copy = m = check_int("num_tokens_to_copy", num_tokens_to_copy, 1)
        self.vocab_size = check_int("vocab_size", vocab_size, 3)
        seq_len = check_int("seq_len", seq_len, 1)
        if not self.paper_format and seq_len < 2 * m + 1:
            raise ValueError(
                f"seq_len ({seq_len}) must be >= 2 * num_tokens_to_copy + 1 ({2 * m + 1}) "
                "in the MAD format (data, copy token and answer positions must fit)"
            )
        self.num_train_examples = check_int("num_train_examples", num_train_examples, 0)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 1)
        self.fixed_train = self.num_train_examples > 0
        self._params = dict(
            seq_len=seq_len, vocab_size=vocab_size, num_tokens_to_copy=m,
            num_train_examples=num_train_examples, num_test_examples=num_test_examples,
        )
        V = self.vocab_size
        if self.paper_format:
            # seq_len counts the noise positions; the model sees L + 2M tokens
            self.seq_len = seq_len + 2 * m
            self._layout = dict(region_len=seq_len + m, data_low=1, data_high=V - 1,
                                filler=0, separator=(), tail=V - 1)
        else:
            self.seq_len = seq_len
            self._layout = dict(region_len=seq_len - m - 1, data_low=0, data_high=V - 2,
                                filler=V - 2, separator=(V - 1,), tail=V - 2)
        self.num_classes = V
        self._set_valid(num_valid_examples)

    def _generate(self, n, rng):
        return copying_examples(n, rng, num_tokens_to_copy=self.num_tokens_to_copy,
                                placement=self.placement, **self._layout)


_PAPER_DOC = (" seq_len = L noise positions (the model sees L + 2M tokens); vocab_size includes"
              " noise (0) and marker (V-1); num_train_examples = 0 draws fresh batches.")


class _PaperCopying(_CopyingBase):
    """The Mamba paper format's parameters and defaults, one signature for both of its tasks
    (they differ only in ``selective``; the registry reads the parameters from it)."""
    paper_format = True

    def __init__(self, seq_len: int = 4096, vocab_size: int = 16, num_tokens_to_copy: int = 16,
                 num_train_examples: int = 0, num_test_examples: int = 256,
                 num_valid_examples: int | None = None):
        super().__init__(seq_len, vocab_size, num_tokens_to_copy, num_train_examples,
                         num_test_examples, num_valid_examples=num_valid_examples)


@register
class SelectiveCopying(_PaperCopying):
    name = "selective_copying"
    description = (
        "Selective copying (Mamba paper format): M data tokens at random positions among L "
        "noise tokens, then M markers; predict the data in order at the markers (loss there only)."
    )
    __doc__ = description + _PAPER_DOC
    selective = True


@register
class Copying(_PaperCopying):
    name = "copying"
    description = (
        "Copying (Mamba paper format): M data tokens first, then L noise tokens, then M "
        "markers; predict the data in order at the markers (fixed spacing: LTI-solvable)."
    )
    __doc__ = description + _PAPER_DOC
    selective = False


@register
class MADSelectiveCopying(_CopyingBase):
    name = "mad_selective_copying"
    description = (
        "MAD selective copying: M data tokens scattered among blanks, then a copy token and "
        "M blanks; predict the data tokens in order at the last M positions (loss/accuracy "
        "there only)."
    )
    selective, paper_format = True, False

    def __init__(self, seq_len: int = 256, vocab_size: int = 16, num_tokens_to_copy: int = 16,
                 num_train_examples: int = 12_800, num_test_examples: int = 1_280,
                 placement: str = "mad", num_valid_examples: int | None = None):
        if placement not in ("mad", "uniform"):
            raise ValueError(f"placement must be 'mad' (mad-lab's generator) or 'uniform', "
                             f"got {placement!r}")
        super().__init__(seq_len, vocab_size, num_tokens_to_copy, num_train_examples,
                         num_test_examples, placement, num_valid_examples)
        self._params["placement"] = placement


@register
class MADCopying(_CopyingBase):
    name = "mad_copying"
    description = (
        "MAD copying: M data tokens, then blanks, a copy token and M blanks; predict the data "
        "in order at the last M positions (fixed spacing)."
    )
    selective, paper_format = False, False

    def __init__(self, seq_len: int = 256, vocab_size: int = 16, num_tokens_to_copy: int = 16,
                 num_train_examples: int = 12_800, num_test_examples: int = 1_280,
                 num_valid_examples: int | None = None):
        super().__init__(seq_len, vocab_size, num_tokens_to_copy, num_train_examples,
                         num_test_examples, num_valid_examples=num_valid_examples)
