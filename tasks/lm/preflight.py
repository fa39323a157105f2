"""Is an ``lm`` task's corpus fit to train on? Answered before anything is launched.

``profile check``, ``run --dry-run``, ``run`` (before queuing) and the sweep form's check
build each task of a profile (workbench/spec/check.py) and call its ``preflight()``; the
``lm`` task's is :func:`check`, which raises one-line ``ValueError``s for:

- a corpus of no text: an empty file, a folder of empty files (``0 bytes``), a JSON-lines
  or Parquet source whose records hold no text;
- binary data where text is read (:func:`binary_reason`): a file whose sampled bytes (its
  first 64 KiB and its last 8 KiB) hold a NUL byte, or more than 1% (and at least 8) bytes
  that are not UTF-8, would become replacement characters; named with its counts. (Not
  looked at: ``stdlib``, the interpreter's own sources, and Parquet, whose rows are strings.)
- a split too small for one context: every split needs ``seq_len + 1`` tokens (the task's
  own rule, tasks/lm/task.py's ``data``); the message names the source and the tokens each
  split would get.

Counting without tokenising (:func:`count`, then :func:`tokens`): the corpus' documents are
assigned to splits exactly as the task assigns them (tasks/lm/split.py), and their UTF-8
bytes counted per split, never more than ``SCAN_BYTES`` (32 MiB) read:

- one file per document (``document = "file"``, ``stdlib``): each file's split key is its
  first 64 KiB and its size, so the heads are read and the sizes summed (exact for UTF-8
  text, whatever the corpus' size, within the scan budget);
- one file cut by position: the cuts give the bytes of each split at once;
- records (lines, paragraphs, JSON lines, Parquet): read and counted; a corpus larger than
  the budget gives lower bounds (``at least``), which refuse nothing;
- ``hf:`` datasets: not counted (their size is the dataset's; the run tokenises them).

Tokens from bytes: ``bytes`` gives one token a byte plus the end-of-text of each document,
exactly; ``char`` one a character (counted where records are read, else at most one a byte);
a trained BPE (``bpe``, and ``char``'s vocabulary) takes the prepared token cache's exact
counts when that cache exists already (reading its meta, tokenising nothing; looked for
only when the corpus is within the scan budget or a split's bound is within 16 contexts,
since finding it hashes the corpus' contents the first time), else the bound ``at most
one token a byte`` (a byte-level BPE token covers at least one byte);
a pretrained tokenizer the bound ``at most bytes + 2 per document`` (room for a start token
and a word-prefix marker; a normaliser that expands text is not allowed for). A bound
refuses only when even it falls short of ``seq_len + 1``.

Counts are memoised in the process by the files' paths, sizes and mtimes (the sweep form
checks again as the user types).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tasks.lm import sources
from tasks.lm.split import SPLITS, SplitRule

SCAN_BYTES = 32 << 20          # at most this much of a corpus is read to count its splits
SNIFF_HEAD, SNIFF_TAIL = sources.KEY_BYTES, 8 << 10
INVALID_FRACTION, INVALID_MIN = 0.01, 8


@dataclass
class Counts:
    """Per split: documents, UTF-8 bytes of text, characters (None when not counted);
    ``complete`` False when the scan stopped at SCAN_BYTES (the counts are lower bounds)."""

    documents: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    chars: dict[str, int] | None = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    complete: bool = True
    files: int = 0
    binary: list[tuple[str, str]] = field(default_factory=list)   # (file, why)
    how: str = ""                                                   # how the source is split

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def total_documents(self) -> int:
        return sum(self.documents.values())


def binary_reason(path: str) -> str | None:
    """Why ``path`` is not text (module doc), or None. Reads at most 72 KiB."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        sample = f.read(SNIFF_HEAD)
        if size > SNIFF_HEAD:
            f.seek(max(SNIFF_HEAD, size - SNIFF_TAIL))
            tail = f.read(SNIFF_TAIL)
            while tail and 0x80 <= tail[0] < 0xC0:   # a character cut by the seek
                tail = tail[1:]
            sample_parts = [sample, tail]
        else:
            sample_parts = [sample]
    nul = sum(p.count(0) for p in sample_parts)
    n = sum(len(p) for p in sample_parts)
    # bytes that are not UTF-8 (a character cut at the head's end counts as at most 3)
    bad = sum(len(p) - len(p.decode("utf-8", "ignore").encode("utf-8")) for p in sample_parts)
    if nul:
        return (f"{nul:,} NUL byte(s) in {n:,} sampled bytes: binary data (or UTF-16), not "
                f"UTF-8 text")
    if bad >= INVALID_MIN and bad > INVALID_FRACTION * n:
        return (f"{bad:,} of {n:,} sampled bytes are not UTF-8 (binary data, or text in another "
                f"encoding: convert it, e.g. iconv -f latin1 -t utf-8)")
    return None


