"""Where an LM corpus comes from: documents streamed one at a time, never the whole corpus.

A source is named by one string (``source`` of the ``lm`` task):

- ``"stdlib"``: the running interpreter's standard library source, every ``.py`` file under
  ``sysconfig.get_paths()["stdlib"]`` (site-packages / dist-packages left out); a corpus
  every machine has (CPython 3.11: 1,790 files, 31.5 MB);
- a local file, folder (every non-hidden file under it, recursively) or glob (``*``, ``?``,
  ``[``; ``**`` recurses). Files ending ``.jsonl`` / ``.json`` are JSON lines and
  ``.parquet`` files Parquet, one document per record's ``text_column``; any other file is
  UTF-8 text (invalid bytes replaced; ``profile check`` refuses binary, tasks/lm/preflight.py),
  one document per file, per line or per paragraph (``document = "file" | "line" |
  "paragraph"``), or one file cut by position (``"position"``);
- ``"hf:REF"``: a Hugging Face dataset through the ``datasets`` library (the ``lm``
  extra): REF is a hub id (``hf:wikitext``, with ``hf_config`` / ``hf_split``), a folder
  written by ``save_to_disk``, or a local data file read by ``datasets``' own loaders
  (``.jsonl``, ``.json``, ``.parquet``, ``.csv``, ``.txt``). The standard cache is used;
  ``streaming = true`` reads a hub corpus without downloading it whole; offline mode
  (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``) is honoured as tasks/hub_data.py
  says (a snapshot in the Hub cache, else ``datasets``' prepared tables), and a corpus
  that cannot be had is one line saying how to fetch it.

``document = "auto"`` (the default) is ``"file"`` for a source of several files (a folder, a
glob, ``stdlib``), but a source that is ONE text file (nanoGPT's ``input.txt``) would be one
document, which lands whole in one split and leaves the others empty. So one text file is
split without being asked (:meth:`Source.mode`), deterministically:

- by paragraph (blank-line separated, as ``"paragraph"``; hash-split like any documents)
  when it has at least ``PARAGRAPHS_PER_SPLIT / min(valid_fraction, test_fraction)``
  paragraphs (1,000 at the default 2% fractions: about 20 paragraphs expected in each of
  valid and test), counted in its first ``SCAN_BYTES`` (64 MiB);
- else by position (``"position"``), as nanoGPT cuts its one file: the first ``1 - valid -
  test`` of its bytes train, the next ``valid_fraction`` valid, the last ``test_fraction``
  test, each cut moved forward to just after the next newline (within 64 KiB; else to the
  next UTF-8 character boundary). The three slices are documents whose split is pinned
  (tasks/lm/split.py's PinnedKey), not hashed.

The resolved mode is what the corpus fingerprint records (and so the token cache key): a
folder's key is what it was before ``"auto"`` existed (``"file"``), one file split by
paragraph has the key an explicit ``document = "paragraph"`` has, and one file cut by
position has a key of its own. (One file with ``document = "file"`` written out stays one
document; tasks/lm/preflight.py refuses it before launch, naming the empty splits.)

Each document is a :class:`Document`: ``key`` (the bytes the train/valid/test split hashes:
the record's text, or a file's first 64 KiB and its size, so a file is split without reading
it twice) and ``pieces()`` (its text in pieces of at most ~4 MiB, cut after a newline, so a
file larger than memory is never read whole).
"""
from __future__ import annotations

import glob
import json
import math
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from tasks.lm.digest import files_digest

PIECE_BYTES = 4 << 20      # a long text file is read and tokenised in pieces of about this size
KEY_BYTES = 64 << 10       # a file's split key: its first 64 KiB and its size
DOCUMENT_MODES = ("auto", "file", "line", "paragraph", "position")
PARAGRAPHS_PER_SPLIT = 20  # one file splits by paragraph when valid and test expect this many
SCAN_BYTES = 64 << 20      # ... counted in its first 64 MiB
CUT_WINDOW = 64 << 10      # a position cut moves to just after a newline at most this far
DEFAULT_FRACTIONS = (0.02, 0.02)   # the lm task's valid_fraction, test_fraction
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
HF_PREFIX = "hf:"
LM_EXTRA = "pip install 'ssm-workbench[lm]'"


@dataclass
class Document:
    key: bytes
    pieces: Callable[[], Iterable[str]]


