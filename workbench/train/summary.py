"""What a run records about itself beyond its metric rows: the run's info at the start
(versions, device, backend, parameter counts, init choice) and, once training is over,
the final results: every eval set's accuracy and loss (the validation set as eval set
``valid``), then the run-level summary (eval set ``''``: step time, inference time,
throughput, peak memory, GPU utilisation, best accuracy and where it was reached).
The summary's ``wall_s`` is what marks a run's results as final
(``Store.has_final_results``), so it is written last.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

import models
from workbench import __version__
from workbench.train import compute, sysmon
from workbench.train.measure import peak_memory_mb
from workbench.train.stop import RunFailed
from workbench.train.trainer import Trainer


def versions() -> dict[str, str]:
    import numpy

    v = {"python": platform.python_version(), "torch": torch.__version__,
         "numpy": numpy.__version__, "ssm_workbench": __version__, "platform": platform.platform()}
    try:
        import mamba_ssm  # noqa: F401  (optional CUDA extra; import may fail on CPU)
        v["mamba_ssm"] = mamba_ssm.__version__
    except Exception:
        pass
    return v


def run_info(trainer: Trainer) -> dict[str, Any]:
    """The run's info once its model is built: versions, device, backend, parameters."""
    dev, model = trainer.device, trainer.model
    info = {
        "versions": versions(), "device": str(dev),
        "device_name": torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor() or "cpu",
        "backend": model.backend, "params_backbone": models.param_count(model.backbone),
        "params_total": models.param_count(model), "state_size": model.state_size(),
        "torch_threads": torch.get_num_threads(), "nvml": sysmon.nvml_status(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **model.init_choice,  # init scheme, std and tying as resolved for this run
        **compute.run_compute(trainer),  # flops_per_token (+ backbone's), at flops_seq_len
    }
    reason = getattr(sys.modules.get("models.kernels.selective_scan"), "cuda_unavailable_reason", None)
    if callable(reason):
        info["cuda_kernels"] = reason() or "available"
    return info


def record_final(store, run_id: int, trainer: Trainer, out: dict[str, Any], gpu_util: list[float],
                 gpu_mem: list[float], t_start: float) -> dict[str, Any]:
    """Evaluate on every eval set and the validation set, write their results, then the
    summary and the stop reason; returns the summary. ``out`` is ``trainer.train()``'s
    result; ``gpu_util``/``gpu_mem`` every attempt's NVML samples; ``t_start`` when this
    attempt's process began."""
    # final measurements on every eval set, and on the validation set as eval set "valid"
    # (what a grid is selected on; numpy-seeded from its own stream, after training)
    skipped, final = {}, dict(out["eval_sets"])
    valid = trainer.task.valid_set(trainer.spec.seed)
    if len(valid):
        final["valid"] = valid
    for name, batch in final.items():
        try:
            c = trainer.evaluate(batch)
        except RunFailed as e:
            skipped[name or "default"] = str(e)
            continue
        vals = {"accuracy": c.token_accuracy, "sequence_accuracy": c.sequence_accuracy,
                "loss": c.loss, "eval_sequences": c.seq_total}
        vals.update(trainer._extra(c, batch))
        store.set_results(run_id, vals, eval_set=name)
    default_eval = out["eval_sets"].get("") or next(iter(out["eval_sets"].values()))
    step_ms = statistics.median(trainer.timed_steps()) * 1000
    bs, L = trainer.cfg.batch_size, default_eval.inputs.shape[1]
    summary = {
        "step_time_ms": step_ms,
        "inference_ms": trainer.inference_ms(default_eval),
        "tokens_per_s": bs * L / (step_ms / 1000),
        "peak_mem_mb": max(trainer.before["peak_mem_mb"], peak_memory_mb(trainer.device)),
        "params": models.param_count(trainer.model.backbone),
        "params_trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "state_size": trainer.model.state_size(),
        "steps": out["steps"],
        "epochs": out["steps"] / out["per_epoch"] if out["per_epoch"] else None,
        "train_s": out["train_s"],
        "wall_s": trainer.before["wall_s"] + time.time() - t_start,
        "best_accuracy": max((h["accuracy"] for h in trainer.history
                              if not math.isnan(h["accuracy"])), default=None),
        "gpu_util_mean": statistics.mean(gpu_util) if gpu_util else None,
        "gpu_util_max": max(gpu_util) if gpu_util else None,
        "gpu_mem_peak_mb": max(gpu_mem) if gpu_mem else None,
    }
    # the epoch at which eval accuracy first reached its best value (papers report it)
    if summary["best_accuracy"] is not None:  # an empty eval set gives NaN accuracies
        best = summary["best_accuracy"]
        first = next(h for h in trainer.history if h["accuracy"] == best)
        summary["best_at_epoch"] = first["epoch"]
        summary["best_at_step"] = first["step"]
    if trainer.tokens_trained(out["steps"]) is not None:
        summary["tokens_trained"] = trainer.tokens_trained(out["steps"])
    if compute.train_flops(trainer, out["steps"]) is not None:  # models.compute's count
        summary["flops_per_token"] = compute.run_compute(trainer)["flops_per_token"]
        summary["train_flops"] = compute.train_flops(trainer, out["steps"])
    if trainer.compile_s is not None:  # train.compile: the first step, compilation included
        summary["compile_s"] = trainer.compile_s
    store.set_results(run_id, summary, eval_set="")
    store.set_info(run_id, {"stop_reason": out["stop_reason"], "eval_skipped": skipped})
    return summary
