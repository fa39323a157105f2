"""The first hour on the command line (issue 32, items 4, 8 and 10).

- tables that fit: `runs` and `run`'s final table choose their columns for the terminal's
  width: the key columns (id, model, seq_len, state, accuracy) whole, never 'ma…', and the
  sweep's varying axes before constant columns;
- messages: `score` on a store without the profile's runs says that nothing ran and what to
  type, and no reading command creates the store; killed, failed and crashed runs are not
  "done"; the hints name the command as the user runs it (`./run.sh ...`); `plot` writes
  into the store's folder (tests/workbench/results/test_plot.py);
- faults: a SIGKILLed scheduler is noticed by the readers (with the command that recovers)
  and started again by `run`, which is the one waiting; `export` and `plot` on a full disk
  say one line and leave no file; a checkpoint holding a pickle is refused in words that
  never advise `weights_only=False`.
"""
from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from helpers import tiny_profile_text
from test_plot import add_run
from test_store import spec
from workbench import cli
from workbench.cli import runs as cli_runs
from workbench.execute import scheduler
from workbench.spec.expand import expand
from workbench.spec.profile import loads
from workbench.store import Run, Store, StoreError, progress

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_700_000_000.0
KEYS = ("id", "model", "L", "state", "acc")


# --------------------------------------------------------------------------- tables that fit
def row(rid: int, model: str, seq_len: int, state: str, acc: float | None, seed: int = 0,
        grid: dict | None = None, profile: str = "mad-selective-copying",
        task: str = "mad_selective_copying") -> Run:
    return Run(id=rid, profile=profile, idx=rid, model=model, label=model, task=task, seq_len=seq_len,
               seed=seed, spec={"grid": grid} if grid else {}, fields={}, state=state, device="cpu",
               slot="cpu0", host="gpu-node-17.cluster.example.org", pid=400000 + rid, pid_start=None,
               created=NOW, started=NOW, ended=NOW + 61, heartbeat=None, progress=1.0, step=300,
               total_steps=300, epoch=10, last_loss=0.012345 * rid, last_accuracy=acc, backend=None,
               error=None, info={}, log_path=None)


def length_sweep() -> list[Run]:
    """Two models at two lengths, three seeds: what `run profiles/...` prints at its end."""
    out, rid = [], 0
    for model in ("transformer", "mamba"):
        for L in (64, 128):
            for seed in (0, 1, 2):
                rid += 1
                out.append(row(rid, model, L, "killed" if rid == 5 else "finished",
                               1.0 if rid % 2 else 0.99753, seed))
    return out


def printed(runs: list[Run], width: int, boxed: bool = True, monkeypatch=None) -> list[str]:
    """The table as a terminal of ``width`` columns shows it (lines, progress lines dropped)."""
    buf = io.StringIO()
    console = Console(width=width, file=buf, color_system=None, legacy_windows=False)
    if not boxed:
        monkeypatch.setattr(cli_runs, "BOXED_MAX", 1)
    cli_runs._print_runs(console, runs)
    return [ln for ln in buf.getvalue().splitlines() if ln and not ln.startswith(runs[0].profile + ":")]


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"[│┃]", line)[1:-1]] if "│" in line or "┃" in line else line.split()


@pytest.mark.parametrize("boxed", [True, False], ids=["boxed", "plain"])
@pytest.mark.parametrize("width", [80, 120])
def test_run_table_fits_the_terminal_with_whole_key_cells(width, boxed, monkeypatch):
    runs = length_sweep()
    lines = printed(runs, width, boxed, monkeypatch)
    assert all(len(ln) <= width for ln in lines), "\n".join(lines)
    assert "…" not in "\n".join(lines)  # no cell cut to 'ma…', 'fi…', '0.9…'
    header = next(cells(ln) for ln in lines if "state" in ln)
    assert set(KEYS) - {"acc"} | {"eval_acc"} <= set(header)  # (the accuracy column: eval_acc)
    body = [cells(ln) for ln in lines if re.search(r"\b(finished|killed)\b", ln)]
    assert len(body) == len(runs)
    col = {h: i for i, h in enumerate(header)}
    for r, c in zip(runs, body):
        assert (c[col["id"]], c[col["model"]], c[col["L"]], c[col["state"]]) == \
            (str(r.id), r.label, str(r.seq_len), r.state)
        # accuracy with three decimals always: 1.000 beside 0.998, never '1'
        assert c[col["eval_acc"]] == f"{r.last_accuracy:.3f}"
    # the seed varies (the sweep's axis): kept at 80 columns too, with what was measured;
    # the profile, task and device are the same on every row, and go first
    assert {"seed", "progress", "train_loss"} <= set(header)
    if width == 80:
        assert not {"profile", "task"} & set(header)
    else:  # room for more: constant columns come back
        assert "task" in set(header)