def clean(text: str) -> str:
    """Text every tokenizer can take: lone surrogates (JSON allows them; UTF-8 and the Rust
    tokenizers do not) become U+FFFD. ASCII is checked first because it is nearly free."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


# -- local files ----------------------------------------------------------------------
def stdlib_files() -> tuple[str, list[str]]:
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        # installed packages are not the standard library (and differ between machines)
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages",
                                                              "__pycache__"))
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return root, files


def local_files(spec: str) -> list[str]:
    """The files a path, folder or glob names, sorted (so the corpus has one order)."""
    path = os.path.expanduser(spec)
    if any(c in path for c in "*?["):
        files = [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)]
    elif os.path.isdir(path):
        files = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            files += [os.path.join(dirpath, f) for f in filenames if not f.startswith(".")]
    elif os.path.isfile(path):
        files = [path]
    else:
        raise ValueError(f"lm: source {spec!r} is no file, folder or glob here (nor 'stdlib' or "
                         "'hf:ID' for a Hugging Face dataset)")
    if not files:
        raise ValueError(f"lm: source {spec!r} names no files")
    return sorted(files)


def _file_pieces(path: str, mode: str = "file", start: int = 0, end: int | None = None) -> Iterator[str]:
    """A text file's text (bytes ``[start, end)`` of it, else all), cut after newlines into
    pieces of about PIECE_BYTES (cut in bytes: a newline byte is never inside a multi-byte
    UTF-8 character)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = None if end is None else max(0, end - start)
        rest = b""
        while True:
            block = f.read(PIECE_BYTES if left is None else min(PIECE_BYTES, left))
            if left is not None:
                left -= len(block)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0 and len(block) < 4 * PIECE_BYTES:  # a very long line: wait for its end
                rest = block
                continue
            cut = cut or len(block)
            rest = block[cut:]
            yield block[:cut].decode("utf-8", "replace")
        if rest:
            yield rest.decode("utf-8", "replace")


def _text_documents(path: str, mode: str) -> Iterator[Document]:
    if mode == "file":
        with open(path, "rb") as f:
            head = f.read(KEY_BYTES)
        key = head + str(os.path.getsize(path)).encode()
        yield Document(key, lambda: _file_pieces(path, mode))
        return
    # line / paragraph: records of one file; the file is still read piece by piece
    para: list[str] = []
    for piece in _file_pieces(path, mode):
        for line in piece.splitlines(keepends=True):
            if mode == "line":
                text = line.rstrip("\r\n")
                if text.strip():
                    yield _record(text)
            elif line.strip():
                para.append(line)
            elif para:
                yield _record("".join(para).rstrip("\r\n"))
                para = []
    if para:
        yield _record("".join(para).rstrip("\r\n"))


def count_paragraphs(path: str, stop: int, scan: int = SCAN_BYTES) -> int:
    """Paragraphs (runs of non-blank lines, as ``document = "paragraph"`` cuts them) in the
    file's first ``scan`` bytes, counting no further than ``stop``."""
    n, read, blank = 0, 0, True
    for piece in _file_pieces(path):
        for line in piece.splitlines():
            if line.strip():
                if blank:
                    n += 1
                    if n >= stop:
                        return n
                blank = False
            else:
                blank = True
        read += len(piece)   # characters: at most the bytes they came from
        if read >= scan:
            break
    return n


def _cut_after_newline(f, size: int, at: int) -> int:
    """The offset just after the first newline at or after ``at`` (looking CUT_WINDOW bytes
    ahead), else ``at`` moved past UTF-8 continuation bytes: a cut inside no character."""
    if at <= 0 or at >= size:
        return min(max(at, 0), size)
    f.seek(at)
    window = f.read(CUT_WINDOW)
    nl = window.find(b"\n")
    if nl >= 0:
        return at + nl + 1
    k = 0
    while k < len(window) and 0x80 <= window[k] < 0xC0:
        k += 1
    return at + k


