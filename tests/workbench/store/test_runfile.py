"""Run files (workbench/store/runfile.py): a worker's rows written as JSON lines on a shared
filesystem and ingested into the store exactly once, torn lines included."""
from __future__ import annotations

import json

import pytest

from test_curves import sweep
from workbench.store import runfile
from workbench.store import Store


@pytest.fixture
def setup(tmp_path):
    store = Store(tmp_path / "store")
    [rid] = sweep(store, models=("lstm",), seeds=(0,))
    shared = tmp_path / "shared"
    folder = runfile.job_dir(shared, rid)
    runfile.write_snapshot(store, rid, folder)
    return store, rid, shared, folder


def test_worker_rows_reach_the_store_once(setup, monkeypatch):
    store, rid, shared, folder = setup
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    rf = runfile.RunFile(shared, rid)
    assert rf.get(rid).spec == store.get(rid).spec and rf.get(rid).state == "running"
    rf.heartbeat(rid, step=3, progress=0.5, last_loss=1.25)
    rf.add_metrics(rid, [(1, 0.1, "train", "loss", 2.0), (2, 0.2, "train", "loss", float("nan"))])
    rf.add_system(rid, {"cpu_percent": 90.0, "rss_mb": 100.0})
    rf.set_info(rid, {"backend": "cpu"})
    assert runfile.ingest(store, rid, folder) == 5
    r = store.get(rid)
    assert r.state == "running" and r.step == 3 and r.last_loss == 1.25 and r.info["backend"] == "cpu"
    assert r.host and r.info["slurm_attempt"] == 0
    rows = store.metrics(rid)
    assert [(x["step"], x["value"]) for x in rows] == [(1, 2.0), (2, None)]  # NaN kept as NULL
    t_metric = json.loads((folder / runfile.EVENTS).read_text().splitlines()[2])["t"]
    assert rows[0]["t"] == pytest.approx(t_metric)  # measured time, not ingestion time
    assert runfile.ingest(store, rid, folder) == 0  # nothing new: nothing applied twice
    assert len(store.metrics(rid)) == 2 and len(store.system(rid)) == 1
    rf.set_results(rid, {"accuracy": 0.75})
    rf.finish(rid, "finished")
    rf.close()
    assert runfile.ingest(store, rid, folder) == 2
    r = store.get(rid)
    assert r.state == "finished" and store.results([rid])[rid][""]["accuracy"] == 0.75


def test_torn_line_is_skipped_and_the_next_attempt_starts_clean(setup, monkeypatch):
    store, rid, shared, folder = setup
    rf = runfile.RunFile(shared, rid)
    rf.add_metrics(rid, [(1, None, "train", "loss", 2.0)])
    rf.close()
    with open(folder / runfile.EVENTS, "ab") as f:  # a job killed in the middle of a write
        f.write(b'{"op": "metrics", "rows": [[2, null, "train", "lo')
    assert runfile.ingest(store, rid, folder) == 2  # start + metrics; the torn line waits
    assert len(store.metrics(rid)) == 1
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    rf2 = runfile.RunFile(shared, rid)  # the requeued job
    rf2.trim_after(rid, 0)
    rf2.add_metrics(rid, [(1, None, "train", "loss", 1.5)])
    rf2.close()
    assert runfile.ingest(store, rid, folder) == 3
    r = store.get(rid)
    assert r.info["runfile_bad_lines"] == 1 and r.info["slurm_attempt"] == 1
    assert [(x["step"], x["value"]) for x in store.metrics(rid)] == [(1, 1.5)]


def test_ingestion_is_atomic_with_its_offset(setup, monkeypatch):
    store, rid, shared, folder = setup
    rf = runfile.RunFile(shared, rid)
    rf.add_metrics(rid, [(1, None, "train", "loss", 2.0)])
    rf.add_metrics(rid, [(2, None, "train", "loss", 1.0)])
    rf.close()
    calls = {"n": 0}
    real = store.add_metrics

    def fail_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("ingester died")
        return real(*a, **k)

    monkeypatch.setattr(store, "add_metrics", fail_second)
    with pytest.raises(RuntimeError):
        runfile.ingest(store, rid, folder)
    assert store.metrics(rid) == [] and store.get(rid).info.get("runfile_offset", 0) == 0
    monkeypatch.setattr(store, "add_metrics", real)
    assert runfile.ingest(store, rid, folder) == 3
    assert [x["step"] for x in store.metrics(rid)] == [1, 2]


def test_read_events_takes_complete_lines_only(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_bytes(b'{"op": "a"}\n{"op": "b"}\n{"op": "c"')
    events, offset, bad = runfile.read_events(p, 0)
    assert [e["op"] for e in events] == ["a", "b"] and offset == p.read_bytes().index(b'{"op": "c"')
    assert runfile.read_events(p, offset) == ([], offset, 0)
    assert runfile.read_events(tmp_path / "missing", 5) == ([], 5, 0)
