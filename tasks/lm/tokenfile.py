"""Token files: a corpus tokenised once into flat binary files, cached, read window by window.

A prepared corpus is one folder ``<cache>/<key>/`` (``key``: a hash of the source's
fingerprint, the tokenizer and the split rule; see :func:`cache_root` for ``<cache>``):

- ``train.tokens``, ``valid.tokens``, ``test.tokens``: the split's documents' token ids one
  after another, each document followed by the end-of-text id; little-endian uint16 when the
  vocabulary fits in 65,536 ids, else uint32 (``numpy.memmap(path, dtype)`` opens one);
- ``valid.bytes``, ``test.bytes``: uint16 per token, the UTF-8 bytes of text that token
  covers (tasks/lm/tokenizer.py), so bits per byte over any window is exact;
- ``meta.json``: counts, dtype, the tokenizer, and per file its size and a hash of sampled
  blocks; written last.

Written atomically: into ``<key>.tmp-<pid>/``, files fsynced, then the folder renamed into
place, all under an exclusive lock on ``<key>.lock`` (a second process preparing the same
corpus waits and then reuses it). A folder whose meta.json is missing, unreadable or
disagrees with its files' sizes or sampled hashes is never used: it is removed and the corpus
tokenised again. Documents are streamed and tokens written in chunks, so memory does not grow
with the corpus.

Reading uses ``os.pread`` of each window rather than a memory map: pages a memory map has
touched count in the process' RSS until the kernel takes them back, so random windows over a
10 GB file would grow it; pread copies just the window (the page cache stays the kernel's).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable

import numpy as np

from tasks.lm.split import SPLITS, SplitRule
from tasks.lm.tokenizer import LMTokenizer

FORMAT = 1
EVAL_SPLITS = ("valid", "test")
FLUSH_CHARS = 1 << 20        # text handed to the tokenizer at a time (batches its threads)
SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 64 << 10
MAX_TOKEN_BYTES = np.iinfo(np.uint16).max


def cache_root() -> Path:
    """``$SSM_WORKBENCH_DATA/lm``, else ``$XDG_CACHE_HOME/ssm-workbench/lm``, else
    ``~/.cache/ssm-workbench/lm``."""
    if os.environ.get("SSM_WORKBENCH_DATA"):
        return Path(os.environ["SSM_WORKBENCH_DATA"]).expanduser() / "lm"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ssm-workbench" / "lm"


def key_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_fit(root: Path, key: str, make) -> str:
    """A tokenizer's fitted state (text), made once per key and cached atomically."""
    path = root / "tokenizers" / f"{key}.json"
    with locked(path.with_suffix(".lock")):
        try:
            with open(path, encoding="utf-8") as f:
                held = json.load(f)
            if held.get("format") == FORMAT and isinstance(held.get("fitted"), str):
                return held["fitted"]
        except (OSError, ValueError):
            pass  # missing or damaged: fit again
        fitted = make()
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "fitted": fitted}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return fitted


