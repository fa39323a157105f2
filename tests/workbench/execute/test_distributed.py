"""Data-parallel training of one run (train.devices; workbench/train/distributed.py) on the
CPU with gloo: two ranks train the 1-rank run's curve to float round-off (same global
batch); a killed rank fails the run in one line that names it; a run stopped on two
ranks resumes, on two or on one, and continues the uninterrupted curve; only rank 0
writes; the scheduler reserves a run's devices; Slurm's job script starts the ranks with
srun. The worker runs rank 0 in this process (as tests/workbench/execute/test_resume.py does) and starts
rank 1 as a real child process."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from helpers import tiny_profile_text
from workbench.execute import resume, scheduler
from workbench.execute.slurm import job_script
from workbench.spec.profile import ProfileError, expand, loads
from workbench.spec.run_spec import run_devices, spec_key
from workbench.spec.slurm_settings import SlurmSettings
from workbench.store import Store
from workbench.train import checkpoint, distributed, worker

TOL = dict(rel=1e-5, abs=1e-6)  # float32 sums in another order, over a few Adam steps


def profile_text(model="transformer", steps=10, extra=""):
    """A one-run selective-copying profile; ``extra``: TOML lines after [train]'s keys. 36
    examples in batches of 8: each epoch ends with a batch of 4 (2 per rank)."""
    return tiny_profile_text("ddp", models=[model], seeds=[0], examples=(36, 16), d_model=16, steps=steps,
                             batch_size=8, lr=3e-3, warmup_steps=2, log_every=1, eval_every=5, device="cpu",
                             tail=extra)


def spec(devices=None, model="transformer", steps=10, extra=""):
    extra = (f"devices = {devices}\n" if devices else "") + extra
    return expand(loads(profile_text(model, steps, extra)))[0].to_dict()


def start(store, rid):
    assert store.mark_started(rid, os.getpid(), "cpu", "cpu0")


def train(path, s, rid=None):
    """Run (or continue) a run to its end with rank 0 in this process; (store, run id)."""
    store = Store(path)
    if rid is None:
        (rid,) = store.add_runs([s])
    start(store, rid)
    worker.run(str(path), rid)
    return store, rid


def curve(store, rid, split="train", name="loss"):
    return [(m["step"], m["value"]) for m in store.metrics(rid) if m["split"] == split and m["name"] == name]


@pytest.fixture
def launched(monkeypatch):
    """The launchers rank 0 makes (their children are ranks 1..N-1)."""
    made = []
    real = distributed.Launcher

    class Recording(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(distributed, "Launcher", Recording)
    return made


def at_step(monkeypatch, k, action):
    """Call ``action()`` in rank 0 during its k-th training step of this attempt."""
    real, calls = distributed.shard_loss, [0]

    def loss(*a):
        calls[0] += 1
        if calls[0] == k:
            action()
        return real(*a)

    monkeypatch.setattr(distributed, "shard_loss", loss)


# --------------------------------------------------------------------------- pieces
def test_ranks_from_torchrun_and_srun_environments():
    assert distributed.from_env({}) is None
    assert distributed.from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None  # torchrun of one: a plain worker
    r = distributed.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                              "MASTER_PORT": "1234"})
    assert (r.rank, r.world, r.local_rank, r.launcher, r.addr, r.port) == (1, 2, 1, "torchrun", "h", 1234)
    r = distributed.from_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                              "MASTER_ADDR": "node1", "MASTER_PORT": "20001"})
    assert (r.rank, r.world, r.local_rank, r.launcher, r.addr) == (3, 4, 1, "srun", "node1")
    # a one-task Slurm job (every run before train.devices) is not a rank
    assert distributed.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "n"}) is None


@pytest.mark.parametrize("n,world", [(8, 2), (4, 2), (5, 2), (1, 2), (7, 3)])
def test_shards_cover_the_batch_in_order(n, world):
    bounds = [distributed.shard_bounds(n, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_devices_is_checked_and_does_not_change_a_runs_identity():
    with pytest.raises(ProfileError, match="batch_size = 8 is not divisible by devices = 3"):
        spec(devices=3)
    with pytest.raises(ProfileError, match="devices"):
        spec(extra="devices = 0")
    one, two = spec(), spec(devices=2)
    assert "devices" not in one["train"] and two["train"]["devices"] == 2
    assert spec_key(one) == spec_key(two)  # the same computation: a replay finds the run
    assert run_devices(one) == 1 and run_devices(two) == 2
    assert run_devices(two, {"devices": 1}) == 1  # resume --devices wins


# --------------------------------------------------------------------------- training
def test_two_ranks_train_the_one_rank_curve(tmp_path, launched):
    s1, rid1 = train(tmp_path / "one", spec())
    s2, rid2 = train(tmp_path / "two", spec(devices=2))
    assert s2.get(rid2).state == "finished", s2.get(rid2).error
    assert len(launched) == 1 and len(launched[0].children) == 1  # rank 1 was a process of its own
    assert all(p.returncode == 0 for p in launched[0].children.values())
    one, two = curve(s1, rid1), curve(s2, rid2)
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(1, 11))
    assert [v for _, v in two] == pytest.approx([v for _, v in one], **TOL)
    assert [v for _, v in curve(s2, rid2, "eval")] == pytest.approx([v for _, v in curve(s1, rid1, "eval")], **TOL)
    # only rank 0 wrote: one row per step and name, as one process writes
    assert len(s2.metrics(rid2)) == len(s1.metrics(rid1))
    assert s2.get(rid2).info["ranks"] == {"world": 2, "launcher": "self", "backend": "gloo", "sharding": "ddp"}


def test_a_killed_rank_fails_the_run_in_one_line(tmp_path, launched, monkeypatch):
    def kill_rank1():
        os.kill(launched[0].children[1].pid, signal.SIGKILL)

    at_step(monkeypatch, 3, kill_rank1)
    store, rid = train(tmp_path / "st", spec(devices=2, steps=40))
    r = store.get(rid)
    pid = launched[0].children[1].pid
    assert r.state == "failed"
    assert r.error == f"rank 1 of 2 (pid {pid}) was killed by SIGKILL"


@pytest.mark.slow  # ~15 s quiet, 40 s at load 13 (rank 1 starts cold)
def test_a_failing_rank_names_itself_and_its_error(tmp_path, launched, monkeypatch):
    # rank 1's process fails inside its training loop: a sitecustomize on its path (the
    # launcher passes this environment on) makes Trainer._loop raise there, on rank 1 only
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    from workbench.train import trainer\n"
        "    def _loop(self, *a, **k):\n"
        "        raise ValueError('injected on rank 1')\n"
        "    trainer.Trainer._loop = _loop\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "hook"), os.getcwd(),
                                                                   os.environ.get("PYTHONPATH")])))
    store, rid = train(tmp_path / "st", spec(devices=2, steps=40))
    r = store.get(rid)
    pid = launched[0].children[1].pid
    assert r.state == "failed"
    assert r.error == f"rank 1 of 2 (pid {pid}) exited with code 1: ValueError: injected on rank 1"


@pytest.mark.slow  # three runs of two processes: ~30 s on a loaded 2-core box
@pytest.mark.parametrize("ranks_after", [2, 1])
def test_a_stopped_run_resumes_on_as_many_or_fewer_ranks_and_continues_the_curve(
        tmp_path, launched, monkeypatch, ranks_after):
    base, brid = train(tmp_path / "base", spec(steps=12))
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # the attempt's worker (this test) is gone
    at_step(monkeypatch, 7, lambda: os.kill(os.getpid(), signal.SIGTERM))
    store, rid = train(tmp_path / "st", spec(devices=2, steps=12))
    r = store.get(rid)
    assert r.state == "preempted" and r.info["checkpoint"]["step"] == 7, r.error
    monkeypatch.undo()
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)
    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: None)  # this test is the worker
    done, errors = resume.resume_runs(store, [rid], devices=None if ranks_after == 2 else ranks_after)
    assert done == [rid] and not errors
    train(tmp_path / "st", None, rid)
    r = store.get(rid)
    assert r.state == "finished", r.error
    assert r.info["resumed"][-1]["from_ranks"] == 2 and r.info["resumed"][-1]["ranks"] == ranks_after
    assert [v for _, v in curve(store, rid)] == pytest.approx([v for _, v in curve(base, brid)], **TOL)
    assert [s for s, _ in curve(store, rid)] == list(range(1, 13))


@pytest.mark.slow  # two runs of two processes, one resumed: ~25-30 s on a loaded 2-core box
def test_a_resumed_run_with_dropout_and_an_open_log_window_continues_the_two_rank_curve(
        tmp_path, launched, monkeypatch):
    """What only a checkpoint of several ranks carries matters here, unlike above: dropout
    draws from each rank's own RNG (rank 1's seeded apart from rank 0's, Trainer.__init__),
    so the resumed run draws the uninterrupted run's masks only if the checkpoint kept every
    rank's RNGs; and the stop at step 7 falls inside a log window (log_every = 3: steps 7-9),
    so the mean logged at step 9 is the uninterrupted one only if the window saved holds both
    ranks' shares of step 7 (RankLossTracker.merge before the save)."""
    sp = spec(devices=2, steps=12, extra="[model.options.transformer]\ndropout = 0.1")
    sp["train"]["log_every"] = 3
    base, brid = train(tmp_path / "base", sp)
    assert base.get(brid).state == "finished", base.get(brid).error
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)
    at_step(monkeypatch, 7, lambda: os.kill(os.getpid(), signal.SIGTERM))
    store, rid = train(tmp_path / "st", sp)
    r = store.get(rid)
    assert r.state == "preempted" and r.info["checkpoint"]["step"] == 7, r.error
    ck = checkpoint.load(r.info["checkpoint"]["path"])
    assert ck["losses"]["count"] == 1  # the window is open: step 7 is in it, not yet logged
    monkeypatch.undo()
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)
    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: None)  # this test is the worker
    done, errors = resume.resume_runs(store, [rid])
    assert done == [rid] and not errors
    train(tmp_path / "st", None, rid)
    assert store.get(rid).state == "finished", store.get(rid).error
    got, want = curve(store, rid), curve(base, brid)
    assert [s for s, _ in got] == [s for s, _ in want] == [3, 6, 9, 12]
    # the same weights and masks; only the window's float64 sum runs in another order
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-12, abs=0)
    # the ranks' dropout streams are distinct (torch's CPU generator: dropout's, on the CPU)
    assert not torch.equal(ck["rng_ranks"][1]["torch"], ck["rng_ranks"][0]["torch"])


