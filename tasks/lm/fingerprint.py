"""What identifies an LM corpus by its contents: the hash the token cache's key and a run's
record of its data are made of.

- :func:`source_fingerprint`: a hash of a source's ``fingerprint()``, which holds its files'
  content digest (:func:`tasks.lm.digest.files_digest`).
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

from tasks.lm.sources import Source


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
    src = Source.of_params(task_params)
    files = src.files
    if src.hf:
        local = os.path.expanduser(src.ref)
        files = [] if not os.path.exists(local) else (
            [local] if os.path.isfile(local) else
            [os.path.join(d, f) for d, _, fs in os.walk(local) for f in fs])
    return [f for f in files if os.stat(f).st_mtime > since]
