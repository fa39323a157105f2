"""A profile's progress and finish estimate, from its runs as the store holds them.

Shared by ``ssm-workbench runs`` (summary lines under the table) and the TUI's runs table
(the lines under it), which both read the runs with :func:`table_runs`. Plain Python on
:class:`~workbench.store.Run` rows: no Textual.

Also the readers' half of a stranded sweep (issue 32): whether the local scheduler that
should start a store's pending runs is still there (:func:`scheduler_state`, from the
record ``workbench.execute.scheduler`` writes and its lock), which :func:`table_runs` puts
on the pending rows so that every progress line says so, with the command that recovers
(:func:`command`: typed as the user runs the workbench).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import socket
import statistics
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from workbench.store import UNFINISHED, Run, Store, default_store_dir, pid_alive
from workbench.store.layout import LOCAL, executor_name

# every column of runs but the two a runs table never shows (a run's spec is ~1 kB of JSON:
# decoding 5,000 of them took most of a poll), in the order of Run's fields
_NAMES = [f.name for f in dataclasses.fields(Run)]
_LIGHT = ", ".join("'' AS " + n if n in ("spec", "fields") else n for n in _NAMES)
_SPEC, _FIELDS, _INFO = (_NAMES.index(n) for n in ("spec", "fields", "info"))


def table_runs(store: Store, profile: str | None = None, grid: bool = False) -> list[Run]:
    """The store's runs for the table, in id order, with ``spec`` and ``fields`` left empty
    ({}): what the TUI's poll reads every half second. Rows come as tuples into Run's
    fields by position (half the time of :meth:`Run.from_row`'s dicts on 5,000 runs).
    Readers of specs want :meth:`Store.runs`.

    ``grid``: ``spec`` holds the run's ``grid`` (its grid point, dotted keys) and
    ``task_setting`` where the spec has them, nothing else: what the TUI's runs table shows.
    A spec never changes once the run is added (ids are never reused), so each run's are
    read once per Store object (:func:`spec_extras`), not at every poll."""
    q, args = f"SELECT {_LIGHT} FROM runs", []
    if profile:
        q, args = q + " WHERE profile=?", [profile]
    cur = store.conn.cursor()
    cur.row_factory = None
    out = []
    for row in cur.execute(q + " ORDER BY id", args):
        row = list(row)
        row[_SPEC], row[_FIELDS] = {}, {}
        info = row[_INFO]
        row[_INFO] = json.loads(info) if info else {}
        out.append(Run(*row))
    if grid and out:
        extras = spec_extras(store, [r.id for r in out])
        for r in out:
            r.spec = extras.get(r.id, _EMPTY)
    note_stranded(store.root, out)
    return out


# --------------------------------------------------------------------------- the local scheduler
SCHEDULER_FILE = "scheduler.json"  # who serves the store: written by workbench.execute.scheduler
SCHEDULER_LOCK = "scheduler.lock"  # held (flock) by the scheduler that hands out slots
WAITING = "waiting"  # a pending row's info key, set on read (never stored): why it does not start
CMD_ENV = "SSM_WORKBENCH_CMD"  # how the user runs the workbench (run.sh sets it), for hints


@dataclass
class SchedulerState:
    """``state``: ``running`` (its lock is held, or the process recorded last is alive),
    ``gone`` (the process recorded last on this host has exited without removing its record,
    as a normal exit does, and no scheduler holds the lock: it was killed or crashed),
    ``none`` (no record: none was started, or the last one exited normally) or
    ``elsewhere`` (recorded on another host: not checkable from here)."""
    state: str
    pid: int | None = None
    host: str | None = None
    jobs: int | None = None
    runs_per_gpu: int | None = None


def _lock_held(root: Path) -> bool:
    """Does a scheduler hold ``root``'s scheduler lock? Probed with a shared, non-blocking
    flock on a read-only descriptor (nothing is created, so a read-only store works)."""
    try:
        fd = os.open(root / SCHEDULER_LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the probe's lock
    return False


def read_scheduler_record(root: str | Path) -> dict:
    """The record of the scheduler started last for the store in ``root`` ({} if none)."""
    try:
        data = json.loads((Path(root) / SCHEDULER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def scheduler_state(root: str | Path) -> SchedulerState:
    """Whether a local scheduler serves the store in ``root`` (:class:`SchedulerState`).
    A scheduler writes its record when it is spawned (so one still starting counts as
    running) and removes it when it exits normally; only a record whose process is gone
    while nobody holds the lock means one died."""
    root = Path(root)
    rec = read_scheduler_record(root)
    st = SchedulerState("none", rec.get("pid"), rec.get("host"), rec.get("jobs"), rec.get("runs_per_gpu"))
    if _lock_held(root):
        st.state = "running"
    elif rec.get("pid"):
        if rec.get("host") not in (None, socket.gethostname()):
            st.state = "elsewhere"
        else:
            st.state = "running" if pid_alive(int(rec["pid"]), rec.get("pid_start")) else "gone"
    return st


DB_FILE = "store.sqlite"  # what makes a folder a store (Store.path)


def no_store_at(root: str | Path) -> bool:
    """True when ``root`` holds no store and could hold one: a reading command then says so
    instead of opening a Store, which would create the folder and an empty database. False
    for a store, and for a path that cannot be a folder (a file on the way), which
    :class:`Store` refuses in its own words without creating anything."""
    root = Path(root).expanduser()
    if (root / DB_FILE).is_file():
        return False
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.is_dir()


def command(store_root: str | Path | None = None) -> str:
    """The workbench's command as the user can type it, for hints: what ``run.sh`` put in
    ``$SSM_WORKBENCH_CMD`` (``./run.sh``), else ``ssm-workbench`` when it is on the PATH, else
    the full path of this environment's one; with ``--store DIR`` unless ``store_root`` is
    the store the command finds by default."""
    cmd = os.environ.get(CMD_ENV, "").strip()
    if not cmd:
        cmd = "ssm-workbench"
        if shutil.which(cmd) is None:
            beside = Path(sys.executable).with_name(cmd)  # the venv's script, not resolved
            cmd = shlex.quote(str(beside.absolute())) if beside.is_file() else \
                f"{shlex.quote(sys.executable)} -m workbench"
    if store_root is not None and Path(store_root).expanduser().absolute() != \
            default_store_dir().expanduser().absolute():
        cmd += f" --store {shlex.quote(str(Path(store_root).expanduser().absolute()))}"
    return cmd


def stranded_note(root: str | Path, st: SchedulerState | None = None) -> str | None:
    """Why the store's pending local runs do not start, with the command that starts them,
    or None when a scheduler serves them (or it cannot be told from here)."""
    st = scheduler_state(root) if st is None else st
    if st.state != "gone":
        return None
    return (f"its scheduler (pid {st.pid}) is gone, pending runs will not start: "
            f"`{command(root)} resume --pending` starts it again")


def note_stranded(root: str | Path, runs: list[Run]) -> str | None:
    """Put :func:`stranded_note` in the info (:data:`WAITING`) of the pending local rows of
    ``runs`` when their scheduler is gone (in memory only: the rows a table shows); returns
    the note. Cheap: the record is read only when a pending local run is there."""
    pending = [r for r in runs if r.state == "pending" and executor_name(r) == LOCAL]
    note = stranded_note(root) if pending else None
    if note:
        for r in pending:
            r.info = {**(r.info or {}), WAITING: note}
    return note


_EMPTY: dict = {}
# Store object -> {run id: {"grid": ..., "task_setting": ...}} (only the keys the spec has);
# by object, not by path: a store deleted and made anew at the same path starts empty
_EXTRAS: "weakref.WeakKeyDictionary[Store, dict[int, dict]]" = weakref.WeakKeyDictionary()


def spec_extras(store: Store, ids: list[int]) -> dict[int, dict]:
    """{run id: {'grid': {...}, 'task_setting': ...}} for ``ids`` (keys the spec lacks are
    left out; schema-1 runs have neither). Read with SQLite's json_extract (no spec is
    decoded in Python) for the ids not read before through this Store, and cached."""
    cache = _EXTRAS.setdefault(store, {})
    missing = [i for i in ids if i not in cache]
    if missing:
        cur = store.conn.cursor()
        cur.row_factory = None
        # new runs are appended (ids only grow): one range scan from the first missing id
        rows = cur.execute("SELECT id, json_extract(spec, '$.grid'), json_extract(spec, '$.task_setting') "
                           "FROM runs WHERE id >= ?", (min(missing),))
        for rid, grid, setting in rows:
            if rid in cache:
                continue
            extra: dict = {}
            if grid:
                extra["grid"] = json.loads(grid)
            if setting is not None:
                extra["task_setting"] = setting
            cache[rid] = extra or _EMPTY
    return cache


# a running run's elapsed / progress stands in for the run time only past this fraction
# (earlier, start-up costs make it a poor guess)
MIN_PROGRESS = 0.05


@dataclass
class ProfileProgress:
    profile: str
    total: int
    finished: int      # finished with results: the runs that are done
    running: int
    pending: int
    run_s: float | None  # the measured time of one run (see :func:`eta`)
    eta_s: float | None  # seconds until the last run ends, None when it cannot be said
    # runs that ended without finishing, by state (failed, crashed, killed, preempted): not
    # done (a killed run holds no results), so said apart
    ended: dict[str, int] = dataclasses.field(default_factory=dict)
    waiting: str | None = None  # why the pending runs do not start (:func:`stranded_note`)

    @property
    def done(self) -> int:
        """Runs done: only finished ones."""
        return self.finished

    @property
    def failed(self) -> int:
        """Runs that ended without finishing, whatever the state."""
        return sum(self.ended.values())

    @property
    def under_way(self) -> bool:
        """Runs still to come (running or pending): a profile whose runs all ended, some
        unfinished, is not done, but no longer under way either."""
        return bool(self.running or self.pending)

    def text(self) -> str:
        """'grid: 37/500 done, 2 failed, 1 killed, 4 running, 459 pending, ETA 1h 12m (run
        3m 20s x 4 slots)'."""
        parts = [f"{self.profile}: {self.done}/{self.total} done"]
        parts += [f"{self.ended[s]} {s}" for s in UNFINISHED if self.ended.get(s)]
        if self.running:
            parts.append(f"{self.running} running")
        if self.pending:
            parts.append(f"{self.pending} pending")
        if not self.running and not self.pending:
            return ", ".join(parts)
        if self.waiting and self.pending:
            parts.append(self.waiting)
        elif self.eta_s is not None:
            how = f"run {duration(self.run_s)} x {max(self.running, 1)} slot{'s' * (self.running > 1)}"
            parts.append(f"ETA {duration(self.eta_s)} ({how})")
        elif not self.running:
            parts.append("ETA – (none running)")
        else:
            parts.append("ETA – (no run time measured yet)")
        return ", ".join(parts)


