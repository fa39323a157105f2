"""What can go wrong with the store's disk: the errors (:class:`StoreError`,
:class:`StoreReadOnly`, :class:`StoreFull`), telling a full disk or a read-only one from an
exception, and the ``disk-reserve`` file that keeps room to record a full disk.
"""

from __future__ import annotations

import errno
import functools
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Iterator

RESERVE_FILE = "disk-reserve"  # space held back for recording a full disk (Store.release_reserve)
RESERVE_BYTES = 256 * 1024     # a failure record needs a few pages of WAL and a log line


class StoreError(Exception):
    """The store cannot be opened, or cannot take a write: the message is one line naming
    the store folder, why, and what to do. The CLI prints it and exits with ``exit_code``."""

    exit_code = 2


class StoreReadOnly(StoreError):
    """A write to a store opened read-only (a read-only mount, no permission to write)."""


class StoreFull(StoreError):
    """No space left for the store (SQLITE_FULL, ENOSPC, EDQUOT). Runs are not lost: the
    worker records ``failed: disk full`` and the run resumes once there is space."""

    exit_code = 1


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_READONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_SQLITE_FULL, _SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_PERM, _SQLITE_BUSY = 13, 8, 14, 3, 5


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    """``e`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _sqlite_code(e: BaseException) -> int | None:
    code = getattr(e, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF  # the primary code of an extended one


def is_disk_full(e: BaseException) -> bool:
    """True when ``e`` (or what it was raised from) says the disk is full: the store's
    SQLITE_FULL, or ENOSPC / EDQUOT from writing a checkpoint, a log or a run file."""
    for x in _chain(e):
        if isinstance(x, StoreFull):
            return True
        if isinstance(x, OSError) and x.errno in _FULL_ERRNOS:
            return True
        if isinstance(x, sqlite3.Error) and _sqlite_code(x) == _SQLITE_FULL:
            return True
    return False


def full_disk_detail(e: BaseException, root: Path) -> str:
    """What ran out of space, for a run's error: the store's database (in ``root``) or the
    file being written (a checkpoint, a log, a run file)."""
    for x in _chain(e):
        if isinstance(x, sqlite3.Error) and _sqlite_code(x) == _SQLITE_FULL:
            return f"the store's database in {root} could not grow ({x})"
        if isinstance(x, OSError) and x.errno in _FULL_ERRNOS:
            return f"{x.strerror or x} writing {x.filename or 'the log'}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _cannot_write(e: BaseException) -> str | None:
    """Why a failed write means the store cannot be written here (a read-only mount, no
    permission, a full disk), in words; None for any other error."""
    if is_disk_full(e):
        return "disk full"
    for x in _chain(e):
        if isinstance(x, StoreReadOnly):
            return str(x)
        if isinstance(x, OSError) and x.errno in _READONLY_ERRNOS:
            return x.strerror or str(x)
        if isinstance(x, sqlite3.Error) and _sqlite_code(x) in (_SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_PERM):
            return str(x)
    return None


def ensure_reserve(folder: Path, size: int = RESERVE_BYTES) -> None:
    """Hold ``size`` bytes in ``folder`` (a file of random bytes, so compressing file
    systems store all of it) for :func:`release_reserve` to free when the disk is full.
    Best effort: with no room for it now, the next open tries again."""
    path = Path(folder) / RESERVE_FILE
    tmp = path.with_name(f".{RESERVE_FILE}.{os.getpid()}.tmp")
    try:
        if path.stat().st_size >= size:
            return
    except OSError:
        pass
    try:
        with open(tmp, "wb") as f:
            f.write(os.urandom(size))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def release_reserve(folder: Path) -> bool:
    """Delete the reserve in ``folder``, so the writes that record a full disk find room.
    True when there was one."""
    try:
        (Path(folder) / RESERVE_FILE).unlink()
        return True
    except OSError:
        return False


def _tidying(method):
    """For a method that readers call to bring the store up to date (:meth:`Store.reap`):
    on a read-only store it does nothing, and a full disk met on the way is said once on
    stderr and kept in ``store.disk_full`` (``run`` stops on it), so reading never fails
    for want of writing."""
    @functools.wraps(method)
    def tidy(self, *args: Any, **kwargs: Any) -> list:
        if self.readonly:
            return []
        try:
            return method(self, *args, **kwargs)
        except StoreFull as e:
            if self.disk_full is None:
                print(f"{e}; runs whose worker ended stay as they are until then", file=sys.stderr)
            self.disk_full = e
            return []
        except sqlite3.OperationalError as e:
            # SQLITE_BUSY past the busy timeout: another process holds the write lock, e.g. a
            # worker stopped (SIGSTOP, a suspended VM) in the middle of one of its short
            # writes. Reading goes on (WAL readers never wait); the next reap tries again.
            if _sqlite_code(e) != _SQLITE_BUSY:
                raise
            print(f"store {self.root}: busy (another process holds its write lock); "
                  f"run states are brought up to date at the next read", file=sys.stderr)
            return []
    return tidy
