"""Checkpoints and resume: a run stopped by SIGTERM/SIGUSR1 (or dead) continues from its
last checkpoint and ends with the metrics of the uninterrupted run; checkpoints are
written atomically; ``resume`` refuses runs without one; a replayed profile skips finished
runs and requeues unfinished ones instead of duplicating them."""
import functools
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import helpers
from tasks import metrics as task_metrics
from workbench.train import checkpoint, worker
from workbench.execute import launch, resume, scheduler
from workbench.spec.profile import ProfileError, expand, loads
from workbench.spec.run_spec import spec_key
from workbench.store import Store

PROFILE = """
schema_version = 1
name = "{name}"
[task]
name = "{task}"
vocab_size = 8
{task_extra}
[sweep]
models = [{model}]
seq_lens = [{seq_len}]
seeds = [{seed}]
[model]
d_model = 16
n_layers = 1
[train]
{budget}
batch_size = 8
lr = 3e-3
warmup_steps = 2
eval_every = {eval_every}
log_every = {log_every}
device = "cpu"
{extra}
"""
MAD = "num_tokens_to_copy = 2\nnum_train_examples = 36\nnum_test_examples = 16"  # 5 steps per epoch
# numbers that differ between two identical runs: clocks and the process's memory
TIMING = {"step_time_ms", "inference_ms", "tokens_per_s", "peak_mem_mb", "train_s", "wall_s",
          "gpu_util_mean", "gpu_util_max", "gpu_mem_peak_mb", "compile_s"}


def profile_text(name="ck", task="mad_selective_copying", task_extra=MAD, model='"lstm"', seq_len=10,
                 seed=0, budget="epochs = 4", eval_every=1, log_every=3, extra=""):
    return PROFILE.format(name=name, task=task, task_extra=task_extra, model=model, seq_len=seq_len,
                          seed=seed, budget=budget, eval_every=eval_every, log_every=log_every, extra=extra)


def spec_of(**kw):
    return expand(loads(profile_text(**kw)))[0].to_dict()


# fixed training set in epochs (dropout: the torch RNG matters; early stopping: its state
# matters: no evaluation counts as better than the first, so the run stops at the third,
# epoch 3 of 4, only if the resumed run remembers the ones before), and fresh batches drawn
# per step (induction heads without a fixed set)
FIXED = dict(model='{ name = "transformer", dropout = 0.1 }',
             extra="[train.early_stopping]\npatience = 2\nmin_delta = 1.0")
FRESH = dict(task="induction_heads", task_extra="eval_lens = [12]\nnum_test_examples = 16", seq_len=12,
             budget="steps = 20", eval_every=4)


@pytest.fixture
def no_live_worker(monkeypatch):
    """In-process workers run under this test's pid, which is alive: let ``resume`` see the
    interrupted attempt's worker as gone, as it is."""
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)


def start(store, rid):
    assert store.mark_started(rid, os.getpid(), "cpu", "cpu0")


def attempt(monkeypatch, store, rid, at=None, sig=signal.SIGTERM, before_signal=None):
    """Run the worker in-process; with ``at`` = k, ``sig`` arrives in the middle of this
    attempt's k-th training step (inside the loss computation). Returns the exit code."""
    real = task_metrics.loss
    calls = [0]

    def loss(logits, targets):
        calls[0] += 1
        if calls[0] == at:
            if before_signal:
                before_signal()
            os.kill(os.getpid(), sig)
        return real(logits, targets)

    monkeypatch.setattr(task_metrics, "loss", loss)
    start(store, rid)
    try:
        return worker.run(str(store.root), rid)
    finally:
        monkeypatch.setattr(task_metrics, "loss", real)


def new_run(path, spec):
    store = Store(path)
    (rid,) = store.add_runs([spec])
    return store, rid


def metric_rows(store, rid):
    return [(m["step"], m["epoch"], m["split"], m["name"], m["value"]) for m in store.metrics(rid)]


def outcome(store, rid):
    """Every metric row, and the results without clocks and memory."""
    res = store.results([rid])[rid]
    return metric_rows(store, rid), {es: {k: v for k, v in vals.items() if k not in TIMING}
                                     for es, vals in res.items()}


def uninterrupted(tmp_path, monkeypatch, spec):
    store, rid = new_run(tmp_path / "whole", spec)
    assert attempt(monkeypatch, store, rid) == 0
    assert store.get(rid).state == "finished"
    return outcome(store, rid)


