"""A small CPU run trains on one thread (workbench/train/threads.py): the rule, the
overrides, and the worker applying it, recording it, and giving the thread count back."""
import pytest
import torch

from workbench.train import threads
from test_worker_loop import run_worker, spec


def test_small_steps_get_one_thread_and_large_ones_keep_the_default():
    assert threads.cpu_threads(8, 20, 32, env={})[0] == 1            # the README's main job
    assert threads.cpu_threads(1, None, threads.SMALL_ACTIVATION, env={})[0] == 1  # at the bound
    n, why = threads.cpu_threads(64, 256, 64, env={})
    assert n is None and why == "torch's default"


def test_the_user_and_the_scheduler_choose_first():
    assert threads.cpu_threads(8, 20, 32, env={"OMP_NUM_THREADS": "2"}) == (None, "OMP_NUM_THREADS")
    assert threads.cpu_threads(64, 256, 64, env={"SSM_WORKBENCH_THREADS": "3"})[0] == 3
    for bad in ("two", "0"):
        with pytest.raises(ValueError, match="SSM_WORKBENCH_THREADS"):
            threads.cpu_threads(8, 20, 32, env={"SSM_WORKBENCH_THREADS": bad})


def test_the_worker_trains_a_small_run_on_one_thread_and_records_it(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SSM_WORKBENCH_THREADS", raising=False)
    before = max(2, torch.get_num_threads())
    torch.set_num_threads(before)
    try:
        _, _, r = run_worker(tmp_path, spec(budget="steps = 4"))   # batch 8 x L 10 x d 16
        assert r.state == "finished"
        assert r.info["torch_threads"] == 1
        assert torch.get_num_threads() == before   # an in-process caller gets its count back
    finally:
        torch.set_num_threads(before)


def test_cpu_workers_wait_passively_unless_the_user_says_otherwise(monkeypatch):
    from pathlib import Path

    from workbench.execute.scheduler import worker_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = worker_env("cpu", "cpu0", 1)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    # the worker imports this copy of the project: the folder that holds workbench/
    assert env["PYTHONPATH"].split(":")[0] == str(Path(__file__).resolve().parents[3])
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_env("cpu", "cpu0", 1)["OMP_WAIT_POLICY"] == "ACTIVE"
