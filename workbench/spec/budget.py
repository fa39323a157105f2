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
- ``train.bytes = B`` (bytes of UTF-8 text; the ``lm`` task): tokens = B / b, with b the
  tokenizer's bytes per token on the training split (its token files' counts: the split's
  text bytes / its tokens, end-of-text tokens included as the training windows hold them),
  steps = ceil(tokens / tokens per step). So every tokenizer of a comparison sees the same
  text, where a budget in tokens gives a BPE of ~4 bytes a token ~4x the text of ``bytes``.
  b is known once the corpus is tokenised: the spec's budget keeps ``steps`` None and the
  worker resolves it when it prepares the data (:func:`resolve_bytes`; recorded in the
  run's info as ``budget``), the dry run shows it from the prepared cache when present
  (:func:`run_compute`), else says it is resolved at launch.
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
"flops", "params_non_embedding"}`` (a bytes budget: ``bytes_per_token`` too, and ``steps``,
``tokens``, ``flops`` None until resolved); the worker's plan takes ``budget["steps"]``.
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
    if kind == "bytes":
        if not hasattr(_task(task, tp), "train_bytes_per_token"):
            raise ProfileError(f"train.bytes: task {task!r} has no text to count bytes of (only the lm "
                               f"task's corpus has); give train.tokens or train.steps")
        return {"asked": {kind: asked}, "steps": None, "tokens_per_step": per_step, "seq_len": L,
                "tokens": None, "bytes_per_token": None, "flops_per_token": fpt, "flops": None,
                "params_non_embedding": params}
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


def resolve_bytes(budget: dict[str, Any], bytes_per_token: float, warmup_steps: int = 0) -> dict[str, Any]:
    """A ``train.bytes`` budget record with its steps filled in from the tokenizer's bytes
    per token on the training split: steps = ceil(bytes / bytes_per_token / tokens per
    step), at least one; ``tokens``, ``flops`` and ``bytes`` (the text those steps cover,
    at that rate) follow. ValueError, in one line, when the rate is not positive or the
    warm-up is longer than the steps."""
    asked = budget["asked"]["bytes"]
    if not bytes_per_token > 0:
        raise ValueError(f"train.bytes: the training split has no text ({bytes_per_token} bytes per token)")
    per_step = budget["tokens_per_step"]
    steps = max(1, math.ceil(asked / bytes_per_token / per_step - 1e-9))
    if warmup_steps > steps:
        raise ValueError(f"train.warmup_steps = {warmup_steps} is longer than the whole run: train.bytes = "
                         f"{asked:,} at {bytes_per_token:.4g} bytes per token is {steps} step(s) of "
                         f"{per_step:,} tokens")
    fpt = budget.get("flops_per_token")
    tokens = steps * per_step
    return {**budget, "steps": steps, "tokens": tokens, "bytes_per_token": bytes_per_token,
            "bytes": tokens * bytes_per_token, "flops": None if fpt is None else fpt * tokens}


def cached_bytes_per_token(spec) -> float | None:
    """A run's bytes per token on its training split from the prepared token cache when
    its corpus was tokenised already (the lm task's ``cached_train_bytes_per_token``), else
    None; tokenises nothing."""
    task = _task(spec.task, json.dumps(spec.task_params, sort_keys=True))
    peek = getattr(task, "cached_train_bytes_per_token", None)
    return peek() if peek is not None else None


def run_compute(spec) -> dict[str, Any] | None:
    """What one run (a RunSpec) trains, whatever its budget, for ``run --dry-run``: its
    ``budget`` record when it has one (a ``train.bytes`` budget resolved from the prepared
    token cache when present, ``resolved = "prepared cache"``; else its steps stay None,
    resolved at launch); for ``train.steps`` the same keys (``asked`` is
    ``{"steps": n}``); for ``train.epochs`` only ``flops_per_token`` (and ``seq_len``,
    ``params_non_embedding``): the tokens of an epoch are known once the data is. None
    when the run has no sequence length to count tokens by. ``flops_per_token`` is None
    (``why`` says why) where the model or the task's ends cannot be counted here (a
    pretrained checkpoint or tokenizer that is absent)."""
    if spec.budget:
        if spec.budget.get("steps") is None and "bytes" in spec.budget.get("asked", {}):
            bpt = cached_bytes_per_token(spec)
            if bpt:
                try:
                    return {**resolve_bytes(spec.budget, bpt), "resolved": "prepared cache"}
                except ValueError:
                    pass
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
