"""Run files: how a worker on another node reports to a store it must not open.

SQLite in WAL mode must not be shared over a network filesystem, so a worker started by
Slurm does not write the store. It appends its rows as JSON lines to its own file in the
job folder on the shared filesystem (``<shared>/slurm/run-<id>/events.jsonl``), one event per
line, and the submit host ingests them into the store (``ingest``: from the TUI's and the
``run``/``runs`` commands' polls, via :func:`workbench.execute.slurm.sync`, which only reads).

Nothing is lost or applied twice:
- the worker is the file's only writer; each event is one ``write`` of a whole line to a
  file opened for appending, flushed and fsync'ed at heartbeats, results and the end;
- a job killed mid-write leaves a last line without its newline: the reader only takes
  complete lines, and the next attempt (a requeued job) first ends that torn line so its
  own events start on a fresh one (the torn line is then skipped as unreadable);
- the reader applies a batch of events and records the byte offset it reached in the same
  store transaction, so a crash of the reader repeats nothing.

:class:`RunFile` and :class:`workbench.store.Store` both implement the worker's writer
interface (:class:`workbench.store.writer.RunWriter`), so the worker runs unchanged on either.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from workbench.store import Run, Store, ensure_reserve, release_reserve
from workbench.store.layout import checkpoint_path

EVENTS = "events.jsonl"
SNAPSHOT = "run.json"


def job_dir(shared: str | Path, run_id: int) -> Path:
    return Path(shared) / "slurm" / f"run-{run_id}"


def write_snapshot(store: Store, run_id: int, folder: Path) -> Path:
    """The run as the worker needs it (spec, info with any resume marker), written
    atomically next to its events before the job is submitted."""
    run = store.get(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    data = {k: getattr(run, k) for k in Run.__dataclass_fields__}
    tmp = folder / f".{SNAPSHOT}.tmp"
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, folder / SNAPSHOT)
    return folder / SNAPSHOT


class RunFile:
    """A worker's store for one run on a shared filesystem (see the module docstring): a
    :class:`~workbench.store.writer.RunWriter`.

    ``root`` is the shared folder (checkpoints go under it, as under a store's root)."""

    readonly = False  # a run file that cannot be written fails in __init__

    def __init__(self, shared: str | Path, run_id: int):
        self.root = Path(shared)
        self.run_id = run_id
        self.folder = job_dir(shared, run_id)
        snap = json.loads((self.folder / SNAPSHOT).read_text())
        self._run = Run(**snap)
        self._lock = threading.Lock()
        self._torn = False  # a write failed part-way (disk full): the next event starts a new line
        ensure_reserve(self.folder)  # room to record a full disk (release_reserve)
        path = self.folder / EVENTS
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if os.fstat(self._fd).st_size:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # an earlier attempt died mid-line: end that line
                    os.write(self._fd, b"\n")
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self._run.state = "running"
        ck = checkpoint_path(self.root, run_id)
        if ck.is_file() and not self._run.info.get("resume"):
            # Slurm restarted the job (requeue, preemption, node failure): go on from the
            # checkpoint the last attempt left. (`resume` with no checkpoint removes it.)
            self._run.info["resume"] = {"checkpoint": str(ck), "by": "slurm", "attempt": attempt}
        self._emit({"op": "start", "host": socket.gethostname(), "pid": os.getpid(),
                    "job": os.environ.get("SLURM_JOB_ID"), "attempt": attempt}, sync=True)

    # ------------------------------------------------------------------ writing
    def _emit(self, event: dict, sync: bool = False) -> None:
        event["t"] = event.get("t", time.time())
        line = (json.dumps(event, default=_jsonable) + "\n").encode()
        with self._lock:
            # a full disk can take part of a line (os.write then returns short) and refuse
            # the rest (ENOSPC, raised to the worker as a full disk): that torn line is ended
            # before the next event, so the reader skips it and loses nothing after it
            view = memoryview((b"\n" if self._torn else b"") + line)
            self._torn = True
            while view:
                view = view[os.write(self._fd, view):]
            self._torn = False
            if sync:
                os.fsync(self._fd)

    def release_reserve(self) -> bool:
        """As :meth:`Store.release_reserve`, for the job folder."""
        return release_reserve(self.folder)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    # ------------------------------------------------------------------ RunWriter: what a worker calls
    def get(self, run_id: int) -> Run | None:
        return self._run if run_id == self.run_id else None

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        # who beats: the reader lets the run's own worker bring a crashed verdict back
        # (Store.heartbeat), as a worker on the store's host does
        self._emit({"op": "heartbeat", "fields": fields, **self._who()}, sync=True)

    def set_info(self, run_id: int, info: dict) -> None:
        self._run.info = {**self._run.info, **info}
        self._emit({"op": "info", "info": info})

    def add_metrics(self, run_id: int, rows: Iterable[tuple]) -> None:
        self._emit({"op": "metrics", "rows": [list(r) for r in rows]})

    def add_system(self, run_id: int, sample: dict) -> None:
        self._emit({"op": "system", "sample": sample})

    def set_results(self, run_id: int, values: dict, eval_set: str = "") -> None:
        self._emit({"op": "results", "values": values, "eval_set": eval_set}, sync=True)

    def trim_after(self, run_id: int, step: int) -> int:
        """Recorded for the reader, which drops the rows; the count is not known here."""
        self._emit({"op": "trim_after", "step": step}, sync=True)
        return 0

    def finish(self, run_id: int, state: str, error: str | None = None) -> bool:
        """True: the end is in the file (fsync'ed); the reader applies it by Store.finish's
        rules, with this worker's pid and host."""
        self._run.state = state
        self._emit({"op": "finish", "state": state, "error": error, **self._who()}, sync=True)
        return True

    @staticmethod
    def _who() -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname()}