def test_a_varying_axis_is_kept_before_constant_columns():
    """A grid sweep at one length: the grid point (and the seed, the length) tells the runs
    apart, so it is shown where the constant task and profile are not."""
    runs = [row(i + 1, "mamba", 256, "finished", 0.5, seed=i % 2,
                grid={"train.lr": lr, "train.weight_decay": 0.1}, profile="mqar-grid-reduced",
                task="mqar [num_kv_pairs=16, vocab_size=8192]")
            for i, lr in enumerate((1e-4, 1e-4, 5e-4, 5e-4, 1e-3, 1e-3))]
    lines = printed(runs, 80)
    header = next(cells(ln) for ln in lines if "state" in ln)
    assert "grid" in header and "seed" in header and "task" not in header, header
    text = "\n".join(lines)
    assert "lr=1e-4" in text and "lr=5e-4" in text and "…" not in text


def test_fit_columns_keeps_keys_whole_or_says_it_cannot():
    natural = {h: 10 for h in cli_runs.RUNS_HEADERS}
    assert cli_runs.fit_columns(10, natural, set(), 3, 1) is None  # keys alone do not fit
    shown = cli_runs.fit_columns(80, natural, {"task"}, 3, 1)
    assert shown == set(KEYS) | {"task"}  # the varying axis first: 6 x 13 + 1 <= 80 < 7 x 13 + 1
    assert cli_runs.fit_columns(80, natural, set(), 3, 1) == set(KEYS) | {"progress"}  # then measurements


