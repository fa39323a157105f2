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
from workbench.spec.compose_options import check_compose_options


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


def resolve_init(task, model_name: str, init_scheme: str | None = None, init_std: float | None = None,
                 tie_embeddings: bool | None = None) -> dict[str, Any]:
    """The init choice a run gets: the profile's, else the model's reference scheme.

    Returns ``{"init_scheme", "init_std", "tie_embeddings"}``. An unset ``tie_embeddings`` follows
    the scheme (``mamba`` and ``hf`` tie, as their reference LM heads do) where the task
    can tie (token inputs, per-position outputs over the same vocabulary).
    """
    from models.init_schemes import DEFAULT_STD

    check_compose_options({"init_scheme": init_scheme, "init_std": init_std,
                           "tie_embeddings": tie_embeddings})
    scheme = init_scheme if init_scheme is not None else models.entry(model_name).init
    std = DEFAULT_STD if init_std is None else float(init_std)
    if tie_embeddings is None:
        tie_embeddings = scheme != "torch" and task_can_tie(task)
    return {"init_scheme": scheme, "init_std": std, "tie_embeddings": bool(tie_embeddings)}


def task_can_tie(task) -> bool:
    return (not getattr(task, "input_dim", None) and task.readout == "per_position"
            and bool(task.vocab_size) and task.num_classes == task.vocab_size)


def build_model(task, model_name: str, d_model: int = 64, n_layers: int = 2, *,
                init_scheme: str | None = None, init_std: float | None = None,
                tie_embeddings: bool | None = None, **options: Any) -> SequenceModel:
    """Compose ``task``'s encoder and head around backbone ``model_name``, then initialise.

    ``init_scheme`` / ``init_std`` / ``tie_embeddings``: see :func:`resolve_init` and
    ``models.init_schemes``; the resolved choice is ``model.init_choice``.
    """
    from models.init_schemes import apply_init, tie
    from tasks.heads import make_encoder, make_head

    choice = resolve_init(task, model_name, init_scheme, init_std, tie_embeddings)
    backbone = models.build(model_name, d_model=d_model, n_layers=n_layers, **options)
    pretrained = getattr(backbone, "token_embedding", None)
    if pretrained is not None:
        # a checkpoint brings its own width and token embedding (models.pretrained)
        d_model, encoder = backbone.d_model, pretrained
        del backbone.token_embedding
        if task.vocab_size and task.vocab_size > encoder.num_embeddings:
            raise ValueError(f"the task's vocabulary ({task.vocab_size} tokens) is larger than "
                             f"the checkpoint's embedding ({encoder.num_embeddings}): tokenise "
                             "with the checkpoint's own tokenizer")
    else:
        encoder = make_encoder(task, d_model)
    # the head owns the readout (per position, mean-pooled, or decoded from the last state)
    model = SequenceModel(encoder, backbone, make_head(task, d_model))
    if pretrained is not None:
        # only the head is new (PyTorch's init); everything else is the checkpoint's
        choice = {**choice, "init_scheme": "pretrained", "tie_embeddings": False}
    else:
        apply_init(model, choice["init_scheme"], choice["init_std"])
    if choice["tie_embeddings"]:
        model.head = tie(model.encoder, model.head)
    model.init_choice = choice
    return model
