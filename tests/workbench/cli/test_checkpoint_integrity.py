"""Checkpoint integrity: a checkpoint carries a header (run id, spec key, step) and a sha256
of its content; ``resume`` verifies it before requeueing or printing anything and refuses a
damaged, cut, foreign or garbage file with its reason (exit 2, the run untouched);
``resume --restart`` trains such a run from step 0; a replayed profile refuses it too; the
worker checks again; no message ever advises loading with torch's unsafe setting; files of
the previous format (a bare torch.save) still resume, checked by their zip CRC32s."""
import io
import pickle
import signal
import struct
import zipfile

import pytest
import torch

from test_resume import (FIXED, attempt, metric_rows, new_run, outcome, sweep, spec_of,  # noqa: F401
                               uninterrupted)
from test_resume import fake_popen, no_live_worker  # noqa: F401  (fixtures)
from workbench.train import checkpoint
from workbench import cli
from workbench.execute import launch, scheduler
from workbench.spec.run_spec import spec_key
from workbench.store.progress import command

UNSAFE = "weights_only=False"


@pytest.fixture
def spawned(monkeypatch):
    calls = []
    monkeypatch.setattr(scheduler, "spawn", lambda st, jobs=None, rpg=None: calls.append(st.root))
    return calls


def preempted_run(tmp_path, monkeypatch, name="cut", spec=None):
    """A real small run stopped by SIGTERM in its 3rd step: preempted, checkpoint at step 3."""
    spec = spec or spec_of(**FIXED)
    store, rid = new_run(tmp_path / name, spec)
    assert attempt(monkeypatch, store, rid, at=3) == 128 + signal.SIGTERM
    r = store.get(rid)
    assert r.state == "preempted" and r.info["checkpoint"]["step"] == 3
    return store, rid, spec


def resume_cli(store, *ids, restart=False):
    argv = ["--store", str(store.root), "resume", *(["--restart"] if restart else []), *map(str, ids)]
    return cli.main(argv)


def refused(capsys, store, rid, before):
    """``resume`` said no (exit 2) and left the run exactly as it was; returns stderr."""
    assert resume_cli(store, rid) == 2
    out = capsys.readouterr()
    assert "resumes" not in out.out  # nothing said about resuming
    assert UNSAFE not in out.err and UNSAFE not in out.out
    r = store.get(rid)
    assert (r.state, r.error, r.info.get("resume")) == (before.state, before.error, before.info.get("resume"))
    assert f"`{command(store.root)} resume --restart {rid}`" in out.err
    return out.err


def flip(path, at):
    b = bytearray(path.read_bytes())
    b[at] ^= 0x01
    path.write_bytes(bytes(b))


# --------------------------------------------------------------------------- the file
def test_a_checkpoint_says_whose_it_is_and_hashes_its_content(tmp_path, monkeypatch, no_live_worker):
    store, rid, spec = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    assert path.read_bytes().startswith(b"ssm-workbench checkpoint 2\n")
    h = checkpoint.verify(path, rid, spec)  # read without unpickling anything
    assert (h.run_id, h.spec_key, h.step, h.legacy) == (rid, spec_key(spec), 3, False)
    assert h.offset + h.payload_bytes == path.stat().st_size and len(h.sha256) == 64


# --------------------------------------------------------------------------- resume refuses
def test_one_flipped_byte_is_refused_before_requeueing(tmp_path, monkeypatch, no_live_worker, spawned, capsys):
    store, rid, spec = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    at = path.stat().st_size // 2  # inside the tensors: torch alone loads it, numbers changed
    flip(path, at)
    data = path.read_bytes()
    torch.load(io.BytesIO(data[data.index(b"PK\x03\x04"):]), weights_only=True)  # silent to torch
    err = refused(capsys, store, rid, store.get(rid))
    assert f"run {rid}: cannot resume: checkpoint {path} is damaged: checksum mismatch" in err
    assert spawned == [] and path.is_file()  # nothing started, nothing deleted


