"""A profile's progress and finish estimate, from its runs as the store holds them.

Shared by ``ssm-workbench runs`` (summary lines under the table) and the TUI's runs table
(the lines under it), which both read the runs with :func:`table_runs`. Plain Python on
:class:`~workbench.store.Run` rows: no Textual.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Iterable

from workbench.store import TERMINAL, Run, Store

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
    return out


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
    done: int          # runs in a terminal state (finished, failed, crashed, killed, preempted)
    finished: int      # of those, finished with results
    running: int
    pending: int
    run_s: float | None  # the measured time of one run (see :func:`eta`)
    eta_s: float | None  # seconds until the last run ends, None when it cannot be said

    @property
    def failed(self) -> int:
        return self.done - self.finished

    def text(self) -> str:
        """'grid: 37/500 done (2 failed), 4 running, 459 pending, ETA 1h 12m (run 3m 20s x 4 slots)'."""
        parts = [f"{self.profile}: {self.done}/{self.total} done" +
                 (f" ({self.failed} not finished)" if self.failed else "")]
        if self.running:
            parts.append(f"{self.running} running")
        if self.pending:
            parts.append(f"{self.pending} pending")
        if self.done == self.total:
            return ", ".join(parts)
        if self.eta_s is not None:
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
        out.append(ProfileProgress(
            profile=name, total=len(rs), done=sum(r.state in TERMINAL for r in rs),
            finished=sum(r.state == "finished" for r in rs), running=sum(r.state == "running" for r in rs),
            pending=sum(r.state == "pending" for r in rs), run_s=t, eta_s=eta_s))
    return out
