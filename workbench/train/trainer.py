"""The Trainer: one run's training and evaluation loop, with its checkpoints.

Builds the task and the model from the run's typed spec
(:class:`~workbench.spec.run_spec.RunSpec`), trains (optimiser and schedule from
:mod:`workbench.train.optim`, step times from :mod:`workbench.train.measure`), evaluates
every ``train.eval_every``, stops early, and writes metric rows and heartbeats to the
run's writer (a :class:`~workbench.store.Store` or a run file). Signals are the entry's
business (:mod:`workbench.train.worker`); here a :class:`~workbench.train.stop.StopFlag`
deferred inside the loop ends it after a whole step with a checkpoint.
"""
from __future__ import annotations

import copy
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
from workbench.train import checkpoint, compute, distributed, optim, sharded
from workbench.train.compose import build_model
from workbench.train.measure import StepClock, median_ms, peak_memory_mb, pick_device, sync
from workbench.train.stop import RunFailed, StopFlag, Stopped

WARMUP_STEPS = 3          # steps excluded from the step-time median
INFER_REPEATS = 5         # forward passes timed for the inference figure (after one untimed)


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


class RankLossTracker(LossTracker):
    """The loss tracker of a run on several ranks. Each rank adds its shard's share of the
    step's loss (its targets' summed loss over the global batch's targets), so the step's
    loss is the sum over ranks; every read first combines the ranks (:meth:`merge`, a
    collective: all ranks read at the same steps), leaving the window's sum on rank 0."""

    def __init__(self, device: torch.device, group: "distributed.Group"):
        super().__init__(device)
        self.group = group

    def merge(self) -> None:
        """Rank 0's sum := the ranks' sum (others 0); the first non-finite step of any rank
        (and its value) on every rank, so every rank fails at the same read."""
        rows = torch.stack(self.group.gather(torch.stack([self.sum, self.bad_step, self.bad_value]))).tolist()
        bad = min(((s, v) for _, s, v in rows if s), default=(0.0, 0.0))
        self.sum.fill_(sum(r[0] for r in rows) if self.group.rank == 0 else 0.0)
        self.bad_step.fill_(bad[0])
        self.bad_value.fill_(bad[1])

    def check(self) -> None:
        self.merge()
        super().check()

    def flush(self) -> float:
        self.merge()
        return super().flush()

    def load(self, st: dict[str, float | int]) -> None:
        # a checkpoint holds the merged window (rank 0's); the others start theirs at 0
        super().load(st if self.group.rank == 0 else {**st, "sum": 0.0})


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
        # several ranks (workbench/train/distributed.py): one device each, the group joined
        # before anything is built, so a rank that cannot start fails every rank's start
        self.ranks, self.group = ranks, None
        self.rank_rngs: list | None = None  # every rank's RNGs, gathered at a checkpoint
        if ranks is not None:
            if self.device.type == "cuda":
                if ranks.local_rank >= torch.cuda.device_count():
                    raise RunFailed(f"rank {ranks.rank} needs GPU {ranks.local_rank}, but this node shows "
                                    f"{torch.cuda.device_count()} (train.devices = {ranks.world})")
                torch.cuda.set_device(ranks.local_rank)
                self.device = torch.device("cuda", ranks.local_rank)
            self.group = distributed.Group(ranks, self.device)
        # train.sharding = "fsdp" (workbench/train/sharded.py): the model is sharded per block
        # when training starts; rank 0 evaluates on a plain replica holding the whole weights
        self.fsdp = ranks is not None and getattr(self.cfg, "sharding", None) == "fsdp"
        self.replica: torch.nn.Module | None = None
        self.whole: tuple[dict, dict | None] | None = None  # gathered (model, optimizer) state dicts
        torch.manual_seed(spec.seed)  # every rank: the same initial weights
        self.task = tasks.build(spec.task, **spec.task_params)
        # under FSDP the model stays on the CPU until it is sharded: fully_shard moves one
        # unit at a time to the device and keeps this rank's shard there (_shard_model)
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
        if self.cfg.steps is None:  # train.tokens / flops / tokens_per_param: steps from expand
            if not self.spec.budget:
                raise RunFailed("the run's spec has a token or FLOP budget but no steps (spec.budget)")
            return self.spec.budget["steps"], per_epoch
        return self.cfg.steps, per_epoch

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
        ranks; under FSDP on the replica the last :meth:`_gather_weights` filled)."""
        model = self.replica if self.replica is not None else self.model
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

    def _shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """This rank's shard of the global batch (x, y), the global batch's number of targets
        (the loss's divisor, so the ranks' losses sum to the global mean) and the shard's
        weight: 1, or 0 when an epoch's last batch has fewer examples than there are ranks
        (the rank then trains on one example with weight 0: DDP needs every rank's backward)."""
        n_all = (y != task_metrics.IGNORE).sum()
        a, b = distributed.shard_bounds(x.shape[0], self.group.world, self.group.rank)
        if a == b:
            return x[:1], y[:1], n_all, 0.0
        return x[a:b], y[a:b], n_all, 1.0

    def _forward(self):
        """The callable for the training forward: the model, or torch.compile(model) with
        train.compile (evaluation, streaming and inference always use the module itself);
        on several ranks under DDP (gradients summed across ranks: distributed.wrap), or
        the model itself, sharded, under FSDP (:meth:`_shard_model`)."""
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
            self._shard_model()
        opt, sched = self.opt, self.sched = optim.build(self.model, cfg, total, dev)
        eval_set = self.task.eval_sets(self.spec.seed)
        default_eval = eval_set.get("") or next(iter(eval_set.values()))
        losses = self.losses = LossTracker(dev) if self.group is None else RankLossTracker(dev, self.group)
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
                self._unshard_for_results()
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
        cfg, dev, group, lead = self.cfg, self.device, self.group, self.leader
        forward = self._forward()
        compiling = cfg.compile
        seed = self.spec.seed
        every, minutes = cfg.checkpoint_every, cfg.checkpoint_minutes
        data = self.batches(per_epoch, ck["data"] if ck else None)
        if ck:  # last, so nothing between here and the first step draws from them
            self._set_rngs(ck, start)
        last_save = time.monotonic()
        step = start
        self.stop.defer = True
        for step, (epoch, x, y) in enumerate(data, start=start + 1):
            aug = self.task.augment_batch(Batch(x, y), step, seed)  # identity for most tasks
            if group is None:
                x, y = self.to_device(aug.inputs), self.to_device(aug.targets)
            else:  # every rank drew the global batch; it trains on its shard
                x, y, n_all, weight = self._shard(aug.inputs, aug.targets)
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
                    self._gather_weights()
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
                self._park_replica()
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
                if signalled or due:
                    losses.merge()  # the open window, whole, on rank 0
                    self.rank_rngs = group.gather_objects(checkpoint.rng_state())
                    if self.fsdp:  # the whole state, gathered by every rank onto rank 0's CPU
                        self.whole = sharded.full_state(self.model, opt, lead)
            if signalled or due:
                if lead:
                    self.save_checkpoint(step, stop_reason, done)
                self.rank_rngs = self.whole = None
                last_save = time.monotonic()
            if signalled:
                raise Stopped(self.stop.signum or signal.SIGTERM)
            if done:
                break
        losses.check()
        return step, stop_reason

    def _set_rngs(self, ck: dict, step: int) -> None:
        """A resumed run's RNGs: rank 0's as saved (one process's); rank r's own where the
        checkpoint has them (saved by as many ranks or more), else a stream of its own."""
        rank = self.group.rank if self.group is not None else 0
        saved = ck.get("rng_ranks") or []
        if rank == 0:
            checkpoint.set_rng_state(ck["rng"])
        elif rank < len(saved):
            checkpoint.set_rng_state(saved[rank])
        else:
            checkpoint.set_rng_state(ck["rng"])
            torch.manual_seed(self.spec.seed + 7919 * rank + 104729 * step)

    # -- FSDP (workbench/train/sharded.py) --------------------------------------------
    def _shard_model(self) -> None:
        """Shard the model per block across the ranks (every rank holds the same weights:
        the same seed, or the same checkpoint restored); rank 0 first keeps a plain replica
        on the CPU, for its evaluations and the final results."""
        whole = sharded.local_bytes(self.model)
        if self.leader:
            self.replica = copy.deepcopy(self.model)  # on the CPU (see __init__)
        sharded.shard(self.model, self.device, self.group.world)
        if self.leader:
            held, n = sharded.local_bytes(self.model), len(sharded.units(self.model))
            self.store.set_info(self.run_id, {"fsdp": {"units": n, "param_bytes": whole, "param_bytes_rank0": held}})
            print(f"[worker] run {self.run_id}: fsdp over {self.group.world} ranks, {n} units: rank 0 holds "
                  f"{held / 2**20:.2f} of {whole / 2**20:.2f} MiB of parameters", flush=True)

    def _gather_weights(self) -> None:
        """Every rank: gather the whole weights; rank 0 loads them into its replica, on the
        device while it evaluates (:meth:`_park_replica` puts it back on the CPU)."""
        weights, _ = sharded.full_state(self.model, None, self.leader)
        if self.leader:
            self.replica.load_state_dict(weights)
            self.replica.to(self.device)

    def _park_replica(self) -> None:
        if self.fsdp and self.replica is not None and self.device.type != "cpu":
            self.replica.to("cpu")

    def _unshard_for_results(self) -> None:
        """After the last step, every rank: gather the whole model and optimizer state onto
        rank 0, which from here on is a one-process run (the final evaluations, the kept
        weights, a final checkpoint if a signal comes) on the replica; the others are done."""
        self.whole = sharded.full_state(self.model, self.opt, self.leader)
        if self.leader:
            self.replica.load_state_dict(self.whole[0])
            self.model = self.replica.to(self.device)
        else:
            self.whole = None

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
            "format": checkpoint.FORMAT, "run_id": self.run_id, "spec_key": self.key,
            "step": step, "total_steps": self.total, "per_epoch": self.per_epoch,
            "train_done": done, "stop_reason": stop_reason, "device": str(self.device),
            # under FSDP the whole state dicts gathered for this checkpoint (sharded.full_state),
            # so a checkpoint reads the same whatever sharded it
            "model": self.whole[0] if self.whole else self.model.state_dict(),
            "optimizer": self.whole[1] if self.whole else self.opt.state_dict(),
            "scheduler": self.sched.state_dict(), "rng": checkpoint.rng_state(),
            "data": self.data_pos, "losses": self.losses.state(),
            "history": self.history, "best": self.best, "bad_evals": self.bad_evals,
            "step_times": list(self.step_times), "attempts": self.attempts, "compile_s": self.compile_s,
            "train_s": self.out["train_s"] if self.out else time.time() - self.train_t0,
            "wall_s": self.before["wall_s"] + time.time() - self.attempt_start,
            "peak_mem_mb": max(self.before["peak_mem_mb"], peak_memory_mb(self.device)),
            "gpu_util": gpu_util, "gpu_mem": gpu_mem, "saved_at": time.time(),
            # several ranks: how many, and each one's RNGs (None after training: none is drawn then)
            **({"ranks": self.group.world, "rng_ranks": self.rank_rngs,
                "sharding": "fsdp" if self.fsdp else "ddp"} if self.group is not None else {}),
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
