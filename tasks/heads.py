"""Input encoders and output heads that a task needs around a backbone.

The worker composes ``encoder -> backbone -> head``; what the encoder and head must be is
a property of the task, so they are built here from the task's attributes:

- ``make_encoder(task, d_model)``: ``nn.Embedding(vocab_size, d_model)`` for token inputs
  ``(batch, length)`` long, ``nn.Linear(input_dim, d_model)`` for continuous inputs
  ``(batch, length, input_dim)``.
- ``make_head(task, d_model)``: maps the backbone output ``h: (batch, length, d_model)`` to
  logits shaped like the targets plus a class axis, according to ``task.readout``:

  * ``per_position``: ``(batch, length, num_classes)``;
  * ``pooled``: mean over positions, then linear: ``(batch, num_classes)``;
  * ``decode_from_last``: ``h[:, -1]`` plus a learned position embedding for every position,
    through a two-layer GELU MLP, then linear: ``(batch, length, num_classes)``. Only the
    last position's state reaches the decoder, so the backbone must compress the sequence
    into it (MAD's compression task; its AutoEncoder decodes the same way);
  * ``cumulative_mean``: linear on the running mean of ``h`` over positions ``0..t``:
    ``(batch, length, num_classes)``. With the target at an example's last real token and
    the padding after it (``tasks.text_classification``), that is mean pooling over exactly
    the real tokens, with no mask.

These carry no positional information into the backbone: position handling belongs to the
backbone (e.g. the Transformer's own positional encoding).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tasks.base import READOUTS, Task


class LastPositionDecoder(nn.Module):
    """h: (batch, length, d_model) -> logits (batch, length, num_classes) from h[:, -1] only."""

    def __init__(self, d_model: int, seq_len: int, num_classes: int):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.mlp = nn.Sequential(
            nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU(),
            nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU(),
            nn.LayerNorm(d_model), nn.Linear(d_model, num_classes),
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        L = h.shape[1]
        if L > self.pos.shape[0]:
            raise ValueError(f"sequence length {L} exceeds the decoder's {self.pos.shape[0]}")
        z = h[:, -1:, :] + self.pos[:L][None]           # (batch, length, d_model)
        return self.mlp(z)


class MeanPoolHead(nn.Module):
    """h: (batch, length, d_model) -> logits (batch, num_classes)."""

    def __init__(self, d_model: int, num_classes: int):
        super().__init__()
        self.out = nn.Linear(d_model, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h.mean(dim=1))


class CumulativeMeanHead(nn.Module):
    """h: (batch, length, d_model) -> logits (batch, length, num_classes), where the logits at
    position t are ``Linear(mean(h[:, :t + 1]))``."""

    def __init__(self, d_model: int, num_classes: int):
        super().__init__()
        self.out = nn.Linear(d_model, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # a linear map commutes with the mean: project first, so the running sum runs over
        # num_classes values, not d_model; in float32, since a bf16 sum over hundreds of
        # positions would lose the small differences the classifier reads
        z = nn.functional.linear(h, self.out.weight).float()
        count = torch.arange(1, h.shape[1] + 1, device=h.device, dtype=torch.float32)
        return z.cumsum(dim=1) / count[None, :, None] + self.out.bias.float()


def make_encoder(task: Task, d_model: int) -> nn.Module:
    if task.input_dim:
        return nn.Linear(task.input_dim, d_model)
    if not task.vocab_size:
        raise ValueError(f"task {task.name} declares neither vocab_size nor input_dim")
    return nn.Embedding(task.vocab_size, d_model)


def make_head(task: Task, d_model: int) -> nn.Module:
    readout = task.readout
    if readout not in READOUTS:
        raise ValueError(f"task {task.name}: unknown readout {readout!r}")
    if readout == "pooled":
        return MeanPoolHead(d_model, task.num_classes)
    if readout == "decode_from_last":
        return LastPositionDecoder(d_model, task.seq_len, task.num_classes)
    if readout == "cumulative_mean":
        return CumulativeMeanHead(d_model, task.num_classes)
    return nn.Linear(d_model, task.num_classes)
