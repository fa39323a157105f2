"""Accuracy, defined once for every task and every table.

- token accuracy: correct predictions / positions with a target (target != IGNORE),
  pooled over all sequences of the evaluation set (micro average);
- sequence accuracy (exact match): sequences whose every targeted position is right /
  sequences with at least one target.

For sequence classification (one label per sequence) the two coincide, and so they do for
tasks with one target per sequence (induction heads: the last position only).

The loss is the mean cross-entropy (nats) over the same targeted positions; the training
loss is the same quantity on training batches. Where the tasks put targets is documented in
each task module (``tasks.describe(name)`` and the module docstring).

How published benchmarks compare with these definitions (compare like with like):

- MAD (Poli et al. 2024): accuracy over the recall / copy target positions, micro-averaged:
  our token accuracy. MAD *trains* on every next token of the recall tasks but scores only
  the targets; we train on the targets only (tasks/mad.py). Its compression reference also
  scores the compression token itself (a free point); ours does not.
- Zoology MQAR (Arora et al. 2023): accuracy over query positions, micro-averaged: our token
  accuracy. Its per-kv-pairs numbers are our ``"kv=D"`` eval sets.
- Mamba paper selective copying / induction heads (Gu & Dao 2023): accuracy on the copied
  tokens / the final token: our token accuracy. Their "solved" means near 100%, i.e. also
  our sequence accuracy.
- Sequential image classification (sequential MNIST/CIFAR, LRA Image): plain accuracy over
  test images (micro), our token accuracy. Macro-averaged (per-class mean) accuracy differs
  on class-imbalanced sets; digits and CIFAR-10 test sets are (near) balanced, so the two
  agree to within a fraction of a point there, but we never report macro averages.
- Character-level LMs report loss in nats per character (nanoGPT) or bits per character
  (loss / ln 2; ``task.extra_metrics`` -> ``bits_per_char``), not accuracy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass
class AccuracyCounts:
    token_correct: int = 0
    token_total: int = 0
    seq_correct: int = 0
    seq_total: int = 0
    loss_sum: float = 0.0  # summed cross-entropy over targeted positions

    def add(self, other: "AccuracyCounts") -> None:
        self.token_correct += other.token_correct
        self.token_total += other.token_total
        self.seq_correct += other.seq_correct
        self.seq_total += other.seq_total
        self.loss_sum += other.loss_sum

    @property
    def token_accuracy(self) -> float:
        return self.token_correct / self.token_total if self.token_total else float("nan")

    @property
    def sequence_accuracy(self) -> float:
        return self.seq_correct / self.seq_total if self.seq_total else float("nan")

    @property
    def loss(self) -> float:
        return self.loss_sum / self.token_total if self.token_total else float("nan")


def counts(logits: torch.Tensor, targets: torch.Tensor) -> AccuracyCounts:
    """logits: (batch, length, classes) or (batch, classes); targets: (batch, length) or (batch,)."""
    if targets.dim() == 1:  # one label per sequence
        targets = targets[:, None]
        logits = logits[:, None, :]
    mask = targets != IGNORE
    pred = logits.argmax(-1)
    right = (pred == targets) & mask
    has_target = mask.any(dim=1)
    seq_right = (right.sum(1) == mask.sum(1)) & has_target
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
        ignore_index=IGNORE, reduction="sum",
    )
    return AccuracyCounts(
        token_correct=int(right.sum()),
        token_total=int(mask.sum()),
        seq_correct=int(seq_right.sum()),
        seq_total=int(has_target.sum()),
        loss_sum=float(loss),
    )


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over targeted positions (the training loss)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE
    )
