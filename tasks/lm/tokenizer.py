"""The LM task's tokenizers: text -> token ids, and how many UTF-8 bytes each token covers.

- ``bytes``: the UTF-8 bytes themselves (ids 0..255), end of text 256: vocabulary 257.
- ``char``: one id per character (code point) of the training split, sorted by code point;
  then ``<unk>`` (characters seen only outside training) and end of text.
- ``bpe``: a byte-level BPE (GPT-2's scheme: bytes mapped to printable characters, split by
  its pre-tokenisation regex, merges learned) trained with the ``tokenizers`` library on
  the training split, ``vocab_size`` ids including ``<|endoftext|>`` (id 0); every byte is
  in its alphabet, so any text round-trips.
- anything else: a pretrained tokenizer: a folder holding ``tokenizer.json`` (as
  ``save_pretrained`` writes it), such a file, or a hub id whose ``tokenizer.json`` comes
  through huggingface_hub's cache (models/hub.py: offline mode honoured, one-line errors). End of text is its EOS token
  (``tokenizer_config.json``'s ``eos_token``, else ``<|endoftext|>``, ``</s>``, ...), one is
  added when it has none.

Byte counts (bits per byte must be exact): each token is charged the text from the end of
the previous token's span to the end of its own (spans from the library's offsets, turned
from characters into UTF-8 bytes). So a character split over two byte-level tokens is
charged once, to the token that completes it, text a tokenizer drops (a normaliser, a
whitespace pre-tokenizer) goes to the next token, and the counts of a document sum to its
UTF-8 length exactly (``missing`` carries what follows the last token to the next token
written). The end-of-text token covers no text: 0 bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Iterable

import numpy as np

EOT = "<|endoftext|>"
EOS_FALLBACKS = (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")
BUILTIN = ("bytes", "char", "bpe")
BPE_VERSION = 1   # bump when the BPE recipe below changes: it is part of the cache key
TOKENIZERS_EXTRA = "pip install 'ssm-workbench[lm]'"

Encoded = tuple[np.ndarray, "np.ndarray | None", int]  # ids, byte counts (or None), missing bytes


def utf8_lengths(codepoints: np.ndarray) -> np.ndarray:
    """UTF-8 bytes of each code point (surrogates as 3, as 'surrogatepass' writes them)."""
    cp = codepoints.astype(np.uint32, copy=False)
    return (1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000)).astype(np.int64)


def codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


class LMTokenizer:
    kind: str = ""
    vocab_size: int = 0
    eot_id: int = 0

    def identity(self) -> dict:
        raise NotImplementedError

    def encode_batch(self, texts: list[str], with_bytes: bool) -> list[Encoded]:
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text], False)[0][0]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError


class BytesTokenizer(LMTokenizer):
    kind, vocab_size, eot_id = "bytes", 257, 256

    def identity(self) -> dict:
        return {"kind": "bytes"}

    def encode_batch(self, texts, with_bytes):
        out = []
        for t in texts:
            ids = np.frombuffer(t.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.int64)
            out.append((ids, np.ones(len(ids), np.int64) if with_bytes else None, 0))
        return out

    def decode(self, ids):
        b = bytes(int(i) for i in ids if int(i) < 256)
        return b.decode("utf-8", "replace")


class CharTokenizer(LMTokenizer):
    kind = "char"

    def __init__(self, chars: list[int]):
        self.cps = np.array(sorted(chars), dtype=np.uint32)
        self.unk_id = len(self.cps)
        self.eot_id = len(self.cps) + 1
        self.vocab_size = len(self.cps) + 2

    def identity(self) -> dict:
        return {"kind": "char", "vocab": hashlib.sha256(self.cps.tobytes()).hexdigest()}

    def encode_batch(self, texts, with_bytes):
        out = []
        for t in texts:
            cp = codepoints(t)
            idx = np.searchsorted(self.cps, cp)
            hit = self.cps[np.minimum(idx, len(self.cps) - 1)] == cp if len(self.cps) else cp != cp
            ids = np.where(hit, idx, self.unk_id).astype(np.int64)
            out.append((ids, utf8_lengths(cp) if with_bytes else None, 0))
        return out

    def decode(self, ids):
        chars = []
        for i in ids:
            i = int(i)
            chars.append(chr(self.cps[i]) if i < len(self.cps) else "\ufffd" if i == self.unk_id else "")
        return "".join(chars)


class HFTokenizer(LMTokenizer):
    """A ``tokenizers.Tokenizer`` (a trained BPE or a pretrained one)."""

    def __init__(self, tok, kind: str, ident: dict, eot_id: int):
        self.tok, self.kind, self._ident, self.eot_id = tok, kind, ident, eot_id
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), eot_id + 1)

    def identity(self) -> dict:
        return dict(self._ident)

    def encode_batch(self, texts, with_bytes):
        if not with_bytes:  # training text: ids only (the fast path computes no offsets)
            encs = self.tok.encode_batch_fast(texts, add_special_tokens=False)
            return [(np.array(e.ids, dtype=np.int64), None, 0) for e in encs]
        out = []
        for t, e in zip(texts, self.tok.encode_batch(texts, add_special_tokens=False)):
            ids = np.array(e.ids, dtype=np.int64)
            ends = np.array([b for _, b in e.offsets], dtype=np.int64)   # in characters
            if t.isascii():
                total = len(t)
            else:
                cum = np.concatenate([[0], np.cumsum(utf8_lengths(codepoints(t)))])
                total = int(cum[-1])
                ends = cum[ends] if len(ends) else ends
            ends = np.maximum.accumulate(ends) if len(ends) else ends
            lens = np.diff(ends, prepend=0)
            out.append((ids, lens, total - (int(ends[-1]) if len(ends) else 0)))
        return out

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


# -- building ------------------------------------------------------------------------------
def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(f"lm: this tokenizer needs the tokenizers library: {TOKENIZERS_EXTRA}") from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE learned from ``texts`` (streamed: the trainer keeps word counts)."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_chars(texts: Iterable[str]) -> list[int]:
    seen: set[str] = set()
    for t in texts:
        seen.update(t)
    return sorted(map(ord, seen))


def pretrained_file(ref: str) -> str:
    """The tokenizer.json of a folder, a file, or a hub id (through huggingface_hub)."""
    path = os.path.expanduser(ref)
    if os.path.isdir(path):
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise ValueError(f"lm: tokenizer folder {ref!r} has no tokenizer.json (a fast "
                             "tokenizer's save_pretrained writes one)")
        return file
    if os.path.isfile(path):
        return path
    if ref.count("/") > 1 or ref.startswith((".", "/", "~")):
        raise ValueError(f"lm: tokenizer {ref!r} is none of {', '.join(BUILTIN)}, no folder or "
                         "file here, and no hub id (owner/name)")
    from models import hub  # the standard cache, offline mode, one line on failure

    folder = hub.snapshot(ref if hub.is_hub_id(ref) else hub.PREFIX + ref, "lm tokenizer",
                          patterns=hub.TOKENIZER_FILES)
    file = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(file):
        raise ValueError(f"lm: the Hub repository {ref} has no tokenizer.json (a fast tokenizer's "
                         "save_pretrained writes one); give a folder holding one")
    return file


def _eos_name(file: str, tok) -> str | None:
    config = os.path.join(os.path.dirname(file), "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and tok.token_to_id(eos) is not None:
            return eos
    return next((t for t in EOS_FALLBACKS if tok.token_to_id(t) is not None), None)


def load_pretrained(ref: str) -> HFTokenizer:
    tk = _tokenizers()
    file = pretrained_file(ref)
    with open(file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    try:
        tok = tk.Tokenizer.from_file(file)
    except Exception as e:  # the library raises a bare Exception on a malformed file
        raise ValueError(f"lm: cannot read tokenizer {file!r}: {e}") from None
    tok.no_padding()
    tok.no_truncation()
    eos = _eos_name(file, tok)
    if eos is None:  # documents must be separated: give the tokenizer an end-of-text token
        tok.add_special_tokens([EOT])
        eos = EOT
    return HFTokenizer(tok, "pretrained", {"kind": "pretrained", "sha256": digest, "eot": eos},
                       tok.token_to_id(eos))


def from_fitted(kind: str, fitted: str) -> LMTokenizer:
    """A char or BPE tokenizer from its cached fit (a JSON list of code points, or
    the BPE's tokenizer.json text)."""
    if kind == "char":
        return CharTokenizer(json.loads(fitted))
    tk = _tokenizers()
    tok = tk.Tokenizer.from_str(fitted)
    return HFTokenizer(tok, "bpe", {"kind": "bpe", "version": BPE_VERSION,
                                    "sha256": hashlib.sha256(fitted.encode()).hexdigest()},
                       tok.token_to_id(EOT))


def fit(kind: str, texts: Callable[[], Iterable[str]], vocab_size: int | None) -> str:
    """The fitted state of a char or BPE tokenizer, as text to cache."""
    if kind == "char":
        return json.dumps(train_chars(texts()))
    return train_bpe(texts(), int(vocab_size)).to_str()


# -- kept with a run's weights ------------------------------------------------------------
CONFIG_FILE = "tokenizer_config.json"   # kind and end-of-text token (as a checkpoint folder's)
TOKENIZER_FILE = "tokenizer.json"       # a BPE's / pretrained tokenizer's own JSON (tokenizers)
CHARS_FILE = "chars.json"               # a char tokenizer's vocabulary: its code points, in id order


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(tok: LMTokenizer, folder: str) -> list[str]:
    """Write ``tok`` into ``folder`` as files a reader rebuilds it from without the corpus:
    ``tokenizer.json`` (the ``tokenizers`` library's own file: ``Tokenizer.from_file`` and
    ``PreTrainedTokenizerFast(tokenizer_file=...)`` read it) for a BPE or pretrained one,
    ``chars.json`` (the code points, id = position) for ``char``, and ``tokenizer_config.json``
    (kind, ``eos_token``, identity) last, so a folder holding it holds the rest. Returns
    the names written."""
    os.makedirs(folder, exist_ok=True)
    config = {"kind": tok.kind, "identity": tok.identity(), "vocab_size": tok.vocab_size,
              "eot_id": int(tok.eot_id)}
    names = []
    if isinstance(tok, HFTokenizer):
        _write(os.path.join(folder, TOKENIZER_FILE), tok.tok.to_str())
        config["eos_token"] = tok.tok.id_to_token(int(tok.eot_id))
        names.append(TOKENIZER_FILE)
    elif isinstance(tok, CharTokenizer):
        _write(os.path.join(folder, CHARS_FILE), json.dumps([int(c) for c in tok.cps]))
        names.append(CHARS_FILE)
    elif not isinstance(tok, BytesTokenizer):
        raise ValueError(f"lm: cannot keep a tokenizer of kind {tok.kind!r}")
    _write(os.path.join(folder, CONFIG_FILE), json.dumps(config, indent=1))
    return names + [CONFIG_FILE]


def saved(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, CONFIG_FILE))


