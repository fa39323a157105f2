"""The catalogue of result metrics: the one place that says what a metric is.

Each :class:`Metric` has a name (as stored in the ``results`` table), a description, a
unit, which way is better (``"max"``, ``"min"`` or ``None`` for counts and sizes that have
no "best"), whether it is *run-level* (measured once per run and stored with eval set
``""``, so it applies to every eval set's row: time, memory, parameter counts) or
*per eval set* (accuracy, loss, ...), and whether it is a *count* (printed as an integer).

``export``, ``plot``, ``curves``, ``report`` and the TUI's Results tab read names,
descriptions, units and directions from here; metrics that are not catalogued (a task's
own) are shown by name, without a direction.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    unit: str | None = None
    better: str | None = None  # "max", "min" or None (no best: counts, sizes)
    run_level: bool = False
    count: bool = False

    @property
    def text(self) -> str:
        """The description with the unit in parentheses (what tables print)."""
        return f"{self.description} ({self.unit})" if self.unit else self.description


_M = Metric
CATALOGUE: dict[str, Metric] = {m.name: m for m in (
    _M("accuracy", "eval accuracy per target token", "fraction", "max"),
    _M("sequence_accuracy", "eval whole-sequence exact match", "fraction", "max"),
    _M("loss", "eval loss", "nats per target token", "min"),
    _M("eval_sequences", "sequences in the eval set (the accuracy's sample size)", count=True),
    _M("best_accuracy", "best eval accuracy seen during training", "fraction", "max", run_level=True),
    _M("best_at_epoch", "epoch at which the best eval accuracy was first reached", None, "min",
       run_level=True),
    _M("best_at_step", "step at which the best eval accuracy was first reached", None, None,
       run_level=True, count=True),
    _M("step_time_ms", "median forward+backward+update time per step after warm-up", "ms", "min",
       run_level=True),
    _M("inference_ms", "median no-grad forward time of one eval batch", "ms", "min", run_level=True),
    _M("compile_s", "time of the first training step with train.compile, compilation included", "s",
       "min", run_level=True),
    _M("tokens_per_s", "training tokens per second", "tokens/s", "max", run_level=True),
    _M("peak_mem_mb", "peak memory (GPU allocator peak, else process peak RSS)", "MiB", "min",
       run_level=True),
    _M("gpu_util_mean", "mean GPU utilisation sampled by NVML during the run", "%", run_level=True),
    _M("gpu_util_max", "max GPU utilisation sampled by NVML", "%", run_level=True),
    _M("gpu_mem_peak_mb", "peak GPU memory used by the device according to NVML", "MiB", "min",
       run_level=True),
    _M("params", "backbone parameter count", run_level=True, count=True),
    _M("params_trainable", "parameters the optimizer updates (all of the model's that require grad)",
       run_level=True, count=True),
    _M("state_size", "recurrent state size", "floats per sequence", run_level=True, count=True),
    _M("wall_s", "wall time of the run", "s", "min", run_level=True),
    _M("train_s", "training time of the run", "s", "min", run_level=True),
    _M("steps", "optimizer steps taken", run_level=True, count=True),
    _M("epochs", "epochs trained", run_level=True),
    _M("bits_per_char", "eval bits per character (char-LM)", None, "min"),
    # the LM task (tasks/lm): loss is nats per token; bits per byte compares tokenizers
    # (an lm-eval task's perplexity is exp(-mean log-likelihood of a document's continuation):
    # LAMBADA's is per last word, not per token)
    _M("perplexity", "eval perplexity, exp(loss) per token; an lm-eval task's per continuation (LAMBADA: "
       "its last word)", None, "min"),
    _M("bits_per_byte", "eval bits per UTF-8 byte of text: total nats / ln 2 / bytes covered (LM)",
       "bits/byte", "min"),
    _M("tokens_trained", "training target tokens seen (steps x batch x seq_len)", "tokens",
       run_level=True, count=True),
    # lm-evaluation-harness tasks (workbench/train/eval_run.py: eval set = the task's name)
    _M("acc", "lm-eval accuracy", "fraction", "max"),
    _M("acc_norm", "lm-eval accuracy, log-likelihood normalised by continuation length in bytes",
       "fraction", "max"),
    _M("word_perplexity", "lm-eval perplexity per word", "per word", "min"),
    _M("byte_perplexity", "lm-eval perplexity per UTF-8 byte", "per byte", "min"),
    _M("acc_stderr", "standard error of acc (lm-eval)", "fraction"),
    _M("acc_norm_stderr", "standard error of acc_norm (lm-eval)", "fraction"),
    _M("perplexity_stderr", "standard error of perplexity (lm-eval, bootstrap)", "per token"),
    _M("samples", "documents an lm-eval task scored", count=True),
    # compute (models.compute, workbench.train.compute): training = forward + backward
    _M("flops_per_token", "training FLOPs per input token (forward + backward, composed model)",
       "FLOPs/token", run_level=True),
    _M("train_flops", "training FLOPs spent: flops_per_token x steps x batch x input length",
       "FLOPs", run_level=True),
)}

# derived views (the names older code imports from workbench.results.export)
DESCRIPTIONS: dict[str, str] = {n: m.text for n, m in CATALOGUE.items()}
BETTER: dict[str, str] = {n: m.better for n, m in CATALOGUE.items() if m.better}
RUN_LEVEL: frozenset[str] = frozenset(n for n, m in CATALOGUE.items() if m.run_level)
COUNTS: frozenset[str] = frozenset(n for n, m in CATALOGUE.items() if m.count)


def get(name: str) -> Metric | None:
    return CATALOGUE.get(name)


def describe(name: str) -> str:
    """Description with unit; the bare name for a metric the catalogue does not know."""
    m = CATALOGUE.get(name)
    return m.text if m else name


def better(name: str) -> str | None:
    m = CATALOGUE.get(name)
    return m.better if m else None


def unit(name: str) -> str | None:
    m = CATALOGUE.get(name)
    return m.unit if m else None


def is_count(name: str) -> bool:
    return name in COUNTS
