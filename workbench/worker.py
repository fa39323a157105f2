"""The worker: one process per run. Builds task + model, trains, evaluates, measures.

Started by the scheduler as ``python -u -m workbench.worker --store DIR --run-id N`` in its
own session (so a closed terminal does not stop it). It is the only writer of its run's
rows: metrics and system samples in short transactions, a heartbeat every few seconds,
and a terminal state at the end (finished, or failed with the error text). SIGTERM (kill)
stops it; the killer has already marked the run ``killed``.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any

import torch

import models
import tasks
from tasks import Batch, Task
from tasks import metrics as task_metrics
from workbench import __version__, sysmon
from workbench.compose import build_model
from workbench.store import HEARTBEAT_S, Store

WARMUP_STEPS = 3          # steps excluded from the step-time median
INFER_REPEATS = 5         # forward passes timed for the inference figure
STREAM_ABOVE = 16384      # evaluate longer sequences chunk by chunk where the model can
STREAM_CHUNK = 4096
ATTENTION_EVAL_MAX = 16384  # longer sequences are skipped for models without recurrent state
EVAL_TOKENS_PER_BATCH = 1 << 16
RESIDENT_MAX_BYTES = 1 << 30  # fixed training sets up to this size are moved to the device once


class RunFailed(Exception):
    """The run cannot go on; the message becomes the run's error."""


class Killed(BaseException):
    """SIGTERM arrived (a user killed the run)."""


