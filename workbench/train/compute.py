"""A run's compute: FLOPs per token of the composed model and the training FLOPs so far.

``models.compute`` counts a backbone (Kaplan's non-embedding convention). A run trains the
composed model (task encoder + backbone + head), so it records:

- ``flops_per_token``: training FLOPs (forward + backward) per input token of the composed
  model: the backbone's count at the run's input length, plus 6 x the weights of the
  encoder's and head's ``nn.Linear`` applied per token (a per-position vocabulary head: the
  de-embedding, which Chinchilla counts; an embedding lookup costs no FLOPs). A pooled or
  last-state head runs once per sequence: its weights count 6 / L per token.
- ``flops_per_token_backbone``: the backbone's alone (``models.flops``; what
  ``ssm-workbench models`` and docs/RESULTS.md tabulate).
- ``train_flops`` at a step = flops_per_token x tokens processed = flops_per_token x
  step x batch_size x input length: every input position runs forward and backward,
  whether or not it carries a target (``tokens_trained`` counts targets only).
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn

import models.compute as mc


def input_len(trainer) -> int:
    """The model's input length in this run: the training set's, else one drawn example's."""
    task = trainer.task
    if task.fixed_train:
        return int(trainer.train_data().inputs.shape[1])
    inputs, _ = task.sample(1, seed=trainer.spec.seed)
    return int(inputs.shape[1])


def _linear_weights(module: nn.Module) -> int:
    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def model_compute(model, seq_len: int, per_position_head: bool = True) -> dict[str, Any]:
    """The compute fields of a composed model (``SequenceModel``) at input length ``seq_len``."""
    backbone = mc.count(model.backbone, seq_len)
    enc = mc.TRAIN_FACTOR * 2.0 * _linear_weights(model.encoder)
    head = mc.TRAIN_FACTOR * 2.0 * _linear_weights(model.head)
    if not per_position_head:
        head /= seq_len
    return {"flops_per_token": backbone.total + enc + head,
            "flops_per_token_backbone": backbone.total,
            "flops_seq_len": seq_len,
            "params_non_embedding": backbone.params.non_embedding}


def run_compute(trainer) -> dict[str, Any]:
    """The run's compute fields (cached on the trainer): see the module docstring."""
    cached = getattr(trainer, "_compute", None)
    if cached is None:
        try:
            per_position = getattr(trainer.task, "readout", "per_position") == "per_position"
            cached = model_compute(trainer.model, input_len(trainer), per_position)
            cached["tokens_per_step"] = trainer.cfg.batch_size * cached["flops_seq_len"]
        except Exception as e:  # counting never fails a run: it says why it has no count
            cached = {"flops_error": f"{type(e).__name__}: {e}"}
        trainer._compute = cached
    return cached


def train_flops(trainer, step: int) -> float | None:
    """Training FLOPs after ``step`` optimizer steps (None where the model has no count)."""
    c = run_compute(trainer)
    if "flops_per_token" not in c:
        return None
    return c["flops_per_token"] * c["tokens_per_step"] * step


def flops_rows(trainer, step: int, epoch: float) -> list[tuple]:
    """The metric row a log point adds: ("train", "flops", cumulative training FLOPs)."""
    f = train_flops(trainer, step)
    return [] if f is None else [(step, epoch, "train", "flops", f)]
