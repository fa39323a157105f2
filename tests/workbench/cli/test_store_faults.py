"""The store under faults (issue 19): a read-only store is read and refuses writes in one
line; ``--store`` at a file is one line; many processes creating one store at once all
succeed; a full disk ends the worker's run as ``failed: disk full`` with its state true and
the commands still working.

Read-only stores are made read-only for real, as root too (where chmod stops nothing): the
commands run in a user and mount namespace (``unshare -rm``) in which the store folder, or
only its database file, is bind-mounted read-only. Without namespaces, a non-root user gets
chmod instead; root without namespaces skips. A full disk is SQLite's own ``max_page_count``
(SQLITE_FULL from the same code path as a full file system) and, where a namespace can mount
one, a 2 MiB tmpfs holding the whole store while ``ssm-workbench run`` trains.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import tiny_profile_text, workers_done
from workbench.train import checkpoint, worker
from workbench import cli
from workbench.execute import resume
from workbench.spec.profile import expand, loads
from workbench.store import RESERVE_FILE, Store, StoreError, StoreFull, StoreReadOnly, is_disk_full
from workbench.store.progress import command

ROOT = Path(__file__).resolve().parents[3]


def profile_text(steps=40, eval_every=20, checkpoint_every=10):
    return tiny_profile_text("faults", examples=(64, 16), d_model=16, steps=steps, batch_size=8, lr=3e-3,
                             warmup_steps=2, eval_every=eval_every, log_every=1,
                             checkpoint_every=checkpoint_every, device="cpu")


def spec(**kw):
    return expand(loads(profile_text(**kw)))[0].to_dict()


def cli_run(capsys, *argv):
    """``ssm-workbench`` in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- --store at a file
@pytest.mark.parametrize("command", [["runs"], ["show", "1"], ["export"], ["kill", "1"], ["resume", "1"],
                                     ["plot"], ["run", "PROFILE"]])
def test_store_at_a_file_is_one_clear_line_with_exit_2(tmp_path, capsys, command):
    prof = tmp_path / "p.toml"
    prof.write_text(profile_text())
    command = [str(prof) if a == "PROFILE" else a for a in command]
    afile = tmp_path / "results.txt"
    afile.write_text("not a store\n")
    for where in (afile, afile / "store"):  # the file itself, and a folder that would be inside it
        code, _, err = cli_run(capsys, "--store", where, *command)
        line = one_line_error(err)
        assert code == 2, (command, err)
        assert str(where) in line and "file" in line and "folder" in line
    assert afile.read_text() == "not a store\n"


# --------------------------------------------------------------------------- read-only store
@functools.lru_cache(maxsize=None)
def namespaces_work() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        got = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind / /mnt 2>/dev/null || mount -t tmpfs t /mnt"],
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return got.returncode == 0


READER = """
import contextlib, io, json, sys
from workbench import cli
out = []
for argv in json.loads(sys.argv[1]):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            code = cli.main(argv)
        except BaseException as x:  # a traceback is what the test looks for
            import traceback
            traceback.print_exc(file=e)
            code = -1
    out.append({"argv": argv, "code": code, "out": o.getvalue(), "err": e.getvalue()})
print(json.dumps(out))
"""


