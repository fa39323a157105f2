"""The Trainer: one run's training and evaluation loop, with its checkpoints.

Builds the task and the model from the run's typed spec
(:class:`~workbench.spec.run_spec.RunSpec`), trains (optimiser and schedule from
:mod:`workbench.train.optim`, step times from :mod:`workbench.train.measure`), evaluates
every ``train.eval_every``, stops early, and writes metric rows and heartbeats to the
run's writer (a :class:`~workbench.store.Store` or a run file). Signals are the entry's
business (:mod:`workbench.train.worker`); here a :class:`~workbench.train.stop.StopFlag`
deferred inside the loop ends it after a whole step with a checkpoint. A run on several
ranks keeps what it needs beyond one process's state in :mod:`workbench.train.rank_state`
(the batch shard, the summed loss window, FSDP's replica, the state gathered for a checkpoint).
"""
from __future__ import annotations

import math
import signal
import time
from typing import Any

import torch

import tasks
from tasks import Batch, Task
from tasks import metrics as task_metrics
from workbench.results import catalogue
from workbench.spec.run_spec import (ATTENTION_EVAL_MAX, EVAL_TOKENS_PER_BATCH, RESIDENT_MAX_BYTES, STREAM_ABOVE,
                                     STREAM_CHUNK, RunSpec, spec_key)
from workbench.store.writer import RunWriter
from workbench.train import checkpoint, compute, distributed, optim, rank_state, sharded
from workbench.train.compose import build_model
from workbench.train.loss_window import LossTracker
from workbench.train.measure import StepClock, median_ms, peak_memory_mb, pick_device, sync
from workbench.train.stop import RunFailed, StopFlag, Stopped

WARMUP_STEPS = 3          # steps excluded from the step-time median
INFER_REPEATS = 5         # forward passes timed for the inference figure (after one untimed)


def _is_compile_error(e: BaseException) -> bool:
    return type(e).__module__.startswith(("torch._dynamo", "torch._inductor"))


