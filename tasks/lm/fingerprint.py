"""What identifies an LM corpus by its contents: the hash the token cache's key and a run's
record of its data are made of.

- :func:`files_digest`: a blake2b over every file's path and a blake2b of its bytes
  (streamed in 1 MiB blocks: memory does not grow with a file). Hashing the stdlib corpus
  (1,790 files, 31.5 MB) takes ~0.4 s, so the digest is cached under
  ``<cache>/digests/<key>`` with ``key`` a hash of every file's (path, size, mtime_ns):
  while no file is touched a digest costs one ``stat`` per file; a file touched but not
  changed gets the same digest, so its corpus is neither tokenised nor trained again.
- :func:`data_identity`: what a run records of the data it trained on (the worker puts it
  in the run's info as ``data``): the source, its content ``fingerprint``, the token
  cache's key, the tokenizer's identity and the tokens in each split.
- :func:`changed`: whether a run's recorded data is still what its source holds now, in
  one line when not (``ssm-workbench run`` replaying a profile, ``eval run:N`` of a run
  without a stored tokenizer).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

BLOCK = 1 << 20


def file_digest(path: str) -> str:
    """blake2b (16 bytes) of a file's bytes, read block by block."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _digest_cache() -> Path:
    from tasks.lm.tokenfile import cache_root
    return cache_root() / "digests"


def files_digest(files: list[str]) -> str:
    """A content hash of ``files`` (their absolute paths and bytes, in the order given),
    cached by every file's (path, size, mtime_ns) (module doc)."""
    paths = [os.path.abspath(f) for f in files]
    stats = hashlib.sha256()
    for p in paths:
        st = os.stat(p)
        stats.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    held = _digest_cache() / stats.hexdigest()[:32]
    try:
        text = held.read_text(encoding="ascii").strip()
        if len(text) == 32 and all(c in "0123456789abcdef" for c in text):
            return text
    except OSError:
        pass  # not cached yet (or unreadable): hash the contents
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        h.update(f"{p}\0{file_digest(p)}\n".encode())
    digest = h.hexdigest()
    try:  # atomically: a reader sees the whole digest or none
        held.parent.mkdir(parents=True, exist_ok=True)
        tmp = held.with_name(f"{held.name}.tmp-{os.getpid()}")
        tmp.write_text(digest, encoding="ascii")
        os.replace(tmp, held)
    except OSError:
        pass  # a read-only cache: the digest is still right, only not remembered
    return digest


def source_fingerprint(source) -> str:
    """The content fingerprint of a :class:`tasks.lm.sources.Source` (a hash of its
    ``fingerprint()``, which holds the files' content digest), 24 hex digits."""
    fp = source.fingerprint()
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:24]


def data_identity(task) -> dict:
    """What a run of the ``lm`` task ``task`` trained on (module doc); prepares the data."""
    data = task.data
    return {"source": task.source.spec, "fingerprint": source_fingerprint(task.source),
            "cache_key": data.meta.get("key"), "tokenizer": task.tokenizer.identity(),
            "tokens": {s: len(f) for s, f in data.tokens.items()}}


def current(task_params: dict) -> str:
    """The content fingerprint the source of an ``lm`` task with ``task_params`` has now
    (reads no text while the files' sizes and times are those of a cached digest)."""
    from tasks.lm.sources import Source

    return source_fingerprint(Source.of_params(task_params))   # as the task builds it


def changed(task_params: dict, recorded: dict | None) -> str | None:
    """None while the source still holds the data a run recorded (``recorded``: its info's
    ``data``), else one line saying how it differs. A run that recorded nothing (trained
    before fingerprints were kept) is taken as unchanged: nothing says otherwise."""
    if not recorded or not recorded.get("fingerprint"):
        return None
    src = (task_params or {}).get("source", "stdlib")
    try:
        now = current(task_params)
    except (OSError, ValueError) as e:
        return f"the corpus {src!r} cannot be read now ({str(e).splitlines()[0]})"
    if now != recorded["fingerprint"]:
        return (f"the corpus {src!r} changed since the run trained (fingerprint "
                f"{recorded['fingerprint'][:12]} then, {now[:12]} now)")
    return None


def newer_files(task_params: dict, since: float) -> list[str]:
    """The source's files modified after ``since`` (a Unix time): how a run that recorded
    no fingerprint (trained before they were kept) is checked."""
    from tasks.lm.sources import Source

    src = Source.of_params(task_params)
    files = src.files
    if src.hf:
        local = os.path.expanduser(src.ref)
        files = [] if not os.path.exists(local) else (
            [local] if os.path.isfile(local) else
            [os.path.join(d, f) for d, _, fs in os.walk(local) for f in fs])
    return [f for f in files if os.stat(f).st_mtime > since]
