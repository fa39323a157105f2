"""Several runs per GPU: G visible GPUs x N runs each = G*N slots, slot i pinned to GPU
i // N through CUDA_VISIBLE_DEVICES; the flag beats the profile, which beats 1.

The GPU count is faked at the seam the scheduler counts GPUs with (``sysmon.gpu_count``,
or ``CUDA_VISIBLE_DEVICES``), and ``subprocess.Popen`` is replaced so that no worker starts:
the fake records the environment each worker would have got."""
import os

import pytest

from workbench import cli
from workbench.execute import launch, scheduler
from workbench.train import sysmon
from workbench.spec.profile import dumps, expand, loads
from workbench.store import Store

PROFILE = """
schema_version = 1
name = "rpg"
{extra}
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 16
num_test_examples = 8
[sweep]
models = ["lstm"]
seq_lens = [8]
seeds = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
[model]
d_model = 8
n_layers = 1
[train]
steps = 2
batch_size = 4
"""


def profile(runs_per_gpu=None):
    return loads(PROFILE.format(extra="" if runs_per_gpu is None else f"runs_per_gpu = {runs_per_gpu}"))


class FakePopen:
    """Stands in for a worker process: alive (this test's pid) until ``exit`` is set."""

    launched: list["FakePopen"] = []

    def __init__(self, cmd, env=None, **kwargs):
        self.cmd, self.env = cmd, dict(env or {})
        self.pid = os.getpid()  # alive, so the store's reaper leaves the run alone
        self.exit = None
        FakePopen.launched.append(self)

    def poll(self):
        return self.exit

    def wait(self, timeout=None):
        return self.exit


@pytest.fixture
def fake(monkeypatch):
    FakePopen.launched = []
    monkeypatch.setattr(scheduler.subprocess, "Popen", FakePopen)

    def gpus(n):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(sysmon, "gpu_count", lambda: n)

    return gpus


def queued(tmp_path, n_runs=10):
    store = Store(tmp_path / "st")
    specs = [s.to_dict() for s in expand(profile())][:n_runs]
    return store, store.add_runs(specs)


def running_by_gpu(store):
    out: dict[str, int] = {}
    for r in store.runs(states=["running"]):
        out[r.slot] = out.get(r.slot, 0) + 1
    return out