# --------------------------------------------------------------------------- training
class Trainer:
    """One run's task, model, training loop, evaluations and checkpoints.

    ``store`` is the run's writer (a Store or a RunFile); ``spec`` its typed spec;
    ``key`` the identity its checkpoints carry: ``spec_key`` of the spec dict as the store
    holds it (by default the spec's own dict; the worker passes the stored one, which for
    a run queued by an older version lacks keys ``spec`` has defaults for)."""

    def __init__(self, store: RunWriter, run_id: int, spec: RunSpec, stop: StopFlag | None = None,
                 key: str | None = None, ranks: distributed.Ranks | None = None):
        self.store, self.run_id, self.spec = store, run_id, spec
        self.key = key if key is not None else spec_key(spec.to_dict())
        self.stop = stop or StopFlag()
        self.cfg = spec.train
        try:
            self.device = pick_device(self.cfg.device, "train.device")
        except ValueError as e:
            raise RunFailed(str(e)) from None
        # several ranks (workbench/train/rank_state.py): one device each, the group joined
        # before anything is built, so a rank that cannot start fails every rank's start;
        # with train.sharding = "fsdp" the model is sharded when training starts
        self.ranks = ranks
        self.rank_state = (rank_state.RankState(ranks, self.device, getattr(self.cfg, "sharding", None))
                           if ranks is not None else None)
        self.group = self.rank_state.group if self.rank_state is not None else None
        self.fsdp = self.rank_state is not None and self.rank_state.fsdp
        if self.rank_state is not None:
            self.device = self.rank_state.device
        torch.manual_seed(spec.seed)  # every rank: the same initial weights
        self.task = tasks.build(spec.task, **spec.task_params)
        # under FSDP the model stays on the CPU until it is sharded: fully_shard moves one
        # unit at a time to the device and keeps this rank's shard there (RankState.shard_model)
        self.model = build_model(
            self.task, spec.model, d_model=spec.d_model, n_layers=spec.n_layers, **spec.model_options,
        ).to("cpu" if self.fsdp else self.device)
        if ranks is not None and ranks.rank:  # rank 0 keeps one process's stream; the others' dropout differs
            torch.manual_seed(spec.seed + 7919 * ranks.rank)
        self.amp = self.cfg.amp and self.device.type == "cuda"
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
        self.background = None  # the worker's sysmon.Sampler (its GPU samples go into checkpoints)

    # -- data ---------------------------------------------------------------------
    def train_data(self):
        """The fixed training set (built once), for tasks that have one."""
        if self._train is None:
            self._train = self.task.train_set(self.spec.seed)
        return self._train

    def _plan(self) -> tuple[int, int]:
        """(total optimizer steps, steps per epoch; 0 per epoch in fresh-batch mode)."""
        bs = self.cfg.batch_size
        if self.task.fixed_train:
            per_epoch = math.ceil(len(self.train_data()) / bs)
        else:
            per_epoch = math.ceil(self.task.num_train_examples / bs) if self.task.num_train_examples else 0
        if self.cfg.epochs:
            if not per_epoch:
                raise RunFailed(f"task {self.task.name} draws fresh batches: give train.steps, not epochs")
            return self.cfg.epochs * per_epoch, per_epoch
        if self.cfg.steps is None:  # train.tokens / bytes / flops / tokens_per_param: steps from expand
            if not self.spec.budget:
                raise RunFailed("the run's spec has a token or FLOP budget but no steps (spec.budget)")
            if self.spec.budget.get("steps") is None:  # train.bytes: resolved now that the data is here
                self.spec.budget = self._resolve_bytes(self.spec.budget)
            return self.spec.budget["steps"], per_epoch
        return self.cfg.steps, per_epoch

    def _resolve_bytes(self, budget: dict) -> dict:
        """A ``train.bytes`` budget's steps from the tokenizer's bytes per token on the
        training split, measured on the prepared data (workbench.spec.budget.resolve_bytes),
        recorded in the run's info as ``budget`` (steps, tokens, bytes_per_token, bytes)."""
        from workbench.spec.budget import resolve_bytes

        rate = getattr(self.task, "train_bytes_per_token", None)
        if "bytes" not in budget.get("asked", {}) or rate is None:
            raise RunFailed(f"the run's budget {budget.get('asked')} has no steps, and task {self.task.name} "
                            f"cannot count bytes of text")
        try:
            resolved = resolve_bytes(budget, rate(), self.cfg.warmup_steps)
        except ValueError as e:
            raise RunFailed(str(e)) from None
        self.store.set_info(self.run_id, {"budget": resolved})
        return resolved

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
        bs, seed = self.cfg.batch_size, self.spec.seed
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
        """Counts over ``batch`` (the whole of it, on this process: rank 0 under several
        ranks; under FSDP on the replica the last ``RankState.gather_weights`` filled)."""
        replica = self.rank_state.replica if self.rank_state is not None else None
        model = replica if replica is not None else self.model
        model.eval()
        n, L = batch.inputs.shape[0], batch.inputs.shape[1]
        streaming = L > STREAM_ABOVE and self.model.can_stream()
        if L > ATTENTION_EVAL_MAX and not streaming and self.model.state_size() is None:
            raise RunFailed(f"length {L} needs streaming inference, which {self.spec.model} lacks")
        bs = self.cfg.eval_batch_size or self.cfg.batch_size
        bs = max(1, min(bs, EVAL_TOKENS_PER_BATCH // max(1, L)))
        total = task_metrics.AccuracyCounts()
        for i in range(0, n, bs):
            x = batch.inputs[i:i + bs].to(self.device)
            y = batch.targets[i:i + bs].to(self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
                logits = model(x, chunk_len=STREAM_CHUNK if streaming else None)
            total.add(task_metrics.counts(logits.float(), y))
        model.train()
        return total

    def _extra(self, counts: task_metrics.AccuracyCounts, batch=None) -> dict[str, float]:
        """The task's own metrics from the counts over ``batch`` (an LM's bits per byte needs
        the bytes the batch's text covers, which the counts do not hold)."""
        fn = getattr(self.task, "extra_metrics", None)
        return dict(fn(counts, batch)) if callable(fn) else {}

    def tokens_trained(self, step: int) -> int | None:
        """Target tokens trained on after ``step`` steps, for tasks that count them (the LM
        task: a target at each of its ``tokens_per_example`` positions); else None."""
        per = getattr(self.task, "tokens_per_example", None)
        return step * self.cfg.batch_size * per if per else None

    # -- the loop -----------------------------------------------------------------
    @property
    def leader(self) -> bool:
        """Whether this process writes and evaluates: the only one, or rank 0."""
        return self.group is None or self.group.rank == 0

    def _forward(self):
        """The callable for the training forward: the model, or torch.compile(model) with
        train.compile (evaluation, streaming and inference always use the module itself);
        on several ranks under DDP (gradients summed across ranks: distributed.wrap), or
        the model itself, sharded, under FSDP (``RankState.shard_model``)."""
        model = self.model if self.group is None or self.fsdp else distributed.wrap(self.model, self.device)
        if not self.cfg.compile:
            return model
        try:
            return torch.compile(model)
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
        if self.fsdp:  # before the optimizer, which then holds each parameter's shard
            self.rank_state.shard_model(self.model, self.store, self.run_id)
        opt, sched = self.opt, self.sched = optim.build(self.model, cfg, total, dev)
        eval_set = self.task.eval_sets(self.spec.seed)
        default_eval = eval_set.get("") or next(iter(eval_set.values()))
        losses = self.losses = LossTracker(dev) if self.group is None else rank_state.RankLossTracker(dev, self.group)
        stop_reason, step, done = "", 0, False
        ck, self.resume_state = self.resume_state, None
        if ck:
            if (ck["total_steps"], ck["per_epoch"]) != (total, per_epoch):
                raise RunFailed(f"checkpoint plan ({ck['total_steps']} steps, {ck['per_epoch']} per epoch) "
                                f"differs from this run's ({total}, {per_epoch})")
            if self.fsdp:  # the checkpoint's whole state (any ranks, DDP or FSDP): this rank's shard
                sharded.load_optimizer(opt, ck["optimizer"])
            else:
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
            if self.fsdp:  # the final results (rank 0 alone) use the whole model
                self.model = self.rank_state.unshard(self.model, self.opt)
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
        cfg, dev, group, rs, lead = self.cfg, self.device, self.group, self.rank_state, self.leader
        forward = self._forward()
        compiling = cfg.compile
        seed = self.spec.seed
        every, minutes = cfg.checkpoint_every, cfg.checkpoint_minutes
        data = self.batches(per_epoch, ck["data"] if ck else None)
        if ck:  # last, so nothing between here and the first step draws from them
            rank_state.set_rngs(ck, group.rank if group is not None else 0, seed, start)
        last_save = time.monotonic()
        step = start
        self.stop.defer = True
        for step, (epoch, x, y) in enumerate(data, start=start + 1):
            aug = self.task.augment_batch(Batch(x, y), step, seed)  # identity for most tasks
            if group is None:
                x, y = self.to_device(aug.inputs), self.to_device(aug.targets)
            else:  # every rank drew the global batch; it trains on its shard
                x, y, n_all, weight = rs.batch_shard(aug.inputs, aug.targets)
                x, y, n_all = self.to_device(x), self.to_device(y), self.to_device(n_all)
            first_compiled = compiling and step == start + 1
            if first_compiled:  # compilation happens here: timed on its own, synchronised
                sync(dev)
                tc = time.perf_counter()
            self.clock.start()
            try:
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.amp):
                    logits = forward(x)
                if group is None:
                    loss = task_metrics.loss(logits.float(), y)
                else:
                    loss = distributed.shard_loss(logits.float(), y, n_all, weight)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            except Exception as e:
                if first_compiled and _is_compile_error(e):
                    raise RunFailed(f"torch.compile failed: {type(e).__name__}: {e}") from e
                raise
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            self.clock.stop()
            if first_compiled:
                sync(dev)
                if self.compile_s is None:  # a resumed attempt compiles again; keep the first
                    self.compile_s = time.perf_counter() - tc
            losses.add(loss, step)

            if step % cfg.log_every == 0 or step == total:
                mean = losses.flush()  # fails the run if a loss since the start was not finite
                self.clock.collect()
                self.store.add_metrics(self.run_id, [
                    (step, self._epoch_f(step, per_epoch), "train", "loss", mean),
                    (step, self._epoch_f(step, per_epoch), "train", "lr", sched.get_last_lr()[0]),
                ])
                self.store.heartbeat(self.run_id, step=step, progress=step / total, last_loss=mean,
                                     epoch=epoch)
            if cfg.epochs:  # eval_every counts epochs
                at_eval = step % per_epoch == 0 and (step // per_epoch) % cfg.eval_every == 0
            else:                  # eval_every counts steps
                at_eval = step % cfg.eval_every == 0
            at_eval = at_eval or step == total
            if at_eval:
                losses.check()
                if self.fsdp:  # every rank gathers; rank 0 evaluates on the replica
                    rs.gather_weights(self.model)
            if at_eval and lead:  # rank 0 evaluates; the others wait for it at the agreement below
                c = self.evaluate(default_eval)
                ep = self._epoch_f(step, per_epoch)
                rows = [(step, ep, "eval", "loss", c.loss), (step, ep, "eval", "accuracy", c.token_accuracy),
                        (step, ep, "eval", "sequence_accuracy", c.sequence_accuracy)]
                rows += [(step, ep, "eval", k, v) for k, v in self._extra(c, default_eval).items()]
                if self.tokens_trained(step) is not None:  # the x axis of LM curves
                    rows.append((step, ep, "train", "tokens_trained", self.tokens_trained(step)))
                rows += compute.flops_rows(self, step, ep)  # cumulative training FLOPs (train/flops)
                self.store.add_metrics(self.run_id, rows)
                if self.fsdp:
                    rs.park_replica()
                self.store.heartbeat(self.run_id, step=step, progress=step / total,
                                     last_accuracy=c.token_accuracy, epoch=epoch)
                self.history.append({"step": step, "epoch": ep, "accuracy": c.token_accuracy, "loss": c.loss})
                stop_reason = self._early_stop(c)
            done = bool(stop_reason) or step >= total
            signalled = self.stop.signum is not None
            # periodic checkpoints only while steps remain: at the end the run finishes
            due = not done and ((every and step % every == 0) or
                                (minutes and time.monotonic() - last_save >= 60 * minutes))
            if group is not None:  # every rank stops, saves and ends at the same step
                done, signalled, due = group.agree(done, signalled, due)
                due = due and not done
                if signalled or due:  # the loss window, RNGs (and FSDP's state) of every rank
                    rs.gather_for_checkpoint(self.model, opt, losses)
            if signalled or due:
                if lead:
                    self.save_checkpoint(step, stop_reason, done)
                if rs is not None:
                    rs.drop_gathered()
                last_save = time.monotonic()
            if signalled:
                raise Stopped(self.stop.signum or signal.SIGTERM)
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
        whole = self.rank_state.whole if self.rank_state is not None else None
        gpu_util = self.gpu_util + (self.background.gpu_util if self.background else [])
        gpu_mem = self.gpu_mem + (self.background.gpu_mem if self.background else [])
        return {
            "format": checkpoint.FORMAT, "run_id": self.run_id, "spec_key": self.key,
            "step": step, "total_steps": self.total, "per_epoch": self.per_epoch,
            "train_done": done, "stop_reason": stop_reason, "device": str(self.device),
            # under FSDP the whole state dicts gathered for this checkpoint (sharded.full_state),
            # so a checkpoint reads the same whatever sharded it
            "model": whole[0] if whole else self.model.state_dict(),
            "optimizer": whole[1] if whole else self.opt.state_dict(),
            "scheduler": self.sched.state_dict(), "rng": checkpoint.rng_state(),
            "data": self.data_pos, "losses": self.losses.state(),
            "history": self.history, "best": self.best, "bad_evals": self.bad_evals,
            "step_times": list(self.step_times), "attempts": self.attempts, "compile_s": self.compile_s,
            "train_s": self.out["train_s"] if self.out else time.time() - self.train_t0,
            "wall_s": self.before["wall_s"] + time.time() - self.attempt_start,
            "peak_mem_mb": max(self.before["peak_mem_mb"], peak_memory_mb(self.device)),
            "gpu_util": gpu_util, "gpu_mem": gpu_mem, "saved_at": time.time(),
            # several ranks: how many, each one's RNGs, the sharding (RankState.checkpoint_fields)
            **(self.rank_state.checkpoint_fields() if self.rank_state is not None else {}),
        }

    def save_checkpoint(self, step: int, stop_reason: str, done: bool) -> None:
        """Write the checkpoint atomically and record it in the run's info."""
        t = time.perf_counter()
        size = checkpoint.save(self.checkpoint_state(step, stop_reason, done), self.ckpt_path)
        if self.spec.task == "lm":  # `eval run:N` of a checkpointed run reads the same ids
            checkpoint.save_tokenizer(self.ckpt_path.parent, self.task)
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
        es = self.cfg.early_stopping
        if es.target is not None and c.token_accuracy >= es.target:
            return f"eval accuracy {c.token_accuracy:.4f} reached target {es.target}"
        if not es.patience:
            return ""
        # which way is better comes from the results catalogue (accuracy up, loss down)
        raw = {"accuracy": c.token_accuracy, "loss": c.loss}[es.metric]
        value = raw if catalogue.better(es.metric) == "max" else -raw
        if self.best is None or value > self.best + es.min_delta:
            self.best, self.bad_evals = value, 0
            return ""
        self.bad_evals += 1
        if self.bad_evals >= es.patience:
            return f"no eval {es.metric} improvement in {es.patience} evaluations"
        return ""

    @torch.no_grad()
    def inference_ms(self, batch) -> float:
        """Median no-grad forward time of one batch of the default eval set."""
        self.model.eval()
        bs = self.cfg.eval_batch_size or self.cfg.batch_size
        x = batch.inputs[:bs].to(self.device)

        def forward():
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
                self.model(x)

        ms = median_ms(forward, INFER_REPEATS, 1, self.device)
        self.model.train()
        return ms