def position_cuts(path: str, valid_fraction: float, test_fraction: float) -> list[tuple[str, int, int]]:
    """``[(split, start, end)]`` of one file cut by position (module doc): train, valid, test."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        a = _cut_after_newline(f, size, int(size * (1 - valid_fraction - test_fraction)))
        b = max(a, _cut_after_newline(f, size, int(size * (1 - test_fraction))))
    return [("train", 0, a), ("valid", a, b), ("test", b, size)]


def _position_documents(path: str, valid_fraction: float, test_fraction: float) -> Iterator[Document]:
    from tasks.lm.split import PinnedKey

    for split, start, end in position_cuts(path, valid_fraction, test_fraction):
        key = PinnedKey(f"{os.path.abspath(path)}\0{split}\0{start}-{end}".encode(), split)
        yield Document(key, lambda s=start, e=end: _file_pieces(path, "file", s, e))


def _record(text: str) -> Document:
    text = clean(text)
    return Document(text.encode("utf-8"), lambda: (text,))


def _jsonl_documents(path: str, column: str) -> Iterator[Document]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"lm: {path}:{n} is not a JSON line ({e.msg}); .jsonl/.json "
                                 "sources hold one JSON object per line") from None
            text = row.get(column) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"lm: {path}:{n} has no text column {column!r} "
                                 f"(keys: {', '.join(row) if isinstance(row, dict) else type(row).__name__})")
            if text:
                yield _record(text)


def _parquet_documents(path: str, column: str) -> Iterator[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"lm: reading {path} needs pyarrow: {LM_EXTRA}") from None
    pf = pq.ParquetFile(path)
    if column not in pf.schema_arrow.names:
        raise ValueError(f"lm: {path} has no text column {column!r} "
                         f"(columns: {', '.join(pf.schema_arrow.names)})")
    for batch in pf.iter_batches(columns=[column], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text:
                yield _record(text)


def is_record_file(path: str) -> bool:
    """Whether a file holds records (JSON lines, Parquet) rather than text."""
    return path.lower().endswith(RECORD_SUFFIXES)


def file_documents(path: str, mode: str, column: str,
                   fractions: tuple[float, float] = DEFAULT_FRACTIONS) -> Iterator[Document]:
    lower = path.lower()
    if lower.endswith((".jsonl", ".json")):
        return _jsonl_documents(path, column)
    if lower.endswith(".parquet"):
        return _parquet_documents(path, column)
    if mode == "position":
        return _position_documents(path, *fractions)
    return _text_documents(path, mode)


# -- Hugging Face datasets ------------------------------------------------------------------
def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))


_HF_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
                ".txt": "text"}


def hf_dataset(ref: str, config: str | None, split: str, streaming: bool):
    """The dataset ``ref`` names, loaded by the ``datasets`` library (imported here: it is
    an optional extra and slow to import)."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f"lm: source 'hf:{ref}' needs the datasets library: {LM_EXTRA}") from None
    local = os.path.expanduser(ref)
    if _is_saved_dataset(local):
        ds = datasets.load_from_disk(local)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"lm: dataset {ref!r} has no split {split!r} (splits: {', '.join(ds)})")
            ds = ds[split]
        return ds.to_iterable_dataset() if streaming else ds
    suffix = os.path.splitext(local)[1].lower()
    if os.path.isfile(local) and suffix in _HF_BUILDERS:
        return datasets.load_dataset(_HF_BUILDERS[suffix], data_files=local, split="train",
                                     streaming=streaming)
    from models import hub
    from tasks import hub_data

    if hub.is_hub_id(ref):  # the standard caches, offline mode, one line on failure
        return hub_data.load(ref, config, split=split, streaming=streaming, what="lm corpus")
    return datasets.load_dataset(ref, config, split=split, streaming=streaming)


def hf_documents(ref: str, config: str | None, split: str, streaming: bool,
                 column: str) -> Iterator[Document]:
    ds = hf_dataset(ref, config, split, streaming)
    names = list(ds.column_names or []) if ds.column_names is not None else None
    if names is not None and column not in names:
        raise ValueError(f"lm: dataset {ref!r} has no text column {column!r} (columns: {', '.join(names)})")
    ds = ds.select_columns([column])
    if streaming:
        rows = (r[column] for r in ds)
    else:  # batches of rows from the memory-mapped Arrow cache
        rows = (t for b in ds.iter(batch_size=1000) for t in b[column])
    for text in rows:
        if text:
            yield _record(text)


