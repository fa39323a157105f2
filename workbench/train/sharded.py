"""Fully sharded data parallelism (``train.sharding = "fsdp"``) for a run on several ranks.

Under DDP (workbench/train/distributed.py) every rank holds the whole model, its gradients
and Adam's two moments: 16 bytes per fp32 parameter on each device. Under FSDP (torch's
FSDP2, ``torch.distributed.fsdp.fully_shard``) each rank keeps 1/N of every parameter, of
its gradient and of its optimizer state (dim-0 shards, DTensors), and gathers one block's
whole weights just before that block's forward or backward, dropping them again after.

The unit of sharding is a block of the backbone: each element of the backbone's outermost
``nn.ModuleList``s (``ResidualStack.layers`` and ``.mlps``, Mamba's layers, a hybrid's
blocks), then the rest (encoder, head, final norm, positions) as the root's unit.

Everything around the training step sees whole tensors, so the run's files do not depend
on how it was sharded:

- :func:`full_state` gathers the whole model and optimizer state dicts, in the plain
  formats of one process (``module.state_dict()``, ``optimizer.state_dict()`` with integer
  parameter ids), onto rank 0's CPU; every rank takes part (all-gathers). Checkpoints hold
  these, so a run resumes from them on any number of ranks, under DDP or FSDP, and a
  finished run's weights load like any other run's.
- :func:`load_optimizer` puts such a whole optimizer state into a sharded optimizer (each
  rank keeps its own shard; no communication: every rank read the same checkpoint).
- Evaluation runs on rank 0 alone (as under DDP), on a plain replica of the model that
  :func:`full_state`'s weights are loaded into (a sharded forward would need every rank).

The step stays the one-process step: a rank's loss is its shard's summed loss over the
global batch's targets (``distributed.shard_loss``), so the gradients are *summed*
across ranks: the reduce-scatter uses SUM and no divide factor (FSDP2 averages by
default; gloo has no PREMUL_SUM, so the sum is forced).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch
from torch import nn

from workbench.train.stop import RunFailed

CHOICES = ("ddp", "fsdp")


def blocks(backbone: nn.Module) -> list[nn.Module]:
    """The backbone's blocks: the elements (with parameters) of its outermost ModuleLists,
    in order; none when it has no ModuleList (the backbone is then one unit)."""
    out: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.ModuleList):
                out.extend(c for c in child if next(c.parameters(), None) is not None)
            else:
                visit(child)

    visit(backbone)
    return out


def units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded each as one unit, innermost first, the model last (its own
    unit holds every parameter no block holds)."""
    backbone = getattr(model, "backbone", model)
    inner = blocks(backbone) or ([backbone] if backbone is not model else [])
    return [*inner, model]


def _check_unshared(parts: list[nn.Module]) -> None:
    """A parameter in two blocks (weights shared across layers) cannot be sharded per
    block: one line naming it, before FSDP's own error."""
    seen: dict[int, int] = {}
    for i, m in enumerate(parts[:-1]):
        for name, p in m.named_parameters():
            if seen.setdefault(id(p), i) != i:
                raise RunFailed(f"train.sharding = \"fsdp\": parameter {name} is shared between blocks "
                                f"{seen[id(p)]} and {i} of the backbone, which FSDP cannot shard per block; "
                                f"use sharding = \"ddp\"")


def shard(model: nn.Module, device: torch.device, world: int) -> nn.Module:
    """Shard ``model`` in place across the default process group's ``world`` ranks, per
    block (:func:`units`), with summed gradients; returns it. Every rank must call this
    with the same weights (the same seed, or the same checkpoint loaded)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    parts = units(model)
    _check_unshared(parts)
    # FSDP2 warns that the root returns a view (an in-place op on it would skip a hook); the
    # trainer only reads the logits (distributed.shard_loss)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # attributes of the parameters (Mamba's A_log/D ``_no_weight_decay``, read by
    # optim.param_groups): fully_shard replaces each parameter by a new DTensor one
    marks = {name: dict(vars(p)) for name, p in model.named_parameters() if vars(p)}
    mesh = init_device_mesh(device.type, (world,))
    for m in parts:
        fully_shard(m, mesh=mesh)
    for name, p in model.named_parameters():
        for k, v in marks.get(name, {}).items():
            setattr(p, k, v)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def _whole(t, keep: bool):
    """A state value as a whole CPU tensor on the rank that keeps it (None elsewhere); a
    DTensor's gather is a collective, so every rank calls this in the same order."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().to("cpu", copy=True) if keep else None


def _values(d: dict, keep: bool) -> dict:
    return {k: _whole(v, keep) for k, v in d.items()}


def full_state(model: nn.Module, opt: torch.optim.Optimizer | None, keep: bool
               ) -> tuple[dict | None, dict | None]:
    """(model state dict, optimizer state dict), whole, on the CPU, in one process's
    formats, where ``keep`` (rank 0); ``(None, None)`` elsewhere. A collective: every rank
    calls it at the same point (``opt`` None on all: the weights only)."""
    msd = _values(model.state_dict(), keep)
    osd = None
    if opt is not None:
        raw = opt.state_dict()  # {"state": {param id: {...}}, "param_groups": [...]}, ids as one process's
        state = {i: _values(raw["state"][i], keep) for i in sorted(raw["state"])}
        osd = {"state": state, "param_groups": raw["param_groups"]}
    return (msd, osd) if keep else (None, None)


def _params(opt: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for g in opt.param_groups:
        yield from g["params"]


def load_optimizer(opt: torch.optim.Optimizer, whole: dict) -> None:
    """Load a whole optimizer state dict (one process's format, from any checkpoint) into
    ``opt``, whose parameters are DTensor shards: each state tensor shaped like its
    parameter becomes this rank's shard of it (cut locally, no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = list(_params(opt))
    state = {}
    for i, st in whole["state"].items():
        p = params[int(i)]
        state[i] = {k: (distribute_tensor(v.to(p.device, p.dtype), p.device_mesh, p.placements,
                                          src_data_rank=None)
                        if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape
                        else v)
                    for k, v in st.items()}
    opt.load_state_dict({"state": state, "param_groups": whole["param_groups"]})


def local_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (its shards under FSDP, else everything)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in model.parameters())