def duration(s: float | None) -> str:
    """Seconds as '45s', '3m 20s', '1h 12m', '2d 3h'."""
    if s is None:
        return "–"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def run_time(runs: Iterable[Run], now: float) -> float | None:
    """The time one run of the profile takes: the mean wall time (ended - started) of its
    finished runs; before any finished, the mean of elapsed / progress over running runs
    past :data:`MIN_PROGRESS`; None when neither is known."""
    runs = list(runs)
    walls = [r.ended - r.started for r in runs
             if r.state == "finished" and r.started is not None and r.ended is not None]
    if walls:
        return statistics.fmean(walls)
    guesses = [(now - r.started) / r.progress for r in runs
               if r.state == "running" and r.started is not None and r.progress >= MIN_PROGRESS]
    return statistics.fmean(guesses) if guesses else None


def eta(runs: Iterable[Run], now: float | None = None) -> tuple[float | None, float | None]:
    """(seconds until the profile's last run ends, the run time used), or None for either.

    With ``T`` the run time of :func:`run_time` and ``S`` the slots, taken as the number of
    the profile's runs running now (what the scheduler actually gives it): the work left is
    ``T x pending + sum over running runs of T x (1 - progress)``, and the ETA is that work
    over ``S``, but never less than the longest running run's own remainder (nor, with runs
    still pending, than one whole run: the last one starts at the earliest now). With no
    run running nothing is moving (the scheduler is stopped or busy elsewhere): None."""
    now = time.time() if now is None else now
    runs = list(runs)
    t = run_time(runs, now)
    running = [r for r in runs if r.state == "running"]
    pending = sum(r.state == "pending" for r in runs)
    if not running and not pending:
        return 0.0, t
    if t is None or not running:
        return None, t
    left = [max(0.0, t * (1.0 - min(r.progress, 1.0))) for r in running]
    work = t * pending + sum(left)
    return max(work / len(running), max(left), t if pending else 0.0), t


def by_profile(runs: Iterable[Run], now: float | None = None) -> list[ProfileProgress]:
    """One :class:`ProfileProgress` per profile among ``runs``, in order of first run id."""
    now = time.time() if now is None else now
    groups: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.id):
        groups.setdefault(r.profile, []).append(r)
    out = []
    for name, rs in groups.items():
        eta_s, t = eta(rs, now)
        ended = {s: n for s in UNFINISHED if (n := sum(r.state == s for r in rs))}
        waiting = next((r.info[WAITING] for r in rs if r.state == "pending" and (r.info or {}).get(WAITING)),
                       None)
        out.append(ProfileProgress(
            profile=name, total=len(rs), finished=sum(r.state == "finished" for r in rs),
            running=sum(r.state == "running" for r in rs), pending=sum(r.state == "pending" for r in rs),
            run_s=t, eta_s=eta_s, ended=ended, waiting=waiting))
    return out