_MEMO: dict[tuple, Counts] = {}
MEMO_SIZE = 8


def _signature(src: sources.Source, rule: SplitRule) -> tuple:
    stats = []
    for f in src.files:
        st = os.stat(f)
        stats.append((f, st.st_size, st.st_mtime_ns))
    return (src.spec, src.mode, src.text_column, src.max_documents, tuple(src.fractions),
            rule.valid_fraction, rule.test_fraction, tuple(stats))


def count(src: sources.Source, rule: SplitRule) -> Counts | None:
    """The source's documents and bytes per split (module doc); None for ``hf:`` datasets.
    ValueError where its records cannot be read (a JSON line that is not JSON)."""
    if src.hf:
        return None
    key = _signature(src, rule)
    if key not in _MEMO:
        while len(_MEMO) >= MEMO_SIZE:   # the oldest first (a check repeats a few corpora)
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = _count(src, rule)
    return _MEMO[key]


def _count(src: sources.Source, rule: SplitRule) -> Counts:
    c = Counts(files=len(src.files))
    if src.spec != "stdlib":   # the interpreter's own sources are text
        for f in src.files:
            if not f.lower().endswith(".parquet"):
                why = binary_reason(f)
                if why:
                    c.binary.append((f, why))
        if c.binary:
            return c
    mode, limit = src.mode, src.max_documents or None
    if mode == "position":
        c.how = "one file cut by position"
        c.chars = None
        for n, (split, start, end) in enumerate(sources.position_cuts(src.files[0], *src.fractions)):
            if limit is not None and n >= limit:
                break
            c.documents[split] += 1
            c.bytes[split] += end - start
        return c
    if mode == "file" and not any(sources.is_record_file(f) for f in src.files):
        c.how = "one document a file"
        c.chars = None
        read = 0
        for n, f in enumerate(src.files):
            if limit is not None and n >= limit:
                break
            if read >= SCAN_BYTES:
                c.complete = False
                break
            size = os.path.getsize(f)
            with open(f, "rb") as fh:
                head = fh.read(sources.KEY_BYTES)
            read += len(head)
            split = rule.of(head + str(size).encode())
            c.documents[split] += 1
            c.bytes[split] += size
        return c
    c.how = {"paragraph": "one document a paragraph", "line": "one document a line"}.get(
        mode, "one document a record")
    read = 0
    for doc in src.documents():
        split = rule.of(doc.key)
        c.documents[split] += 1
        for piece in doc.pieces():
            b = len(piece.encode("utf-8", "surrogatepass"))
            c.bytes[split] += b
            c.chars[split] += len(piece)
            read += b
        if read >= SCAN_BYTES:
            c.complete = False
            break
    return c


@dataclass
class TokenCount:
    tokens: dict[str, int]
    kind: str          # "exact", "at most", "at least"
    rule: str          # how they were had, for the message


