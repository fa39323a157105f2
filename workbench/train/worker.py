"""The worker: one process per run. Builds task + model, trains, evaluates, measures.

Started by the scheduler as ``python -u -m workbench.train.worker --store DIR --run-id N`` in its
own session (so a closed terminal does not stop it). It is the only writer of its run's
rows: metrics and system samples in short transactions, a heartbeat every few seconds,
and a terminal state at the end (finished, or failed with the error text).

Checkpoints (workbench/train/checkpoint.py) are saved every ``train.checkpoint_every`` steps and
``train.checkpoint_minutes`` minutes, and on SIGTERM or SIGUSR1: inside the training loop the
signal only sets a flag, the current step finishes, the checkpoint is written and the run
ends ``preempted`` (or stays ``killed`` when ``kill`` sent the signal and marked it first).
A run whose info carries a ``resume`` marker loads its checkpoint and continues from it.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

import models
import tasks
from tasks import Batch, Task
from tasks import metrics as task_metrics
from workbench import __version__
from workbench.train import checkpoint, sysmon
from workbench.train.compose import build_model
from workbench.results import catalogue
from workbench.store.runfile import RunFile
from workbench.spec.run_spec import (ATTENTION_EVAL_MAX, EVAL_TOKENS_PER_BATCH, RESIDENT_MAX_BYTES, STREAM_ABOVE,
                                     STREAM_CHUNK, spec_key)
from workbench.store import HEARTBEAT_S, Store, StoreError, full_disk_detail, is_disk_full

WARMUP_STEPS = 3          # steps excluded from the step-time median
INFER_REPEATS = 5         # forward passes timed for the inference figure


class RunFailed(Exception):
    """The run cannot go on; the message becomes the run's error."""


class Stopped(BaseException):
    """SIGTERM or SIGUSR1 arrived: stop (after saving a checkpoint where there is state)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopFlag:
    """The SIGTERM/SIGUSR1 handler. While ``defer`` is set (inside the training loop) a
    signal only records itself and the loop stops after the step it is in, so the
    checkpoint holds a whole step; elsewhere it raises :class:`Stopped` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum: int | None = None
        self.defer = False

    def handler(self, signum, frame) -> None:
        self.signum = signum
        if not self.defer:
            raise Stopped(signum)

    def raise_if_set(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)


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

    def state(self) -> dict[str, float | int]:
        """The open log window for a checkpoint (one host read), so a resumed run logs the
        same mean at the next log point."""
        total, bad_step, bad_value = torch.stack([self.sum, self.bad_step, self.bad_value]).tolist()
        return {"sum": total, "count": self.count, "bad_step": bad_step, "bad_value": bad_value}

    def load(self, st: dict[str, float | int]) -> None:
        for name in ("sum", "bad_step", "bad_value"):
            getattr(self, name).fill_(st[name])
        self.count = int(st["count"])


def _is_compile_error(e: BaseException) -> bool:
    return type(e).__module__.startswith(("torch._dynamo", "torch._inductor"))


