"""The worker's training loop: no host synchronisation inside a step, the loss and the
non-finite check kept on the device and read at log points, the fixed training set indexed
where it lives without changing the batch order, and the opt-in ``train.compile``."""
import math
import os
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import tasks
from tasks import metrics as task_metrics
from helpers import tiny_profile_text
from workbench.spec.run_spec import RunSpec
from workbench.train import optim, worker
from workbench.train import trainer as trainer_module
from workbench.train.measure import StepClock
from workbench.train.loss_window import LossTracker
from workbench.train.stop import RunFailed
from workbench.train.trainer import Trainer
from workbench.train.compose import build_model
from workbench.spec.profile import ProfileError, expand, loads
from workbench.store import Store


def spec(model="lstm", budget="steps = 20", eval_every=100, log_every=8, n_train=64, extra=""):
    """The run spec of a one-run selective-copying profile; ``budget`` and ``extra``: [train] lines."""
    text = tiny_profile_text("loop", models=[model], examples=(n_train, 16), d_model=16, batch_size=8, lr=3e-3,
                             warmup_steps=2, eval_every=eval_every, log_every=log_every, device="cpu",
                             tail=f"{budget}\n{extra}")
    return expand(loads(text))[0].to_dict()


def new_run(tmp_path, s):
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([s])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    return store, rid


def new_trainer(store, rid):
    return Trainer(store, rid, RunSpec.from_dict(store.get(rid).spec))


def run_worker(tmp_path, s):
    store, rid = new_run(tmp_path, s)
    worker.run(str(store.root), rid)
    return store, rid, store.get(rid)


def nan_from(monkeypatch, k, bad=float("nan")):
    """The training loss is ``bad`` from the k-th training step on (counted in Python)."""
    real, calls = task_metrics.loss, [0]

    def loss(logits, targets):
        calls[0] += 1
        out = real(logits, targets)
        return out + bad if calls[0] >= k else out

    monkeypatch.setattr(task_metrics, "loss", loss)


# --------------------------------------------------------------------------- non-finite loss
@pytest.mark.parametrize("bad,word", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_non_finite_loss_names_the_first_bad_step_not_the_log_point(tmp_path, monkeypatch, bad, word):
    nan_from(monkeypatch, 5, bad)
    store, rid, r = run_worker(tmp_path, spec(log_every=8))
    assert r.state == "failed"
    assert r.error == f"loss became {word} at step 5"
    assert store.metrics(rid, "train", "loss") == []  # the window with the bad loss is never logged


def test_non_finite_loss_is_caught_before_an_evaluation(tmp_path, monkeypatch):
    nan_from(monkeypatch, 3)
    store, rid, r = run_worker(tmp_path, spec(log_every=10, eval_every=6))
    assert r.state == "failed" and r.error == "loss became nan at step 3"
    assert store.metrics(rid, "eval", "accuracy") == []  # the step-6 evaluation did not run


def test_loss_tracker_reads_once_and_keeps_the_first_bad_step():
    t = LossTracker(torch.device("cpu"))
    for step, v in enumerate([1.0, 2.0, 3.0], start=1):
        t.add(torch.tensor(v), step)
    assert t.flush() == 2.0
    t.add(torch.tensor(5.0), 4)
    assert t.flush() == 5.0  # a new window
    t.add(torch.tensor(float("inf")), 5)
    t.add(torch.tensor(float("nan")), 6)
    with pytest.raises(RunFailed, match=r"^loss became inf at step 5$"):
        t.check()
    with pytest.raises(RunFailed, match=r"^loss became inf at step 5$"):
        t.flush()


# --------------------------------------------------------------------------- host syncs
SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__")
OPTIMIZER_PY = os.path.join("torch", "optim", "optimizer.py")


@pytest.mark.parametrize("model", ["lstm", "transformer", "mamba"])
def test_host_reads_happen_only_at_log_points(tmp_path, monkeypatch, model):
    steps, log_every = 40, 10
    store, rid = new_run(tmp_path, spec(model=model, budget=f"steps = {steps}", eval_every=steps,
                                        log_every=log_every))
    trainer = new_trainer(store, rid)
    # evaluation reads counts back by design; it is outside the steps
    monkeypatch.setattr(trainer, "evaluate", lambda batch: task_metrics.AccuracyCounts(1, 2, 1, 2, 1.0))
    calls = []
    for name in SYNC_METHODS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **k):
            caller = sys._getframe(1).f_code
            # AdamW's step counter: a CPU scalar read on the host by design (no device
            # sync; on CUDA the fused AdamW keeps it on the device and never reads it)
            if not (caller.co_name == "_get_value" and caller.co_filename.endswith(OPTIMIZER_PY)):
                calls.append(f"{_name} from {caller.co_filename}:{caller.co_name}")
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    out = trainer.train()
    monkeypatch.undo()
    assert out["steps"] == steps
    # one read per log point, one before the evaluation, one at the end
    assert len(calls) <= steps // log_every + 2, calls
    assert len(trainer.step_times) == steps and all(t > 0 for t in trainer.step_times)