def sample_hash(path: Path) -> str:
    """blake2b of the size and SAMPLE_BLOCKS blocks spread over the file: catches truncated or
    overwritten files without reading gigabytes at every start."""
    size = path.stat().st_size
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as f:
        for i in range(SAMPLE_BLOCKS):
            f.seek(max(0, size - SAMPLE_BLOCK) * i // max(1, SAMPLE_BLOCKS - 1))
            h.update(f.read(SAMPLE_BLOCK))
    return h.hexdigest()


class TokenFile:
    """One flat array file, read by pread (constant memory whatever its size)."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.n = self.path.stat().st_size // self.dtype.itemsize
        self._fd: int | None = None

    def __len__(self) -> int:
        return self.n

    def __del__(self):
        try:  # at interpreter exit the os module may already be gone
            if self._fd is not None:
                os.close(self._fd)
        except Exception:
            pass

    def read(self, start: int, length: int) -> np.ndarray:
        if start < 0 or start + length > self.n:
            raise IndexError(f"{self.path.name}: [{start}, {start + length}) outside [0, {self.n})")
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        size = self.dtype.itemsize
        buf = os.pread(self._fd, length * size, start * size)
        return np.frombuffer(buf, dtype=self.dtype)

    def windows(self, starts: Iterable[int], length: int) -> np.ndarray:
        """(len(starts), length) int64 array of the windows at ``starts``."""
        starts = list(starts)
        out = np.empty((len(starts), length), dtype=np.int64)
        for i, s in enumerate(starts):
            out[i] = self.read(int(s), length)
        return out

    def memmap(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r")


class Prepared:
    """A valid cache folder: its meta, a TokenFile per split, byte counts for valid/test."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self.tokens = {s: TokenFile(folder / f"{s}.tokens", meta["dtype"]) for s in SPLITS}
        self.nbytes = {s: TokenFile(folder / f"{s}.bytes", "<u2") for s in EVAL_SPLITS}

    def window_bytes(self, split: str, starts: Iterable[int], length: int) -> int:
        """UTF-8 bytes of text covered by the tokens [s, s + length) of each start, summed."""
        f = self.nbytes[split]
        return int(sum(int(f.read(int(s), length).sum(dtype=np.int64)) for s in starts))


def _files(meta: dict) -> list[str]:
    return [f"{s}.tokens" for s in SPLITS] + [f"{s}.bytes" for s in EVAL_SPLITS]


def load(folder: Path, key: str) -> tuple[Prepared | None, str]:
    """(the prepared corpus, "") or (None, why it cannot be used)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None, "absent" if not folder.exists() else "no meta.json (an unfinished write)"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"meta.json unreadable ({e})"
    if meta.get("format") != FORMAT or meta.get("key") != key:
        return None, "meta.json of another format or key"
    for name in _files(meta):
        p = folder / name
        want = meta["files"].get(name, {})
        if not p.is_file() or p.stat().st_size != want.get("size"):
            return None, f"{name}: size differs from meta.json (truncated or missing)"
        if sample_hash(p) != want.get("sample_hash"):
            return None, f"{name}: content differs from meta.json (damaged)"
    return Prepared(folder, meta), ""


class _SplitWriter:
    def __init__(self, folder: Path, split: str, dtype: np.dtype, eot: int):
        self.split, self.dtype, self.eot = split, dtype, eot
        self.tokens = open(folder / f"{split}.tokens", "wb")
        self.bytes = open(folder / f"{split}.bytes", "wb") if split in EVAL_SPLITS else None
        self.pending: list[tuple[str, bool]] = []   # (text piece, ends its document)
        self.pending_chars = 0
        self.n_tokens = self.n_docs = self.n_text_bytes = 0
        self.carry = 0   # bytes not yet charged to a token (text after a piece's last token)

    def add(self, text: str, last: bool, tok: LMTokenizer) -> None:
        self.pending.append((text, last))
        self.pending_chars += len(text)
        if self.pending_chars >= FLUSH_CHARS:
            self.flush(tok)

    def flush(self, tok: LMTokenizer) -> None:
        if not self.pending:
            return
        texts = [t for t, _ in self.pending]
        encoded = tok.encode_batch(texts, with_bytes=self.bytes is not None)
        chunks, counts = [], []
        for (text, last), (ids, lens, missing) in zip(self.pending, encoded):
            if self.bytes is not None:
                lens = np.asarray(lens, dtype=np.int64).copy()
                if len(ids):
                    lens[0] += self.carry
                    self.carry = 0
                self.carry += missing
            else:
                self.n_text_bytes += len(text.encode("utf-8", "surrogatepass"))
            chunks.append(ids)
            counts.append(lens)
            if last:  # the document ends: its end-of-text token takes any bytes left over
                chunks.append(np.array([self.eot], dtype=np.int64))
                counts.append(np.array([self.carry], dtype=np.int64))
                self.carry = 0
                self.n_docs += 1
        ids = np.concatenate(chunks)
        self.tokens.write(ids.astype(self.dtype).tobytes())
        self.n_tokens += len(ids)
        if self.bytes is not None:
            lens = np.concatenate(counts)
            if len(lens) and lens.max() > MAX_TOKEN_BYTES:
                raise ValueError(f"lm: one token covers {int(lens.max())} bytes of text (the "
                                 "tokenizer drops long runs of text); byte counts are 16-bit")
            self.n_text_bytes += int(lens.sum())
            self.bytes.write(lens.astype("<u2").tobytes())
        self.pending, self.pending_chars = [], 0

    def close(self) -> None:
        for f in (self.tokens, self.bytes):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()


def _progress(total: int | None, label: str):
    """A rich progress bar on stderr (the worker's log), in bytes of text read."""
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    return Progress(TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True))


def build(folder: Path, key: str, documents, split: SplitRule, tok: LMTokenizer,
          identity: dict, total: int | None = None, label: str = "tokenising") -> dict:
    """Tokenise ``documents`` into ``folder`` (which must not exist); returns the meta."""
    dtype = np.dtype("<u2") if tok.vocab_size <= 1 << 16 else np.dtype("<u4")
    folder.mkdir(parents=True)
    writers = {s: _SplitWriter(folder, s, dtype, tok.eot_id) for s in SPLITS}
    t0, read = time.perf_counter(), 0
    with _progress(total, label) as bar:
        task = bar.add_task(label, total=total)
        for doc in documents:
            w = writers[split.of(doc.key)]
            prev = None   # hold one piece back: the last one ends the document
            for piece in doc.pieces():
                if prev is not None:
                    w.add(prev, False, tok)
                    read += len(prev)
                    bar.update(task, completed=read)
                prev = piece
            w.add(prev or "", True, tok)
            read += len(prev or "")
            bar.update(task, completed=read)
        for w in writers.values():
            w.flush(tok)
    for w in writers.values():
        w.close()
    seconds = time.perf_counter() - t0
    text_bytes = sum(w.n_text_bytes for w in writers.values())
    meta = {
        "format": FORMAT, "key": key, "dtype": dtype.str, **identity,
        "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
        "splits": {s: {"tokens": w.n_tokens, "documents": w.n_docs, "text_bytes": w.n_text_bytes}
                   for s, w in writers.items()},
        "seconds": round(seconds, 3), "mb_per_s": round(text_bytes / 1e6 / max(seconds, 1e-9), 3),
        "created": time.time(),
    }
    meta["tokens"] = sum(w.n_tokens for w in writers.values())
    meta["text_bytes"] = text_bytes
    meta["files"] = {name: {"size": (folder / name).stat().st_size,
                            "sample_hash": sample_hash(folder / name)} for name in _files(meta)}
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    os.replace(tmp, folder / "meta.json")
    return meta


def prepare(root: Path, key: str, documents_fn, split: SplitRule, tok_fn, identity: dict,
            total: int | None = None, label: str = "tokenising") -> Prepared:
    """The prepared corpus for ``key``: reused when valid, else built (once, under a lock).
    ``documents_fn()`` streams the documents, ``tok_fn()`` gives the tokenizer; both are
    called only when the corpus must be tokenised."""
    folder = root / key
    found, _ = load(folder, key)
    if found:
        return found
    with locked(root / f"{key}.lock"):
        found, why = load(folder, key)   # another process may have finished it meanwhile
        if found:
            return found
        if folder.exists():
            print(f"lm: not reusing {folder}: {why}; tokenising again", file=sys.stderr, flush=True)
            shutil.rmtree(folder)
        for stale in root.glob(f"{key}.tmp-*"):   # left by a killed process (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f"{key}.tmp-{os.getpid()}"
        try:
            meta = build(tmp, key, documents_fn(), split, tok_fn(), identity, total, label)
            os.rename(tmp, folder)
            print(f"lm: tokenised {meta['text_bytes'] / 1e6:.1f} MB into {meta['tokens']:,} tokens in "
                  f"{meta['seconds']:.1f} s ({meta['mb_per_s']:.2f} MB/s) -> {folder}",
                  file=sys.stderr, flush=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    found, why = load(folder, key)
    if not found:
        raise RuntimeError(f"lm: the token files just written in {folder} do not check: {why}")
    return found