# -- the source -------------------------------------------------------------------------------
@dataclass
class Source:
    spec: str
    text_column: str = "text"
    document: str = "auto"
    hf_config: str | None = None
    hf_split: str = "train"
    streaming: bool = False
    max_documents: int = 0
    fractions: tuple[float, float] = DEFAULT_FRACTIONS   # (valid, test): for one file's cut

    @classmethod
    def of_params(cls, p: dict) -> "Source":
        """The source of an ``lm`` task with parameters ``p`` (a run's spec), as the task
        builds it: the same documents, mode and fingerprint."""
        p = p or {}
        return cls(p.get("source", "stdlib"), text_column=p.get("text_column", "text"),
                   document=p.get("document", "auto"), hf_config=p.get("hf_config"),
                   hf_split=p.get("hf_split", "train"), streaming=bool(p.get("streaming", False)),
                   max_documents=int(p.get("max_documents", 0) or 0),
                   fractions=(p.get("valid_fraction", DEFAULT_FRACTIONS[0]),
                              p.get("test_fraction", DEFAULT_FRACTIONS[1])))

    def __post_init__(self) -> None:
        if self.document not in DOCUMENT_MODES:
            raise ValueError(f"lm: document must be one of {', '.join(DOCUMENT_MODES)}, got {self.document!r}")
        if not isinstance(self.spec, str) or not self.spec:
            raise ValueError("lm needs source = a file, folder, glob, 'stdlib' or 'hf:ID'")
        self.hf = self.spec.startswith(HF_PREFIX)
        if self.hf:
            self.ref = self.spec[len(HF_PREFIX):]
            if not self.ref:
                raise ValueError("lm: source 'hf:' needs a dataset id or folder after the colon")
            self.files: list[str] = []
        elif self.spec == "stdlib":
            self.root, self.files = stdlib_files()
        else:
            self.files = local_files(self.spec)
        self._mode: str | None = None
        if self.document == "position" and not self.one_text_file:
            raise ValueError(f"lm: document = 'position' cuts one text file into train / valid / test; "
                             f"source {self.spec!r} names {len(self.files) or 'a dataset, not'} "
                             f"{'files' if len(self.files) != 1 else 'file'}")

    @property
    def one_text_file(self) -> bool:
        """A local source of exactly one text (not JSON lines / Parquet) file."""
        return not self.hf and len(self.files) == 1 and not is_record_file(self.files[0])

    @property
    def mode(self) -> str:
        """The document mode in effect: ``document``, with ``"auto"`` resolved (module doc):
        ``"file"`` unless the source is one text file, which is split by ``"paragraph"``
        when it has enough paragraphs, else by ``"position"``. Read once (a few KiB of the
        file as a rule), on first use: building the task reads nothing."""
        if self._mode is None:
            mode = self.document
            if mode == "auto":
                mode = "file"
                if self.one_text_file:
                    need = math.ceil(PARAGRAPHS_PER_SPLIT / min(self.fractions))
                    mode = "paragraph" if count_paragraphs(self.files[0], need) >= need else "position"
            self._mode = mode
        return self._mode

    def size_hint(self) -> int | None:
        """Bytes to read, for the progress bar (local files; None for a dataset)."""
        if self.hf or self.max_documents:
            return None
        return sum(os.path.getsize(f) for f in self.files)

    def fingerprint(self) -> dict:
        """What identifies the corpus in the cache key: the files' paths and a hash of their
        contents (tasks/lm/digest.py; cached by path, size and mtime, so text is read
        only after a file changed), or the dataset reference (a hub dataset is taken to be
        what its id, config and split name; a local dataset folder adds its files')."""
        fp = {"spec": self.spec, "document": self.mode, "max_documents": self.max_documents}
        if self.mode == "position":  # where the cuts fall
            fp["fractions"] = list(self.fractions)
        files = self.files
        if self.hf:
            fp.update(config=self.hf_config, split=self.hf_split, column=self.text_column)
            local = os.path.expanduser(self.ref)
            files = local_files(local) if os.path.exists(local) else []
        elif self.spec == "stdlib":
            fp["python"] = sys.version
        if any(f.lower().endswith(RECORD_SUFFIXES) for f in files):
            fp["column"] = self.text_column
        fp["files"] = [len(files), files_digest(files)]
        return fp

    def documents(self) -> Iterator[Document]:
        """The documents in the corpus' order, streamed; at most ``max_documents``."""
        if self.hf:
            it = hf_documents(self.ref, self.hf_config, self.hf_split, self.streaming, self.text_column)
        else:
            mode = self.mode
            it = (d for f in self.files for d in file_documents(f, mode, self.text_column, self.fractions))
        for n, doc in enumerate(it):
            if self.max_documents and n >= self.max_documents:
                return
            yield doc