def test_step_clock_reads_cuda_events_only_when_collected(monkeypatch):
    """The CUDA branch with stand-in events (no GPU here): record only inside steps, one
    wait at collect, times in seconds from elapsed_time (ms)."""
    log = []

    class Event:
        n = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            Event.n += 1
            self.t = Event.n

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append(f"sync {self.t}")

        def elapsed_time(self, end):
            return float(end.t - self.t) * 1000

    monkeypatch.setattr(torch.cuda, "Event", Event)
    clock = StepClock(torch.device("cuda"))
    for _ in range(3):
        clock.start()
        clock.stop()
    assert log == ["record"] * 6 and clock.times == []
    assert clock.collect() == [1.0, 1.0, 1.0]
    assert log[6:] == ["sync 6"]  # one wait, for the last event
    assert clock.collect() == [1.0, 1.0, 1.0] and len(log) == 7


# --------------------------------------------------------------------------- data on the device
def expected_losses(s):
    """The per-step training losses of the original loop, computed here on their own: CPU
    shuffling with the run's seed, indexing the CPU training set, AdamW, the lr schedule."""
    cfg, seed = s["train"], s["seed"]
    torch.manual_seed(seed)
    task = tasks.build(s["task"], **s["task_params"])
    model = build_model(task, s["model"], d_model=s["d_model"], n_layers=s["n_layers"], **s["model_options"])
    train = task.train_set(seed)
    bs = cfg["batch_size"]
    per_epoch = math.ceil(len(train) / bs)
    total = cfg["epochs"] * per_epoch
    opt = torch.optim.AdamW(optim.param_groups(model, cfg["weight_decay"]), lr=cfg["lr"],
                            betas=tuple(cfg["betas"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: optim.lr_factor(
        i, total, cfg["warmup_steps"], cfg["schedule"], cfg["min_lr_ratio"]))
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(cfg["epochs"]):
        order = torch.randperm(len(train), generator=g)
        for i in range(per_epoch):
            idx = order[i * bs:(i + 1) * bs]
            loss = task_metrics.loss(model(train.inputs[idx]), train.targets[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            opt.step()
            sched.step()
            out.append(loss.item())
    return out


@pytest.mark.parametrize("limit", [trainer_module.RESIDENT_MAX_BYTES, 0])
def test_fixed_train_set_keeps_its_batch_order_and_losses(tmp_path, monkeypatch, limit):
    # 36 examples, batch 8: 5 steps per epoch, the last one a short batch
    s = spec(budget="epochs = 2", eval_every=1, log_every=1, n_train=36)
    monkeypatch.setattr(trainer_module, "RESIDENT_MAX_BYTES", limit)
    store, rid = new_run(tmp_path, s)
    trainer = new_trainer(store, rid)
    trainer.train()
    assert trainer.train_on_device == (limit > 0)
    got = [m["value"] for m in store.metrics(rid, "train", "loss")]
    assert got == expected_losses(s)  # bit for bit


def test_to_device_leaves_gpu_tensors_alone_and_copies_cpu_ones_from_pinned_memory():
    """The CUDA branch with stand-in tensors (no GPU here). The resident training set lives
    on ``cuda:0`` while the trainer's device is ``cuda`` (the two compare unequal): its
    batches must be used as they are, not pinned (pinning a CUDA tensor raises) or copied."""
    log = []

    class OnGpu:
        device = torch.device("cuda", 0)

        def pin_memory(self):
            raise RuntimeError("cannot pin 'torch.cuda.LongTensor' only dense CPU tensors can be pinned")

        def to(self, *a, **k):
            raise AssertionError("copied again")

    class OnCpu:
        device = torch.device("cpu")

        def pin_memory(self):
            log.append("pin")
            return self

        def to(self, device, non_blocking=False):
            log.append((str(device), non_blocking))
            return "on the gpu"

    cuda = SimpleNamespace(device=torch.device("cuda"))
    gpu = OnGpu()
    assert Trainer.to_device(cuda, gpu) is gpu
    assert Trainer.to_device(cuda, OnCpu()) == "on the gpu"
    assert log == ["pin", ("cuda", True)]
    log.clear()
    assert Trainer.to_device(SimpleNamespace(device=torch.device("cpu")), x := torch.ones(2)) is x
    assert log == []


def test_augmenting_task_indexes_on_the_cpu_and_augments_every_step(tmp_path):
    s = spec(budget="steps = 6", log_every=3, n_train=36)
    store, rid = new_run(tmp_path, s)
    trainer = new_trainer(store, rid)
    seen = []

    def augment(batch, step, seed):
        seen.append((step, batch.inputs.device.type, len(batch)))
        return batch

    trainer.task.augment_batch = augment
    trainer.train()
    assert not trainer.train_on_device
    assert seen == [(1, "cpu", 8), (2, "cpu", 8), (3, "cpu", 8), (4, "cpu", 8), (5, "cpu", 4), (6, "cpu", 8)]


# --------------------------------------------------------------------------- train.compile
def test_compile_is_a_profile_setting(tmp_path):
    assert spec(extra="compile = true")["train"]["compile"] is True
    assert spec()["train"]["compile"] is False
    with pytest.raises(ProfileError, match="compiled"):
        spec(extra="compiled = true")


def test_compile_failure_fails_the_run_naming_the_error(tmp_path, monkeypatch):
    def broken(model, **kw):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(torch, "compile", broken)
    _, _, r = run_worker(tmp_path, spec(extra="compile = true"))
    assert r.state == "failed" and r.error == "torch.compile failed: RuntimeError: no C compiler"


def test_lazy_compile_failure_on_the_first_step(tmp_path, monkeypatch):
    class BackendCompilerFailed(Exception):
        pass

    BackendCompilerFailed.__module__ = "torch._dynamo.exc"

    def lazy(model, **kw):
        def call(x):
            raise BackendCompilerFailed("inductor exploded")
        return call

    monkeypatch.setattr(torch, "compile", lazy)
    _, _, r = run_worker(tmp_path, spec(extra="compile = true"))
    assert r.state == "failed"
    assert r.error == "torch.compile failed: BackendCompilerFailed: inductor exploded"


def test_compile_trains_through_the_compiled_forward_and_records_compile_s(tmp_path, monkeypatch):
    """Compilation itself is stood in for (real compilation: the slow test below): the
    compiled callable is used for the training forward only, its first step is timed as
    compile_s and kept out of the step-time median, losses are those of the eager run."""
    compiled = []

    def fake_compile(model, **kw):
        def call(x, **k):
            compiled.append(x.shape)
            if len(compiled) == 1:
                time.sleep(0.5)  # "compiling"
            return model(x, **k)
        return call

    monkeypatch.setattr(torch, "compile", fake_compile)
    store, rid, r = run_worker(tmp_path, spec(extra="compile = true", log_every=1))
    assert r.state == "finished", r.error
    assert len(compiled) == 20  # every training step, and nothing else (evaluation, inference)
    res = store.results([rid])[rid][""]
    assert res["compile_s"] >= 0.5 and res["step_time_ms"] < 500
    monkeypatch.undo()
    store2, rid2, r2 = run_worker(tmp_path / "eager", spec(log_every=1))
    assert "compile_s" not in store2.results([rid2])[rid2][""]
    loss = lambda st, i: [m["value"] for m in st.metrics(i, "train", "loss")]  # noqa: E731
    assert loss(store, rid) == loss(store2, rid2)


@pytest.mark.slow
def test_real_torch_compile_on_cpu(tmp_path):
    store, rid, r = run_worker(tmp_path, spec(model="transformer", extra="compile = true", log_every=4))
    assert r.state == "finished", r.error
    res = store.results([rid])[rid][""]
    assert res["compile_s"] > 0 and res["step_time_ms"] > 0 and 0 <= res["accuracy"] <= 1
    _, rid2, _ = (x := run_worker(tmp_path / "eager", spec(model="transformer", log_every=4)))
    eager = [m["value"] for m in x[0].metrics(rid2, "train", "loss")]
    got = [m["value"] for m in store.metrics(rid, "train", "loss")]
    assert got == pytest.approx(eager, rel=1e-3)