def peak_memory_mb(device: torch.device) -> float:
    """Allocator peak on GPU; this process's own peak RSS on CPU (sysmon.peak_rss_mib)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return sysmon.peak_rss_mib()


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

    def __init__(self, store, run_id: int, interval: float = 1.0):
        super().__init__(daemon=True, name="heartbeat")
        self.store_main, self.run_id, self.interval = store, run_id, interval
        self.stop_event = threading.Event()
        self.gpu_util: list[float] = []
        self.gpu_mem: list[float] = []
        self.disk_full = False

    def run(self) -> None:
        # a store gets a connection of its own; a run file is shared (it locks its writes)
        store = Store(self.store_main.root) if isinstance(self.store_main, Store) else self.store_main
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
                if is_disk_full(e):
                    # the main thread meets it at its next write and records the run's end;
                    # until then say it once (the log may be on the full disk too)
                    if not self.disk_full:
                        _say(f"[worker] background sampling: disk full: {e}", err=True)
                    self.disk_full = True
                    continue
                _say(f"[worker] background sampling error: {e}", err=True)


# --------------------------------------------------------------------------- training
class Trainer:
    def __init__(self, store: Store, run_id: int, spec: dict[str, Any], stop: StopFlag | None = None):
        self.store, self.run_id, self.spec = store, run_id, spec
        self.stop = stop or StopFlag()
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
        # -- what checkpoints carry beyond model/optimizer/scheduler/RNGs (see checkpoint_state)
        self.resume_state: dict | None = None  # the loaded checkpoint, consumed by train()
        self.data_pos: dict = {}  # where the data stream stands after the last batch handed out
        self.attempts = [0]  # index into step_times where each attempt began (its warm-up)
        self.before: dict[str, float] = {"train_s": 0.0, "wall_s": 0.0, "peak_mem_mb": 0.0}
        self.gpu_util: list[float] = []  # earlier attempts' NVML samples (run() adds this one's)
        self.gpu_mem: list[float] = []
        self.attempt_start = time.time()
        self.ckpt_path = checkpoint.path_for(store.root, run_id)
        self.saved: dict | None = None  # {"step", "done"} of the last checkpoint written
        self.out: dict | None = None  # train()'s result once the loop is over
        self.background = None  # the Background sampler (its GPU samples go into checkpoints)

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

    def batches(self, per_epoch: int, start: dict | None = None):
        """(epoch, inputs, targets) per step. A fixed training set is shuffled each epoch by
        a CPU generator seeded with the run's seed (the same order wherever the set lives).

        Before each yield ``data_pos`` says where the stream will stand once that batch is
        used: for a fixed set the epoch, the batches of it used, and the generator's state
        before the epoch's permutation was drawn; for fresh batches (a function of seed and
        step) the number drawn. ``start`` (a saved ``data_pos``) continues from there."""
        bs, seed = self.cfg["batch_size"], int(self.spec["seed"])
        if self.task.fixed_train:
            train = self._resident_train() or self.train_data()
            g = torch.Generator().manual_seed(seed)
            epoch, first = 0, 0
            if start:
                g.set_state(start["generator"])
                epoch, first = start["epoch"], start["batch"]
            while True:
                before = g.get_state()
                order = torch.randperm(len(train), generator=g)
                if train.inputs.device != order.device:
                    order = self.to_device(order)  # once per epoch; batches are indexed there
                for i in range(first, per_epoch):
                    idx = order[i * bs:(i + 1) * bs]
                    self.data_pos = {"epoch": epoch, "batch": i + 1, "generator": before}
                    yield epoch, train.inputs[idx], train.targets[idx]
                epoch, first = epoch + 1, 0
        step = start["drawn"] if start else 0
        while True:
            b = self.task.train_batch(bs, step, seed)
            self.data_pos = {"drawn": step + 1}
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
        (LossTracker) and are read at log points, before evaluations and at the end.

        With ``resume_state`` (a loaded checkpoint) it continues after the checkpoint's
        step with the optimizer, scheduler, loss window, data position and RNGs as saved,
        so the steps that follow are those of the uninterrupted run."""
        cfg, dev = self.cfg, self.device
        total, per_epoch = self._plan()
        self.total, self.per_epoch = total, per_epoch
        params = [p for p in self.model.parameters() if p.requires_grad]
        fused = ({"fused": True} if dev.type == "cuda"
                 and all(p.is_cuda and p.is_floating_point() for p in params) else {})
        opt = self.opt = make_optimizer(self.model, cfg, fused)
        sched = self.sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_factor(s, total, cfg["warmup_steps"], cfg["schedule"], cfg["min_lr_ratio"]))
        eval_set = self.task.eval_sets(int(self.spec["seed"]))
        default_eval = eval_set.get("") or next(iter(eval_set.values()))
        losses = self.losses = LossTracker(dev)
        stop_reason, step, done = "", 0, False
        ck, self.resume_state = self.resume_state, None
        if ck:
            if (ck["total_steps"], ck["per_epoch"]) != (total, per_epoch):
                raise RunFailed(f"checkpoint plan ({ck['total_steps']} steps, {ck['per_epoch']} per epoch) "
                                f"differs from this run's ({total}, {per_epoch})")
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            losses.load(ck["losses"])
            step, stop_reason, done = ck["step"], ck["stop_reason"], ck["train_done"]
        self.store.heartbeat(self.run_id, total_steps=total, progress=step / total, step=step)
        self.train_t0 = time.time() - self.before["train_s"]
        try:
            if not done:
                step, stop_reason = self._loop(opt, sched, losses, default_eval, total, per_epoch,
                                               step, stop_reason, ck)
            self.clock.collect()
            self.out = {"steps": step, "total_steps": total, "per_epoch": per_epoch, "eval_sets": eval_set,
                        "stop_reason": stop_reason, "train_s": time.time() - self.train_t0}
        finally:
            self.stop.defer = False
        self.stop.raise_if_set()  # a signal after the last step's check: run() saves the final state
        return self.out

    def _loop(self, opt, sched, losses: LossTracker, default_eval, total: int, per_epoch: int,
              start: int, stop_reason: str, ck: dict | None) -> tuple[int, str]:
        """Steps start+1 ... until the budget or early stopping; returns (last step, stop
        reason). Signals are deferred to the end of a step, then a checkpoint is saved and
        :class:`Stopped` raised; periodic checkpoints follow train.checkpoint_every/_minutes."""
        cfg, dev = self.cfg, self.device
        forward = self._forward()
        compiling = forward is not self.model
        seed = int(self.spec["seed"])
        every, minutes = cfg.get("checkpoint_every") or 0, cfg.get("checkpoint_minutes") or 0
        data = self.batches(per_epoch, ck["data"] if ck else None)
        if ck:  # last, so nothing between here and the first step draws from them
            checkpoint.set_rng_state(ck["rng"])
        last_save = time.monotonic()
        step = start
        self.stop.defer = True
        for step, (epoch, x, y) in enumerate(data, start=start + 1):
            aug = self.task.augment_batch(Batch(x, y), step, seed)  # identity for most tasks
            x, y = self.to_device(aug.inputs), self.to_device(aug.targets)
            first_compiled = compiling and step == start + 1
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
                if self.compile_s is None:  # a resumed attempt compiles again; keep the first
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
            done = bool(stop_reason) or step >= total
            signalled = self.stop.signum is not None
            # periodic checkpoints only while steps remain: at the end the run finishes
            due = not done and ((every and step % every == 0) or
                                (minutes and time.monotonic() - last_save >= 60 * minutes))
            if signalled or due:
                self.save_checkpoint(step, stop_reason, done)
                last_save = time.monotonic()
            if signalled:
                raise Stopped(self.stop.signum)
            if done:
                break
        losses.check()
        return step, stop_reason

    # -- checkpoints -----------------------------------------------------------------
    def checkpoint_state(self, step: int, stop_reason: str, done: bool) -> dict[str, Any]:
        """Everything the rest of the run depends on, after ``step`` completed: weights,
        optimizer and LR scheduler, every RNG, the data position, the open loss window,
        early-stopping and eval history, and the measurements summed over attempts (step
        times, training and wall time, peak memory, GPU samples). Mixed precision is bf16
        autocast, which needs no gradient scaler, so there is no scaler state to keep."""
        self.clock.collect()
        gpu_util = self.gpu_util + (self.background.gpu_util if self.background else [])
        gpu_mem = self.gpu_mem + (self.background.gpu_mem if self.background else [])
        return {
            "format": checkpoint.FORMAT, "run_id": self.run_id, "spec_key": spec_key(self.spec),
            "step": step, "total_steps": self.total, "per_epoch": self.per_epoch,
            "train_done": done, "stop_reason": stop_reason, "device": str(self.device),
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(), "rng": checkpoint.rng_state(),
            "data": self.data_pos, "losses": self.losses.state(),
            "history": self.history, "best": self.best, "bad_evals": self.bad_evals,
            "step_times": list(self.step_times), "attempts": self.attempts, "compile_s": self.compile_s,
            "train_s": self.out["train_s"] if self.out else time.time() - self.train_t0,
            "wall_s": self.before["wall_s"] + time.time() - self.attempt_start,
            "peak_mem_mb": max(self.before["peak_mem_mb"], peak_memory_mb(self.device)),
            "gpu_util": gpu_util, "gpu_mem": gpu_mem, "saved_at": time.time(),
        }

    def save_checkpoint(self, step: int, stop_reason: str, done: bool) -> None:
        """Write the checkpoint atomically and record it in the run's info."""
        t = time.perf_counter()
        size = checkpoint.save(self.checkpoint_state(step, stop_reason, done), self.ckpt_path)
        self.saved = {"step": step, "done": done}
        self.store.set_info(self.run_id, {"checkpoint": {
            "path": str(self.ckpt_path), "step": step, "train_done": done, "time": time.time(),
            "bytes": size}})
        print(f"[worker] run {self.run_id}: checkpoint at step {step} ({size / 2**20:.1f} MiB, "
              f"{time.perf_counter() - t:.2f} s)", flush=True)

    def restore(self, ck: dict[str, Any]) -> None:
        """Load a checkpoint's weights and bookkeeping; train() takes the rest (optimizer,
        scheduler, loss window, data position and RNGs) when it builds those."""
        self.model.load_state_dict(ck["model"])
        self.resume_state = ck
        self.history, self.best, self.bad_evals = list(ck["history"]), ck["best"], ck["bad_evals"]
        self.clock.times.extend(ck["step_times"])
        self.attempts = list(ck["attempts"]) + [len(self.clock.times)]
        self.compile_s = ck["compile_s"]
        self.before = {"train_s": ck["train_s"], "wall_s": ck["wall_s"], "peak_mem_mb": ck["peak_mem_mb"]}
        self.gpu_util, self.gpu_mem = list(ck["gpu_util"]), list(ck["gpu_mem"])
        self.saved = {"step": ck["step"], "done": ck["train_done"]}

    def timed_steps(self) -> list[float]:
        """Step times without each attempt's first WARMUP_STEPS (all of them if that is
        nothing)."""
        t, skip = self.step_times, set()
        for a in self.attempts:
            skip.update(range(a, a + WARMUP_STEPS))
        return [x for i, x in enumerate(t) if i not in skip] or t

    @staticmethod
    def _epoch_f(step: int, per_epoch: int) -> float | None:
        return step / per_epoch if per_epoch else None

    def _early_stop(self, c: task_metrics.AccuracyCounts) -> str:
        es = self.cfg["early_stopping"]
        if es.get("target") is not None and c.token_accuracy >= es["target"]:
            return f"eval accuracy {c.token_accuracy:.4f} reached target {es['target']}"
        if not es["patience"]:
            return ""
        # which way is better comes from the results catalogue (accuracy up, loss down)
        raw = {"accuracy": c.token_accuracy, "loss": c.loss}[es["metric"]]
        value = raw if catalogue.better(es["metric"]) == "max" else -raw
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


