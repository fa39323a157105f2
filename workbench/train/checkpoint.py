"""Checkpoints of a run: everything the worker needs to continue exactly where it stopped.

One file per run, ``<store>/checkpoints/<run_id>/last.pt``, replaced atomically: written to
a temporary file in the same folder, flushed and fsynced, then ``os.replace``d over the old
one (and the folder fsynced), so a process killed mid-write leaves the previous checkpoint
whole. The worker fills the dictionary (see ``Trainer.checkpoint_state``); this module owns
the file, the RNG snapshots and the check that a checkpoint belongs to a run.

The file is a small text head, then the ``torch.save`` payload::

    ssm-workbench checkpoint 2\n          magic line
    {"run_id": 3, "spec_key": ..., ...}\n   JSON header: whose checkpoint, which step, payload size
    sha256 <64 hex>\n                      digest of the header line and the payload together
    <payload>

so whose it is, and whether its bytes are the ones written, is known without unpickling
anything (:func:`verify`): ``resume`` refuses a damaged or foreign file before it says a
word, and the worker checks again before ``torch.load`` sees the bytes. Payloads are read
with ``torch.load(weights_only=True)`` (they hold only tensors and plain Python values, the
numpy RNG keys as a list), so loading never runs code, and torch's own error text, which
advises loading with the unsafe setting, is never passed on.

Checkpoints written before the head existed (a plain ``torch.save`` zip, "format 1") are
still accepted: refusing them would throw away every interrupted run of a store made by the
previous version. They are checked as far as they can be, by the CRC32 the zip keeps for
each of its entries (any flipped bit in the data is caught) and by the run id and spec key
inside the payload; the resume marker and the worker's log call them "written before
checksums".
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.spec.run_spec import spec_key
from workbench.store.layout import checkpoint_folder as folder
from workbench.store.layout import checkpoint_path as path_for

FORMAT = 1  # of the state dictionary the worker fills
FILE_FORMAT = 2  # of the file around it (1: a bare torch.save, before checksums)
MAGIC = b"ssm-workbench checkpoint "
MAX_HEAD = 1 << 20  # a header line longer than this is not ours (spec keys are ~1 KB)
LEGACY_NOTE = "written before checksums: checked by its zip CRC32s only"
# train settings that do not change what a run computes: a run checkpointed more or less
# often is the same run (used when a replayed profile looks for runs it already has)


class CheckpointError(Exception):
    """A checkpoint that is missing, damaged, not ours or another run's.

    ``reason`` names the kind, for callers and tests: ``missing``, ``not-a-checkpoint``,
    ``truncated``, ``checksum``, ``another-run``, ``unreadable``."""

    def __init__(self, message: str, reason: str = "unreadable"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Header:
    """What a checkpoint file says about itself, read without unpickling."""
    file_format: int
    run_id: int | None
    spec_key: str | None
    step: int | None
    payload_bytes: int
    offset: int  # where the payload starts in the file
    sha256: str | None  # of header line + payload; None for a format-1 (legacy) file
    head: bytes = b""  # the JSON header line as stored (the digest covers it)

    @property
    def legacy(self) -> bool:
        return self.file_format == 1

    @property
    def note(self) -> str:
        return LEGACY_NOTE if self.legacy else "sha256 verified"


# --------------------------------------------------------------------------- files
def save(state: dict[str, Any], path: str | Path) -> int:
    """Write ``state`` to ``path`` atomically, with the header and digest (module doc); its
    ``run_id``, ``spec_key`` and ``step`` go into the header. Returns the size in bytes.

    Leftover temporary files (from a writer killed mid-write) are removed first: there is
    one writer per run, the worker, so none of them can still be in use."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(state, buf)  # serialised once, in memory: the digest goes before the payload
    payload = buf.getbuffer()
    head = json.dumps({"run_id": state.get("run_id"), "spec_key": state.get("spec_key"),
                       "step": state.get("step"), "payload_bytes": len(payload)},
                      sort_keys=True, default=str).encode() + b"\n"
    digest = hashlib.sha256(head)
    digest.update(payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + str(FILE_FORMAT).encode() + b"\n" + head)
            f.write(b"sha256 " + digest.hexdigest().encode() + b"\n")
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # and the rename itself survives a power cut
    return path.stat().st_size


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def read_header(path: str | Path) -> Header:
    """The file's head (module doc), or the facts of a format-1 file; nothing is unpickled.
    CheckpointError when the file is missing, not a checkpoint or shorter than it says."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}", "missing")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            first = f.readline(len(MAGIC) + 16)
            if first.startswith(b"PK\x03\x04"):  # a bare torch.save zip: the previous format
                return _legacy_header(path, size)
            if not (first.startswith(MAGIC) and first.endswith(b"\n")):
                raise CheckpointError(f"checkpoint {path} is not a workbench checkpoint (it starts with {first[:16]!r}, "
                                      f"not {MAGIC.strip()!r})", "not-a-checkpoint")
            try:
                fmt = int(first[len(MAGIC):])
            except ValueError:
                raise CheckpointError(f"checkpoint {path} has a damaged first line {first!r}", "not-a-checkpoint") from None
            if fmt != FILE_FORMAT:
                raise CheckpointError(f"checkpoint {path} has file format {fmt}; this version reads "
                                      f"{FILE_FORMAT} (and 1)", "not-a-checkpoint")
            head = f.readline(MAX_HEAD)
            check = f.readline(80)
            offset = f.tell()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e}", "unreadable") from None
    if not head.endswith(b"\n") or not check.endswith(b"\n"):
        raise CheckpointError(f"checkpoint {path} is truncated: it ends inside its header "
                              f"({size} bytes)", "truncated")
    try:
        meta = json.loads(head)
        n = int(meta["payload_bytes"])
        run_id, key, step = meta.get("run_id"), meta.get("spec_key"), meta.get("step")
    except (ValueError, KeyError, TypeError):
        # the digest covers the header too, but it cannot be checked without knowing the
        # payload's length: a damaged header is a damaged checkpoint all the same
        raise CheckpointError(f"checkpoint {path} is damaged: its header is not valid "
                              f"(checksum mismatch)", "checksum") from None
    if not check.startswith(b"sha256 ") or len(check) != len("sha256 ") + 64 + 1:
        raise CheckpointError(f"checkpoint {path} is damaged: its checksum line is not valid "
                              f"(checksum mismatch)", "checksum")
    if size < offset + n:
        raise CheckpointError(f"checkpoint {path} is truncated: {size - offset} of its {n} payload "
                              f"bytes are there", "truncated")
    if size > offset + n:
        raise CheckpointError(f"checkpoint {path} is damaged: {size - offset - n} bytes more than its "
                              f"header says (checksum mismatch)", "checksum")
    return Header(FILE_FORMAT, run_id, key, step, n, offset, check[7:-1].decode("ascii", "replace"), head)


def _legacy_header(path: Path, size: int) -> Header:
    return Header(1, None, None, None, size, 0, None)


def _check_identity(path: Path, header_or_state, run_id: int | None, spec: dict | None) -> None:
    """The file is ``run_id``'s and was written for ``spec``'s computation."""
    get = header_or_state.get if isinstance(header_or_state, dict) else (
        lambda k: getattr(header_or_state, k))
    if run_id is not None and get("run_id") != run_id:
        raise CheckpointError(f"checkpoint {path} belongs to run {get('run_id')}, not run {run_id} "
                              f"(copied from another store?)", "another-run")
    if spec is not None and get("spec_key") != spec_key(spec):
        raise CheckpointError(f"checkpoint {path} was written for another spec than run {run_id}'s "
                              f"(another run's file, or another store's)", "another-run")


def _check_digest(path: Path, h: Header, digest: "hashlib._Hash") -> None:
    if digest.hexdigest() != h.sha256:
        raise CheckpointError(f"checkpoint {path} is damaged: checksum mismatch (sha256 of its content "
                              f"is {digest.hexdigest()[:12]}…, its header says {h.sha256[:12]}…)", "checksum")


def verify(path: str | Path, run_id: int | None = None, spec: dict | None = None) -> Header:
    """Check a checkpoint file without unpickling it: header, length, sha256 over every byte,
    and (when given) that it is ``run_id``'s and ``spec``'s. Reads the file once in chunks
    (no copy in memory). Returns the header; CheckpointError (with ``reason``) otherwise.

    A format-1 file (no header) is checked by its zip CRC32s; whose it is is recorded only
    in its pickle, read here with ``weights_only=True`` and the tensors memory-mapped (not
    read), which is safe and cheap."""
    path = Path(path)
    h = read_header(path)
    if h.legacy:
        _check_legacy_zip(path)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} (written before checksums) cannot be read "
                                  f"({_torch_reason(e)})", "unreadable") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path} is not a format-{FORMAT} workbench checkpoint",
                                  "not-a-checkpoint")
        _check_identity(path, state, run_id, spec)
        h.run_id, h.spec_key, h.step = state.get("run_id"), state.get("spec_key"), state.get("step")
        return h
    digest = hashlib.sha256(h.head)
    try:
        with open(path, "rb") as f:
            f.seek(h.offset)
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e}", "unreadable") from None
    _check_digest(path, h, digest)
    _check_identity(path, h, run_id, spec)  # after the digest: a damaged header is damage, not a stranger
    return h


def _check_legacy_zip(path: Path, data: bytes | None = None) -> None:
    """A format-1 checkpoint is a zip (torch.save's); every entry's CRC32 must match."""
    try:
        with zipfile.ZipFile(io.BytesIO(data) if data is not None else path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        # a cut zip loses its directory (at the end) first: "not a zip file"
        raise CheckpointError(f"checkpoint {path} (written before checksums) is truncated or damaged: "
                              f"not a whole zip ({type(e).__name__}: {e})", "truncated") from None
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} (written before checksums) is damaged: checksum "
                              f"mismatch (CRC32 of its entry {bad!r})", "checksum")


def _torch_reason(e: Exception) -> str:
    """torch.load's error, minus its advice to load with weights_only off (never safe for a
    file one did not write; ours hold nothing that needs it)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "weights_only" not in ln]
    useful = [ln for ln in lines if "Unsupported" in ln or "error" in ln.lower()] or lines
    return f"{type(e).__name__}: {useful[-1][:300]}" if useful else type(e).__name__


