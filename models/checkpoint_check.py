"""Checks of a Hugging Face checkpoint folder that need no model built and no library
imported: what ``ssm-workbench eval`` and evaluation profiles ask of a folder before they
queue anything (workbench/spec/eval_profile.py, workbench/execute/eval_queue.py).

Why: a folder that loads badly fails late and unreadably. Without tokenizer files
``transformers``' ``AutoTokenizer`` builds an empty tokenizer from ``config.json`` (2 ids)
and the evaluation fails ~50 s later with "lm-eval asked for the log-likelihood of an empty
continuation"; a truncated ``model.safetensors`` fails inside safetensors with "incomplete
metadata, file not fully covered" and a traceback that never names the file. Each check
here reads a few bytes and says in one line what is wrong and with which file:

- ``config.json`` is there and is JSON;
- the weights are there and whole: a ``.safetensors`` file's 8-byte header length, its JSON
  header, and the file size against the data offsets the header declares (the format:
  https://github.com/huggingface/safetensors, "Format"); a ``pytorch_model.bin`` in
  torch's zip format has its central directory (at the end of the file: a truncated file
  has none); an ``*.index.json`` of shards names files that are there, each checked so;
- a tokenizer is there (``tokenizer.json``, a SentencePiece model, ``vocab.json`` +
  ``merges.txt``, ``vocab.txt``), and where its size can be read from the files (the
  ``tokenizer.json`` vocabulary and added tokens, ``vocab.json`` + ``added_tokens.json``,
  ``vocab.txt``) no token id reaches past the embedding's rows (``vocab_size`` in
  ``config.json``): ``len(tokenizer) <= vocab_size`` and every id below it.
"""
from __future__ import annotations

import functools
import json
import zipfile
from pathlib import Path

CONFIG = "config.json"
# files any of which makes a tokenizer transformers loads (fast, SentencePiece, BPE, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "vocab.json", "vocab.txt", "tokenizer.tiktoken")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
MAX_HEADER = 100 * 2**20  # safetensors refuses larger headers (its MAX_HEADER_SIZE)


def folder_problems(folder: str | Path) -> list[str]:
    """Each problem of checkpoint folder ``folder`` (module doc), one line each naming the
    file; [] when it looks loadable."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return [f"{folder}: no such folder"]
    problems: list[str] = []
    config: dict = {}
    cfg = folder / CONFIG
    if not cfg.is_file():
        problems.append(f"{folder}: no {CONFIG}: not a Hugging Face checkpoint folder (save_pretrained writes one)")
    else:
        try:
            config = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"{cfg} cannot be read as JSON ({_first_line(e)})")
    problems += weights_problems(folder)
    problems += tokenizer_problems(folder, vocab_size(config))
    return problems


def vocab_size(config: dict) -> int | None:
    """The embedding's rows as ``config.json`` gives them (a multimodal model's text config's)."""
    for c in (config, config.get("text_config") if isinstance(config, dict) else None):
        if isinstance(c, dict) and isinstance(c.get("vocab_size"), int) and not isinstance(c["vocab_size"], bool):
            return c["vocab_size"]
    return None


# ------------------------------------------------------------------ weights
def weights_problems(folder: Path) -> list[str]:
    """The folder's weights are present and whole (module doc); shards through their index."""
    present = [folder / n for n in WEIGHT_FILES if (folder / n).is_file()]
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    if not present and not shards:
        return [f"{folder}: no weights file ({', '.join(WEIGHT_FILES)})"]
    first = present[0] if present else None
    if first is None:  # shards without their index (transformers needs the index; the Mamba loader reads them)
        return [p for f in shards for p in [file_problem(f)] if p]
    if first.name.endswith(".index.json"):
        return index_problems(first)
    p = file_problem(first)
    return [p] if p else []


def file_problem(path: Path) -> str | None:
    """A weights file whole as far as its own header says, or the one line why not."""
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    return torch_zip_problem(path)


