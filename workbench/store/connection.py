"""A store's database opened: writable (created or upgraded under a lock file), or read-only
where it must be (a read-only mount, no permission, a full disk) or is asked to be; a
connection per process and short write transactions; and what a write that cannot be made
says (:class:`StoreConnection`, the base of every part of :class:`workbench.store.sqlite.Store`)."""
from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workbench.store.faults import (StoreError, StoreFull, StoreReadOnly, _cannot_write, ensure_reserve,
                                    is_disk_full, release_reserve)
from workbench.store.migrate import needs_setup, set_up
from workbench.store.run import default_store_dir

LOCK_FILE = "store.lock"       # serialises creating and upgrading the database (Store._open_writable)


def _check_writable(path: Path) -> None:
    """Raise OSError (EROFS, EACCES) when ``path`` cannot be opened for writing. Without
    opening it: closing any descriptor of the database file drops every POSIX lock this
    process holds on it, those of its open SQLite connections too. Another process then
    takes itself for the last connection and deletes the -wal and -shm files under them,
    and they read a stale snapshot from then on (a second Store of the same folder in one
    process, e.g. `resume` called where the store is already open, left a run "pending" to
    its first Store for good; SQLite's "How To Corrupt", section 2.2)."""
    if os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        return
    try:
        read_only_fs = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    code = errno.EROFS if read_only_fs else errno.EACCES
    raise OSError(code, os.strerror(code), str(path))


class StoreConnection:
    """The database of the store in folder ``root``, open (see :class:`workbench.store.sqlite.Store`
    for when it is read-only); the parts of the Store (runs, transitions, measurements,
    reaping) read through :attr:`conn` and write through :meth:`tx`."""

    def __init__(self, root: str | Path | None = None, *, readonly: bool = False):
        self.root = Path(root).expanduser() if root else default_store_dir()
        self.path = self.root / "store.sqlite"
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._uri: str | None = None  # read-only: what every connection opens (mode=ro or immutable=1)
        self.readonly_reason: str | None = "opened read-only" if readonly else None
        self.disk_full: StoreFull | None = None  # set when a best-effort write (reap) met a full disk
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is a file, not a folder; give --store (or "
                             f"$SSM_WORKBENCH_STORE) a folder, or a path where one can be created")
        if not readonly:
            try:
                self._open_writable()
            except (OSError, sqlite3.Error, StoreReadOnly) as e:
                why = _cannot_write(e)
                if why is None:
                    self.close()
                    if isinstance(e, sqlite3.DatabaseError):
                        raise StoreError(f"store {self.root}: cannot open {self.path.name}: {e}") from None
                    raise
                self.close()
                if not self.path.is_file():
                    raise StoreError(f"cannot create a store in {self.root}: {why}") from None
                self.readonly_reason = why
        if self.readonly_reason:
            self._open_readonly()

    @property
    def readonly(self) -> bool:
        return self.readonly_reason is not None

    # -- opening ------------------------------------------------------------------
    def _open_writable(self) -> None:
        """Create or upgrade the store under a lock file, so processes opening a new store at
        the same moment take turns (SQLite's switch to WAL needs the database to itself and
        does not wait on a busy one). Opening a complete store writes nothing, so it works
        on a full disk; a store that cannot be written fails here, before anything is read."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(f"store {self.root} cannot be a folder: part of that path is a file; "
                             f"give --store (or $SSM_WORKBENCH_STORE) a folder") from None
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.path.exists():
                # SQLite opens a database file it may not write read-only without a word (and
                # even takes its write lock): ask the file system first (EROFS, EACCES)
                _check_writable(self.path)
            c = self.conn
            if needs_setup(c):
                set_up(c, self.tx)
            ensure_reserve(self.root)

    def _open_readonly(self) -> None:
        """Read without writing anything. ``mode=ro`` first; SQLite reads a WAL database
        read-only only where its -shm file exists or can be made, so a store whose last
        writer closed cleanly on a read-only mount needs ``immutable=1`` (then changes still
        in a -wal file there, from a writer that died, are not seen; the reason says so)."""
        if not self.path.is_file():
            raise StoreError(f"no store in {self.root} ({self.readonly_reason})")
        where = urllib.parse.quote(str(self.path.absolute()))
        last: Exception | None = None
        for uri in (f"file:{where}?mode=ro", f"file:{where}?immutable=1"):
            self._uri = uri
            try:
                c = self.conn
                tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            except sqlite3.Error as e:
                last = e
                self.close()
                continue
            if "runs" not in tables:
                self.close()
                raise StoreError(f"{self.path} is not an ssm-workbench store (no runs table)")
            wal = self.path.with_name(self.path.name + "-wal")
            if uri.endswith("immutable=1") and wal.is_file() and wal.stat().st_size:
                self.readonly_reason += f"; its {wal.name} file could not be read, so its latest changes are not shown"
            return
        self._uri = None
        raise StoreError(f"cannot read the store {self.path}: {last} ({self.readonly_reason})")

    def _refusal(self) -> StoreError:
        if self.readonly_reason == "disk full":
            return StoreFull(f"store {self.root}: disk full; free some space there (unfinished runs "
                             f"can be resumed then: {_command(self.root)} resume ID)")
        return StoreReadOnly(f"store {self.root} is read-only ({self.readonly_reason}): it can be "
                             f"read (runs, show, export) but not changed; copy the folder somewhere "
                             f"writable to run or resume there")

    def _write_error(self, e: sqlite3.Error) -> StoreError | None:
        """A failed write in words: a full disk or a store that cannot be written."""
        if is_disk_full(e):
            return StoreFull(f"store {self.root}: disk full ({e}); free some space there (unfinished "
                             f"runs can be resumed then: {_command(self.root)} resume ID)")
        why = _cannot_write(e)
        if why is not None:
            return StoreReadOnly(f"store {self.root} cannot be written ({why})")
        return None

    def release_reserve(self) -> bool:
        """Free the space held back in the store folder (:func:`ensure_reserve`), for the
        few writes that record a full disk; the next writable open holds it again."""
        return release_reserve(self.root)

    # -- connection ---------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        # a connection must not cross fork(); reopen in a child process
        if self._conn is None or self._pid != os.getpid():
            self._conn, self._pid = self._connect(), os.getpid()
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        """A new connection (the journal mode is WAL from creation on: it is kept in the
        database file, and switching it here would race with other processes opening)."""
        if self._uri:
            c = sqlite3.connect(self._uri, uri=True, timeout=30.0, isolation_level=None,
                                check_same_thread=False)
        else:
            c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA synchronous=NORMAL")
        c.row_factory = sqlite3.Row
        c.execute("PRAGMA busy_timeout=30000")
        return c

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction (BEGIN IMMEDIATE takes the write lock up front).
        Inside another one it joins it, so several writes can commit together (the
        ingestion of a run file applies a batch of events and its offset as one).
        A read-only store refuses (:class:`StoreReadOnly`); a full disk raises
        :class:`StoreFull`, with the transaction rolled back."""
        if self.readonly_reason:
            raise self._refusal()
        c = self.conn
        if c.in_transaction:
            yield c
            return
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL does)
                    try:
                        c.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
        except sqlite3.Error as e:
            err = self._write_error(e)
            if err is None:
                raise
            raise err from e

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _command(root: Path) -> str:
    """The workbench's command for this store as the user types it (progress.command:
    ./run.sh when run.sh started it; imported here, as progress reads stores itself)."""
    from workbench.store.progress import command

    return command(root)
