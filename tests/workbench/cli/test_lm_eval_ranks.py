"""An evaluation on several ranks (``eval.devices``; workbench/train/eval_run.py and the
adapter's rank methods in workbench/train/lm_eval_adapter.py): on the CPU with gloo, two
ranks store the numbers one rank stores, for the four request types of tests/workbench/cli/test_lm_eval.py's
task folder (its tiny GPT-NeoX and tasks); a killed rank fails the run in one line that names
it; a two-rank run stopped after its first task resumes at the next; the setting is checked
where it is given. The worker runs rank 0 in this process (as tests/workbench/cli/test_lm_eval.py's
``eval_run`` does) and starts rank 1 as a real child process, as for training."""
from __future__ import annotations

import os
import signal

import pytest
from test_lm_eval import TASKS, eval_run, made, needs_lm_eval  # noqa: F401 (made: the fixture)

from workbench.spec.run_spec import run_devices, spec_key
from workbench.train import distributed


@pytest.fixture
def launched(monkeypatch):
    """The launchers rank 0 makes (their children are ranks 1..N-1)."""
    made_launchers = []
    real = distributed.Launcher

    class Recording(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made_launchers.append(self)

    monkeypatch.setattr(distributed, "Launcher", Recording)
    return made_launchers


def spec(made, devices: int, tasks=TASKS):
    from workbench.spec.eval_spec import eval_spec

    # batch 2: each rank's documents go through several forwards (padding, reordering)
    return eval_spec(str(made["neox"]), list(tasks), include=[str(made["tasks"])], bootstrap_iters=50,
                     device="cpu", batch_size=2, devices=devices)


def per_task(store, rid) -> dict:
    """{task: {metric: value}} of a finished evaluation run (eval set "" is run-level)."""
    run = store.get(rid)
    assert run.state == "finished", run.error
    return {k: v for k, v in store.results([rid])[rid].items() if k}


def same_numbers(two: dict, one: dict) -> None:
    """Every task's metrics equal: counts exactly, log-likelihood ones to float32 round-off
    (test_two_ranks_store_the_one_rank_numbers says why)."""
    assert two.keys() == one.keys()
    for task in one:
        assert two[task].keys() == one[task].keys(), task
        for k, v in one[task].items():
            exact = task in ("tiny_mc", "tiny_gen") or k in ("acc", "acc_stderr", "samples")
            assert two[task][k] == (v if exact or v is None else pytest.approx(v, rel=1e-5)), (task, k)


# ------------------------------------------------------------------------------- pieces
def test_gathered_metrics_come_back_in_document_order():
    from workbench.train.lm_eval_adapter import in_document_order

    # 5 documents on 2 ranks: rank 0 holds 0, 2, 4 and rank 1 holds 1, 3
    a = {"t": {("acc", "none"): [0.0, 2.0, 4.0], ("ppl", "none"): ["a", "c", "e"]}}
    b = {"t": {("acc", "none"): [1.0, 3.0], ("ppl", "none"): ["b", "d"]}}
    got = in_document_order([a, b])
    assert got[0] == {"t": {("acc", "none"): [0.0, 1.0, 2.0, 3.0, 4.0], ("ppl", "none"): list("abcde")}}
    assert got[1] == {"t": {("acc", "none"): [], ("ppl", "none"): []}}  # lm-eval chains rank 0's, then these
    # what is not the round-robin split is left as gathered
    odd = [{"t": {"x": [0, 2]}}, {"t": {"x": [1, 3]}}, {"t": {"x": []}}]
    assert in_document_order(odd) == odd


def test_devices_is_checked_and_does_not_change_an_evaluations_identity(tmp_path, capsys, monkeypatch):
    from workbench.cli import eval_cmd
    from workbench.execute import scheduler
    from workbench.spec.eval_spec import eval_spec
    from workbench.spec.profile import ProfileError, loads

    one, two = eval_spec("x/y", ["t"]), eval_spec("x/y", ["t"], devices=2)
    assert run_devices(one) == 1 and run_devices(two) == 2
    assert spec_key(one) == spec_key(two)  # one rank's numbers: the same evaluation
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="devices must be an integer >= 1"):
            eval_spec("x/y", ["t"], devices=bad)
    text = 'schema_version = 1\nname = "ev"\n[eval]\nmodels = [{label = "m", model = "x/y"}]\ntasks = ["t"]\n'
    assert loads(text + "devices = 3\n").eval.devices == 3
    with pytest.raises(ProfileError, match="devices"):
        loads(text + "devices = 0\n")
    with pytest.raises(ProfileError, match="a Slurm evaluation is one process"):  # not split across a job yet
        loads('executor = "slurm"\n' + text + "devices = 2\n")
    # more ranks than GPUs: refused in the scheduler's words, before anything is queued
    monkeypatch.setattr(scheduler, "visible_gpus", lambda: ["0"])
    with pytest.raises(ValueError, match=r"eval.devices = 2, but this machine shows 1 GPU\(s\) \(0\)"):
        eval_cmd.check_devices([two])
    eval_cmd.check_devices([one])
    monkeypatch.setattr(scheduler, "visible_gpus", lambda: [])  # CPU ranks
    eval_cmd.check_devices([two])
    assert eval_cmd.ranks_lines([one]) == []
    assert eval_cmd.ranks_lines([two, two]) == [
        "  ranks: 2 per run (each holds the whole model and scores 1 document in 2 of each task; "
        "rank 0 gathers the metrics and writes the run)"]