@pytest.mark.parametrize("G,N", [(1, 1), (1, 3), (2, 2), (3, 2), (4, 1)])
def test_slot_assignment(fake, G, N):
    fake(G)
    slots = scheduler.detect_slots(runs_per_gpu=N)
    assert slots == [("cuda", str(i // N)) for i in range(G * N)]


def test_visible_devices_are_the_gpu_ids(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert scheduler.detect_slots(runs_per_gpu=2) == [("cuda", "2"), ("cuda", "2"), ("cuda", "5"), ("cuda", "5")]


def test_no_effect_without_a_gpu(fake):
    fake(0)
    assert scheduler.detect_slots(runs_per_gpu=4) == [("cpu", "cpu0")]
    assert scheduler.detect_slots(jobs=2, runs_per_gpu=4) == [("cpu", "cpu0"), ("cpu", "cpu1")]


@pytest.mark.parametrize("G,N", [(1, 2), (2, 2), (3, 1), (2, 3)])
def test_at_most_g_times_n_workers_and_their_gpu(fake, tmp_path, G, N):
    fake(G)
    store, ids = queued(tmp_path)
    sched = scheduler.Scheduler(store, runs_per_gpu=N)
    assert sched.tick()
    assert len(FakePopen.launched) == G * N == len(store.runs(states=["running"]))
    # spread evenly: N workers on every GPU, each pinned to its GPU only
    assert running_by_gpu(store) == {str(g): N for g in range(G)}
    for p in FakePopen.launched:
        run = store.get(int(p.cmd[p.cmd.index("--run-id") + 1]))
        assert p.env["CUDA_VISIBLE_DEVICES"] == run.slot and run.device == "cuda"
    # a second round launches nothing: every slot is busy
    sched.tick()
    assert len(FakePopen.launched) == G * N

    # one worker ends: exactly one more starts, on the GPU that freed up
    first = FakePopen.launched[0]
    rid = int(first.cmd[first.cmd.index("--run-id") + 1])
    freed = store.get(rid).slot
    store.finish(rid, "finished")
    first.exit = 0
    sched.tick()
    assert len(FakePopen.launched) == G * N + 1
    assert FakePopen.launched[-1].env["CUDA_VISIBLE_DEVICES"] == freed
    assert len(store.runs(states=["running"])) == G * N
    assert running_by_gpu(store) == {str(g): N for g in range(G)}


def test_spreads_over_gpus_before_doubling_up(fake, tmp_path):
    fake(2)
    store, ids = queued(tmp_path, n_runs=2)
    scheduler.Scheduler(store, runs_per_gpu=4).tick()
    assert sorted(p.env["CUDA_VISIBLE_DEVICES"] for p in FakePopen.launched) == ["0", "1"]


def test_cpu_workers_hide_the_gpus(fake, tmp_path):
    fake(0)
    store, ids = queued(tmp_path)
    scheduler.Scheduler(store, jobs=2, runs_per_gpu=3).tick()
    assert len(FakePopen.launched) == 2
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" for p in FakePopen.launched)


# --------------------------------------------------------------------------- precedence
def test_precedence_flag_profile_default():
    assert scheduler.resolve_runs_per_gpu(None, profile()) == 1
    assert scheduler.resolve_runs_per_gpu(None, profile(3)) == 3
    assert scheduler.resolve_runs_per_gpu(2, profile(3)) == 2
    assert scheduler.resolve_runs_per_gpu(2, profile()) == 2


def _spawned_runs_per_gpu(cmd):
    return int(cmd[cmd.index("--runs-per-gpu") + 1]) if "--runs-per-gpu" in cmd else None


@pytest.mark.parametrize("flag,prof,want", [(None, None, 1), (None, 3, 3), (2, 3, 2), (4, None, 4)])
def test_submit_passes_it_to_the_detached_scheduler(fake, tmp_path, flag, prof, want):
    store = Store(tmp_path / "st")
    launch.submit(store, profile(prof), runs_per_gpu=flag)
    (p,) = FakePopen.launched
    assert p.cmd[p.cmd.index("-m") + 1] == "workbench.execute.scheduler"
    assert _spawned_runs_per_gpu(p.cmd) == want


def test_scheduler_main_reads_the_flag(monkeypatch, tmp_path):
    seen = {}

    class Probe(scheduler.Scheduler):
        def __init__(self, store, jobs=None, runs_per_gpu=None):
            seen.update(jobs=jobs, runs_per_gpu=runs_per_gpu)

        def run_until_idle(self):
            pass

    monkeypatch.setattr(scheduler, "Scheduler", Probe)
    assert scheduler.main(["--store", str(tmp_path / "st"), "--runs-per-gpu", "3"]) == 0
    assert seen == {"jobs": None, "runs_per_gpu": 3}


@pytest.mark.parametrize("argv,want", [([], None), (["--runs-per-gpu", "2"], 2)])
def test_cli_flag(monkeypatch, tmp_path, argv, want):
    seen = {}

    def submit(store, prof, jobs=None, runs_per_gpu=None, fresh=False):
        seen.update(runs_per_gpu=runs_per_gpu, profile=prof.runs_per_gpu)
        raise SystemExit(0)  # stop before the progress loop

    monkeypatch.setattr(launch, "submit", submit)
    path = tmp_path / "p.toml"
    path.write_text(PROFILE.format(extra="runs_per_gpu = 3"))
    with pytest.raises(SystemExit):
        cli.main(["--store", str(tmp_path / "st"), "run", str(path), *argv])
    assert seen == {"runs_per_gpu": want, "profile": 3}


def test_cli_rejects_zero(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(["run", "x.toml", "--runs-per-gpu", "0"])
    assert e.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_help_says_no_effect_on_cpu(capsys):
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--runs-per-gpu N" in out and "no effect on a machine without a GPU" in out


# --------------------------------------------------------------------------- profile field
def test_profile_field_round_trips(tmp_path):
    p = profile(2)
    assert p.runs_per_gpu == 2
    assert "runs_per_gpu = 2" in dumps(p)
    assert loads(dumps(p)) == p
    assert profile().runs_per_gpu is None and "runs_per_gpu" not in dumps(profile())


def test_profile_field_must_be_positive():
    from workbench.spec.profile import ProfileError

    with pytest.raises(ProfileError, match="runs_per_gpu"):
        profile(0)


async def test_tui_form_keeps_a_loaded_profiles_setting(tmp_path):
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.sweep_form import SweepForm

    class NoScheduler:
        def submit(self, store, profile, jobs=None):
            raise AssertionError("not launched here")

    app = WorkbenchApp(store=Store(tmp_path / "st"), profiles_dir=tmp_path / "profiles", scheduler=NoScheduler())
    async with app.run_test(size=(160, 48)) as pilot:
        await app.mount_tab("sweep")  # (mounted when first shown; here it stays hidden)
        form = app.query_one(SweepForm)
        await form.fill(profile(2))
        await pilot.pause()
        built = form.build_profile()
        assert built is not None and built.runs_per_gpu == 2  # submit() reads it from the profile
        await form.fill(profile())
        await pilot.pause()
        assert form.build_profile().runs_per_gpu is None
