"""sysmon.Sampler, the worker's system sampler: a sample at once with ``at_start``, errors
to ``on_error`` without ending the thread, GPU samples kept."""
import threading

from workbench.train import sysmon


def test_at_start_samples_at_once_then_every_interval():
    got = threading.Event()
    s = sysmon.Sampler(lambda sample: got.set(), interval=3600, at_start=True)
    s.start()
    try:
        assert got.wait(10), "no sample before the first interval"
    finally:
        s.stop()
    s.join(10)
    assert s.stopped and not s.is_alive()


def test_without_at_start_the_first_sample_waits_an_interval():
    got = threading.Event()
    s = sysmon.Sampler(lambda sample: got.set(), interval=3600)
    s.start()
    assert not got.wait(0.5)
    s.stop()
    s.join(10)
    assert not s.is_alive()


def test_a_sink_error_goes_to_on_error_and_sampling_goes_on(monkeypatch):
    monkeypatch.setattr(sysmon, "sample", lambda: {"gpu_util": 50.0, "gpu_mem_used_mb": 10.0})
    errors, calls = [], []
    enough = threading.Event()

    def sink(sample):
        calls.append(sample)
        if len(calls) >= 3:
            enough.set()
        raise OSError("disk full")

    s = sysmon.Sampler(sink, interval=0.01, on_error=errors.append, at_start=True)
    s.start()
    try:
        assert enough.wait(10)
    finally:
        s.stop()
    s.join(10)
    assert len(errors) >= 3 and all(isinstance(e, OSError) for e in errors)
    assert s.gpu_util[:3] == [50.0] * 3 and s.gpu_mem[:3] == [10.0] * 3