def load(path: str | Path, run_id: int | None = None, spec: dict | None = None) -> dict[str, Any]:
    """Read a checkpoint onto the CPU after checking its bytes (:func:`verify`'s checks, on
    the bytes in memory, so what is checked is what is loaded); CheckpointError otherwise.
    The state gets ``_file`` = {"format", "check"} saying how it was verified."""
    path = Path(path)
    h = read_header(path)
    try:
        with open(path, "rb") as f:
            f.seek(h.offset)
            payload = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e}", "unreadable") from None
    if h.legacy:
        _check_legacy_zip(path, payload)
    else:
        if len(payload) != h.payload_bytes:  # changed since read_header looked
            raise CheckpointError(f"checkpoint {path} changed while being read", "truncated")
        digest = hashlib.sha256(h.head)
        digest.update(payload)
        _check_digest(path, h, digest)
        _check_identity(path, h, run_id, spec)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({_torch_reason(e)}); its bytes are as "
                              f"written{'' if h.legacy else ' (checksum matches)'}, so it was written by a "
                              f"different version", "unreadable") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a format-{FORMAT} workbench checkpoint",
                              "not-a-checkpoint")
    _check_identity(path, state, run_id, spec)  # the payload's own record, for format 1 too
    state["_file"] = {"format": h.file_format, "check": h.note}
    return state