def load_saved(folder: str) -> LMTokenizer:
    """The tokenizer :func:`save` wrote into ``folder``: the same ids as when it was saved
    (a BPE is read from its file, never fitted again). A ValueError naming the file when
    a file is missing or unreadable."""
    cfg_path = os.path.join(folder, CONFIG_FILE)
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        kind = cfg["kind"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"lm: the kept tokenizer {cfg_path} cannot be read ({e})") from None
    if kind == "bytes":
        return BytesTokenizer()
    if kind == "char":
        path = os.path.join(folder, CHARS_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                return CharTokenizer(json.load(f))
        except (OSError, ValueError) as e:
            raise ValueError(f"lm: the kept tokenizer {path} cannot be read ({e})") from None
    path = os.path.join(folder, TOKENIZER_FILE)
    tk = _tokenizers()
    try:
        tok = tk.Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception on a missing or malformed file
        raise ValueError(f"lm: the kept tokenizer {path} cannot be read ({e})") from None
    eot = tok.token_to_id(cfg.get("eos_token") or EOT)
    if eot is None:
        raise ValueError(f"lm: the kept tokenizer {path} has no end-of-text token {cfg.get('eos_token')!r}")
    return HFTokenizer(tok, kind, cfg.get("identity") or {"kind": kind}, eot)
