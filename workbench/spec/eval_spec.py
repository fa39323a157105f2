"""What an evaluation run is before it runs: its stored spec (``kind = "eval"``).

``ssm-workbench eval`` and an eval profile (workbench/spec/eval_profile.py) build the same
spec here, so the same settings find the same run; workbench/train/eval_run.py runs it.
"""
from __future__ import annotations

import json
from typing import Any

KIND = "eval"
TASK = "lm-eval"  # the runs table's task column for an evaluation run
DEFAULTS: dict[str, Any] = {
    "tasks": [], "include": [], "limit": None, "num_fewshot": None, "batch_size": 8,
    "device": "auto", "dtype": "float32", "max_length": None, "backend": "auto",
    "max_gen_toks": 256, "bootstrap_iters": 100000, "seed": 0,
    # ranks, each holding the model, that lm-eval splits the documents between
    # (workbench/train/eval_run.py); the numbers are one rank's, so spec_key ignores it
    "devices": 1,
}
# where lm-eval's own files go (its results JSON, and with log_samples its per-document JSONL
# per task, as ``lm_eval --output_path DIR --log_samples`` writes them): kept in the spec only
# when asked for, and left out of its identity (run_spec.spec_key): they change no number
OUTPUTS: dict[str, Any] = {"output_path": None, "log_samples": False}


def eval_spec(model: str, tasks: list[str], *, profile: str = "eval", label: str | None = None,
              store_root: str | None = None, allow_unfinished: bool = False, **options: Any) -> dict:
    """The stored spec of an evaluation of ``model`` (a hub id, a folder, or ``run:N``) on
    ``tasks``; ``options`` are :data:`DEFAULTS`' and :data:`OUTPUTS`' keys (unknown ones are
    an error; an output folder is stored only when given, as an absolute path by the caller).
    ``allow_unfinished``: a ``run:N`` that has not finished may be scored at its last
    checkpoint (``eval --allow-unfinished``, ``[eval] allow_unfinished``); kept in the spec
    only when given, so the specs (and the stored runs they find) of every other evaluation
    stay as they were. :func:`at_checkpoint` then records which step is scored."""
    bad = sorted(set(options) - set(DEFAULTS) - set(OUTPUTS))
    if bad:
        raise ValueError(f"eval: unknown option(s) {', '.join(bad)}; known: {', '.join([*DEFAULTS, *OUTPUTS])}")
    if not tasks:
        raise ValueError("eval: no tasks given")
    outputs = {k: options.pop(k) for k in OUTPUTS if k in options}
    if outputs.get("log_samples") and not outputs.get("output_path"):
        raise ValueError("eval: log_samples writes lm-eval's per-document files into output_path: give output_path too")
    cfg = {**DEFAULTS, **options, "tasks": list(tasks)}
    if outputs.get("output_path"):  # unset outputs stay out: every other spec stays as it was
        cfg["output_path"] = str(outputs["output_path"])
        if outputs.get("log_samples"):
            cfg["log_samples"] = True
    cfg["include"] = [str(p) for p in cfg["include"]]
    if cfg["limit"] is not None and not cfg["limit"] > 0:
        raise ValueError(f"eval: limit must be > 0, not {cfg['limit']}")
    devices = cfg["devices"]
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"eval: devices must be an integer >= 1, not {devices!r}")
    if int(cfg["batch_size"]) < 1:
        raise ValueError(f"eval: batch_size must be >= 1, not {cfg['batch_size']}")
    if allow_unfinished:
        cfg["allow_unfinished"] = True
    label = label or model
    return {"kind": KIND, "profile": profile, "model": model, "label": label, "task": TASK,
            "seq_len": None, "seed": int(cfg["seed"]), "index": 0, "eval": cfg,
            "fields": {"model": label, "task": TASK, "seed": int(cfg["seed"]), "checkpoint": model}}


def at_checkpoint(spec: dict, step: int) -> dict:
    """``spec`` (an evaluation of an unfinished ``run:N``) as the evaluation of that run's
    checkpoint at ``step``: the step is in its settings (``eval.checkpoint_step``: the run
    checks it loads that step, workbench/train/eval_run.py) and in its label and checkpoint
    column (``run:1@step660``), so it is its own run of the store, never the same cached
    answer as the finished run's evaluation, and never shown as the run's result."""
    import re

    out = json.loads(json.dumps(spec))
    out["eval"]["checkpoint_step"] = int(step)
    out["eval"]["allow_unfinished"] = True
    tag = f"@step{int(step)}"
    out["label"] = re.sub(r"@step\d+$", "", out["label"]) + tag  # a step given before is replaced
    out["fields"]["model"] = out["label"]
    out["fields"]["checkpoint"] = f"{spec['model']}{tag}"
    return out


def finished_form(spec: dict) -> dict:
    """``spec`` without ``allow_unfinished``: what an evaluation of a run that has finished
    is, asked with the flag or not (the same stored run answers both)."""
    out = json.loads(json.dumps(spec))
    out["eval"].pop("allow_unfinished", None)
    out["eval"].pop("checkpoint_step", None)
    return out
