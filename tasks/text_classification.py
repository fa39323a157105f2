"""Text classification on a local dataset, tokenised with a pretrained backbone's tokenizer.

``data_path`` is one of four layouts:

- an aclImdb-style folder: ``train/<label>/*.txt`` and ``test/<label>/*.txt``, one text per
  file (read as UTF-8, unchanged: IMDB's ``<br />`` tags stay, as in the published runs).
  The classes are the label folders present in BOTH ``train/`` and ``test/``, sorted by
  name (aclImdb: ``neg`` = 0, ``pos`` = 1; its train-only ``unsup`` folder is ignored);
- one CSV (``.csv``) or JSON-lines (``.jsonl`` / ``.json``) file with a text column and a
  label column (``text_column``, ``label_column``). Train and test come from the same
  file: for each seed, a seeded permutation of the rows gives ``num_test_examples`` test
  rows and, from the rest, ``num_train_examples`` training rows (never the same row);
- a folder holding ``train.csv`` / ``train.jsonl`` and ``test.csv`` / ``test.jsonl``;
- a Hugging Face Hub dataset id (``stanfordnlp/imdb``; ``hf:owner/name`` forces the Hub
  over a local path of that name), read with ``datasets`` through the standard cache
  (tasks/hub_data.py; offline mode honoured): its ``train`` split and its ``test`` split
  (else ``validation``), with ``text_column`` / ``label_column`` as in a file.

Labels (folder names, or the label column's values, strings or integers) are mapped to
class ids 0..C-1 in sorted order (integer-valued labels sort as numbers);
``task.label_names[i]`` is the label of class ``i``. Where a split holds more examples
than asked for, a seeded subset is used; where it holds fewer, all of them (the attributes
``num_train_examples`` / ``num_test_examples`` hold the counts actually used, ``params()``
the ones asked for). Test examples whose tokens equal a training example's are dropped (an
exact duplicate would score memorisation), so the test set may be a few smaller.

Validation (``valid_set``): carved out of the training split by seed, never a test example.
The training examples of a seed are the first ones of a seeded permutation of the training
rows (single file: of the rows left after the test rows); the validation examples are the
``num_valid_examples`` that follow them in the same permutation, so no row is in both. By
default (``None``) only rows that training does not use: min(``num_test_examples``, training
rows - ``num_train_examples``) (aclImdb with 20 000 of its 25 000 training reviews: 1 000),
so the training set never changes by default. An explicit ``num_valid_examples`` takes that
many (at most training rows - 1) and, where the rows do not suffice for both, trains on
fewer (``num_train_examples`` then holds the count used). Validation examples whose tokens
equal a training or test example's are dropped, so it may be a few smaller.

Tokens: ``tokenizer`` is a tokenizer saved by Hugging Face (a directory with
``tokenizer.json``, as ``save_pretrained`` writes, or that file itself, or a Hub model id
whose snapshot in the Hugging Face cache holds one: models/hub.py), loaded with the
``tokenizers`` library with its own special-token settings. A text longer than
``seq_len`` tokens keeps its FIRST ``seq_len`` tokens. Every example is right-padded to
exactly ``seq_len`` tokens with the pad id: the tokenizer's padding token if it has one
(``tokenizer.json``'s padding, else ``pad_token`` in ``tokenizer_config.json``), else the
id of ``<|endoftext|>``, ``</s>`` or ``<pad>`` (the first one present), else 0. A text
with no tokens at all becomes a single pad token.

The target-position trick: targets are IGNORE (-100) everywhere except at the LAST REAL
token of each example, which holds the class id. A causal backbone's output there has seen
the whole text and none of the padding, so the ordinary per-position head, loss and
accuracy give last-token classification (GPT-style), one prediction per example.
``pool = "mean"`` instead uses the ``cumulative_mean`` readout (``tasks.heads``): the logits
at position t come from the mean of the backbone outputs 0..t, so at the target position
they see the mean over exactly the real tokens (the pads come after it).

Training uses the fixed training set (``fixed_train``), built once per seed and cached.
"""
from __future__ import annotations

import csv
import json
import os
import re

import numpy as np

from models import hub
from tasks import hub_data
from tasks.base import TEST_STREAM, TRAIN_STREAM, Task, check_int, rng_for
from tasks.metrics import IGNORE
from tasks.registry import register

