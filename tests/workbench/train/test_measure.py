"""workbench.train.measure, shared by the worker and ``bench``: median timings after
untimed warm-up calls, the extra peak memory of a piece of work, the device choice."""
import pytest
import torch

from workbench.train import measure, sysmon

CPU = torch.device("cpu")


def test_median_ms_runs_warmup_untimed_then_takes_the_median(monkeypatch):
    calls, clock = [], iter([0.0, 0.001, 1.0, 1.003, 2.0, 2.5])  # 1 ms, 3 ms, 500 ms
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    ms = measure.median_ms(lambda: calls.append(1), repeats=3, warmup=2, device=CPU)
    assert len(calls) == 5 and ms == pytest.approx(3.0)


def test_extra_peak_counts_what_the_work_added_not_what_was_there():
    if not sysmon.reset_peak_rss():
        pytest.skip("this OS cannot reset the peak RSS")
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB before the measurement: not counted
    peak = measure.ExtraPeak(CPU)
    x = torch.ones(96 * 2**20 // 4)  # 96 MiB touched after it
    extra = peak.mib()
    del x, held
    assert 80 < extra < 150, extra


def test_timed_with_peak_times_both_and_measures_the_training_step():
    if not sysmon.reset_peak_rss():
        pytest.skip("this OS cannot reset the peak RSS")
    train_ms, extra, fwd_ms = measure.timed_with_peak(
        lambda: torch.ones(48 * 2**20 // 4).sum(), lambda: None, repeats=2, warmup=1, device=CPU)
    assert train_ms > 0 and fwd_ms >= 0 and extra > 30


def test_pick_device():
    assert measure.pick_device("cpu") == CPU
    with pytest.raises(ValueError, match="--device = 'gpu'"):
        measure.pick_device("gpu", "--device")
    if not torch.cuda.is_available():
        assert measure.pick_device("auto") == CPU
        with pytest.raises(ValueError, match="train.device is 'cuda' but torch sees no CUDA device"):
            measure.pick_device("cuda", "train.device")
