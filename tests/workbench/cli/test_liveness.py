"""Liveness that cannot lose a finished run (issue 19, finding 1).

A worker that stalls (SIGSTOP, a suspended laptop, a paused VM) past the heartbeat timeout
is not declared dead while its process exists; a heartbeat verdict made where the process
cannot be checked (another host) is overturned when the worker reports again; a worker
whose end was not recorded keeps its checkpoint; and no requeue, resume or replay deletes
the results of a run that recorded them all. ``runs`` and ``show`` name the worker (pid
and host)."""
import os
import signal
import re
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from helpers import tiny_profile_text, wait_for
from workbench.train import checkpoint, worker
from workbench import cli
from workbench.execute import launch, resume, scheduler
from workbench.store import run as store_run
from workbench.spec.profile import expand, loads
from workbench.store import Store


def profile_text(name: str, steps: int) -> str:
    """A few seconds of training on one CPU thread, a checkpoint along the way (so a finished
    run has one to remove), heartbeats at each step's log."""
    return tiny_profile_text(name, examples=(64, 16), seeds=(0,), d_model=16, steps=steps, batch_size=8,
                             lr=3e-3, eval_every=100, log_every=1, checkpoint_every=20, device="cpu")


TIMEOUT_S = 3.0  # the heartbeat timeout these tests run under (default 30 s)


def counts(store, rid):
    c = store.conn
    return tuple(c.execute(f"SELECT COUNT(*) FROM {t} WHERE run_id=?", (rid,)).fetchone()[0]
                 for t in ("metrics", "results"))