@needs_lm_eval
def test_eval_dry_run_names_the_ranks(made, tmp_path, capsys):
    from workbench.cli import main

    assert main(["--store", str(tmp_path / "st"), "eval", str(made["neox"]), "--tasks", "tiny_mc",
                 "--include", str(made["tasks"]), "--devices", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ranks: 2 per run" in out and "nothing queued" in out
    assert main(["--store", str(tmp_path / "st"), "eval", str(made["neox"]), "--tasks", "tiny_mc",
                 "--include", str(made["tasks"]), "--devices", "0", "--dry-run"]) == 2
    assert "devices must be an integer >= 1, not 0" in capsys.readouterr().err


# ------------------------------------------------------------------------ runs on two ranks
@needs_lm_eval
@pytest.mark.slow
def test_two_ranks_store_the_one_rank_numbers(made, tmp_path, launched):
    """Every number of every task equals one rank's: the counts (acc, acc_norm, exact match,
    their standard errors, documents) exactly, the log-likelihood ones (perplexity, word/byte
    perplexity, bits per byte, perplexity's bootstrapped standard error) to float32 round-off
    (rel 1e-5). Each log-likelihood is a float32 forward whose last bits depend on the batch it
    shares (its padded width) and on the CPU threads (measured: 1 vs 2 threads alone move
    word perplexity by 5e-8 relative); which choice wins does not change. Rank 0 aggregates
    the metrics in the documents' order, so sums and the seeded bootstrap's resamples are
    those of one process (in rank order the bootstrapped standard error moves far more)."""
    from workbench.store import Store

    store = Store(tmp_path / "st")
    one = per_task(store, eval_run(store, spec(made, 1)))
    assert launched == []
    rid = eval_run(store, spec(made, 2))
    two = per_task(store, rid)
    assert len(launched) == 1 and len(launched[0].children) == 1  # rank 1 was a process of its own
    assert all(p.returncode == 0 for p in launched[0].children.values())
    assert set(one) == set(TASKS) and one["tiny_lambada"]["samples"] == 5
    same_numbers(two, one)
    info = store.get(rid).info
    assert info["ranks"] == {"world": 2, "launcher": "self", "backend": "gloo"}
    # rank 0's 2 generations + rank 1's 1, and the copy lm-eval pads rank 1 with (equal work per rank)
    assert info["generation"] == {"streamed": 4, "recomputed": 0}
    assert store.get(rid).step == 4 and store.get(rid).total_steps == 4


@needs_lm_eval
@pytest.mark.slow
def test_a_killed_rank_fails_the_evaluation_in_one_line(made, tmp_path, launched, monkeypatch):
    import lm_eval

    from workbench.store import Store

    real, calls = lm_eval.simple_evaluate, []

    def kill_rank1_at_second(*a, **kw):  # rank 0 then meets the dead peer in lm-eval's all_gather
        calls.append(kw["tasks"])
        if len(calls) == 2:
            os.kill(launched[0].children[1].pid, signal.SIGKILL)
        return real(*a, **kw)

    monkeypatch.setattr(lm_eval, "simple_evaluate", kill_rank1_at_second)
    store = Store(tmp_path / "st")
    rid = eval_run(store, spec(made, 2, ["tiny_mc", "tiny_lambada"]))
    run = store.get(rid)
    pid = launched[0].children[1].pid
    assert run.state == "failed" and run.error == f"rank 1 of 2 (pid {pid}) was killed by SIGKILL"
    assert set(store.results([rid])[rid]) == {"tiny_mc"}  # the first task's numbers stay


@needs_lm_eval
@pytest.mark.slow
def test_a_two_rank_evaluation_stopped_after_a_task_resumes_at_the_next(made, tmp_path, launched,
                                                                        monkeypatch):
    import lm_eval

    from workbench.execute.resume import requeue
    from workbench.store import Store
    from workbench.train import worker

    real, calls = lm_eval.simple_evaluate, []

    def stopped_at_second(*a, **kw):
        calls.append(kw["tasks"])
        if len(calls) == 2:  # as if kill's SIGTERM reached rank 0 while the second task ran
            raise worker.Stopped(signal.SIGTERM)
        return real(*a, **kw)

    monkeypatch.setattr(lm_eval, "simple_evaluate", stopped_at_second)
    store = Store(tmp_path / "st")
    tasks = ["tiny_mc", "tiny_lambada"]
    rid = eval_run(store, spec(made, 2, tasks))
    run = store.get(rid)
    assert run.state == "preempted" and "after 1 task" in run.error
    monkeypatch.setattr("workbench.execute.resume.pid_alive", lambda *a: False)
    assert requeue(store, rid) == "resumed"
    store.mark_started(rid, os.getpid(), "cpu", None)
    worker.run(str(store.root), rid)
    assert calls == [["tiny_mc"], ["tiny_lambada"], ["tiny_lambada"]]  # rank 0's; rank 1 followed it
    assert len(launched) == 2 and all(p.returncode == 0 for p in launched[1].children.values())
    two = per_task(store, rid)
    monkeypatch.setattr(lm_eval, "simple_evaluate", real)
    same_numbers(two, per_task(store, eval_run(store, spec(made, 1, tasks))))