def _jsonable(v: Any) -> Any:
    try:
        return float(v)  # numpy / torch scalars
    except (TypeError, ValueError):
        return str(v)


# --------------------------------------------------------------------------- reading
def read_events(path: Path, offset: int) -> tuple[list[dict], int, int]:
    """Complete lines after byte ``offset``: (events, new offset, unreadable lines)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset, 0
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset, 0
    events, bad = [], 0
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            bad += 1  # a torn line from a job that died mid-write
    return events, offset + end + 1, bad


def ingest(store: Store, run_id: int, folder: Path) -> int:
    """Apply the run file's new events to the store; returns how many were applied."""
    run = store.get(run_id)
    if run is None:
        return 0
    offset = int(run.info.get("runfile_offset", 0))
    events, new_offset, bad = read_events(folder / EVENTS, offset)
    if new_offset == offset:
        return 0
    with store.tx():  # the events and the offset they bring us to, together
        for ev in events:
            _apply(store, run_id, ev)
        store.set_info(run_id, {"runfile_offset": new_offset,
                                "runfile_bad_lines": int(run.info.get("runfile_bad_lines", 0)) + bad})
    return len(events)


def _apply(store: Store, run_id: int, ev: dict) -> None:
    op, t = ev.get("op"), ev.get("t")
    if op == "start":
        store.mark_started_remote(run_id, ev.get("host"), ev.get("pid"), t)
        store.set_info(run_id, {"slurm_attempt": ev.get("attempt", 0)})
    elif op == "heartbeat":  # events from before pid/host were written name no worker (-1)
        store.heartbeat(run_id, pid=ev.get("pid", -1), host=ev.get("host"), **ev.get("fields", {}))
    elif op == "info":
        store.set_info(run_id, ev.get("info", {}))
    elif op == "metrics":
        store.add_metrics(run_id, [tuple(r) for r in ev.get("rows", [])], t=t)
    elif op == "system":
        store.add_system(run_id, ev.get("sample", {}), t=t)
    elif op == "results":
        store.set_results(run_id, ev.get("values", {}), ev.get("eval_set", ""))
    elif op == "trim_after":
        store.trim_after(run_id, int(ev["step"]))
    elif op == "finish":
        store.finish(run_id, ev["state"], ev.get("error"), pid=ev.get("pid", -1), host=ev.get("host"))