# --------------------------------------------------------------------------- helpers
def pick_device(want: str) -> torch.device:
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RunFailed("train.device is 'cuda' but torch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class StepClock:
    """Per-step times without host synchronisation inside a step.

    On CUDA a pair of timing events is recorded around each step and read only in
    :meth:`collect` (at log points and at the end); on CPU ``time.perf_counter`` (the work
    is done when the call returns). ``times`` holds seconds per step, in step order.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: list[float] = []
        self._pending: list[tuple[Any, Any]] = []
        self._start: Any = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
        else:
            self.times.append(time.perf_counter() - self._start)

    def collect(self) -> list[float]:
        """Resolve the recorded events (one wait for the last); returns ``times``."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.times.extend(a.elapsed_time(b) / 1000 for a, b in self._pending)
            self._pending.clear()
        return self.times


class LossTracker:
    """Train loss kept on the device: a running sum for the log window and the first step
    whose loss was not finite (0: none yet, set with ``torch.where``, so no host sync).
    Read once per log point (:meth:`flush`) or before an evaluation (:meth:`check`)."""

    def __init__(self, device: torch.device):
        z = lambda: torch.zeros((), dtype=torch.float64, device=device)  # noqa: E731
        self.sum, self.bad_step, self.bad_value = z(), z(), z()
        self.count = 0

    def add(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().double()
        self.sum += loss
        first = (self.bad_step == 0) & ~torch.isfinite(loss)
        self.bad_step = torch.where(first, float(step), self.bad_step)
        self.bad_value = torch.where(first, loss, self.bad_value)
        self.count += 1

    @staticmethod
    def _fail(bad_step: float, bad_value: float) -> None:
        if bad_step:
            raise RunFailed(f"loss became {bad_value} at step {int(bad_step)}")

    def check(self) -> None:
        """Fail the run if any loss so far was not finite (one host read)."""
        if self.bad_step.item():
            self._fail(self.bad_step.item(), self.bad_value.item())

    def flush(self) -> float:
        """Check, then return the mean loss since the last flush and start a new window."""
        total, bad_step, bad_value = torch.stack([self.sum, self.bad_step, self.bad_value]).tolist()
        self._fail(bad_step, bad_value)
        mean = total / max(1, self.count)
        self.sum.zero_()
        self.count = 0
        return mean


def _is_compile_error(e: BaseException) -> bool:
    return type(e).__module__.startswith(("torch._dynamo", "torch._inductor"))


def peak_memory_mb(device: torch.device) -> float:
    """Allocator peak on GPU; process peak RSS on CPU (Linux reports KiB, macOS bytes)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


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


def make_optimizer(model: torch.nn.Module, cfg: dict, extra: dict | None = None) -> torch.optim.Optimizer:
    """``train.optimizer``: AdamW (decoupled weight decay) or Adam (L2 added to the gradient),
    both with the same parameter groups (no decay for ``_no_weight_decay`` parameters and
    vectors), ``lr`` and ``betas``; ``extra`` e.g. ``{"fused": True}`` on CUDA."""
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[cfg.get("optimizer", "adamw")]
    return cls(param_groups(model, cfg["weight_decay"]), lr=cfg["lr"], betas=tuple(cfg["betas"]),
               **(extra or {}))


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` (or constant)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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


class Background(threading.Thread):
    """Heartbeat + system samples, on its own store connection."""

    def __init__(self, store_dir: str, run_id: int, interval: float = 1.0):
        super().__init__(daemon=True, name="heartbeat")
        self.store_dir, self.run_id, self.interval = store_dir, run_id, interval
        self.stop_event = threading.Event()
        self.gpu_util: list[float] = []
        self.gpu_mem: list[float] = []

    def run(self) -> None:
        store = Store(self.store_dir)
        last_beat = 0.0
        first = True  # sample at once, so even a short run shows its system panel
        while first or not self.stop_event.wait(self.interval):
            first = False
            try:
                s = sysmon.sample()
                if s.get("gpu_util") is not None:
                    self.gpu_util.append(s["gpu_util"])
                    self.gpu_mem.append(s["gpu_mem_used_mb"])
                store.add_system(self.run_id, s)
                if time.time() - last_beat >= HEARTBEAT_S:
                    store.heartbeat(self.run_id)
                    last_beat = time.time()
            except Exception as e:  # keep sampling; report once on stderr
                print(f"[worker] background sampling error: {e}", file=sys.stderr)


# --------------------------------------------------------------------------- training
class Trainer:
    def __init__(self, store: Store, run_id: int, spec: dict[str, Any]):
        self.store, self.run_id, self.spec = store, run_id, spec
        self.cfg = spec["train"]
        self.device = pick_device(self.cfg.get("device", "auto"))
        seed = int(spec["seed"])
        torch.manual_seed(seed)
        self.task = tasks.build(spec["task"], **spec["task_params"])
        self.model = build_model(
            self.task, spec["model"], d_model=spec["d_model"], n_layers=spec["n_layers"],
            **spec["model_options"],
        ).to(self.device)
        self.amp = bool(self.cfg.get("amp")) and self.device.type == "cuda"
        self.clock = StepClock(self.device)
        self.step_times: list[float] = self.clock.times  # filled at log points and at the end
        self.compile_s: float | None = None  # first (compiling) step, with train.compile
        self.history: list[dict] = []
        self.best: float | None = None
        self.bad_evals = 0
        self._train = None
        self.train_on_device = False  # the fixed training set was moved to the device once

    # -- data ---------------------------------------------------------------------
    def train_data(self):
        """The fixed training set (built once), for tasks that have one."""
        if self._train is None:
            self._train = self.task.train_set(int(self.spec["seed"]))
        return self._train

    def _plan(self) -> tuple[int, int]:
        """(total optimizer steps, steps per epoch; 0 per epoch in fresh-batch mode)."""
        bs = self.cfg["batch_size"]
        if self.task.fixed_train:
            per_epoch = math.ceil(len(self.train_data()) / bs)
        else:
            per_epoch = math.ceil(self.task.num_train_examples / bs) if self.task.num_train_examples else 0
        if self.cfg.get("epochs"):
            if not per_epoch:
                raise RunFailed(f"task {self.task.name} draws fresh batches: give train.steps, not epochs")
            return self.cfg["epochs"] * per_epoch, per_epoch
        return self.cfg["steps"], per_epoch

    def _resident_train(self) -> Batch | None:
        """The fixed training set on the device (moved once), or None to index it on the
        CPU and copy each batch: when it is over RESIDENT_MAX_BYTES, or when the task
        augments batches (augmentation is task code written for CPU tensors)."""
        train = self.train_data()
        augment = getattr(self.task.augment_batch, "__func__", None)
        if augment is not Task.augment_batch:
            return None
        if train.inputs.nbytes + train.targets.nbytes > RESIDENT_MAX_BYTES:
            return None
        self.train_on_device = True
        if self.device.type == "cpu":
            return train
        return Batch(train.inputs.to(self.device), train.targets.to(self.device))

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A batch tensor on the device; from pinned memory without waiting on CUDA.
        (Compares device types: the resident set lives on ``cuda:0``, and
        ``torch.device("cuda:0") != torch.device("cuda")``.)"""
        if t.device.type == self.device.type:
            return t
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def batches(self, per_epoch: int):
        """(epoch, inputs, targets) per step. A fixed training set is shuffled each epoch by
        a CPU generator seeded with the run's seed (the same order wherever the set lives)."""
        bs, seed = self.cfg["batch_size"], int(self.spec["seed"])
        if self.task.fixed_train:
            train = self._resident_train() or self.train_data()
            g = torch.Generator().manual_seed(seed)
            epoch = 0
            while True:
                order = torch.randperm(len(train), generator=g)
                if train.inputs.device != order.device:
                    order = self.to_device(order)  # once per epoch; batches are indexed there
                for i in range(per_epoch):
                    idx = order[i * bs:(i + 1) * bs]
                    yield epoch, train.inputs[idx], train.targets[idx]
                epoch += 1
        step = 0
        while True:
            b = self.task.train_batch(bs, step, seed)
            yield (step // per_epoch if per_epoch else None), b.inputs, b.targets
            step += 1

    # -- evaluation ---------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batch) -> task_metrics.AccuracyCounts:
        self.model.eval()
        n, L = batch.inputs.shape[0], batch.inputs.shape[1]
        streaming = L > STREAM_ABOVE and self.model.can_stream()
        if L > ATTENTION_EVAL_MAX and not streaming and self.model.state_size() is None:
            raise RunFailed(f"length {L} needs streaming inference, which {self.spec['model']} lacks")
        bs = self.cfg.get("eval_batch_size") or self.cfg["batch_size"]
        bs = max(1, min(bs, EVAL_TOKENS_PER_BATCH // max(1, L)))
        total = task_metrics.AccuracyCounts()
        for i in range(0, n, bs):
            x = batch.inputs[i:i + bs].to(self.device)
            y = batch.targets[i:i + bs].to(self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
                logits = self.model(x, chunk_len=STREAM_CHUNK if streaming else None)
            total.add(task_metrics.counts(logits.float(), y))
        self.model.train()
        return total

    def _extra(self, counts: task_metrics.AccuracyCounts) -> dict[str, float]:
        fn = getattr(self.task, "extra_metrics", None)
        return dict(fn(counts)) if callable(fn) else {}

    # -- the loop -----------------------------------------------------------------
    def _forward(self):
        """The callable for the training forward: the model, or torch.compile(model) with
        train.compile (evaluation, streaming and inference always use the module itself)."""
        if not self.cfg.get("compile"):
            return self.model
        try:
            return torch.compile(self.model)
        except Exception as e:
            raise RunFailed(f"torch.compile failed: {type(e).__name__}: {e}") from e

    def train(self) -> dict[str, Any]:
        """The training loop. Nothing inside a step waits for the device: step times come
        from CUDA events (StepClock), the loss and the non-finite check stay on the device
        (LossTracker) and are read at log points, before evaluations and at the end."""
        cfg, dev = self.cfg, self.device
        total, per_epoch = self._plan()
        params = [p for p in self.model.parameters() if p.requires_grad]
        fused = ({"fused": True} if dev.type == "cuda"
                 and all(p.is_cuda and p.is_floating_point() for p in params) else {})
        opt = make_optimizer(self.model, cfg, fused)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_factor(s, total, cfg["warmup_steps"], cfg["schedule"], cfg["min_lr_ratio"]))
        eval_set = self.task.eval_sets(int(self.spec["seed"]))
        default_eval = eval_set.get("") or next(iter(eval_set.values()))
        forward = self._forward()
        compiling = forward is not self.model
        losses = LossTracker(dev)
        self.store.heartbeat(self.run_id, total_steps=total, progress=0.0, step=0)
        t0 = time.time()
        stop_reason = ""
        step = 0
        epoch = None
        seed = int(self.spec["seed"])
        for step, (epoch, x, y) in enumerate(self.batches(per_epoch), start=1):
            aug = self.task.augment_batch(Batch(x, y), step, seed)  # identity for most tasks
            x, y = self.to_device(aug.inputs), self.to_device(aug.targets)
            first_compiled = compiling and step == 1
            if first_compiled:  # compilation happens here: timed on its own, synchronised
                sync(dev)
                tc = time.perf_counter()
            self.clock.start()
            try:
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.amp):
                    logits = forward(x)
                loss = task_metrics.loss(logits.float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            except Exception as e:
                if first_compiled and _is_compile_error(e):
                    raise RunFailed(f"torch.compile failed: {type(e).__name__}: {e}") from e
                raise
            if cfg["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg["grad_clip"])
            opt.step()
            sched.step()
            self.clock.stop()
            if first_compiled:
                sync(dev)
                self.compile_s = time.perf_counter() - tc
            losses.add(loss, step)

            if step % cfg["log_every"] == 0 or step == total:
                mean = losses.flush()  # fails the run if a loss since the start was not finite
                self.clock.collect()
                self.store.add_metrics(self.run_id, [
                    (step, self._epoch_f(step, per_epoch), "train", "loss", mean),
                    (step, self._epoch_f(step, per_epoch), "train", "lr", sched.get_last_lr()[0]),
                ])
                self.store.heartbeat(self.run_id, step=step, progress=step / total, last_loss=mean,
                                     epoch=epoch)
            if cfg.get("epochs"):  # eval_every counts epochs
                at_eval = step % per_epoch == 0 and (step // per_epoch) % cfg["eval_every"] == 0
            else:                  # eval_every counts steps
                at_eval = step % cfg["eval_every"] == 0
            at_eval = at_eval or step == total
            if at_eval:
                losses.check()
                c = self.evaluate(default_eval)
                ep = self._epoch_f(step, per_epoch)
                rows = [(step, ep, "eval", "loss", c.loss), (step, ep, "eval", "accuracy", c.token_accuracy),
                        (step, ep, "eval", "sequence_accuracy", c.sequence_accuracy)]
                rows += [(step, ep, "eval", k, v) for k, v in self._extra(c).items()]
                self.store.add_metrics(self.run_id, rows)
                self.store.heartbeat(self.run_id, step=step, progress=step / total,
                                     last_accuracy=c.token_accuracy, epoch=epoch)
                self.history.append({"step": step, "epoch": ep, "accuracy": c.token_accuracy, "loss": c.loss})
                stop_reason = self._early_stop(c)
                if stop_reason:
                    break
            if step >= total:
                break
        losses.check()
        self.clock.collect()
        wall_train = time.time() - t0
        return {"steps": step, "total_steps": total, "per_epoch": per_epoch, "eval_sets": eval_set,
                "stop_reason": stop_reason, "train_s": wall_train}

    @staticmethod
    def _epoch_f(step: int, per_epoch: int) -> float | None:
        return step / per_epoch if per_epoch else None

    def _early_stop(self, c: task_metrics.AccuracyCounts) -> str:
        es = self.cfg["early_stopping"]
        if es.get("target") is not None and c.token_accuracy >= es["target"]:
            return f"eval accuracy {c.token_accuracy:.4f} reached target {es['target']}"
        if not es["patience"]:
            return ""
        value = c.token_accuracy if es["metric"] == "accuracy" else -c.loss
        if self.best is None or value > self.best + es["min_delta"]:
            self.best, self.bad_evals = value, 0
            return ""
        self.bad_evals += 1
        if self.bad_evals >= es["patience"]:
            return f"no eval {es['metric']} improvement in {es['patience']} evaluations"
        return ""

    @torch.no_grad()
    def inference_ms(self, batch) -> float:
        """Median no-grad forward time of one batch of the default eval set."""
        self.model.eval()
        bs = self.cfg.get("eval_batch_size") or self.cfg["batch_size"]
        x = batch.inputs[:bs].to(self.device)
        times = []
        for _ in range(INFER_REPEATS + 1):
            sync(self.device)
            t = time.perf_counter()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
                self.model(x)
            sync(self.device)
            times.append(time.perf_counter() - t)
        self.model.train()
        return statistics.median(times[1:]) * 1000


def run(store_dir: str, run_id: int) -> int:
    store = Store(store_dir)
    t_start = time.time()

    def on_term(signum, frame):
        raise Killed()

    signal.signal(signal.SIGTERM, on_term)
    # The scheduler records our pid right after starting us; wait for it so the first
    # heartbeat cannot race with the pending -> running transition.
    for _ in range(100):
        r = store.get(run_id)
        if r is None:
            print(f"run {run_id} does not exist", file=sys.stderr)
            return 2
        if r.state != "pending":
            break
        time.sleep(0.1)
    if r.state != "running":
        print(f"run {run_id} is {r.state}; nothing to do", file=sys.stderr)
        return 0
    bg = Background(store_dir, run_id)
    bg.start()
    try:
        trainer = Trainer(store, run_id, r.spec)
        dev = trainer.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        params = models.param_count(trainer.model.backbone)
        info = {
            "versions": versions(), "device": str(dev),
            "device_name": torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor() or "cpu",
            "backend": trainer.model.backend, "params_backbone": params,
            "params_total": models.param_count(trainer.model), "state_size": trainer.model.state_size(),
            "torch_threads": torch.get_num_threads(), "nvml": sysmon.nvml_status(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            **trainer.model.init_choice,  # init scheme, std and tying as resolved for this run
        }
        reason = getattr(sys.modules.get("models.kernels.selective_scan"), "cuda_unavailable_reason", None)
        if callable(reason):
            info["cuda_kernels"] = reason() or "available"
        store.set_info(run_id, info)
        store.heartbeat(run_id, backend=trainer.model.backend, device=str(dev))
        print(f"[worker] run {run_id}: {r.label} on {r.task} L={r.seq_len} seed={r.seed} "
              f"device={dev} backend={trainer.model.backend} params={params} "
              f"init={trainer.model.init_choice['init_scheme']}"
              f"{' tied' if trainer.model.init_choice['tie_embeddings'] else ''}", flush=True)

        out = trainer.train()
        # final measurements on every eval set
        skipped = {}
        for name, batch in out["eval_sets"].items():
            try:
                c = trainer.evaluate(batch)
            except RunFailed as e:
                skipped[name or "default"] = str(e)
                continue
            vals = {"accuracy": c.token_accuracy, "sequence_accuracy": c.sequence_accuracy,
                    "loss": c.loss, "eval_sequences": c.seq_total}
            vals.update(trainer._extra(c))
            store.set_results(run_id, vals, eval_set=name)
        default_eval = out["eval_sets"].get("") or next(iter(out["eval_sets"].values()))
        st = trainer.step_times[WARMUP_STEPS:] or trainer.step_times
        step_ms = statistics.median(st) * 1000
        bs, L = trainer.cfg["batch_size"], default_eval.inputs.shape[1]
        summary = {
            "step_time_ms": step_ms,
            "inference_ms": trainer.inference_ms(default_eval),
            "tokens_per_s": bs * L / (step_ms / 1000),
            "peak_mem_mb": peak_memory_mb(dev),
            "params": params,
            "params_trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "state_size": trainer.model.state_size(),
            "steps": out["steps"],
            "epochs": out["steps"] / out["per_epoch"] if out["per_epoch"] else None,
            "train_s": out["train_s"],
            "wall_s": time.time() - t_start,
            "best_accuracy": max((h["accuracy"] for h in trainer.history
                                  if not math.isnan(h["accuracy"])), default=None),
            "gpu_util_mean": statistics.mean(bg.gpu_util) if bg.gpu_util else None,
            "gpu_util_max": max(bg.gpu_util) if bg.gpu_util else None,
            "gpu_mem_peak_mb": max(bg.gpu_mem) if bg.gpu_mem else None,
        }
        # the epoch at which eval accuracy first reached its best value (papers report it)
        if summary["best_accuracy"] is not None:  # an empty eval set gives NaN accuracies
            best = summary["best_accuracy"]
            first = next(h for h in trainer.history if h["accuracy"] == best)
            summary["best_at_epoch"] = first["epoch"]
            summary["best_at_step"] = first["step"]
        if trainer.compile_s is not None:  # train.compile: the first step, compilation included
            summary["compile_s"] = trainer.compile_s
        store.set_results(run_id, summary, eval_set="")
        store.set_info(run_id, {"stop_reason": out["stop_reason"], "eval_skipped": skipped})
        store.finish(run_id, "finished")
        print(f"[worker] run {run_id} finished: {summary}", flush=True)
        return 0
    except Killed:
        store.finish(run_id, "killed", "killed (SIGTERM)")
        print(f"[worker] run {run_id} killed", flush=True)
        return 143
    except RunFailed as e:
        store.finish(run_id, "failed", str(e))
        print(f"[worker] run {run_id} failed: {e}", flush=True)
        return 1
    except Exception as e:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        store.finish(run_id, "failed", f"{type(e).__name__}: {e}\n{tb[-4000:]}")
        return 1
    finally:
        bg.stop_event.set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.worker")
    ap.add_argument("--store", required=True)
    ap.add_argument("--run-id", type=int, required=True)
    a = ap.parse_args(argv)
    return run(a.store, a.run_id)


if __name__ == "__main__":
    sys.exit(main())
