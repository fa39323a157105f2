"""The optimiser and the learning-rate schedule of a run (``train.optimizer``, ``lr``,
``betas``, ``weight_decay``, ``warmup_steps``, ``schedule``, ``min_lr_ratio``).

Parameter groups come from the parameters' own attributes: a parameter marked
``_no_weight_decay`` (Mamba's A_log and D, as in state-spaces/mamba) and every vector
(biases, norm gains) gets no weight decay.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from workbench.spec.schema import TrainSection

OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on parameters that opt out (A_log, D: ``_no_weight_decay``), on
    biases and on norm/gain vectors (ndim < 2); the rest decays."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if getattr(p, "_no_weight_decay", False) or p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, optimizer: str, lr: float, betas, weight_decay: float,
                   **extra) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay) or Adam (L2 added to the gradient), both with the same
    parameter groups (:func:`param_groups`); ``extra`` e.g. ``fused=True`` on CUDA."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer = {optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[optimizer](param_groups(model, weight_decay), lr=lr, betas=tuple(betas), **extra)


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` (or constant)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build(model: torch.nn.Module, cfg: "TrainSection", total: int, device: torch.device
          ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The run's optimiser (``fused`` on CUDA when every trainable parameter is a floating
    CUDA tensor) and its LR scheduler over ``total`` optimiser steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = ({"fused": True} if device.type == "cuda"
             and all(p.is_cuda and p.is_floating_point() for p in params) else {})
    opt = make_optimizer(model, cfg.optimizer, cfg.lr, cfg.betas, cfg.weight_decay, **fused)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total, cfg.warmup_steps, cfg.schedule, cfg.min_lr_ratio))
    return opt, sched