def tokens(task, c: Counts) -> TokenCount:
    """Tokens each split would get (module doc: exact, or a bound, and which)."""
    docs, nbytes = c.documents, c.bytes
    kind = task.tokenizer_name
    if not c.complete:   # lower bounds: bytes (tokens for the bytes tokenizer)
        if kind == "bytes":
            return TokenCount({s: nbytes[s] + docs[s] for s in SPLITS}, "at least",
                              f"counted in the first {SCAN_BYTES >> 20} MiB read")
        return TokenCount(dict(nbytes), "at least",
                          f"bytes of text, counted in the first {SCAN_BYTES >> 20} MiB read")
    if kind == "bytes":
        return TokenCount({s: nbytes[s] + docs[s] for s in SPLITS}, "exact",
                          "bytes tokenizer: one a byte, plus end-of-text a document")
    if kind == "char" and c.chars is not None:
        return TokenCount({s: c.chars[s] + docs[s] for s in SPLITS}, "exact",
                          "char tokenizer: one a character, plus end-of-text a document")
    if kind in ("char", "bpe"):
        # the prepared cache's exact counts where they can matter (a split within 16 times a
        # context of the bound) or the corpus is small: finding the cache hashes the corpus
        # the first time (tasks/lm/fingerprint.py), which a large one should not pay for here
        need = task.seq_len + 1
        marginal = min(nbytes.values()) < 16 * need or c.total_bytes <= SCAN_BYTES
        cached = task.cached_split_tokens() if marginal else None
        if cached is not None:
            return TokenCount(cached, "exact", f"{kind} tokenizer: the prepared token cache")
        return TokenCount({s: nbytes[s] + docs[s] for s in SPLITS}, "at most",
                          f"{kind} tokenizer, not fitted yet: at most one token a byte, plus "
                          f"end-of-text a document")
    return TokenCount({s: nbytes[s] + 2 * docs[s] for s in SPLITS}, "at most",
                      "pretrained tokenizer: at most one token a byte, plus 2 a document")


def _n(d: dict[str, int]) -> str:
    return ", ".join(f"{s} {d[s]:,}" for s in SPLITS)


def _bytes(n: int) -> str:
    return f"{n:,} byte{'' if n == 1 else 's'}"


def check(task) -> str:
    """Refuse (ValueError, one line) a corpus that cannot train the task (module doc); else
    one line saying what each split gets, for ``profile check`` to show ('' when not
    counted)."""
    src, spec = task.source, task.source.spec
    c = count(src, task.split)
    if c is None:
        return ""
    if c.binary:
        f, why = c.binary[0]
        if c.files == 1:
            raise ValueError(f"lm: source {spec!r} is not text: {why}")
        raise ValueError(f"lm: source {spec!r}: {len(c.binary)} of its {c.files} files are not text, "
                         f"e.g. {f}: {why}")
    if c.complete and c.total_bytes == 0:
        if c.files == 1 and src.mode != "file" and sources.is_record_file(src.files[0]):
            what = "holds no text (no record with a non-empty text column " + repr(src.text_column) + ")"
        elif c.files == 1:
            what = "is an empty file (0 bytes)"
        else:
            what = (f"holds {c.files} files and 0 bytes of text (every file empty"
                    f"{'' if src.mode == 'file' else ', or no record with text'})")
        raise ValueError(f"lm: source {spec!r} {what}: every split would get 0 tokens of text; "
                         f"nothing to train on")
    need = task.seq_len + 1
    tc = tokens(task, c)
    short = [s for s in SPLITS if tc.tokens[s] < need]
    unit = "bytes" if tc.kind == "at least" and task.tokenizer_name != "bytes" else "tokens"
    counted = f"{tc.kind + ' ' if tc.kind != 'exact' else ''}{_n(tc.tokens)} {unit}"
    if short and tc.kind != "at least":
        if src.mode == "file" and c.files == 1:
            hint = ("one file read with document = 'file' is one document, so it lands whole in one "
                    "split: leave document out (one file is then split by paragraph or position), "
                    "or give 'paragraph' / 'line' / 'position'")
        elif "train" in short:
            hint = "use a larger corpus or a shorter seq_len"
        else:
            hint = ("raise valid_fraction / test_fraction, use a larger corpus, or a shorter seq_len")
        raise ValueError(
            f"lm: source {spec!r} is too small for seq_len {task.seq_len}: its splits would get "
            f"{counted} ({c.how}, {c.total_documents:,} document(s), {_bytes(c.total_bytes)}; "
            f"{tc.rule}), and each needs seq_len + 1 = {need:,}; {hint}")
    return f"data {spec!r}: {counted} ({c.how}; {tc.rule})"
