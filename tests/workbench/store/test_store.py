"""The store: run lifecycle, guarded transitions, measurements, crash detection."""
import os
import subprocess
import sys
import time

from workbench.store import Store


def spec(**kw):
    d = dict(profile="p", model="lstm", label="lstm", task="t", seq_len=8, seed=0,
             fields={"model": "lstm", "seq_len": 8})
    d.update(kw)
    return d


def test_lifecycle(tmp_path):
    s = Store(tmp_path)
    (rid,) = s.add_runs([spec()])
    assert s.get(rid).state == "pending"
    assert s.mark_started(rid, os.getpid(), "cpu", "cpu0")
    assert not s.mark_started(rid, os.getpid(), "cpu", "cpu0")  # only from pending
    s.heartbeat(rid, progress=0.5, step=3, last_loss=1.5)
    r = s.get(rid)
    assert (r.state, r.progress, r.step, r.last_loss) == ("running", 0.5, 3, 1.5)
    s.add_metrics(rid, [(1, None, "train", "loss", 2.0), (2, None, "train", "loss", float("nan"))])
    rows = s.metrics(rid, "train", "loss")
    assert [x["value"] for x in rows] == [2.0, None]  # non-finite values stored as NULL
    assert s.metrics(rid, after_rowid=rows[0]["rowid"])[0]["step"] == 2
    s.set_results(rid, {"accuracy": 0.5})
    s.set_results(rid, {"accuracy": 0.25}, eval_set="len=64")
    assert s.results([rid]) == {rid: {"": {"accuracy": 0.5}, "len=64": {"accuracy": 0.25}}}
    assert s.finish(rid, "killed", "by user")
    assert not s.finish(rid, "finished")  # a terminal state is never overwritten
    assert s.get(rid).state == "killed"


def test_a_second_process_sees_writes(tmp_path):
    s = Store(tmp_path)
    (rid,) = s.add_runs([spec()])
    code = ("import sys; from workbench.store import Store; s = Store(sys.argv[1]); "
            "s.add_metrics(int(sys.argv[2]), [(1, None, 'eval', 'accuracy', 0.75)])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), str(rid)], check=True)
    assert s.metrics(rid, "eval")[0]["value"] == 0.75


def test_reap_marks_dead_worker_crashed(tmp_path):
    s = Store(tmp_path)
    a, b = s.add_runs([spec(), spec(seed=1)])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    s.mark_started(a, dead.pid, "cpu", "cpu0")
    s.mark_started(b, os.getpid(), "cpu", "cpu1")  # alive: this test process
    assert s.reap() == [a]
    assert s.get(a).state == "crashed" and "exited" in s.get(a).error
    assert s.get(b).state == "running"
    # silence alone is no crash while the process exists (tests/workbench/cli/test_liveness.py) ...
    assert s.reap(now=time.time() + 3600) == []
    assert s.get(b).state == "running" and s.get(b).info["stalled"]["pid"] == os.getpid()
    # ... but it is for a worker that cannot be checked from here (another host)
    with s.tx() as c:
        c.execute("UPDATE runs SET host='elsewhere' WHERE id=?", (b,))
    assert s.reap(now=time.time() + 3600) == [b]
    assert "no heartbeat" in s.get(b).error


def test_system_samples_keep_the_runs_own_gpu_memory_and_old_stores_upgrade(tmp_path):
    """A store made before the per-process GPU memory column gains it on open, keeping its
    rows; new samples store the field."""
    import sqlite3

    old = sqlite3.connect(tmp_path / "store.sqlite")
    old.executescript(
        "CREATE TABLE system (run_id INTEGER NOT NULL, t REAL NOT NULL, cpu_percent REAL,"
        " rss_mb REAL, gpu_util REAL, gpu_mem_used_mb REAL, gpu_mem_total_mb REAL, gpu_name TEXT);"
        "INSERT INTO system VALUES (1, 0.0, 50.0, 100.0, NULL, NULL, NULL, NULL);")
    old.commit()
    old.close()
    s = Store(tmp_path)
    (rid,) = s.add_runs([spec()])
    s.add_system(rid, {"gpu_util": 80.0, "gpu_mem_used_mb": 2048.0, "gpu_mem_total_mb": 81559.0,
                       "gpu_proc_mem_mb": 700.0, "gpu_name": "H100"})
    assert s.system(rid)[-1]["gpu_proc_mem_mb"] == 700.0
    assert s.system(1)[0]["cpu_percent"] == 50.0 and s.system(1)[0]["gpu_proc_mem_mb"] is None
    Store(tmp_path)  # opening again is a no-op


def test_a_second_store_of_the_same_folder_keeps_the_first_ones_reads_current(tmp_path):
    """Opening the store again in one process (``resume`` or ``run`` called where the TUI
    or a test holds it open) must not drop the first connection's locks on the database
    file: then another process closing its connection took itself for the last one and
    deleted the -wal and -shm files, and this process read an old snapshot for good (a
    resumed run stayed "pending" to a waiting test for 5 minutes after it finished)."""
    first = Store(tmp_path)
    (rid,) = first.add_runs([spec()])
    Store(tmp_path).close()  # a second Store here, opened and closed

    def writer(state, hold):
        code = ("import sys\nfrom workbench.store import Store\n"
                f"s = Store({str(tmp_path)!r})\n"
                f"with s.tx() as c:\n    c.execute(\"UPDATE runs SET state='{state}' WHERE id={rid}\")\n"
                "print('written', flush=True)\n"
                + ("sys.stdin.read()\n" if hold else "") + "s.close()\n")
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)

    p = writer("running", hold=False)
    assert p.communicate(timeout=120)[0].strip() == "written"
    # this process's connection is still open: the closing writer was not the last one
    assert (tmp_path / "store.sqlite-wal").exists()
    p = writer("finished", hold=True)  # commits, then keeps its connection open
    try:
        assert p.stdout.readline().strip() == "written"
        assert first.get(rid).state == "finished"
        assert Store(tmp_path).get(rid).state == "finished"
    finally:
        p.communicate("", timeout=120)