# --------------------------------------------------------------------------- placing the ranks
class FakePopen:
    launched: list = []

    def __init__(self, cmd, env=None, **kwargs):
        self.cmd, self.env, self.pid, self.exit = cmd, dict(env or {}), os.getpid(), None
        FakePopen.launched.append(self)

    def poll(self):
        return self.exit

    def wait(self, timeout=None):
        return self.exit


def queue(tmp_path, devices_list):
    store = Store(tmp_path / "q")
    return store, store.add_runs([spec(devices=d) | {"index": i} for i, d in enumerate(devices_list)])


def test_the_scheduler_reserves_a_runs_cpu_slots(tmp_path, monkeypatch):
    FakePopen.launched = []
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(scheduler, "_visible_gpus", lambda: [])
    store, (a, b, c) = queue(tmp_path, [None, 2, None])
    sched = scheduler.Scheduler(store, jobs=2)
    sched.tick()
    # run a takes one slot; b needs two, so it waits, and c waits behind it
    assert [store.get(i).state for i in (a, b, c)] == ["running", "pending", "pending"]
    store.finish(a, "finished")
    FakePopen.launched[0].exit = 0
    sched.tick()
    assert [store.get(i).state for i in (b, c)] == ["running", "pending"]
    assert store.get(b).slot == "cpu0,cpu1"
    assert FakePopen.launched[-1].env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    sched.tick()
    assert store.get(c).state == "pending"  # both slots are b's