def test_runs_command_at_80_columns(tmp_path, monkeypatch, capsys):
    """`runs` itself, in an 80-column terminal (COLUMNS is what `shutil` reads)."""
    store = Store(tmp_path / "store")
    ids = store.add_runs([spec(profile="lens", model=m, label=m, task="mad_selective_copying", seq_len=L, seed=0)
                          for m in ("transformer", "mamba") for L in (64, 128)])
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", "cpu0")
        store.heartbeat(rid, progress=1.0, step=10, last_loss=0.5, last_accuracy=0.875)
        store.finish(rid, "finished")
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["--store", str(store.root), "runs"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and all(len(ln) <= 80 for ln in out.splitlines())
    for m in ("transformer", "mamba"):
        assert m in out
    assert "128" in out and "0.875" in out and "finished" in out


# --------------------------------------------------------------------------- messages
def test_killed_failed_and_crashed_runs_are_not_done():
    runs = [row(1, "lstm", 8, "killed", None)]
    assert progress.by_profile(runs, NOW)[0].text() == "mad-selective-copying: 0/1 done, 1 killed"
    runs += [row(2, "lstm", 8, "finished", 0.5), row(3, "lstm", 8, "crashed", None),
             row(4, "lstm", 8, "failed", None)]
    [p] = progress.by_profile(runs, NOW)
    assert (p.done, p.failed) == (1, 3)
    assert p.text() == "mad-selective-copying: 1/4 done, 1 failed, 1 crashed, 1 killed"


def test_score_without_the_profiles_runs_says_nothing_ran_and_creates_no_store(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SSM_WORKBENCH_CMD", "./run.sh")
    profile = "profiles/mad-benchmark-reduced.toml"
    root = tmp_path / "nowhere" / "store"
    assert cli.main(["--store", str(root), "score", str(ROOT / profile), "--allow-partial"]) == 1
    err = capsys.readouterr().err
    assert "nothing of profile 'mad-benchmark-reduced' has run" in err
    # counted as `profile check` counts: 6 settings (not 12, one per model and setting)
    assert "none of its 72 run(s) (6 setting(s) x 2 model(s))" in err and "waiting" not in err
    assert f"run them: `./run.sh --store {root} run {ROOT / profile}`" in err
    assert not (tmp_path / "nowhere").exists()

    # a store holding other runs only: said the same way
    store = Store(tmp_path / "other")
    add_run(store, "something-else", "lstm", 16, 0)
    assert cli.main(["--store", str(store.root), "score", str(ROOT / profile), "--allow-partial"]) == 1
    err = capsys.readouterr().err
    assert f"nothing of profile 'mad-benchmark-reduced' has run in {store.root}" in err
    assert "run them: `./run.sh --store" in err


def test_unfinished_settings_are_counted_as_profile_check_counts_them(tmp_path, capsys):
    """Two models on one setting, one run unfinished each: one setting (for two models),
    not 'two settings'; and with nothing complete, runs counted, with where to look."""
    from test_score import add

    store = Store(tmp_path / "st")
    for model in ("a", "b"):
        add(store, model, "t1", "baseline", 0, 0.8)
        add(store, model, "t1", "n=8", 0, 0.5)
        add(store, model, "t1", "n=8", 1, None, state="pending")
    assert cli.main(["--store", str(store.root), "score", "p"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("'p': 1 setting(s), for 2 model(s), have unfinished runs")
    assert cli.main(["--store", str(store.root), "score", "p", "--allow-partial"]) == 0
    assert "PARTIAL: 1 setting(s), for 2 model(s), not finished" in capsys.readouterr().out

    other = Store(tmp_path / "other")
    for model in ("a", "b"):
        add(other, model, "t1", "baseline", 0, None, state="pending")
    assert cli.main(["--store", str(other.root), "score", "p", "--allow-partial"]) == 1
    err = capsys.readouterr().err
    assert "no setting of profile 'p' has all its runs finished yet: 0 of its 2 run(s) (1 setting(s) x " \
           "2 model(s)) finished" in err
    assert "runs --profile p`" in err


@pytest.mark.parametrize("argv", [["runs"], ["show", "1"], ["kill", "1"], ["export", "--profile", "p"],
                                  ["score", "p"], ["report", str(ROOT / "profiles/mad-selective-copying.toml")],
                                  ["plot", "p"]])
def test_reading_commands_never_create_the_store(tmp_path, capsys, argv):
    root = tmp_path / "absent"
    code = cli.main(["--store", str(root), *argv])
    out = capsys.readouterr()
    assert not root.exists()
    assert "Traceback" not in out.err
    if argv == ["runs"]:
        assert code == 0 and f"no runs in {root} (no store there yet)" in out.out
    else:
        assert code in (1, 2) and f"no store in {root} yet" in out.err


def test_hints_name_the_command_as_typed(tmp_path, monkeypatch):
    monkeypatch.setenv("SSM_WORKBENCH_CMD", "./run.sh")
    monkeypatch.setenv("SSM_WORKBENCH_STORE", str(tmp_path / "default"))
    assert progress.command() == "./run.sh"
    assert progress.command(tmp_path / "default") == "./run.sh"  # the default store: no --store
    assert progress.command(tmp_path / "b c") == f"./run.sh --store '{tmp_path / 'b c'}'"
    # not through run.sh, and not on the PATH: this environment's own script, by full path
    monkeypatch.delenv("SSM_WORKBENCH_CMD")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    beside = Path(sys.executable).with_name("ssm-workbench")
    assert progress.command() == (str(beside.absolute()) if beside.is_file() else f"{sys.executable} -m workbench")


COMMAND_HINT = re.compile(r"ssm-workbench (?:--store \S+ )?(?:resume|run|show|kill|runs|export|plot|score|"
                          r"report|profile|doctor|eval|bench|models|tasks)\b")
# generated documents (report's tables) name the installed command, not this machine's path
HINTS_AS_DOCUMENTS = {"workbench/results/report.py"}


def test_no_message_hard_codes_the_command():
    """A hint the user types (`resume 3`, `show 3`, `run --fresh`) names the command as they
    run it, through progress.command ($SSM_WORKBENCH_CMD: ./run.sh), not `ssm-workbench`,
    which is not on the PATH after ./run.sh. Docstrings and comments may name it."""
    import ast

    found = []
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in HINTS_AS_DOCUMENTS:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{rel}:{n.lineno}: {n.value.strip()[:80]}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and COMMAND_HINT.search(n.value)
                  and not re.fullmatch(r"ssm-workbench \w+", n.value)]  # a title, a prog name
    assert not found, "\n".join(found)


def test_resume_hints_name_the_command_as_typed(tmp_path, monkeypatch, capsys):
    from workbench.execute import resume

    monkeypatch.setenv("SSM_WORKBENCH_CMD", "./run.sh")
    store = Store(tmp_path / "st")
    rid = add_run(store, "p", "lstm", 16, 0, state="pending")
    gone = subprocess.Popen(["true"])
    gone.wait()  # its worker exited
    store.mark_started(rid, gone.pid, "cpu", "cpu0")
    assert store.finish(rid, "killed", "killed by user")
    with pytest.raises(resume.ResumeError) as e:  # no checkpoint: restart is the way
        resume.requeue(store, rid)
    assert f"`./run.sh --store {store.root} resume --restart {rid}`" in str(e.value)
    assert "ssm-workbench" not in str(e.value)


def test_run_sh_tells_the_workbench_how_it_was_invoked(tmp_path):
    """run.sh puts its own name, as typed, in $SSM_WORKBENCH_CMD (a stand-in set-up script and
    workbench print what they get)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "run.sh", repo / "run.sh")
    (repo / "scripts" / "setup-env.sh").write_text("#!/bin/sh\nexit 0\n")
    (repo / ".venv" / "bin" / "ssm-workbench").write_text('#!/bin/sh\necho "$SSM_WORKBENCH_CMD"\n')
    for f in ("run.sh", "scripts/setup-env.sh", ".venv/bin/ssm-workbench"):
        (repo / f).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SSM_WORKBENCH_CMD"}

    def said(cmd, cwd):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert said(["./run.sh", "export"], repo) == "./run.sh"
    assert said(["repo/run.sh"], tmp_path) == "repo/run.sh"
    assert said(["bash", "run.sh"], repo) == "./run.sh"


# --------------------------------------------------------------------------- a dead scheduler
def profile_text(name: str, seeds) -> str:
    """One lstm at length 10, 30 steps a run: a second or two each."""
    return tiny_profile_text(name, models=["lstm"], seq_lens=[10], seeds=seeds, steps=30, batch_size=8, lr=3e-3,
                             eval_every=100, log_every=5, device="cpu")
WAIT_S = 300  # bounds a hang (the failure this guards against), never a measured time


def wait_for(pred, what: str, timeout: float = WAIT_S):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"not reached: {what}")


def record_pid(root: Path) -> int | None:
    return progress.read_scheduler_record(root).get("pid")


def test_run_starts_a_killed_scheduler_again(tmp_path, monkeypatch):
    """SIGKILL the scheduler while the first of two runs trains: the pending one would never
    start. `run`, which spawned it and is waiting, notices and starts it again; its final
    hint is typed as the user ran it (here through run.sh)."""
    root = tmp_path / "store"
    prof = tmp_path / "two.toml"
    prof.write_text(profile_text("two", [0, 1]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SSM_WORKBENCH_CMD": "./run.sh",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "--store", str(root), "run", str(prof), "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = {}

    def kill_when_training():
        def first_running():
            try:  # the store may not exist yet, or be in the middle of its creation
                s = Store(root, readonly=True)
            except StoreError:
                return None
            try:
                runs = s.runs()
                return len(runs) == 2 and runs[0].state == "running" and record_pid(root)
            except sqlite3.Error:
                return None
            finally:
                s.close()
        pid = wait_for(first_running, "the first run training")
        os.kill(pid, signal.SIGKILL)
        killed["pid"] = pid

    t = threading.Thread(target=kill_when_training, daemon=True)
    t.start()
    try:
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    t.join(5)
    assert proc.returncode == 0, out
    assert f"the scheduler (pid {killed['pid']}) had died with 1 run(s) pending: started it again" in out
    assert f"all 2 run(s) finished. Table: ./run.sh --store {root} export --profile two" in out
    s = Store(root)
    assert [r.state for r in s.runs()] == ["finished", "finished"]


def test_readers_notice_a_killed_scheduler_and_resume_pending_restarts_it(tmp_path, monkeypatch, capsys):
    """A scheduler SIGKILLed (here while it waits for the lock, so that its runs are surely
    still pending) strands them: `runs` and every progress line say so with the command
    that recovers, and that command starts a scheduler that runs them."""
    import fcntl

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SSM_WORKBENCH_CMD", "./run.sh")
    store = Store(tmp_path / "store")
    ids = store.add_runs([s.to_dict() for s in expand(loads(profile_text("one", [0])))])
    with open(store.root / progress.SCHEDULER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the scheduler spawned now waits here, alive
        p = scheduler.spawn(store)
        assert progress.scheduler_state(store.root).state == "running"
        assert progress.stranded_note(store.root) is None
        p.send_signal(signal.SIGKILL)
        p.wait()
    st = progress.scheduler_state(store.root)
    assert (st.state, st.pid) == ("gone", p.pid)

    assert cli.main(["--store", str(store.root), "runs"]) == 0
    # one line, however narrow the terminal: a command cut in two cannot be pasted
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("one:")]
    assert line == (f"one: 0/1 done, 1 pending, its scheduler (pid {p.pid}) is gone, pending runs will "
                    f"not start: `./run.sh --store {store.root} resume --pending` starts it again")

    assert cli.main(["--store", str(store.root), "resume", "--pending"]) == 0
    said = capsys.readouterr().out
    assert f"its scheduler (pid {p.pid}) had died: started one (pid " in said
    wait_for(lambda: store.get(ids[0]).state == "finished", "the stranded run finished")
    wait_for(lambda: record_pid(store.root) is None, "the scheduler's normal exit removing its record")
    # the record goes a moment before the lock is released: wait for both
    wait_for(lambda: progress.scheduler_state(store.root).state == "none", "the scheduler's lock released")


def test_revive_only_where_this_process_waits(tmp_path, monkeypatch):
    """`revive` (run's loop, the TUI's poll) starts a scheduler only for a store this process
    spawned one for, and gives up (once) after MAX_RESTARTS."""
    store = Store(tmp_path / "store")
    store.add_runs([spec()])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    started = []

    def fake_spawn(st, jobs=None, runs_per_gpu=None):
        started.append((jobs, runs_per_gpu))
        (st.root / progress.SCHEDULER_FILE).write_text(json.dumps({"pid": dead.pid, "host": None}))
        scheduler._SPAWNED.setdefault(str(st.root.resolve()), 0)
        return dead

    (store.root / progress.SCHEDULER_FILE).write_text(json.dumps({"pid": dead.pid, "jobs": 2}))
    monkeypatch.setattr(scheduler, "spawn", fake_spawn)
    monkeypatch.setattr(scheduler, "_SPAWNED", {})
    assert progress.scheduler_state(store.root).state == "gone"
    assert scheduler.revive(store) is None and started == []  # not ours to restart: readers say so
    scheduler._SPAWNED[str(store.root.resolve())] = 0
    said = [scheduler.revive(store) for _ in range(scheduler.MAX_RESTARTS + 2)]
    assert started == [(2, None)] + [(None, None)] * (scheduler.MAX_RESTARTS - 1)
    assert all(s.restarted for s in said[:scheduler.MAX_RESTARTS])
    assert not said[scheduler.MAX_RESTARTS].restarted and "died again" in said[scheduler.MAX_RESTARTS]
    assert said[-1] is None  # said once


async def test_the_tui_says_a_scheduler_is_gone_and_restarts_the_one_it_spawned(tmp_path, monkeypatch):
    """The TUI's status line says a store's scheduler is gone (with the command); where this
    TUI spawned it (it launched the sweep: it is the one waiting), its poll starts it again."""
    from textual.widgets import Static

    from test_tui import make_app, settle

    store = Store(tmp_path / "store")
    store.add_runs([spec(profile="p")])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (store.root / progress.SCHEDULER_FILE).write_text(json.dumps({"pid": dead.pid}))
    spawned = []

    def fake_spawn(st, jobs=None, runs_per_gpu=None):  # a live record, as spawn writes it
        spawned.append(st.root)
        (st.root / progress.SCHEDULER_FILE).write_text(json.dumps({"pid": os.getpid()}))
        return type("P", (), {"pid": os.getpid()})()

    monkeypatch.setattr(scheduler, "spawn", fake_spawn)
    monkeypatch.setattr(scheduler, "_SPAWNED", {})
    app = make_app(store, tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        status = str(app.query_one("#runs-summary", Static).render())
        assert f"its scheduler (pid {dead.pid}) is gone" in status and "resume --pending" in status
        assert spawned == []  # another process's sweep: said, not restarted
        scheduler._SPAWNED[str(store.root.resolve())] = 0  # as if this TUI had launched it
        for _ in range(300):  # the next polls (bounded: a loaded machine may skip ticks)
            if spawned:
                break
            await pilot.pause(0.1)
        for _ in range(300):  # a poll after the restart redraws the status
            if "is gone" not in str(app.query_one("#runs-summary", Static).render()):
                break
            await pilot.pause(0.1)
        await settle(pilot)
        assert spawned == [store.root]
        assert "is gone" not in str(app.query_one("#runs-summary", Static).render())


# --------------------------------------------------------------------------- full disk
@pytest.fixture
def results_store(tmp_path):
    store = Store(tmp_path / "store")
    for L in (16, 32):
        for seed in (0, 1):
            add_run(store, "p", "lstm", L, seed)
    return store


def enospc(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_export_on_a_full_disk_says_one_line_and_leaves_no_file(results_store, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tables" / "acc.md"
    out.parent.mkdir()
    real = Path.write_text

    def full(self, *a, **kw):  # as a full disk does: the file is created, nothing fits in it
        real(self, "")
        raise enospc(self)

    monkeypatch.setattr(Path, "write_text", full)
    assert cli.main(["--store", str(results_store.root), "export", "--profile", "p", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"ssm-workbench: cannot write {out}: disk full (No space left on device); " \
                          f"nothing was written"
    assert list(out.parent.iterdir()) == []  # no 0-byte acc.md, no temporary file

    # an earlier good table is kept, not replaced by an empty one
    monkeypatch.setattr(Path, "write_text", real)
    assert cli.main(["--store", str(results_store.root), "export", "--profile", "p", "-o", str(out)]) == 0
    good = out.read_text()
    monkeypatch.setattr(Path, "write_text", full)
    assert cli.main(["--store", str(results_store.root), "export", "--profile", "p", "-o", str(out)]) == 1
    assert out.read_text() == good and list(out.parent.iterdir()) == [out]


def test_plot_on_a_full_disk_says_one_line_and_leaves_no_file(results_store, tmp_path, monkeypatch, capsys):
    from matplotlib.figure import Figure

    def full(self, fname, *a, **kw):
        Path(fname).write_bytes(b"")  # created, then the disk is full
        raise enospc(fname)

    monkeypatch.setattr(Figure, "savefig", full)
    out = tmp_path / "figs"
    assert cli.main(["--store", str(results_store.root), "plot", "p", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Errno" not in err
    [line] = err.strip().splitlines()
    assert line.startswith(f"ssm-workbench: cannot write {out}/") and "disk full" in line
    assert [p for p in out.rglob("*") if p.is_file()] == []


# --------------------------------------------------------------------------- a pickle in a checkpoint
class _Opens:
    """Unpickling this would create ``path``: proof that code in the file ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_holding_a_pickle_is_refused_in_clear_words(tmp_path):
    from models import pretrained

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 8,
                                                    "num_hidden_layers": 1, "vocab_size": 16}))
    marker = tmp_path / "ran"
    torch.save({"backbone.embeddings.weight": torch.zeros(16, 8), "extra": _Opens(marker)},
               folder / "pytorch_model.bin")
    with pytest.raises(pretrained.CheckpointError) as e:
        pretrained.mamba_from_checkpoint(folder)
    msg = str(e.value)
    assert not marker.exists()
    assert "weights_only" not in msg and "trust" not in msg.split("where you trust")[0]
    assert f"{folder / 'pytorch_model.bin'} holds a pickled Python object" in msg
    assert "will not execute it" in msg and "safetensors" in msg and "open" in msg

    # a damaged file: one clear line as well, without torch's advice
    (folder / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(pretrained.CheckpointError, match="cannot be read as PyTorch weights") as e:
        pretrained.load_state_dict(folder)
    assert "weights_only" not in str(e.value)