def safetensors_problem(path: str | Path) -> str | None:
    """``path`` is a whole safetensors file: 8 bytes of little-endian header length N, N
    bytes of JSON (``{name: {dtype, shape, data_offsets: [begin, end]}}``, offsets into the
    data after the header), then exactly the data those offsets cover."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path} is truncated: {size} bytes, shorter than a safetensors header"
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER:
                return f"{path} is not a safetensors file (its first 8 bytes give a {n:,}-byte header)"
            if 8 + n > size:
                return (f"{path} is truncated: its header alone should be {n:,} bytes; the file has "
                        f"{size:,} bytes in all")
            raw = f.read(n)
    except OSError as e:
        return f"{path} cannot be read: {e.strerror or e}"
    try:
        header = json.loads(raw)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        return f"{path} is damaged: its safetensors header is not valid ({_first_line(e)})"
    need = 8 + n + max(ends, default=0)
    if size < need:
        return (f"{path} is truncated: {size:,} bytes, its header declares {need:,} "
                f"({len(ends)} tensors); download or save it again")
    if size > need:
        return f"{path} is damaged: {size - need:,} bytes more than its header declares ({need:,})"
    return None


def torch_zip_problem(path: str | Path) -> str | None:
    """A ``pytorch_model.bin`` in torch's zip format has its central directory (a truncated
    one has not); a legacy pickle (before torch 1.6) cannot be checked without reading it."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return f"{path} cannot be read: {e.strerror or e}"
    if magic != b"PK\x03\x04":
        return None if magic else f"{path} is empty"
    try:
        with zipfile.ZipFile(path) as z:
            z.infolist()
    except (zipfile.BadZipFile, OSError) as e:
        return f"{path} is truncated or damaged: not a whole torch zip file ({_first_line(e)})"
    return None


def index_problems(index: Path) -> list[str]:
    """An ``*.index.json`` of shards: JSON with a ``weight_map``, every shard it names there
    and whole."""
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"{index} cannot be read as a shard index ({_first_line(e)})"]
    out = []
    for name in shards:
        f = index.parent / str(name)
        if not f.is_file():
            out.append(f"{f}: missing (named by {index.name})")
        else:
            p = file_problem(f)
            if p:
                out.append(p)
    return out


# ------------------------------------------------------------------ tokenizer
def tokenizer_problems(folder: Path, rows: int | None) -> list[str]:
    """A tokenizer is there, and its ids fit ``rows`` (config.json's vocab_size) where its
    size can be read from the files."""
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        return [f"{folder}: no tokenizer (no tokenizer.json, tokenizer.model, vocab.json or the like): transformers "
                f"would make an empty one from {CONFIG}; save the model's tokenizer there (tokenizer.save_pretrained)"]
    try:
        counted = tokenizer_size(folder)
    except ValueError as e:
        return [str(e)]
    if counted is None:
        return []
    n, top, source = counted
    if n == 0:
        return [f"{folder / source} holds no tokens"]
    if rows is not None and top > rows:
        return [f"{folder / source} has {n:,} tokens (ids up to {top - 1:,}), but {CONFIG}'s vocab_size is "
                f"{rows:,}: ids from {rows:,} on have no embedding row (a tokenizer of another model?)"]
    return []


def tokenizer_size(folder: str | Path) -> tuple[int, int, str] | None:
    """(tokens, highest id + 1, the file read) from the tokenizer files where they say it
    without a library (module doc), else None; ValueError naming a file that cannot be read."""
    folder = Path(folder)
    for name in ("tokenizer.json", "vocab.json", "vocab.txt"):
        f = folder / name
        if f.is_file():
            st = f.stat()
            return _size_of(str(f), st.st_mtime_ns, st.st_size)
    return None


@functools.lru_cache(maxsize=32)
def _size_of(path: str, mtime_ns: int, size: int) -> tuple[int, int, str]:
    """tokenizer_size of one file, cached by its path, time and size (a form checks on each edit)."""
    f = Path(path)
    try:
        if f.name == "vocab.txt":  # one token a line, ids by line number
            n = sum(1 for _ in f.open(encoding="utf-8"))
            return n, n, f.name
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{f} cannot be read as a tokenizer ({_first_line(e)})") from None
    ids: set[int] = set()
    try:
        if f.name == "tokenizer.json":
            vocab = (data.get("model") or {}).get("vocab")
            if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
                ids.update(int(i) for i in vocab.values())
            elif isinstance(vocab, list):  # Unigram: [piece, score] by id
                ids.update(range(len(vocab)))
            ids.update(int(t["id"]) for t in data.get("added_tokens") or [])
        else:  # vocab.json (+ added_tokens.json beside it)
            ids.update(int(i) for i in data.values())
            added = f.parent / "added_tokens.json"
            if added.is_file():
                ids.update(int(i) for i in json.loads(added.read_text(encoding="utf-8")).values())
    except (AttributeError, TypeError, ValueError, KeyError, OSError) as e:
        raise ValueError(f"{f} cannot be read as a tokenizer ({_first_line(e)})") from None
    return len(ids), (max(ids) + 1 if ids else 0), f.name


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


__all__ = ["folder_problems", "safetensors_problem", "tokenizer_problems", "tokenizer_size", "torch_zip_problem",
           "vocab_size", "weights_problems"]
