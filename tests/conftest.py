import os
import sys
from pathlib import Path

import pytest

# OpenMP threads that wait passively (unless set): every process the tests start (commands,
# bench's measuring children, schedulers) inherits it, as the scheduler gives it to its
# workers. Two spinning threads per process on a 2-core machine that runs two test workers
# and their children burned the CPU the other processes were waiting for.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Without a GPU the Triton kernels are tested on CPU tensors through Triton's interpreter.
# The switch is read when the kernels are decorated, so it must be set before anything
# imports them; on a CUDA machine the same tests run the compiled kernels on the GPU.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# One intra-op thread in the test process: the tests' tensors are tiny, so a second thread
# buys nothing, and on a busy 2-core machine (workers the tests start, other jobs) two
# threads spin-waiting on each other made single tests 50x slower. Worker subprocesses
# keep their own setting.
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("SSM_WORKBENCH_TEST_THREADS", "1")))

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# tests/ mirrors the code in folders (tests/models/, tests/workbench/<layer>/, tests/tui/, ...),
# and test modules import each other's helpers by name (``from test_tui import make_app``):
# every folder of tests is on sys.path, whichever file pytest was asked to run (its prepend
# import mode adds only the folders of the files it collected). tests/test_layering.py keeps
# the names unique and those imports going down the layers.
for _folder in sorted({p.parent for p in Path(__file__).resolve().parent.rglob("test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


@pytest.fixture(scope="session", autouse=True)
def wide_console():
    """Commands' tables at the width a piped console gets (160: workbench/cli/common.py),
    whoever runs the tests: pytest-xdist's workers inherit COLUMNS=80, which left columns
    out that tests of wide output look for. Tests of a narrow terminal set COLUMNS
    themselves."""
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", "160")
    yield
    mp.undo()


@pytest.fixture(scope="session", autouse=True)
def lm_data_cache(tmp_path_factory):
    """The LM task's token cache (tasks/lm; workers inherit it) in a folder of the session,
    never the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SSM_WORKBENCH_DATA", str(tmp_path_factory.mktemp("lm-data")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """A cache folder for this test session (per xdist worker), shared by the tests that
    ask for it: the estimate's probes are made once a session instead of once a test in a
    fresh folder, and never come from the user's home folder."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture
def cache_env(shared_cache, monkeypatch) -> dict[str, str]:
    """XDG_CACHE_HOME = ``shared_cache`` for this test and the commands it starts (returned:
    the variables to pass to them), the C kernels kept where they were: building them
    takes ~15 s on a loaded machine, and their cache is keyed by source and compiler."""
    from models.kernels import cpu_kernels
    from workbench.spec import cost_probe

    env = {"SSM_WORKBENCH_KERNEL_CACHE": str(cpu_kernels.cache_dir()), "XDG_CACHE_HOME": str(shared_cache)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cost_probe, "_DISK", None)  # read the probes from there, not an earlier folder
    return env


@pytest.fixture
def bench_in_process(monkeypatch):
    """``bench`` measures each config in this process instead of a fresh one: for tests of
    what bench plans and tabulates at toy sizes, where a process per config (an interpreter
    and torch imported, seconds of CPU each) costs more than the measuring. The config
    still goes through JSON both ways, as it does to and from ``--one``. A test of the
    fresh process itself must not use this."""
    import json

    from workbench.cli import bench

    monkeypatch.setattr(bench, "_run_subprocess",
                        lambda spec, timeout: json.loads(json.dumps(bench.measure(json.loads(json.dumps(spec))))))


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    d = tmp_path / "store"
    monkeypatch.setenv("SSM_WORKBENCH_STORE", str(d))
    return d


# SSM_WORKBENCH_TEST_CPU=FILE: one line per test (CPU seconds of this process, of the child
# processes it waited for, and wall seconds), appended to FILE. On a loaded machine wall
# times (--durations) mostly measure the load; CPU time says which tests cost the most.
_CPU_LOG = os.environ.get("SSM_WORKBENCH_TEST_CPU")
if _CPU_LOG:
    import resource
    import time as _time

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        def cpu(who):
            r = resource.getrusage(who)
            return r.ru_utime + r.ru_stime

        before = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), _time.perf_counter()
        yield
        after = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), _time.perf_counter()
        with open(_CPU_LOG, "a") as f:
            f.write("%.2f %.2f %.2f %s\n" % (*(b - a for a, b in zip(before, after)), item.nodeid))