# --------------------------------------------------------------------------- same result
@pytest.mark.parametrize("kind,stops,sig", [
    ("fixed", [7], signal.SIGTERM),        # mid-epoch, mid log window
    ("fixed", [10], signal.SIGUSR1),       # at an epoch's end, right after its evaluation
    ("fixed", [4, 6], signal.SIGTERM),     # stopped twice
    ("fresh", [9], signal.SIGUSR1),
])
def test_resumed_run_ends_with_the_metrics_of_an_uninterrupted_one(tmp_path, monkeypatch, no_live_worker,
                                                                   kind, stops, sig):
    spec = spec_of(**(FIXED if kind == "fixed" else FRESH))
    want = uninterrupted(tmp_path, monkeypatch, spec)
    store, rid = new_run(tmp_path / "cut", spec)
    step = 0
    for k in stops:
        assert attempt(monkeypatch, store, rid, at=k, sig=sig) == 128 + sig
        step += k  # the step the signal arrived in is completed, then saved
        r = store.get(rid)
        assert r.state == "preempted"
        assert r.error.startswith(f"preempted ({signal.Signals(sig).name}): checkpoint at step {step};")
        assert r.info["checkpoint"]["step"] == step and checkpoint.path_for(store.root, rid).is_file()
        assert resume.requeue(store, rid) == "resumed"
        assert store.get(rid).state == "pending"
    assert attempt(monkeypatch, store, rid) == 0
    r = store.get(rid)
    assert r.state == "finished", r.error
    assert [x["step"] for x in r.info["resumed"]] == [sum(stops[:i + 1]) for i in range(len(stops))]
    if kind == "fixed":  # early stopping ended it after epoch 3, as it ends the whole run
        assert r.step == 15 and r.info["stop_reason"].startswith("no eval accuracy improvement")
    got = outcome(store, rid)
    assert got[0] == want[0]  # every train loss, lr and eval number, bit for bit
    assert got[1] == want[1]
    assert not checkpoint.folder(store.root, rid).exists()  # a finished run keeps none
    assert r.info["checkpoint"] is None


def test_signal_during_final_evaluation_saves_the_trained_state(tmp_path, monkeypatch, no_live_worker):
    """Training over, the final evaluations running: the checkpoint holds the end of
    training, and the resumed run only evaluates."""
    spec = spec_of(**FIXED)
    want = uninterrupted(tmp_path, monkeypatch, spec)
    store, rid = new_run(tmp_path / "cut", spec)
    real = worker.Trainer.inference_ms
    fired = []

    def inference_ms(self, batch):
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises right here
        return real(self, batch)

    monkeypatch.setattr(worker.Trainer, "inference_ms", inference_ms)
    assert attempt(monkeypatch, store, rid) == 128 + signal.SIGTERM
    r = store.get(rid)
    assert r.state == "preempted" and r.info["checkpoint"]["train_done"]
    assert r.info["checkpoint"]["step"] == want[0][-1][0]
    resume.requeue(store, rid)
    losses = []
    monkeypatch.setattr(worker.Trainer, "_loop", lambda *a: losses.append(a) or (0, ""))
    assert attempt(monkeypatch, store, rid) == 0
    assert losses == []  # not one more training step
    assert outcome(store, rid) == want


def test_a_kill_keeps_the_killed_state_and_a_resumable_checkpoint(tmp_path, monkeypatch, no_live_worker):
    spec = spec_of(**FIXED)
    store, rid = new_run(tmp_path / "cut", spec)
    # `ssm-workbench kill` marks the run first, then sends SIGTERM
    code = attempt(monkeypatch, store, rid, at=6,
                   before_signal=lambda: store.finish(rid, "killed", "killed by user"))
    assert code == 128 + signal.SIGTERM
    r = store.get(rid)
    assert r.state == "killed" and r.error == "killed by user" and r.info["checkpoint"]["step"] == 6
    assert resume.requeue(store, rid) == "resumed"
    assert attempt(monkeypatch, store, rid) == 0
    assert outcome(store, rid) == uninterrupted(tmp_path, monkeypatch, spec)