@pytest.mark.parametrize("keep", ["10 bytes", "60 bytes", "half", "all but 1 byte"])
def test_a_truncated_checkpoint_is_refused(tmp_path, monkeypatch, no_live_worker, spawned, capsys, keep):
    store, rid, spec = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    data = path.read_bytes()
    n = {"10 bytes": 10, "60 bytes": 60, "half": len(data) // 2, "all but 1 byte": len(data) - 1}[keep]
    path.write_bytes(data[:n])
    err = refused(capsys, store, rid, store.get(rid))
    if keep == "10 bytes":  # not even the magic line is left
        assert "is not a workbench checkpoint" in err
    else:
        assert f"checkpoint {path} is truncated" in err
    assert spawned == []


@pytest.mark.parametrize("garbage", [b"", b"not a checkpoint", bytes(range(256)) * 40,
                                     pickle.dumps({"format": 1, "step": 3})],
                         ids=["empty", "text", "binary", "a plain pickle"])
def test_a_garbage_file_is_refused(tmp_path, monkeypatch, no_live_worker, spawned, capsys, garbage):
    store, rid, _ = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    path.write_bytes(garbage)
    err = refused(capsys, store, rid, store.get(rid))
    assert f"checkpoint {path} is not a workbench checkpoint" in err
    assert spawned == []


def test_another_runs_or_another_specs_checkpoint_is_refused(tmp_path, monkeypatch, no_live_worker, spawned,
                                                             capsys):
    store, a, spec = preempted_run(tmp_path, monkeypatch)
    (b,) = store.add_runs([spec_of(**FIXED, seed=1)])
    assert attempt(monkeypatch, store, b, at=3) == 128 + signal.SIGTERM
    pa, pb = checkpoint.path_for(store.root, a), checkpoint.path_for(store.root, b)
    mine = pa.read_bytes()
    pa.write_bytes(pb.read_bytes())  # b's whole, valid checkpoint in a's place
    err = refused(capsys, store, a, store.get(a))
    assert f"checkpoint {pa} belongs to run {b}, not run {a}" in err
    # a's id but written for another computation (another store's run a, say)
    state = checkpoint.load(pb)
    state.pop("_file", None)
    checkpoint.save(dict(state, run_id=a), pa)
    err = refused(capsys, store, a, store.get(a))
    assert f"checkpoint {pa} was written for another spec than run {a}'s" in err
    pa.write_bytes(mine)
    assert resume_cli(store, a) == 0 and store.get(a).state == "pending"  # its own: resumed
    assert spawned == [store.root]


def test_a_file_torch_would_refuse_never_brings_the_unsafe_advice(tmp_path, monkeypatch, no_live_worker,
                                                                  spawned, capsys):
    """A zip torch.save wrote holding an object weights_only loading refuses: torch's error
    says to load with weights_only=False; neither resume nor the worker repeats that."""
    store, rid, spec = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    torch.save({"format": 1, "run_id": rid, "spec_key": spec_key(spec),
                "thing": zipfile.ZipInfo("x")}, path)  # a class outside weights_only's allow-list
    err = refused(capsys, store, rid, store.get(rid))
    assert f"checkpoint {path} (written before checksums) cannot be read" in err
    # the worker, should it meet such a file anyway (e.g. replaced after the requeue)
    store.requeue(rid, {"checkpoint": str(path), "step": 3})
    assert attempt(monkeypatch, store, rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith(f"cannot resume: checkpoint {path}")
    assert UNSAFE not in r.error and "weights_only" not in r.error
    assert f"`{command(store.root)} resume --restart {rid}`" in r.error


def test_the_worker_checks_again_and_fails_clearly(tmp_path, monkeypatch, no_live_worker, spawned, capsys):
    """Damaged between ``resume`` and the worker's start: the worker refuses it too."""
    store, rid, spec = preempted_run(tmp_path, monkeypatch)
    assert resume_cli(store, rid) == 0
    path = checkpoint.path_for(store.root, rid)
    flip(path, path.stat().st_size * 2 // 3)
    assert attempt(monkeypatch, store, rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith(f"cannot resume: checkpoint {path} is damaged: "
                                                      f"checksum mismatch")
    assert UNSAFE not in r.error and f"`{command(store.root)} resume --restart {rid}`" in r.error
    assert metric_rows(store, rid)  # the first attempt's rows are still there


# --------------------------------------------------------------------------- the way on
def test_restart_trains_a_run_with_a_bad_checkpoint_from_scratch(tmp_path, monkeypatch, no_live_worker,
                                                                 spawned, capsys):
    spec = spec_of(**FIXED)
    want = uninterrupted(tmp_path, monkeypatch, spec)
    store, rid, _ = preempted_run(tmp_path, monkeypatch, spec=spec)
    path = checkpoint.path_for(store.root, rid)
    flip(path, path.stat().st_size // 2)
    assert resume_cli(store, rid) == 2
    capsys.readouterr()
    assert resume_cli(store, rid, restart=True) == 0
    assert f"run {rid}: restarts from step 0" in capsys.readouterr().out
    r = store.get(rid)
    assert r.state == "pending" and not r.info.get("resume") and not path.exists()
    assert metric_rows(store, rid) == [] and spawned == [store.root]
    assert attempt(monkeypatch, store, rid) == 0
    r = store.get(rid)
    assert r.state == "finished" and not r.info.get("resumed")  # trained from step 0, not resumed
    assert outcome(store, rid) == want  # the same numbers as a run never interrupted


def test_restart_never_touches_a_finished_run(tmp_path, monkeypatch, no_live_worker, spawned, capsys):
    spec = spec_of(**FIXED)
    store, rid = new_run(tmp_path / "done", spec)
    assert attempt(monkeypatch, store, rid) == 0
    before = outcome(store, rid)
    assert resume_cli(store, rid, restart=True) == 2
    assert f"run {rid} is finished" in capsys.readouterr().err
    assert store.get(rid).state == "finished" and outcome(store, rid) == before and spawned == []


def test_a_replayed_profile_refuses_a_run_with_a_bad_checkpoint(tmp_path, fake_popen, monkeypatch,
                                                                no_live_worker):
    """``run PROFILE`` again: the preempted run with a damaged checkpoint is neither resumed
    nor silently restarted (which would throw its training away); it is refused, with why."""
    store = scheduler.Store(tmp_path / "st")
    a, b, c = launch.submit(store, sweep())
    for rid in (a, b):
        assert attempt(monkeypatch, store, rid, at=2) == 128 + signal.SIGTERM
    bad = checkpoint.path_for(store.root, b)
    flip(bad, bad.stat().st_size // 2)
    rows = metric_rows(store, b)
    out = launch.submit(store, sweep())
    assert out.resumed == [a] and out.restarted == [] and [rid for rid, _ in out.refused] == [b]
    why = out.refused[0][1]
    assert "checksum mismatch" in why and f"resume --restart {b}" in why and UNSAFE not in why
    r = store.get(b)
    assert r.state == "preempted" and bad.is_file() and metric_rows(store, b) == rows


# --------------------------------------------------------------------------- previous format
def write_legacy(path):
    """Rewrite a checkpoint as the previous version wrote it: a bare torch.save."""
    state = checkpoint.load(path)
    state.pop("_file", None)
    path.write_bytes(b"")
    with open(path, "wb") as f:
        torch.save(state, f)


def test_a_checkpoint_of_the_previous_format_still_resumes(tmp_path, monkeypatch, no_live_worker, spawned,
                                                           capsys):
    spec = spec_of(**FIXED)
    want = uninterrupted(tmp_path, monkeypatch, spec)
    store, rid, _ = preempted_run(tmp_path, monkeypatch, spec=spec)
    path = checkpoint.path_for(store.root, rid)
    write_legacy(path)
    assert resume_cli(store, rid) == 0
    assert (f"run {rid}: resumes from its checkpoint at step 3 ({checkpoint.LEGACY_NOTE})"
            in capsys.readouterr().out)
    assert attempt(monkeypatch, store, rid) == 0
    r = store.get(rid)
    assert r.state == "finished" and r.info["resumed"][0]["check"] == checkpoint.LEGACY_NOTE
    assert outcome(store, rid) == want


def test_a_damaged_checkpoint_of_the_previous_format_is_caught_by_its_crc(tmp_path, monkeypatch,
                                                                          no_live_worker, spawned, capsys):
    store, rid, _ = preempted_run(tmp_path, monkeypatch)
    path = checkpoint.path_for(store.root, rid)
    write_legacy(path)
    data = path.read_bytes()
    entry = max(zipfile.ZipFile(io.BytesIO(data)).infolist(), key=lambda i: i.file_size)  # a storage
    name_len, extra_len = struct.unpack("<HH", data[entry.header_offset + 26:entry.header_offset + 30])
    data_at = entry.header_offset + 30 + name_len + extra_len  # after its local header (stored, not deflated)
    flip(path, data_at + entry.file_size // 2)
    err = refused(capsys, store, rid, store.get(rid))
    assert f"checkpoint {path} (written before checksums) is damaged: checksum mismatch (CRC32" in err
