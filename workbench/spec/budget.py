"""Training budgets in tokens, FLOPs or tokens per parameter, turned into optimizer steps.

A step trains ``batch_size x seq_len`` tokens (every input position runs forward and
backward; the run's ``seq_len``, else its task's default length). For one run:

- ``train.tokens = T``: steps = ceil(T / tokens per step).
- ``train.flops = C``: steps = ceil(C / (flops_per_token x tokens per step)), with
  flops_per_token the composed model's training FLOPs per token as the run records it
  (workbench.train.compute): ``models.flops`` of the backbone at the run's length (6N plus
  each family's term) plus 6 x the task encoder's and head's Linear weights per token (the
  de-embedding, which Chinchilla counts; a pooled head once per sequence). So the run's
  ``train/flops`` at its last step is the budget, up to one step.
- ``train.tokens_per_param = r``: tokens = r x N, steps = ceil(tokens / tokens per step),
  with N the backbone's **non-embedding** parameters (``models.flops(...).params
  .non_embedding``: Kaplan et al. 2020's N; the task's token embedding and head are left
  out). Chinchilla's "about 20 tokens per parameter" (Hoffmann et al. 2022) was fitted with
  parameters counted *with* their embeddings (Pearce & Song 2024 trace part of the
  Kaplan/Chinchilla gap to that difference): at tiny sizes, where the embedding is most of
  the model, N here is much smaller than the total and the budget correspondingly shorter.

Steps round up, so a run trains at least its budget, by less than one step. The RunSpec
keeps the budget asked (``train.tokens`` ...) and records what it became in its
``budget``: ``{"asked": {key: value}, "steps", "tokens_per_step", "tokens", "flops_per_token",
"flops", "params_non_embedding"}``; the worker's plan takes ``budget["steps"]``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from workbench.spec.schema import STEP_BUDGETS, ProfileError


@lru_cache(maxsize=256)
def _task(name: str, params_json: str):
    import tasks

    return tasks.build(name, **json.loads(params_json))


@lru_cache(maxsize=256)
def _count(model: str, seq_len: int, d_model: int, n_layers: int, options_json: str,
           task_name: str, task_json: str) -> tuple[float | None, int | None, str]:
    """(flops_per_token of the composed model, non-embedding parameters, why not)."""
    import torch.nn as nn

    import models
    from models.compute import TRAIN_FACTOR
    from tasks.heads import make_encoder, make_head
    from workbench.spec.compose_options import split_options

    backbone_opts, _ = split_options(json.loads(options_json))
    try:
        c = models.flops(model, seq_len, d_model=d_model, n_layers=n_layers, **backbone_opts)
    except Exception as e:  # e.g. a pretrained entry whose folder is not here
        return None, None, f"{type(e).__name__}: {e}"
    task = _task(task_name, task_json)
    try:  # the ends need the vocabulary: a pretrained tokenizer absent here (offline) has none
        ends = [models.registry.build_for_shapes(lambda f=f: f(task, d_model)) for f in (make_encoder, make_head)]
    except (ValueError, OSError, ImportError) as e:
        return None, c.params.non_embedding, str(e).splitlines()[0]
    w = [sum(m.in_features * m.out_features for m in e.modules() if isinstance(m, nn.Linear)) for e in ends]
    head = TRAIN_FACTOR * 2.0 * w[1]
    if getattr(task, "readout", "per_position") != "per_position":
        head /= seq_len
    return c.total + TRAIN_FACTOR * 2.0 * w[0] + head, c.params.non_embedding, ""


def run_budget(train, *, model: str, d_model: int, n_layers: int, options: dict[str, Any],
               task: str, task_params: dict[str, Any]) -> dict[str, Any] | None:
    """The budget record of one run (see the module docstring), or None when its train
    section gives steps or epochs. ProfileError when it cannot be turned into steps."""
    kind = next((k for k in STEP_BUDGETS if getattr(train, k, None) is not None), None)
    if kind is None:
        return None
    asked = getattr(train, kind)
    tp = json.dumps(task_params, sort_keys=True)
    L = task_params.get("seq_len")
    if L is None:
        L = getattr(_task(task, tp), "seq_len", None)
        if not isinstance(L, int):
            raise ProfileError(f"train.{kind}: task {task!r} has no sequence length to count tokens "
                               f"by; give train.steps or train.epochs")
    per_step = train.batch_size * L
    fpt, params, why = _count(model, L, d_model, n_layers, json.dumps(options, sort_keys=True), task, tp)
    if kind == "tokens":
        tokens = asked
    elif kind == "tokens_per_param":
        if params is None:
            raise ProfileError(f"train.tokens_per_param: no parameter count for {model!r} ({why})")
        tokens = asked * params
    else:
        if fpt is None:
            raise ProfileError(f"train.flops: no FLOP count for {model!r} ({why})")
        tokens = asked / fpt
    steps = max(1, math.ceil(tokens / per_step - 1e-9))
    if train.warmup_steps > steps:
        raise ProfileError(f"train.warmup_steps = {train.warmup_steps} is longer than the whole run: "
                           f"train.{kind} = {asked:,} is {steps} step(s) of {per_step:,} tokens for "
                           f"{model} (d_model {d_model}, {n_layers} layers)")
    return {"asked": {kind: asked}, "steps": steps, "tokens_per_step": per_step, "seq_len": L,
            "tokens": steps * per_step, "flops_per_token": fpt,
            "flops": None if fpt is None else fpt * steps * per_step, "params_non_embedding": params}


def run_compute(spec) -> dict[str, Any] | None:
    """What one run (a RunSpec) trains, whatever its budget, for ``run --dry-run``: its
    ``budget`` record when it has one; for ``train.steps`` the same keys (``asked`` is
    ``{"steps": n}``); for ``train.epochs`` only ``flops_per_token`` (and ``seq_len``,
    ``params_non_embedding``): the tokens of an epoch are known once the data is. None
    when the run has no sequence length to count tokens by. ``flops_per_token`` is None
    (``why`` says why) where the model or the task's ends cannot be counted here (a
    pretrained checkpoint or tokenizer that is absent)."""
    if spec.budget:
        return spec.budget
    tp = json.dumps(spec.task_params, sort_keys=True)
    L = spec.seq_len if spec.seq_len is not None else getattr(_task(spec.task, tp), "seq_len", None)
    if not isinstance(L, int):
        return None
    fpt, params, why = _count(spec.model, L, spec.d_model, spec.n_layers,
                              json.dumps(spec.model_options, sort_keys=True), spec.task, tp)
    out: dict[str, Any] = {"seq_len": L, "flops_per_token": fpt, "params_non_embedding": params}
    if why:
        out["why"] = why
    steps = spec.train.steps
    if steps is None:
        out["asked"] = {"epochs": spec.train.epochs}
        return out
    per_step = spec.train.batch_size * L
    out.update({"asked": {"steps": steps}, "steps": steps, "tokens_per_step": per_step,
                "tokens": steps * per_step, "flops": None if fpt is None else fpt * steps * per_step})
    return out