def test_metrics_logged_after_the_checkpoint_are_dropped(tmp_path, monkeypatch, no_live_worker):
    """A worker that dies (no signal, no goodbye) 3 steps after its periodic checkpoint:
    the rows it logged after the checkpoint's step are deleted on resume, so the curve has
    each step once and equals the uninterrupted one."""
    spec = spec_of(budget="steps = 20", log_every=1, eval_every=10, extra="checkpoint_every = 5")
    want = uninterrupted(tmp_path, monkeypatch, spec)
    store, rid = new_run(tmp_path / "cut", spec)

    class Died(BaseException):
        pass

    real = task_metrics.loss
    calls = [0]

    def loss(logits, targets):
        calls[0] += 1
        if calls[0] == 14:
            raise Died()  # like SIGKILL: nothing of the worker's own handling runs
        return real(logits, targets)

    monkeypatch.setattr(task_metrics, "loss", loss)
    start(store, rid)
    with pytest.raises(Died):
        worker.run(str(store.root), rid)
    monkeypatch.setattr(task_metrics, "loss", real)
    assert store.get(rid).info["checkpoint"]["step"] == 10
    assert max(m["step"] for m in store.metrics(rid)) == 13  # logged after the checkpoint
    store.finish(rid, "crashed", "worker exited without finishing")  # what the reaper does
    assert resume.requeue(store, rid) == "resumed"
    assert attempt(monkeypatch, store, rid) == 0
    r = store.get(rid)
    assert r.info["resumed"][0]["metrics_dropped"] == 3 * 2  # loss and lr at steps 11..13
    rows, results = outcome(store, rid)
    keys = [(s, split, name) for s, _, split, name, _ in rows]
    assert len(keys) == len(set(keys))
    assert (rows, results) == want


# --------------------------------------------------------------------------- atomic file
CRASH_MID_WRITE = """
import os, signal, sys, torch
sys.path.insert(0, {root!r})
from workbench.train import checkpoint

class HalfThenDie:  # the temporary file: its header goes in, the payload half, then SIGKILL
    def __init__(self, path, mode):
        self.f = open(path, mode)
        self.writes = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()

    def write(self, b):
        self.writes += 1
        if len(b) > 1000 or self.writes == 3:
            self.f.write(bytes(b)[:len(b) // 2])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.f.write(b)

checkpoint.open = HalfThenDie
checkpoint.save({{"format": checkpoint.FORMAT, "version": 2}}, {path!r})
"""