POOLS = ("last", "mean")
PAD_FALLBACKS = ("<|endoftext|>", "</s>", "<pad>")
SPLIT_STREAM = 3          # rng stream of the train/test split of a single file
LAYOUTS = ("expected an aclImdb-style folder (train/<label>/*.txt and test/<label>/*.txt, "
           "e.g. train/pos, train/neg, test/pos, test/neg), a .csv or .jsonl file with text "
           "and label columns, or a folder holding train.csv/test.csv or train.jsonl/"
           "test.jsonl")
PRETRAINED_EXTRA = "pip install 'ssm-workbench[pretrained]'"


# -- tokenizer ---------------------------------------------------------------------------
def load_tokenizer(path: str):
    """(tokenizers.Tokenizer without its own padding/truncation, pad id)."""
    if not path or not isinstance(path, str):
        raise ValueError("text_classification needs tokenizer = a tokenizer directory saved by "
                         "Hugging Face (with tokenizer.json), a tokenizer.json file or a Hub model id")
    if hub.is_hub_id(path):  # the repository's tokenizer files, through the Hugging Face cache
        path = str(hub.snapshot(path, "tokenizer", patterns=hub.TOKENIZER_FILES))
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isdir(path) and not os.path.isfile(file) and _slow_files(path):
        return _converted(path)
    if not os.path.isfile(file):
        raise ValueError(
            f"text_classification: no tokenizer file {file!r}; expected a directory saved by "
            "Hugging Face save_pretrained with tokenizer.json inside, or a tokenizer.json file "
            "(on a connected machine: AutoTokenizer.from_pretrained(name).save_pretrained(dir) "
            "with a fast tokenizer writes it)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("text_classification needs the 'tokenizers' library: "
                          f"{PRETRAINED_EXTRA}") from None
    try:
        tok = Tokenizer.from_file(file)
    except Exception as e:  # the library raises a bare Exception on a malformed file
        raise ValueError(f"text_classification: cannot read tokenizer {file!r}: {e}") from None
    pad_id = _pad_id(tok, os.path.dirname(file))
    # the examples are truncated and padded here, to seq_len; the file's own settings would
    # pad or cut at other lengths
    tok.no_padding()
    tok.no_truncation()
    return tok, pad_id


def _slow_files(folder: str) -> bool:
    """A tokenizer saved without tokenizer.json (GPT-2 style vocab.json + merges.txt, as
    EleutherAI/gpt-neo-125m's repository has), which transformers converts to a fast one."""
    return os.path.isfile(os.path.join(folder, "vocab.json")) and os.path.isfile(os.path.join(folder, "merges.txt"))


def _converted(folder: str):
    """(tokenizers.Tokenizer, pad id) of such a folder, converted in memory by transformers'
    fast tokenizer (what AutoTokenizer.from_pretrained(...).save_pretrained(...) would write
    as tokenizer.json); the folder (maybe the Hub cache) is not written to."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"text_classification: {folder!r} has vocab.json and merges.txt but no "
                         f"tokenizer.json; converting them needs transformers: {PRETRAINED_EXTRA}") from None
    try:
        tok = AutoTokenizer.from_pretrained(folder, use_fast=True, local_files_only=True).backend_tokenizer
    except Exception as e:
        raise ValueError(f"text_classification: cannot convert the tokenizer in {folder!r} "
                         f"({type(e).__name__}: {e})") from None
    pad_id = _pad_id(tok, folder)
    tok.no_padding()
    tok.no_truncation()
    return tok, pad_id


def _pad_id(tok, folder: str) -> int:
    if tok.padding is not None:
        return int(tok.padding["pad_id"])
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            pad = json.load(f).get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        if isinstance(pad, str) and tok.token_to_id(pad) is not None:
            return int(tok.token_to_id(pad))
    for token in PAD_FALLBACKS:
        if tok.token_to_id(token) is not None:
            return int(tok.token_to_id(token))
    return 0


# -- reading the data ---------------------------------------------------------------------
def _label_key(value):
    """Integer-valued labels (1, "1") compare as numbers; anything else as its string."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else text