def run(store_dir: str | None, run_id: int, run_file: str | None = None) -> int:
    """Run ``run_id`` of the store in ``store_dir``, or, with ``run_file`` (a Slurm job on
    another node), of the run file in that shared folder (workbench/store/runfile.py)."""
    try:
        store = RunFile(run_file, run_id) if run_file else Store(store_dir)
    except (StoreError, OSError) as e:  # nothing can be recorded: the scheduler's check says crashed
        _say(f"[worker] run {run_id}: cannot open its store: {e}", err=True)
        return 2
    if getattr(store, "readonly", False):
        _say(f"[worker] run {run_id}: {store._refusal()}", err=True)
        return 2
    t_start = time.time()
    stop = StopFlag()
    previous = {sig: signal.signal(sig, stop.handler) for sig in StopFlag.SIGNALS}
    try:
        return _run(store, run_id, t_start, stop)
    except Stopped as e:  # before the run started: nothing to save
        store.finish(run_id, "preempted", f"preempted ({signal.Signals(e.signum).name}) before it started")
        return 128 + e.signum
    except Exception as e:  # a full disk, met anywhere, even while recording another end
        if not is_disk_full(e):
            raise
        return _disk_full(store, run_id, e)
    finally:  # in-process callers (tests) get their handlers back
        for sig, h in previous.items():
            signal.signal(sig, h)


