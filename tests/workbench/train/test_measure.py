"""workbench.train.measure, shared by the worker and ``bench``: median timings after
untimed warm-up calls, the extra peak memory of a piece of work, the device choice."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.train import measure

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[3]


def test_median_ms_runs_warmup_untimed_then_takes_the_median(monkeypatch):
    calls, clock = [], iter([0.0, 0.001, 1.0, 1.003, 2.0, 2.5])  # 1 ms, 3 ms, 500 ms
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    ms = measure.median_ms(lambda: calls.append(1), repeats=3, warmup=2, device=CPU)
    assert len(calls) == 5 and ms == pytest.approx(3.0)


# The RSS is measured in a fresh interpreter, as bench measures: in pytest's long-lived
# worker, heap memory an earlier test freed is reused without raising the RSS (CI once
# read 0.0 MiB for a 48 MiB transient there).
_RSS_PROBE = """
import json, torch
from workbench.train import measure, sysmon
cpu = torch.device("cpu")
if not sysmon.reset_peak_rss():
    print(json.dumps(None)); raise SystemExit
held = torch.ones(64 * 2**20 // 4)  # 64 MiB before the measurement: not counted
peak = measure.ExtraPeak(cpu)
x = torch.ones(96 * 2**20 // 4)  # 96 MiB touched after it
extra = peak.mib()
del x, held
train_ms, step_extra, fwd_ms = measure.timed_with_peak(
    lambda: torch.ones(48 * 2**20 // 4).sum(), lambda: None, repeats=2, warmup=1, device=cpu)
print(json.dumps([extra, train_ms, step_extra, fwd_ms]))
"""


@pytest.fixture(scope="module")
def rss_probe():
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got is None:
        pytest.skip("this OS cannot reset the peak RSS")
    return got


def test_extra_peak_counts_what_the_work_added_not_what_was_there(rss_probe):
    extra = rss_probe[0]
    assert 80 < extra < 150, extra


def test_timed_with_peak_measures_a_transient_the_training_step_freed(rss_probe):
    _, train_ms, step_extra, fwd_ms = rss_probe
    assert train_ms > 0 and fwd_ms >= 0 and step_extra > 30, rss_probe


def test_timed_with_peak_reads_the_peak_after_the_training_step_before_the_forward(monkeypatch):
    """The peak is the training step's alone: read after it, before the forward runs."""
    rss = {"now": 100.0, "peak": 100.0}
    monkeypatch.setattr(measure, "rss_mib", lambda: rss["now"])
    monkeypatch.setattr(measure.sysmon, "reset_peak_rss", lambda: rss.update(peak=rss["now"]) or True)
    monkeypatch.setattr(measure.sysmon, "peak_rss_mib", lambda: rss["peak"])

    def touch(mib):
        return lambda: rss.update(peak=max(rss["peak"], rss["now"] + mib))

    _, extra, _ = measure.timed_with_peak(touch(40), touch(500), repeats=2, warmup=1, device=CPU)
    assert extra == 40


def test_pick_device():
    assert measure.pick_device("cpu") == CPU
    with pytest.raises(ValueError, match="--device = 'gpu'"):
        measure.pick_device("gpu", "--device")
    if not torch.cuda.is_available():
        assert measure.pick_device("auto") == CPU
        with pytest.raises(ValueError, match="train.device is 'cuda' but torch sees no CUDA device"):
            measure.pick_device("cuda", "train.device")