def load_for_run(store_root: str | Path, run_id: int, spec: dict) -> dict[str, Any]:
    """The run's checkpoint, checked to be whole and this run's (same id, same computation)."""
    return load(path_for(store_root, run_id), run_id, spec)


WEIGHTS_FILE = "weights.pt"  # a finished lm run's final weights, for `ssm-workbench eval run:N`


def weights_path(store_root: str | Path, run_id: int) -> Path:
    return folder(store_root, run_id) / WEIGHTS_FILE


def save_weights(store_root: str | Path, run_id: int, key: str, step: int, model_state: dict) -> int:
    """Keep a finished run's final weights (no optimizer, no RNGs), in the checkpoint's
    file format so :func:`load` checks them the same way. Returns the size in bytes."""
    return save({"format": FORMAT, "run_id": run_id, "spec_key": key, "step": step,
                 "weights_only": True, "model": model_state}, weights_path(store_root, run_id))


def tokenizer_folder(store_root: str | Path, run_id: int) -> Path:
    """Where an ``lm`` run keeps its tokenizer: beside its weights, in the checkpoint folder
    (tasks/lm/tokenizer.py's files: ``tokenizer.json`` or ``chars.json``, and
    ``tokenizer_config.json``), as a Hugging Face checkpoint folder keeps its own."""
    return folder(store_root, run_id)


def save_tokenizer(where: str | Path, task) -> list[str]:
    """Keep the tokenizer ``task`` (an ``lm`` task) trained with beside the run's weights,
    so ``eval run:N`` reads the same ids whatever happens to the corpus afterwards (a BPE
    fitted again on an edited corpus would give other ids to the same weights) into the
    run's checkpoint folder ``where`` (:func:`tokenizer_folder`). Written when absent;
    returns the file names written (none when already there)."""
    from tasks.lm import tokenizer as toks

    if toks.saved(str(where)):
        return []
    return toks.save(task.tokenizer, str(where))


def remove(store_root: str | Path, run_id: int) -> None:
    """Delete a run's checkpoint folder (a finished run needs none)."""
    d = folder(store_root, run_id)
    if d.is_dir():
        for f in d.iterdir():
            f.unlink(missing_ok=True)
        try:
            d.rmdir()
        except OSError:
            pass


# --------------------------------------------------------------------------- RNGs
def rng_state() -> dict[str, Any]:
    """Every global RNG a training step may draw from: Python's, numpy's, torch's CPU
    generator and each CUDA device's (dropout, sampling in model code)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():  # one per device it was saved on
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def _tuples(x):
    """random.setstate wants the nested tuples it gave out (a round trip may give lists)."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