def read_rows(path: str, text_column: str, label_column: str) -> tuple[list[str], list]:
    """(texts, labels) of a CSV or JSON-lines file; ValueError naming the path and column."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".csv":
        with open(path, encoding="utf-8-sig", newline="") as f:
            try:
                rows = list(csv.DictReader(f))
            except csv.Error as e:
                raise ValueError(f"text_classification: cannot parse CSV {path!r}: {e}") from None
    elif suffix in (".jsonl", ".json"):
        rows = []
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"text_classification: {path!r} line {number} is not a "
                                     f"JSON object (expected JSON lines): {e}") from None
                if not isinstance(row, dict):
                    raise ValueError(f"text_classification: {path!r} line {number} is not a "
                                     "JSON object (expected JSON lines)")
                rows.append(row)
    else:
        raise ValueError(f"text_classification: {path!r} is neither .csv nor .jsonl; {LAYOUTS}")
    if not rows:
        raise ValueError(f"text_classification: {path!r} holds no examples; {LAYOUTS}")
    for column in (text_column, label_column):
        missing = next((i for i, r in enumerate(rows) if r.get(column) is None), None)
        if missing is not None:
            have = ", ".join(map(str, rows[missing])) or "none"
            raise ValueError(f"text_classification: {path!r} has no column {column!r} (row "
                             f"{missing + 1}; its columns: {have}); set text_column / "
                             "label_column")
    blank = next((i for i, r in enumerate(rows) if str(r[label_column]).strip() == ""), None)
    if blank is not None:
        raise ValueError(f"text_classification: {path!r} row {blank + 1} has an empty "
                         f"{label_column!r}")
    return [str(r[text_column]) for r in rows], [_label_key(r[label_column]) for r in rows]


def sorted_labels(labels, path: str, label_column: str) -> list:
    """The distinct labels in class-id order: integers by value, then strings."""
    names = sorted(set(labels), key=lambda v: (isinstance(v, str), v))
    if len(names) < 2:
        raise ValueError(f"text_classification: {path!r} has a single value in column "
                         f"{label_column!r} ({names[0]!r}); classification needs two or more")
    return names


def _text_files(folder: str) -> list[str]:
    files = sorted(e.path for e in os.scandir(folder) if e.is_file() and e.name.endswith(".txt"))
    if not files:
        raise ValueError(f"text_classification: the class folder {folder!r} holds no .txt "
                         f"files; {LAYOUTS}")
    return files


def scan_folder_layout(path: str) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(label names, train files per class, test files per class) of an aclImdb folder."""
    labels = {}
    for split in ("train", "test"):
        folder = os.path.join(path, split)
        if not os.path.isdir(folder):
            raise ValueError(f"text_classification: {folder!r} is missing; {LAYOUTS}")
        labels[split] = {e.name for e in os.scandir(folder) if e.is_dir()}
    names = sorted(labels["train"] & labels["test"])
    if len(names) < 2:
        lonely = sorted(labels["train"] ^ labels["test"])
        missing = [os.path.join(path, "test" if n in labels["train"] else "train", n)
                   for n in lonely]
        raise ValueError(
            f"text_classification: {path!r} needs at least two label folders present in both "
            f"train/ and test/; found train/: {', '.join(sorted(labels['train'])) or 'none'}, "
            f"test/: {', '.join(sorted(labels['test'])) or 'none'}"
            + (f" (missing: {', '.join(missing)})" if missing else "") + f"; {LAYOUTS}")
    return (names, [_text_files(os.path.join(path, "train", n)) for n in names],
            [_text_files(os.path.join(path, "test", n)) for n in names])


def _split_files(path: str) -> tuple[str, str] | None:
    """(train file, test file) of a folder holding train.{csv,jsonl} and test.{csv,jsonl}."""
    found = {}
    for split in ("train", "test"):
        for suffix in (".csv", ".jsonl", ".json"):
            if os.path.isfile(os.path.join(path, split + suffix)):
                found[split] = os.path.join(path, split + suffix)
                break
    if len(found) == 1:
        have = next(iter(found.values()))
        raise ValueError(f"text_classification: {path!r} has {os.path.basename(have)} but no "
                         f"{'test' if 'train' in found else 'train'} file; {LAYOUTS}")
    return (found["train"], found["test"]) if found else None


def _hub_rows(value: str, text_column: str, label_column: str) -> tuple[tuple[list, list], tuple[list, list]]:
    """((texts, labels) of the train split, the same of the test split) of a Hub dataset."""
    what = "text_classification dataset"
    ds = hub_data.load(value, what=what)
    out = []
    for names in (("train",), ("test", "validation")):
        part = hub_data.split_of(ds, names, value, what)
        for column in (text_column, label_column):
            if column not in part.column_names:
                raise ValueError(f"text_classification: {value} has no column {column!r} (columns: "
                                 f"{', '.join(part.column_names)}); set text_column / label_column")
        texts, labels = list(part[text_column]), list(part[label_column])
        if any(not isinstance(t, str) or not t for t in texts):
            raise ValueError(f"text_classification: {value} has an empty or non-text {text_column!r}")
        out.append((texts, labels))
    return out[0], out[1]