def run_read_only(target: Path, commands: list[list[str]]) -> list[dict]:
    """Run ``ssm-workbench`` commands (in one Python process) while ``target`` (the store
    folder or its database file) is read-only: a read-only bind mount in a user+mount
    namespace, or chmod for a non-root user."""
    argv = [sys.executable, "-c", READER, json.dumps(commands)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if namespaces_work():
        t = str(target)
        script = f'mount --bind "{t}" "{t}" && mount -o remount,bind,ro "{t}" && exec "$@"'
        got = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *argv], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=300)
    elif os.geteuid() != 0:
        mode = target.stat().st_mode
        target.chmod(mode & 0o555)
        try:
            got = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        finally:
            target.chmod(mode)
    else:
        pytest.skip("root without user namespaces: nothing here can make a folder read-only for root")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def make_store(folder: Path, wal_left: bool) -> None:
    """A store with run 1 finished (accuracy 0.75) and run 2 running under a dead worker.
    ``wal_left``: made by a process that died without closing it, so the last changes are
    still in its -wal file (a colleague's store copied while in use, a crashed machine)."""
    code = textwrap.dedent(f"""
        import json, os
        from workbench.store import Store
        s = Store({str(folder)!r})
        a, b = s.add_runs([json.loads({json.dumps(spec())!r})] * 2)
        s.mark_started(a, os.getpid(), "cpu", "cpu0")
        s.set_results(a, {{"accuracy": 0.75}})
        s.finish(a, "finished")
        s.mark_started(b, os.getpid(), "cpu", "cpu0")
        if {wal_left!r}:
            os._exit(0)  # no close: the -wal and -shm files stay, with the rows in them
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (folder / "store.sqlite-wal").exists() == wal_left


@pytest.mark.parametrize("what,wal_left", [("folder", False), ("folder", True), ("file", False)])
def test_a_read_only_store_is_read_and_refuses_writes_in_one_line(tmp_path, what, wal_left):
    folder = tmp_path / "archived"
    make_store(folder, wal_left)
    before = snapshot(folder)
    s = str(folder)
    got = run_read_only(folder if what == "folder" else folder / "store.sqlite", [
        ["--store", s, "runs"], ["--store", s, "show", "1"], ["--store", s, "show", "2"],
        ["--store", s, "export", "--format", "csv"], ["--store", s, "kill", "2"],
        ["--store", s, "resume", "2"]])
    runs, show1, show2, export, kill, res = got
    for r in (runs, show1, show2, export):
        assert r["code"] == 0 and "Traceback" not in r["err"], r
        assert "read-only" in r["err"]  # said once, on stderr
    assert "finished" in runs["out"] and "running" in runs["out"]
    # the dead worker's run is shown as it is: reaping it would be a write
    assert "running" in show2["out"]
    assert "finished" in show1["out"] and "accuracy=0.75" in show1["out"]
    assert "0.75" in export["out"]
    line = one_line_error(kill["err"].split("\n", 1)[1])  # after the read-only note
    assert kill["code"] == 2 and "read-only" in line and s in line
    assert res["code"] != 0 and "Traceback" not in res["err"]
    after = snapshot(folder)
    assert {k: after.get(k) for k in before} == before  # nothing was written, not a byte
    # where the folder is writable SQLite may make its WAL index to read the file (an empty
    # -wal, a -shm): no data
    assert set(after) - set(before) <= ({"store.sqlite-wal", "store.sqlite-shm"} if what == "file" else set())
    if "store.sqlite-wal" in set(after) - set(before):
        assert (folder / "store.sqlite-wal").stat().st_size == 0


def test_writes_to_a_store_opened_read_only_raise_store_read_only(tmp_path):
    Store(tmp_path / "s").add_runs([spec()])
    ro = Store(tmp_path / "s", readonly=True)
    assert ro.readonly and [r.id for r in ro.runs()] == [1]
    assert ro.reap() == []
    with pytest.raises(StoreReadOnly, match=str(tmp_path / "s")):
        ro.finish(1, "failed", "x")
    with pytest.raises(StoreError, match="no store"):
        Store(tmp_path / "none", readonly=True)


async def test_the_tui_reads_a_read_only_store(tmp_path):
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.runs_table import RunsTable

    folder = tmp_path / "archived"
    make_store(folder, wal_left=True)
    before = snapshot(folder)
    store = Store(folder, readonly=True)
    app = WorkbenchApp(store=store, profiles_dir=tmp_path / "profiles")
    async with app.run_test(size=(160, 48)) as pilot:
        await workers_done(pilot.app)
        await pilot.pause()
        app.poll_runs()
        await workers_done(pilot.app)
        await pilot.pause()
        assert [r.state for r in app.runs_seen] == ["finished", "running"]  # nothing reaped
        assert app.query_one(RunsTable).row_count == 2
        assert "read-only" in app.sub_title
    # the folder is writable here, so SQLite may rebuild the WAL index (-shm) it reads through
    without_index = lambda snap: {k: v for k, v in snap.items() if k != "store.sqlite-shm"}  # noqa: E731
    assert without_index(snapshot(folder)) == without_index(before)


# --------------------------------------------------------------------------- concurrent creation
OPENERS = """
import multiprocessing as mp, sys
from pathlib import Path
from workbench.store import Store

def open_store(barrier, path, q):
    barrier.wait()  # all released at once (a futex wake), then all create the same new store
    try:
        s = Store(path)
        s.add_runs([{"profile": "p", "model": "m", "label": "x", "task": "t", "seed": 0}])
        s.reap()
        s.runs()
        s.close()
        q.put("")
    except Exception as e:
        q.put(f"{type(e).__name__}: {e}")

base, n, trials = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ctx = mp.get_context("fork")  # this interpreter has no threads yet: forking is safe
errors = []
for t in range(trials):
    barrier, q = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=open_store, args=(barrier, base / f"store-{t}", q)) for _ in range(n)]
    for p in procs:
        p.start()
    errors += [f"trial {t}: {e}" for e in (q.get(timeout=240) for _ in procs) if e]
    for p in procs:
        p.join()