def test_a_crash_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = checkpoint.path_for(tmp_path, 7)
    checkpoint.save({"format": checkpoint.FORMAT, "version": 1, "w": torch.arange(4.0)}, path)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    p = subprocess.run([sys.executable, "-c", CRASH_MID_WRITE.format(root=root, path=str(path))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    state = checkpoint.load(path)
    assert state["version"] == 1 and torch.equal(state["w"], torch.arange(4.0))
    leftovers = [f for f in path.parent.iterdir() if f != path]
    assert leftovers  # the half-written temporary file
    checkpoint.save({"format": checkpoint.FORMAT, "version": 3}, path)
    assert checkpoint.load(path)["version"] == 3
    assert list(path.parent.iterdir()) == [path]  # the next save cleared it


def test_a_damaged_or_foreign_checkpoint_fails_the_resumed_run_clearly(tmp_path, monkeypatch, no_live_worker):
    spec = spec_of(**FIXED)
    store, rid = new_run(tmp_path / "cut", spec)
    assert attempt(monkeypatch, store, rid, at=3) == 128 + signal.SIGTERM
    resume.requeue(store, rid)
    checkpoint.path_for(store.root, rid).write_bytes(b"not a checkpoint")
    assert attempt(monkeypatch, store, rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith("cannot resume: checkpoint ")
    with pytest.raises(checkpoint.CheckpointError, match="written for another spec than run"):
        other = dict(spec, seed=1)
        checkpoint.save({"format": checkpoint.FORMAT, "run_id": rid, "spec_key": spec_key(other)},
                        checkpoint.path_for(store.root, rid))
        checkpoint.load_for_run(store.root, rid, spec)


# --------------------------------------------------------------------------- resume command
def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    store = Store(tmp_path / "st")
    a, b = store.add_runs([spec_of(), spec_of(seed=1)])
    store.finish(a, "crashed", "worker exited without finishing")
    store.finish(b, "finished")
    args = SimpleNamespace(store=str(store.root), ids=[a, b, 99], jobs=None, runs_per_gpu=None)
    assert resume.cmd_resume(args) == 2
    err = capsys.readouterr().err
    assert f"run {a} (crashed) has no checkpoint to resume from" in err
    assert f"run {b} is finished; nothing to resume" in err
    assert "no run 99" in err
    assert store.get(a).state == "crashed" and store.get(b).state == "finished"  # untouched


def test_resume_command_requeues_and_starts_a_scheduler(tmp_path, monkeypatch, no_live_worker, capsys):
    store, rid = new_run(tmp_path / "st", spec_of(**FIXED))
    assert attempt(monkeypatch, store, rid, at=3) == 128 + signal.SIGTERM
    spawned = []
    monkeypatch.setattr(scheduler, "spawn", lambda st, jobs=None, rpg=None: spawned.append(st.root))
    args = SimpleNamespace(store=str(store.root), ids=[rid], jobs=None, runs_per_gpu=None)
    assert resume.cmd_resume(args) == 0
    assert f"run {rid}: resumes from its checkpoint at step 3" in capsys.readouterr().out
    r = store.get(rid)
    assert r.state == "pending" and r.info["resume"]["step"] == 3 and r.error is None
    assert spawned == [store.root]


def test_a_live_worker_is_never_requeued(tmp_path):
    store, rid = new_run(tmp_path / "st", spec_of())
    start(store, rid)  # this test's own (live) pid
    store.finish(rid, "killed", "killed by user")
    with pytest.raises(resume.ResumeError, match="has not exited yet"):
        resume.requeue(store, rid)


# --------------------------------------------------------------------------- replay
class FakePopen:
    launched: list = []

    def __init__(self, cmd, **kw):
        self.cmd, self.pid = cmd, os.getpid()
        FakePopen.launched.append(cmd)


@pytest.fixture
def fake_popen(monkeypatch):
    FakePopen.launched = []
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)
    return FakePopen.launched


def sweep(**kw):
    text = profile_text(name="replay", **kw).replace("seeds = [0]", "seeds = [0, 1, 2]")
    return loads(text)


def test_replaying_a_finished_profile_submits_nothing(tmp_path, fake_popen):
    store = Store(tmp_path / "st")
    first = launch.submit(store, sweep())
    assert first.queued == list(first) and len(first) == 3 and len(fake_popen) == 1
    for rid in first:
        store.finish(rid, "finished")
    again = launch.submit(store, sweep(extra="checkpoint_every = 7"))  # neutral setting
    assert list(again) == list(first) and again.skipped == list(first)
    assert again.queued == again.resumed == again.restarted == []
    assert len(fake_popen) == 1  # no scheduler started for nothing
    assert len(store.runs()) == 3
    fresh = launch.submit(store, sweep(), fresh=True)
    assert fresh.queued == list(fresh) and len(store.runs()) == 6 and len(fake_popen) == 2
    changed = launch.submit(store, loads(profile_text(name="replay").replace("lr = 3e-3", "lr = 1e-3")))
    assert len(changed.queued) == 1 and changed.skipped == []


def test_replay_resumes_or_restarts_unfinished_runs_instead_of_adding_them(tmp_path, fake_popen,
                                                                            monkeypatch, no_live_worker):
    store = Store(tmp_path / "st")
    a, b, c = launch.submit(store, sweep())
    store.finish(a, "finished")
    # b: preempted with a checkpoint
    start(store, b)
    store.add_metrics(b, [(3, None, "train", "loss", 1.0)])
    checkpoint.save({"format": checkpoint.FORMAT, "run_id": b, "step": 3,  # b's own, as requeue checks
                     "spec_key": spec_key(store.get(b).spec)}, checkpoint.path_for(store.root, b))
    store.set_info(b, {"checkpoint": {"step": 3}})
    store.finish(b, "preempted", "preempted (SIGTERM): checkpoint at step 3")
    # c: crashed before its first checkpoint
    start(store, c)
    store.add_metrics(c, [(1, None, "train", "loss", 2.0)])
    store.set_results(c, {"accuracy": 0.5})
    store.finish(c, "crashed", "no heartbeat")
    out = launch.submit(store, sweep())
    assert list(out) == [a, b, c]
    assert (out.skipped, out.resumed, out.restarted, out.queued) == ([a], [b], [c], [])
    rb, rc = store.get(b), store.get(c)
    assert rb.state == rc.state == "pending" and len(store.runs()) == 3
    assert rb.info["resume"]["step"] == 3 and store.metrics(b)  # its rows are kept (the worker trims)
    assert not rc.info["resume"] and store.metrics(c) == [] and store.results([c]) == {}
    assert len(fake_popen) == 2  # a scheduler to serve them
    again = launch.submit(store, sweep())  # still pending: watched, not duplicated
    assert again.attached == [b, c] and again.queued == [] and len(store.runs()) == 3


# --------------------------------------------------------------------------- schema
def test_checkpoint_settings_are_validated():
    assert spec_of()["train"]["checkpoint_every"] == 0
    assert spec_of()["train"]["checkpoint_minutes"] == 10.0
    assert spec_of(extra="checkpoint_every = 50")["train"]["checkpoint_every"] == 50
    with pytest.raises(ProfileError, match="checkpoint_every"):
        spec_of(extra="checkpoint_every = -1")
    with pytest.raises(ProfileError, match="unknown key 'train.checkpoint_evry'"):
        spec_of(extra="checkpoint_evry = 5")


def test_neutral_settings_do_not_change_a_runs_identity():
    base = spec_of()
    assert spec_key(base) == spec_key(spec_of(extra="checkpoint_minutes = 1"))
    assert spec_key(base) == spec_key(dict(base, index=5))
    assert spec_key(base) != spec_key(spec_of(seed=1))


# --------------------------------------------------------------------------- real processes
wait_for = functools.partial(helpers.wait_for, timeout=90.0, poll=0.1)  # this file's defaults


def test_preempted_worker_process_resumes_through_the_scheduler(tmp_path, monkeypatch):
    """Real processes: the scheduler starts the worker, SIGTERM arrives from outside (as a
    cluster sends it), ``resume`` requeues it, the scheduler starts it again, and the curve
    equals the one of the same run left alone; replaying the profile then adds nothing."""
    # the two stores' workers run side by side: one thread each, not two spinning on each core
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # 300 steps: SIGTERM lands at step 20 or soon after (polled every 20 ms, one store row a
    # step), leaving the resumed attempt most of the run; 1000 steps took minutes on a loaded
    # machine and checked nothing more
    text = profile_text(name="proc", budget="steps = 300", eval_every=75, log_every=1)
    prof = loads(text)
    whole = Store(tmp_path / "whole")
    (w,) = launch.submit(whole, prof)
    cut = Store(tmp_path / "cut")
    (c,) = launch.submit(cut, prof)
    # the timeouts are generous: on a loaded 2-core machine starting a worker alone can take 30 s
    r = wait_for(lambda: (x := cut.get(c)).state == "running" and x.step >= 20 and x, timeout=240,
                 poll=0.02)
    os.kill(r.pid, signal.SIGTERM)
    r = wait_for(lambda: (x := cut.get(c)).state != "running" and x, timeout=120)
    assert r.state == "preempted", r.error
    step = r.info["checkpoint"]["step"]
    assert 20 <= step < 300
    wait_for(lambda: not resume.pid_alive(r.pid, r.pid_start), timeout=60)
    args = SimpleNamespace(store=str(cut.root), ids=[c], jobs=None, runs_per_gpu=None)
    assert resume.cmd_resume(args) == 0
    r = wait_for(lambda: (x := cut.get(c)).state not in ("pending", "running") and x, timeout=300)
    assert r.state == "finished", r.error
    assert r.info["resumed"][0]["step"] == step
    assert wait_for(lambda: whole.get(w).state == "finished", timeout=300)
    assert outcome(cut, c) == outcome(whole, w)
    again = launch.submit(cut, prof)
    assert list(again) == again.skipped == [c] and len(cut.runs()) == 1


def test_a_resumed_runs_elapsed_time_goes_on_and_a_restart_starts_at_zero(tmp_path):
    """Issue 22: the runs table's time of a resumed run continued from zero. The store keeps
    each ended attempt's seconds when the run is requeued to resume; a restart clears them."""
    store, rid = new_run(tmp_path / "st", spec_of())
    start(store, rid)
    store.finish(rid, "killed", "killed by user")
    with store.tx() as c:  # a 100-second first attempt
        c.execute("UPDATE runs SET started=1000.0, ended=1100.0 WHERE id=?", (rid,))
    assert store.requeue(rid, {"step": 3})
    r = store.get(rid)
    assert r.state == "pending" and r.elapsed == pytest.approx(100.0)
    start(store, rid)
    store.finish(rid, "killed", "killed by user")
    with store.tx() as c:  # a second attempt of 50 seconds
        c.execute("UPDATE runs SET started=2000.0, ended=2050.0 WHERE id=?", (rid,))
    assert store.get(rid).elapsed == pytest.approx(150.0)
    assert store.requeue(rid, {"step": 5})
    assert store.get(rid).elapsed == pytest.approx(150.0)
    store.finish(rid, "killed", "killed by user")
    assert store.requeue(rid, None)   # from scratch: the clock starts again
    assert store.get(rid).elapsed is None
