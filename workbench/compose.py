"""A model = the task's encoder + a registry backbone + the task's head.

    inputs --encoder--> (batch, length, d_model) --backbone--> (batch, length, d_model)
           --head--> logits (batch, length, num_classes), or (batch, num_classes) when the
                     task is pooled (mean over positions, then a linear classifier)

Encoders and heads are the task's business (``tasks.heads``): token inputs use an
embedding table, continuous inputs (pixels, patches) a linear map; the head follows the
task's ``readout``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

import models


class SequenceModel(nn.Module):
    def __init__(self, encoder: nn.Module, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder, self.backbone, self.head = encoder, backbone, head

    def forward(self, inputs: torch.Tensor, chunk_len: int | None = None) -> torch.Tensor:
        """inputs: long (batch, length) or float (batch, length, input_dim) -> logits.

        ``chunk_len``: run the backbone chunk by chunk, carrying its recurrent state
        (only for backbones with ``forward_chunked``; memory then does not grow with length).
        """
        h = self.encoder(inputs)
        if chunk_len and hasattr(self.backbone, "forward_chunked"):
            h = self.backbone.forward_chunked(h, chunk_len)
        else:
            h = self.backbone(h)
        return self.head(h)

    @property
    def backend(self) -> str:
        return models.backend(self.backbone)

    def state_size(self) -> int | None:
        return models.state_size(self.backbone)

    def can_stream(self) -> bool:
        return hasattr(self.backbone, "forward_chunked")


def build_model(task, model_name: str, d_model: int = 64, n_layers: int = 2, **options: Any) -> SequenceModel:
    """Compose ``task``'s encoder and head around backbone ``model_name``."""
    from tasks.heads import make_encoder, make_head

    backbone = models.build(model_name, d_model=d_model, n_layers=n_layers, **options)
    # the head owns the readout (per position, mean-pooled, or decoded from the last state)
    return SequenceModel(make_encoder(task, d_model), backbone, make_head(task, d_model))