@pytest.fixture
def real_run(tmp_path, monkeypatch):
    """Submit a one-run profile through a real detached scheduler and worker; yields
    (store, run id, profile) once the worker trains. The worker is woken and stopped at
    the end whatever happened."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SSM_WORKBENCH_HEARTBEAT_TIMEOUT", str(TIMEOUT_S))
    prof = loads(profile_text("live", steps=400))
    store = Store(tmp_path / "st")
    (rid,) = launch.submit(store, prof)
    r = wait_for(lambda: (x := store.get(rid)).state == "running" and x.step >= 5 and x, poll=0.01)
    try:
        yield store, rid, prof, r.pid
    finally:  # never leave a stopped worker behind
        try:
            os.kill(r.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        if store.get(rid).state != "finished" and store_run.pid_alive(r.pid, r.pid_start):
            scheduler._terminate_group(r.pid, signal.SIGKILL)


def stop_past_timeout(store, rid, pid):
    # Stop it outside its short writes: a worker stopped inside one holds the store's write
    # lock until it goes on (test_reap_gives_way_to_a_held_write_lock covers that case).
    for _ in range(20):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(store.path, timeout=0.5, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            break
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.3)
        finally:
            probe.close()
    # the last beat may have been on its way: wait for silence well past the timeout
    wait_for(lambda: time.time() - store.get(rid).heartbeat > TIMEOUT_S + 1.5, timeout=60)


def test_a_stopped_worker_is_stalled_not_crashed_and_its_replay_deletes_nothing(real_run):
    store, rid, prof, pid = real_run
    stop_past_timeout(store, rid, pid)
    assert store.reap() == []
    r = store.get(rid)
    assert r.state == "running", r.error
    assert r.info["stalled"]["pid"] == pid
    assert "process alive (stopped)" in r.stall_note()
    # even hours of silence do not make a live process dead
    assert store.reap(now=time.time() + 3600) == [] and store.get(rid).state == "running"
    # a replay meanwhile watches it, it does not restart it
    during = launch.submit(store, prof)
    assert during.attached == [rid] and during.restarted == during.queued == []

    os.kill(pid, signal.SIGCONT)
    r = wait_for(lambda: (x := store.get(rid)).state != "running" and x)
    assert r.state == "finished", r.error
    assert "stalled" not in r.info  # woken: the note went with its next heartbeat
    assert store.results([rid])[rid][""]["steps"] == 400
    assert not checkpoint.path_for(store.root, rid).exists()  # finish recorded, then removed
    before = counts(store, rid)
    assert before[0] > 0 and before[1] > 0

    again = launch.submit(store, prof)
    assert list(again) == again.skipped == [rid]
    assert again.restarted == again.resumed == again.queued == []
    assert counts(store, rid) == before and store.get(rid).state == "finished"


def test_a_heartbeat_verdict_from_another_host_is_overturned_when_the_worker_wakes(real_run, monkeypatch):
    store, rid, prof, pid = real_run
    stop_past_timeout(store, rid, pid)
    # seen from another machine the pid cannot be checked: silence is all it has
    monkeypatch.setattr(socket, "gethostname", lambda: "observer")
    assert store.reap(now=time.time() + 3600) == [rid]
    r = store.get(rid)
    assert r.state == "crashed" and "no heartbeat" in r.error and "cannot be checked" in r.error
    monkeypatch.undo()

    os.kill(pid, signal.SIGCONT)
    r = wait_for(lambda: (x := store.get(rid)).state == "finished" and x)
    assert r.error is None and r.progress == 1.0
    assert r.info["revived"][0]["was"] == "crashed" and "no heartbeat" in r.info["revived"][0]["verdict"]
    assert store.results([rid])[rid][""]["steps"] == 400
    assert not checkpoint.path_for(store.root, rid).exists()
    assert launch.submit(store, prof).skipped == [rid]


# --------------------------------------------------------------------------- the store's rules
def spec(seed=0):
    return {"profile": "p", "model": "lstm", "label": "lstm", "task": "t", "seq_len": 8, "seed": seed,
            "train": {}}


def started(store, rid, pid=None, host=None):
    assert store.mark_started(rid, pid or os.getpid(), "cpu", "cpu0")
    if host:
        with store.tx() as c:
            c.execute("UPDATE runs SET host=? WHERE id=?", (host, rid))


def test_only_the_runs_own_worker_overturns_a_crashed_verdict(tmp_path):
    s = Store(tmp_path)
    a, b = s.add_runs([spec(), spec(1)])
    started(s, a)  # this process is a's worker
    assert s.finish(a, "crashed", "no heartbeat for 40 s")
    s.heartbeat(a, step=7)
    assert s.get(a).state == "running" and s.get(a).step == 7 and s.get(a).ended is None
    assert s.finish(a, "crashed", "no heartbeat for 40 s")
    assert s.finish(a, "finished")
    assert s.get(a).state == "finished" and len(s.get(a).info["revived"]) == 2
    # anyone else's heartbeat or end leaves a verdict alone; other ends are never undone
    started(s, b, pid=os.getpid(), host="node7")
    assert s.finish(b, "crashed", "no heartbeat")
    s.heartbeat(b)
    assert not s.finish(b, "finished") and s.get(b).state == "crashed"
    assert s.finish(b, "finished", pid=os.getpid(), host="node7")  # e.g. its run file's record
    assert not s.finish(a, "failed") and s.get(a).state == "finished"


def final(s, rid):
    s.add_metrics(rid, [(i, None, "train", "loss", 1.0) for i in range(5)])
    s.set_results(rid, {"accuracy": 0.9, "loss": 0.1})
    s.set_results(rid, {"steps": 5, "wall_s": 3.0})  # the summary: the worker's last measurement


def test_no_requeue_resume_or_replay_deletes_final_results(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler.subprocess, "Popen", lambda *a, **k: type("P", (), {"pid": os.getpid()})())
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # the workers here are gone
    s = Store(tmp_path)
    prof = loads(profile_text("keep", steps=10).replace("seeds = [0]", "seeds = [0, 1, 2]"))
    crashed, killed, partial = launch.submit(s, prof)
    for rid, state in ((crashed, "crashed"), (killed, "killed"), (partial, "failed")):
        started(s, rid, pid=1, host="elsewhere")
        final(s, rid)
        s.finish(rid, state, "no heartbeat for 31 s" if state == "crashed" else state)
    with s.tx() as c:  # partial: measured, but its summary never came
        c.execute("DELETE FROM results WHERE run_id=? AND name='wall_s'", (partial,))
    kept = {rid: counts(s, rid) for rid in (crashed, killed)}

    assert not s.requeue(killed, None) and not s.requeue(killed, {"checkpoint": "x"})
    assert s.trim_after(killed, 0) == 0
    with pytest.raises(resume.ResumeError, match="holds all its final results"):
        resume.requeue(s, killed, require_checkpoint=False)
    assert s.get(killed).state == "killed" and counts(s, killed) == kept[killed]

    out = launch.submit(s, prof)
    assert out.skipped == [crashed] and out.restarted == [partial]
    assert [rid for rid, _ in out.refused] == [killed] and "final results" in out.refused[0][1]
    r = s.get(crashed)
    assert r.state == "finished" and r.error is None and "no heartbeat" in r.info["recognised"]["verdict"]
    assert {rid: counts(s, rid) for rid in (crashed, killed)} == kept
    assert counts(s, partial) == (0, 0)  # no final results: a restart starts clean, as before


def test_a_worker_whose_end_is_not_recorded_keeps_its_checkpoint(tmp_path, monkeypatch):
    """Killed while it recorded its last results: the run stays killed, and the checkpoint
    (the state a resume would go on from) is not removed."""
    prof = loads(profile_text("ck", steps=40))
    s = Store(tmp_path)
    (rid,) = s.add_runs([sp.to_dict() for sp in expand(prof)])
    real = worker.Trainer.timed_steps

    def killed_meanwhile(self):
        s.finish(rid, "killed", "killed by user")  # what `ssm-workbench kill` does first
        return real(self)

    monkeypatch.setattr(worker.Trainer, "timed_steps", killed_meanwhile)
    started(s, rid)
    assert worker.run(str(s.root), rid) == 0
    r = s.get(rid)
    assert r.state == "killed"
    assert checkpoint.path_for(s.root, rid).is_file() and r.info["checkpoint"]["step"] == 20
    assert s.results([rid])[rid][""]["steps"] == 40


def test_runs_and_show_print_the_workers_pid_and_host(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SSM_WORKBENCH_HEARTBEAT_TIMEOUT", "5")
    s = Store(tmp_path)
    a, b = s.add_runs([spec(), spec(1)])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started(s, a, pid=child.pid)
        with s.tx() as c:  # silent for a minute, its process alive
            c.execute("UPDATE runs SET heartbeat=? WHERE id=?", (time.time() - 60, a))
        host = socket.gethostname().split(".")[0]
        assert cli.main(["--store", str(tmp_path), "runs"]) == 0
        out = capsys.readouterr().out
        assert f"{child.pid}@{host}" in out and "worker" in out
        # 60 s, or a second more on a loaded machine between the update and the read
        assert "stalled" in out and re.search(rf"run {a}: no heartbeat for 6[01] s, process alive", out)
        assert cli.main(["--store", str(tmp_path), "show", str(a)]) == 0
        out = capsys.readouterr().out
        assert f"worker: pid {child.pid} on {socket.gethostname()}" in out
        assert "stalled:" in out and "process alive" in out
        assert cli.main(["--store", str(tmp_path), "show", str(b)]) == 0
        assert "worker: not started" in capsys.readouterr().out
    finally:
        child.kill()
        child.wait()


def test_the_heartbeat_timeout_is_read_from_the_environment(monkeypatch, capsys):
    monkeypatch.delenv("SSM_WORKBENCH_HEARTBEAT_TIMEOUT", raising=False)
    assert store_run.heartbeat_timeout() == 30.0
    monkeypatch.setenv("SSM_WORKBENCH_HEARTBEAT_TIMEOUT", "2.5")
    assert store_run.heartbeat_timeout() == 2.5
    monkeypatch.setenv("SSM_WORKBENCH_HEARTBEAT_TIMEOUT", "soon")
    assert store_run.heartbeat_timeout() == 30.0
    assert "SSM_WORKBENCH_HEARTBEAT_TIMEOUT='soon' is not a positive number" in capsys.readouterr().err


def test_reap_gives_way_to_a_held_write_lock(tmp_path, capsys):
    """A worker stopped in the middle of one of its writes holds the write lock: reading
    commands that reap on the way must go on (WAL reads never wait), not fail."""
    s = Store(tmp_path)
    (rid,) = s.add_runs([spec()])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started(s, rid, pid=gone.pid)  # its worker is gone: reap has a crash to write
    s.conn.execute("PRAGMA busy_timeout=200")
    holder = sqlite3.connect(s.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        assert s.reap() == []
        assert "busy" in capsys.readouterr().err
        assert [r.state for r in s.runs()] == ["running"]  # reads still work
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert s.reap() == [rid]  # and the next reap writes what it could not