def _run(store: Store, run_id: int, t_start: float, stop: StopFlag) -> int:
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
    bg = Background(store, run_id)
    bg.start()
    trainer = None
    try:
        trainer = Trainer(store, run_id, r.spec, stop)
        trainer.attempt_start = t_start
        trainer.background = bg
        resumed = None
        if r.info.get("resume"):
            try:  # verified again here (resume did once): the file may have changed since
                ck = checkpoint.load_for_run(store.root, run_id, r.spec)
            except checkpoint.CheckpointError as e:
                raise RunFailed(f"cannot resume: {e}; `ssm-workbench resume --restart {run_id}` "
                                f"trains the run from step 0") from None
            check = ck.pop("_file", {}).get("check")
            trainer.restore(ck)
            dropped = store.trim_after(run_id, ck["step"])  # the interrupted attempt's later rows
            resumed = {"step": ck["step"], "from_device": ck["device"], "metrics_dropped": dropped,
                       "time": time.time(), "check": check}
            print(f"[worker] run {run_id}: resuming from the checkpoint at step {ck['step']} "
                  f"({check}; {dropped} later metric rows dropped)", flush=True)
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
        if resumed:
            info["resumed"] = r.info.get("resumed", []) + [resumed]
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
        # final measurements on every eval set, and on the validation set as eval set "valid"
        # (what a grid is selected on; numpy-seeded from its own stream, after training)
        skipped, final = {}, dict(out["eval_sets"])
        valid = trainer.task.valid_set(int(trainer.spec["seed"]))
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
            vals.update(trainer._extra(c))
            store.set_results(run_id, vals, eval_set=name)
        default_eval = out["eval_sets"].get("") or next(iter(out["eval_sets"].values()))
        st = trainer.timed_steps()
        step_ms = statistics.median(st) * 1000
        bs, L = trainer.cfg["batch_size"], default_eval.inputs.shape[1]
        gpu_util, gpu_mem = trainer.gpu_util + bg.gpu_util, trainer.gpu_mem + bg.gpu_mem
        summary = {
            "step_time_ms": step_ms,
            "inference_ms": trainer.inference_ms(default_eval),
            "tokens_per_s": bs * L / (step_ms / 1000),
            "peak_mem_mb": max(trainer.before["peak_mem_mb"], peak_memory_mb(dev)),
            "params": params,
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
        if trainer.compile_s is not None:  # train.compile: the first step, compilation included
            summary["compile_s"] = trainer.compile_s
        store.set_results(run_id, summary, eval_set="")
        store.set_info(run_id, {"stop_reason": out["stop_reason"], "eval_skipped": skipped})
        stop.defer = True  # all measured: a signal from here on changes nothing
        if not store.finish(run_id, "finished"):
            # killed at the last moment, or requeued to another worker while this one was
            # paused: the checkpoint may be what the run goes on from, so it stays
            now = store.get(run_id)
            print(f"[worker] run {run_id}: every result is recorded, but the run is "
                  f"{now.state if now else 'gone'} and was not marked finished; its checkpoint "
                  f"is kept: {summary}", flush=True)
            return 0
        if trainer.saved:  # a finished run needs no checkpoint (weights + optimizer: often GBs)
            checkpoint.remove(store.root, run_id)
            store.set_info(run_id, {"checkpoint": None})
        print(f"[worker] run {run_id} finished: {summary}", flush=True)
        return 0
    except Stopped as e:
        return _stopped(store, run_id, trainer, stop, e.signum)
    except RunFailed as e:
        store.finish(run_id, "failed", str(e))
        print(f"[worker] run {run_id} failed: {e}", flush=True)
        return 1
    except Exception as e:
        if is_disk_full(e):
            raise  # run() records it, with the space it frees first
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        store.finish(run_id, "failed", f"{type(e).__name__}: {e}\n{tb[-4000:]}")
        return 1
    finally:
        bg.stop_event.set()


def _say(text: str, err: bool = False) -> None:
    """Print to the run's log, which may sit on a full disk: a line lost there must not
    stop the worker from recording how the run ended."""
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except OSError:
        pass


def _disk_full(store: Store, run_id: int, e: BaseException) -> int:
    """The disk under the store, the checkpoints or the log is full. The run ends
    ``failed`` with an error starting ``disk full`` (an unfinished state: ``resume`` goes on
    from its last checkpoint, which stays, once there is space). Recording that needs a
    little space itself: the background thread is stopped so it takes none, and the
    store's reserve file is deleted to make room; a shorter message is tried last."""
    for t in threading.enumerate():
        if isinstance(t, Background) and t.stop_event.is_set():
            t.join(timeout=10)
    try:
        ck = ((store.get(run_id).info or {}).get("checkpoint") or {})
    except Exception:
        ck = {}
    where = f"from its checkpoint at step {ck['step']}" if ck.get("step") is not None else "from the start"
    detail = full_disk_detail(e, store.root)
    msg = f"disk full: {detail}; free space there, then `ssm-workbench resume {run_id}` goes on {where}"
    store.release_reserve()
    for text in (msg, "disk full"):
        try:
            store.finish(run_id, "failed", text)
        except Exception as again:
            if not is_disk_full(again):
                raise
            continue
        _say(f"[worker] run {run_id} failed: {text}")
        return 1
    _say(f"[worker] run {run_id}: disk full, and its end could not be recorded: {detail}", err=True)
    return 1


def _stopped(store: Store, run_id: int, trainer: Trainer | None, stop: StopFlag, signum: int) -> int:
    """SIGTERM/SIGUSR1 ended the run. Training over but the run not finished (the signal
    came during the final evaluations): save the final state, so a resume only evaluates.
    Then mark the run ``preempted`` naming its checkpoint, unless ``kill`` marked it
    ``killed`` first (its checkpoint is resumable all the same)."""
    stop.defer = True  # a second signal must not cut the save short
    name = signal.Signals(signum).name
    if trainer is not None and trainer.out is not None and not (trainer.saved or {}).get("done"):
        try:
            trainer.save_checkpoint(trainer.out["steps"], trainer.out["stop_reason"], True)
        except Exception as e:  # the earlier checkpoint (if any) stays valid
            print(f"[worker] run {run_id}: final checkpoint failed: {e}", file=sys.stderr, flush=True)
    ck = (store.get(run_id).info or {}).get("checkpoint")
    if ck and Path(ck["path"]).is_file():
        msg = f"preempted ({name}): checkpoint at step {ck['step']}; `ssm-workbench resume {run_id}` continues"
    else:
        msg = f"preempted ({name}) before its first checkpoint"
    job = os.environ.get("SLURM_JOB_ID")
    if signum == signal.SIGUSR1 and job and ck and os.environ.get("SSMWB_REQUEUE_AT_TIME_LIMIT") == "1":
        # Slurm's warning before the time limit (--signal=B:USR1@N, workbench/execute/slurm.py): the
        # checkpoint is saved, so put this job back in the queue; its next attempt goes on
        # from the checkpoint instead of the run ending at the limit
        got = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        msg += ("; time limit near: Slurm job requeued" if got.returncode == 0 else
                f"; time limit near: scontrol requeue failed: {(got.stderr or got.stdout).strip()}")
    if not store.finish(run_id, "preempted", msg):
        msg = f"stopped ({name}) after it was marked {store.get(run_id).state}" + (
            f"; checkpoint at step {ck['step']}" if ck else "")
    print(f"[worker] run {run_id}: {msg}", flush=True)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.train.worker")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="the store's folder (a worker on this machine)")
    where.add_argument("--run-file", metavar="SHARED",
                       help="a shared folder holding slurm/run-ID/ (a Slurm job: rows go to a run file)")
    ap.add_argument("--run-id", type=int, required=True)
    a = ap.parse_args(argv)
    return run(a.store, a.run_id, a.run_file)


if __name__ == "__main__":
    sys.exit(main())