def test_a_cpu_run_wanting_more_slots_than_there_are_runs_alone(tmp_path, monkeypatch):
    FakePopen.launched = []
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(scheduler, "_visible_gpus", lambda: [])
    store, (a,) = queue(tmp_path, [2])
    scheduler.Scheduler(store).tick()  # one CPU slot (no --jobs)
    assert store.get(a).state == "running" and store.get(a).slot == "cpu0"


def test_gpu_runs_get_distinct_gpus_or_fail_in_one_line(tmp_path, monkeypatch):
    FakePopen.launched = []
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(scheduler, "_visible_gpus", lambda: ["0", "1"])
    store, (a, b) = queue(tmp_path, [2, 4])
    scheduler.Scheduler(store, runs_per_gpu=2).tick()
    assert store.get(a).state == "running" and store.get(a).slot == "0,1"
    assert FakePopen.launched[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    r = store.get(b)
    assert r.state == "failed" and r.error == "train.devices = 4, but this machine shows 2 GPU(s) (0, 1): one rank per GPU"


def test_slurm_job_script_starts_the_ranks_with_srun(tmp_path):
    s = SlurmSettings(nodes=2, gpus_per_node=4, cpus_per_run=8)
    text = job_script(5, s, tmp_path, tmp_path, "x", devices=8)
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=4" in text
    assert "#SBATCH --gpus-per-node=4" in text and "#SBATCH --cpus-per-task=8" in text
    assert "export MASTER_ADDR=\"$(scontrol show hostnames" in text
    assert text.rstrip().splitlines()[-1].startswith("exec srun ")
    one = job_script(5, SlurmSettings(), tmp_path, tmp_path, "x")
    assert "srun" not in one and "#SBATCH --ntasks=1" in one  # one device: as before


def test_slurm_settings_must_add_up_to_the_devices():
    base = profile_text("lstm", 4, "devices = 4")
    ok = loads('executor = "slurm"\n' + base + '\n[slurm]\nnodes = 2\ngpus_per_node = 2\n')
    assert ok.slurm.nodes == 2
    with pytest.raises(ProfileError, match=r"nodes \* gpus_per_node = 1 \* 2 = 2, but train.devices = 4"):
        loads('executor = "slurm"\n' + base + '\n[slurm]\ngpus_per_node = 2\n')
    with pytest.raises(ProfileError, match="train.devices = 4 cannot be split evenly over nodes = 3"):
        loads('executor = "slurm"\n' + base + '\n[slurm]\nnodes = 3\n')
    with pytest.raises(ProfileError, match="nodes = 2"):
        loads('executor = "slurm"\n' + profile_text("lstm", 4) +
              '\n[slurm]\nnodes = 2\n')


def test_the_memory_estimate_is_per_device():
    """Each rank holds its shard's activations: the estimate (checked against one device's
    memory) shrinks with train.devices; the weights, gradients and moments do not."""
    from workbench.spec import estimate
    from workbench.spec.run_spec import RunSpec

    def run(devices):
        d = spec(devices=devices, extra="eval_batch_size = 2")
        d["train"]["batch_size"] = 512  # training's activations outweigh the eval forward's
        return estimate.estimate_run(RunSpec.from_dict(d), estimate.Limit(device="cpu", bytes=None, what=""))

    one, two = run(None), run(2)
    assert one.parts["weights"] == two.parts["weights"] and one.parts["optimizer"] == two.parts["optimizer"]
    assert two.parts["activations"] == pytest.approx(one.parts["activations"] / 2, rel=0.01)


def test_a_rank_takes_its_own_gpu_and_is_refused_where_the_node_has_too_few(monkeypatch):
    """Ranks.pin (training's and evaluation's ranks): rank r's device is cuda:local_rank, made
    current; a node with fewer GPUs refuses in one line naming the setting; CPU unchanged."""
    from workbench.train.stop import RunFailed

    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    r = distributed.Ranks(rank=3, world=4, local_rank=1, launcher="srun")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert r.pin(torch.device("cuda"), "train.devices") == torch.device("cuda", 1)
    assert made_current == [1]
    assert r.pin(torch.device("cpu"), "train.devices") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RunFailed, match=r"^rank 3 needs GPU 1, but this node shows 1 \(eval.devices = 4\)$"):
        r.pin(torch.device("cuda"), "eval.devices")
    assert made_current == [1]


def test_a_worker_started_as_ranks_takes_its_rank_and_refuses_another_count(monkeypatch):
    """worker._start_ranks under torchrun or srun: the given rank when the world is the run's
    devices (the launcher is theirs, none of its own), else one line naming the setting."""
    from types import SimpleNamespace

    from workbench.train.stop import RunFailed

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    two = SimpleNamespace(spec={"train": {"devices": 2}}, info={})
    ranks, launcher = worker._start_ranks(None, 7, two, [])
    assert (ranks.rank, ranks.world, ranks.local_rank, launcher) == (1, 2, 1, None)
    four = SimpleNamespace(spec={"kind": "eval", "eval": {"devices": 4}}, info={})
    with pytest.raises(RunFailed, match=r"^started as 2 ranks \(torchrun\), but the run asks for 4 "
                                        r"\(eval.devices\)$"):
        worker._start_ranks(None, 7, four, [])