print("\\n".join(errors))
"""


@pytest.mark.parametrize("n,trials", [(2, 100), (24, 4)])  # before the lock: 2 processes failed 21-45 in 100
def test_many_processes_creating_one_store_at_once_all_succeed(tmp_path, n, trials):
    got = subprocess.run([sys.executable, "-c", OPENERS, str(tmp_path), str(n), str(trials)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert got.returncode == 0 and not got.stdout.strip(), got.stdout + got.stderr
    for t in range(trials):
        s = Store(tmp_path / f"store-{t}")
        assert len(s.runs()) == n
        assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_creating_a_store_waits_for_the_set_up_lock(tmp_path):
    """The set-up (schema, the switch to WAL, upgrades) runs under the store's lock file,
    so no opener ever meets a half-made store or a journal-mode switch."""
    import fcntl

    from workbench.store import LOCK_FILE

    folder = tmp_path / "new"
    folder.mkdir()
    with open(folder / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = subprocess.Popen([sys.executable, "-c", f"from workbench.store import Store; Store({str(folder)!r})"],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(3)
        assert p.poll() is None  # waiting
        assert not (folder / "store.sqlite").exists() or (folder / "store.sqlite").stat().st_size == 0
    assert p.wait(timeout=120) == 0
    assert Store(folder).runs() == []


# --------------------------------------------------------------------------- full disk
def test_disk_full_is_recognised_through_the_chain():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as e:
        assert is_disk_full(e)
    assert not is_disk_full(OSError(errno.EIO, "I/O error"))
    assert not is_disk_full(ValueError("database or disk is full"))  # words alone are not the error


def cap_pages(monkeypatch, extra_pages: int, store: Store):
    """From now on every new store connection sees a database that may grow only
    ``extra_pages`` pages beyond its size now: SQLITE_FULL, as from a full file system."""
    cap = store.conn.execute("PRAGMA page_count").fetchone()[0] + extra_pages
    real = Store._connect

    def connect(self):
        c = real(self)
        c.execute(f"PRAGMA max_page_count={cap}")
        return c

    monkeypatch.setattr(Store, "_connect", connect)
    store.close()  # its next connection is capped too
    return real


def test_full_database_fails_the_run_as_disk_full_and_it_resumes_when_space_returns(tmp_path, monkeypatch,
                                                                                    capsys):
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # the in-process worker is gone after
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec(steps=150, eval_every=100, checkpoint_every=10)])
    assert (store.root / RESERVE_FILE).stat().st_size > 0
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    real = cap_pages(monkeypatch, 3, store)
    assert worker.run(str(store.root), rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith("disk full"), r.error
    assert f"{command(store.root)} resume {rid}" in r.error
    assert 10 < r.step < 150 and r.progress < 1
    assert "the store's database" in r.error and "database or disk is full" in r.error
    ck = r.info["checkpoint"]
    assert ck and checkpoint.path_for(store.root, rid).is_file() and f"step {ck['step']}" in r.error
    # the commands work on the full store
    code, out, _ = cli_run(capsys, "--store", store.root, "runs")
    assert code == 0 and "failed" in out
    code, out, _ = cli_run(capsys, "--store", store.root, "show", rid)
    assert code == 0 and "disk full" in out
    with pytest.raises(StoreFull, match="disk full"):
        store.add_metrics(rid, [(1, None, "train", "x", 1.0)] * 2000)
    # space returns: the run goes on from its checkpoint and finishes
    monkeypatch.setattr(Store, "_connect", real)
    store.close()
    assert resume.requeue(store, rid) == "resumed"
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    assert worker.run(str(store.root), rid) == 0
    r = store.get(rid)
    assert r.state == "finished" and r.info["resumed"][0]["step"] == ck["step"]


def test_enospc_writing_a_checkpoint_fails_the_run_as_disk_full(tmp_path, monkeypatch):
    monkeypatch.setenv("SSM_WORKBENCH_CMD", "./run.sh")  # as run.sh sets it for the workers too
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec(steps=30, checkpoint_every=10)])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")

    def save(state, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "save", save)
    assert worker.run(str(store.root), rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith("disk full: No space left on device writing ")
    assert "Traceback" not in r.error
    assert f"`./run.sh --store {store.root} resume {rid}` goes on" in r.error  # typed as it says


def test_recording_a_full_disk_frees_the_reserve_first(tmp_path, monkeypatch):
    """The failure record itself needs room: with the disk full until the reserve is gone,
    the worker still records ``failed: disk full``."""
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec(steps=30, checkpoint_every=10)])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    reserve = store.root / RESERVE_FILE
    real_tx = Store.tx

    def tx(self):
        if reserve.exists():  # "no space" while the reserve holds it
            raise StoreFull(f"store {self.root}: disk full (database or disk is full)")
        return real_tx(self)

    monkeypatch.setattr(Store, "tx", tx)
    assert worker.run(str(store.root), rid) == 1
    monkeypatch.setattr(Store, "tx", real_tx)
    r = Store(store.root).get(rid)
    assert r.state == "failed" and r.error.startswith("disk full"), r.error
    assert reserve.exists()  # held again by the next writable open


FILL = """
set -e
mount -t tmpfs -o size=2m tmpfs "$MNT"
cd "$REPO"
set +e
"$PY" -m workbench.cli --store "$MNT/store" run --quiet "$PROF" > "$OUT/run.out" 2> "$OUT/run.err"
echo $? > "$OUT/run.code"
"$PY" -m workbench.cli --store "$MNT/store" runs > "$OUT/runs.out" 2> "$OUT/runs.err"
echo $? > "$OUT/runs.code"
"$PY" -m workbench.cli --store "$MNT/store" show 1 > "$OUT/show.out" 2> "$OUT/show.err"
echo $? > "$OUT/show.code"
df -k "$MNT" > "$OUT/df"
"""


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare for a private tmpfs")
def test_a_2_mib_file_system_fails_the_run_as_disk_full_and_commands_still_work(tmp_path):
    if not namespaces_work():
        pytest.skip("user and mount namespaces are not available here: no private small file system")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    prof = tmp_path / "fill.toml"
    prof.write_text(profile_text(steps=20000, eval_every=5000, checkpoint_every=50))
    env = {**os.environ, "MNT": str(mnt), "OUT": str(out), "REPO": str(ROOT), "PY": sys.executable,
           "PROF": str(prof), "PYTHONPATH": str(ROOT)}
    got = subprocess.run(["unshare", "-rm", "sh", "-c", FILL], env=env, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stderr
    res = {k: (out / f"{k}.out").read_text() + (out / f"{k}.err").read_text() for k in ("run", "runs", "show")}
    codes = {k: int((out / f"{k}.code").read_text()) for k in ("run", "runs", "show")}
    assert codes["run"] == 1 and "disk full" in res["run"] and "Traceback" not in res["run"], res["run"]
    assert codes["runs"] == 0 and "failed" in res["runs"], res["runs"]
    assert codes["show"] == 0 and "disk full" in res["show"] and "Traceback" not in res["show"], res["show"]


def test_enospc_writing_the_log_fails_the_run_as_disk_full(tmp_path, monkeypatch):
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec(steps=30)])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")

    class FullLog:  # the worker's stdout/stderr are its log file, on the full disk
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", FullLog())
    monkeypatch.setattr(sys, "stderr", FullLog())
    assert worker.run(str(store.root), rid) == 1
    monkeypatch.undo()
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith("disk full: No space left on device writing the log")


def test_a_run_file_on_a_full_disk_loses_no_event_after_a_torn_line(tmp_path, monkeypatch):
    """A Slurm worker's run file: a write cut short by a full disk leaves a torn line; the
    worker frees the job folder's reserve and records its end, which the reader applies."""
    from workbench.store import runfile

    store = Store(tmp_path / "store")
    (rid,) = store.add_runs([spec()])
    shared = tmp_path / "shared"
    folder = runfile.job_dir(shared, rid)
    runfile.write_snapshot(store, rid, folder)
    rf = runfile.RunFile(shared, rid)
    assert (folder / RESERVE_FILE).is_file()
    real_write = os.write

    def half_then_full(fd, data):
        if fd != rf._fd:
            return real_write(fd, data)
        if len(data) > 8:
            return real_write(fd, bytes(data[: len(data) // 2]))  # a short write ...
        raise OSError(errno.ENOSPC, "No space left on device")   # ... then no room at all

    monkeypatch.setattr(runfile.os, "write", half_then_full)
    with pytest.raises(OSError) as got:
        rf.add_metrics(rid, [(1, None, "train", "loss", 2.0)])
    assert is_disk_full(got.value)
    monkeypatch.setattr(runfile.os, "write", real_write)
    assert rf.release_reserve() and not (folder / RESERVE_FILE).exists()
    rf.finish(rid, "failed", "disk full: test")
    rf.close()
    runfile.ingest(store, rid, folder)
    r = store.get(rid)
    assert r.state == "failed" and r.error == "disk full: test"
    assert r.info["runfile_bad_lines"] == 1  # the torn line, skipped