def _flatten(files_per_class: list[list[str]]) -> tuple[list[str], np.ndarray]:
    """(all files, class id of each) from one file list per class."""
    files = [f for fs in files_per_class for f in fs]
    return files, np.repeat(np.arange(len(files_per_class)), [len(fs) for fs in files_per_class])


def _read_text(file: str) -> str:
    try:
        with open(file, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"text_classification: {file!r} is not UTF-8 text: {e}") from None


@register
class TextClassification(Task):
    name = "text_classification"
    description = (
        "Text classification (e.g. IMDB) from an aclImdb folder or a CSV/JSONL file, tokenised "
        "with a Hugging Face tokenizer; the label is the target at the last real token."
    )
    fixed_train = True

    def __init__(self, data_path: str | None = None, tokenizer: str | None = None,
                 seq_len: int = 512, text_column: str = "text", label_column: str = "label",
                 num_train_examples: int = 20000, num_test_examples: int = 1000,
                 pool: str = "last", num_valid_examples: int | None = None):
        if not data_path or not isinstance(data_path, str):
            raise ValueError(f"text_classification needs data_path: {LAYOUTS}")
        for column_name, column in (("text_column", text_column), ("label_column", label_column)):
            if not column or not isinstance(column, str):
                raise ValueError(f"{column_name} must be a column name, got {column!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        self.seq_len = check_int("seq_len", seq_len, 1)
        wanted_train = check_int("num_train_examples", num_train_examples, 1)
        wanted_test = check_int("num_test_examples", num_test_examples, 1)
        self.data_path, self.pool = data_path, pool
        # the class attribute stays "per_position" (what the registry checks); mean pooling
        # needs the running-mean head at the same target positions
        self.readout = "cumulative_mean" if pool == "mean" else "per_position"
        self._tokenizer, self.pad_id = load_tokenizer(tokenizer)
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))

        self._files = self._rows = None
        if os.path.isfile(data_path):
            self.layout = "file"
            texts, labels = read_rows(data_path, text_column, label_column)
            if len(texts) < 2:
                raise ValueError(f"text_classification: {data_path!r} holds {len(texts)} "
                                 "example; a single file needs at least 2 (one train, one test)")
            self.label_names = sorted_labels(labels, data_path, label_column)
            self._rows = (texts, labels)
            self.num_test_examples = min(wanted_test, len(texts) - 1)
            pool = len(texts) - self.num_test_examples
        elif hub.is_hub_id(data_path):
            self.layout = "hub"
            train, test = _hub_rows(data_path, text_column, label_column)
            self.label_names = sorted_labels(train[1], data_path, label_column)
            unknown = sorted(set(test[1]) - set(train[1]), key=str)
            if unknown:
                raise ValueError(f"text_classification: {data_path}'s test split has label(s) "
                                 f"{', '.join(map(repr, unknown))} that its train split lacks")
            self._rows = (train, test)
            pool = len(train[0])
            self.num_test_examples = min(wanted_test, len(test[0]))
        elif os.path.isdir(data_path):
            pair = _split_files(data_path)
            if pair is not None:
                self.layout = "files"
                train, test = (read_rows(p, text_column, label_column) for p in pair)
                self.label_names = sorted_labels(train[1], pair[0], label_column)
                unknown = sorted(set(test[1]) - set(train[1]), key=str)
                if unknown:
                    raise ValueError(f"text_classification: {pair[1]!r} has label(s) "
                                     f"{', '.join(map(repr, unknown))} that {pair[0]!r} lacks")
                self._rows = (train, test)
                sizes = len(train[0]), len(test[0])
            else:
                self.layout = "folders"
                self.label_names, train_files, test_files = scan_folder_layout(data_path)
                self._files = (_flatten(train_files), _flatten(test_files))
                sizes = tuple(len(files) for files, _ in self._files)
            pool = sizes[0]
            self.num_test_examples = min(wanted_test, sizes[1])
        else:
            raise ValueError(f"text_classification: no such file or folder {data_path!r} "
                             f"(paths are relative to where ssm-workbench runs); {LAYOUTS}")
        # the training rows give the training examples, then the validation examples
        if num_valid_examples is None:
            self.num_valid_examples = min(self.num_test_examples, pool - min(wanted_train, pool))
        else:
            self.num_valid_examples = check_int("num_valid_examples", num_valid_examples, 0,
                                                pool - 1)
        self.num_train_examples = min(wanted_train, pool - self.num_valid_examples)
        self.num_classes = len(self.label_names)
        self._class_of = {label: i for i, label in enumerate(self.label_names)}
        self._params = dict(data_path=data_path, tokenizer=tokenizer, seq_len=seq_len,
                            text_column=text_column, label_column=label_column,
                            num_train_examples=num_train_examples,
                            num_test_examples=num_test_examples, pool=pool,
                            num_valid_examples=num_valid_examples)

    # -- examples -------------------------------------------------------------------------
    def encode(self, texts: list[str], classes) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (n, seq_len), right-padded with pad_id; targets IGNORE except the class
        id at each example's last real token."""
        n = len(texts)
        inputs = np.full((n, self.seq_len), self.pad_id, np.int64)
        targets = np.full((n, self.seq_len), IGNORE, np.int64)
        for row, encoding in enumerate(self._tokenizer.encode_batch(list(texts))):
            ids = encoding.ids[: self.seq_len]          # keep the first seq_len tokens
            inputs[row, : len(ids)] = ids
            # the target sits where the model has read the whole (truncated) text; an empty
            # text is a lone pad token at position 0
            targets[row, max(len(ids), 1) - 1] = classes[row]
        return inputs, targets

    def _pick(self, split: str, seed: int) -> tuple[list[str], np.ndarray]:
        """(texts, class ids) of this seed's train, valid or test examples."""
        is_train = split != "test"   # validation rows come from the training rows
        wanted = self.num_train_examples if is_train else self.num_test_examples
        # validation: the rows after the training rows in the same permutation
        start = self.num_train_examples if split == "valid" else 0
        if split == "valid":
            wanted = self.num_valid_examples
        if self.layout == "file":
            # one permutation per seed: test rows first, training rows from the rest
            texts, labels = self._rows
            order = rng_for(seed, SPLIT_STREAM).permutation(len(texts))
            first = self.num_test_examples + start
            idx = np.sort(order[: self.num_test_examples] if not is_train
                          else order[first: first + wanted])
        else:
            part = 0 if is_train else 1
            if self.layout == "folders":
                files, classes = self._files[part]
            else:
                texts, labels = self._rows[part]
            size = len(files) if self.layout == "folders" else len(texts)
            stream = TRAIN_STREAM if is_train else TEST_STREAM
            idx = np.sort(rng_for(seed, stream, SPLIT_STREAM).permutation(size)[
                start: start + wanted])
            if self.layout == "folders":  # read only the chosen files
                return [_read_text(files[i]) for i in idx], classes[idx]
        return [texts[i] for i in idx], np.array([self._class_of[labels[i]] for i in idx],
                                                 np.int64)

    def _arrays(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(train inputs, train targets, test inputs, test targets), tokenised once per seed."""
        cache = self.__dict__.setdefault("_split_cache", {})
        if seed not in cache:
            cache.clear()  # keep one seed's data only
            tx, ty = self.encode(*self._pick("train", seed))
            vx, vy = self.encode(*self._pick("test", seed))
            seen = {row.tobytes() for row in tx}
            fresh = np.array([row.tobytes() not in seen for row in vx], bool)
            if len(vx) and not fresh.any():
                raise ValueError(f"text_classification: every test example of {self.data_path!r} "
                                 f"is also a training example (after tokenising to {self.seq_len} "
                                 "tokens): nothing left to evaluate on")
            cache[seed] = (tx, ty, vx[fresh], vy[fresh])
        return cache[seed]

    def _train_arrays(self, seed):
        tx, ty, _, _ = self._arrays(seed)
        return tx, ty

    def eval_sets(self, seed):
        _, _, vx, vy = self._arrays(seed)
        return {"": self._to_batch(vx, vy)}

    def valid_set(self, seed):
        tx, _, vx, _ = self._arrays(seed)
        x, y = self.encode(*self._pick("valid", seed))
        seen = {row.tobytes() for part in (tx, vx) for row in part}
        fresh = np.array([row.tobytes() not in seen for row in x], bool)
        return self._to_batch(x[fresh], y[fresh])

    def sample(self, batch_size, seed=0):
        # training examples of this seed's split only, never test ones
        return self._rows_of_train(batch_size, seed, rng_for(seed, TRAIN_STREAM, 1))

    def train_batch(self, batch_size, step, seed):
        return self._rows_of_train(batch_size, seed, rng_for(seed, TRAIN_STREAM, 2, step))

    def _rows_of_train(self, batch_size: int, seed: int, rng: np.random.Generator):
        tx, ty = self._train_arrays(seed)
        idx = rng.integers(0, len(tx), size=batch_size)
        return self._to_batch(tx[idx], ty[idx])
