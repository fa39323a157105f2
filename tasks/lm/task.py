"""The ``lm`` task: next-token prediction on a tokenised corpus.

``tasks.build("lm", source="stdlib", tokenizer="bpe", vocab_size=4096, seq_len=256)``

- data: the corpus (tasks/lm/sources.py), split by document into train / valid / test
  (tasks/lm/split.py, ``valid_fraction`` / ``test_fraction`` of the documents; a source
  that is one text file is split by paragraph, or cut by position as nanoGPT cuts its
  ``input.txt``, unless ``document`` says otherwise: sources.py's module doc), tokenised
  once into cached token files (tasks/lm/tokenfile.py) by the tokenizer named
  (tasks/lm/tokenizer.py: ``bytes``, ``char``, ``bpe`` with ``vocab_size``, or a
  pretrained one, whose ``vocab_size`` may give the embedding rows, padded as Mamba pads
  GPT-NeoX's 50,277 ids to 50,280). Building the task reads nothing; the corpus is tokenised
  the first time data (or, for ``char`` and pretrained tokenizers without ``vocab_size``,
  the vocabulary size) is asked for, so ``profile check`` and the sweep form stay fast.
  Before launch they call :meth:`LMTask.preflight` (tasks/lm/preflight.py): an empty or
  binary corpus, or a split too small for one context, is refused in one line with the
  tokens each split would get, counted from bytes without tokenising.
- inputs: ``seq_len`` consecutive tokens; targets: the next token at every position
  (documents are joined by the end-of-text id, which is predicted like any token).
- training: fresh batches of windows at uniformly random offsets in the training tokens,
  the offsets drawn from ``(seed, TRAIN, 2, step)``: a function of seed and step, so a
  resumed run sees exactly the windows of an uninterrupted one. ``sample`` draws from
  ``(seed, TRAIN, 1)``.
- evaluation (``""``: the test split; ``valid_set``: the valid split): up to
  ``num_test_examples`` / ``num_valid_examples`` fixed, non-overlapping windows of the
  split, spread evenly over it (``0`` = every window); the same for every seed.

Metrics: ``loss`` is the mean cross-entropy in nats per token; ``extra_metrics`` adds
``perplexity`` = exp(loss) and ``bits_per_byte`` = total nats over the eval windows /
ln 2 / the UTF-8 bytes of text their target tokens cover (counted per token at
tokenisation time, so exact; end-of-text tokens cover none), the number that compares
models across tokenizers. The worker records ``tokens_trained`` (steps x batch x seq_len).
A budget in bytes of text (``train.bytes``) becomes steps through
:meth:`LMTask.train_bytes_per_token` (the training split's text bytes / its tokens, from the
token files' meta.json), so runs of different tokenizers train on the same amount of text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tasks.base import Batch, Task, check_bool, check_int
from tasks.metrics import AccuracyCounts
from tasks.registry import register
from tasks.lm import tokenfile
from tasks.lm import tokenizer as toks
from tasks.lm.sources import DEFAULT_FRACTIONS, Source
from tasks.lm.split import SplitRule

BPE_DEFAULT_VOCAB = 4096


@dataclass
class LMBatch(Batch):
    target_bytes: int = 0   # UTF-8 bytes of text the targets cover (bits per byte)


@register
class LMTask(Task):
    name = "lm"
    description = ("Token-level language modelling on a corpus (files, folders, globs, JSONL/Parquet, "
                   "'hf:ID' datasets, or 'stdlib'), bytes/char/BPE/pretrained tokenizers; loss, "
                   "perplexity, bits per byte.")

    def __init__(self, source: str = "stdlib", tokenizer: str = "bytes", vocab_size: int | None = None,
                 seq_len: int = 256, document: str = "auto", text_column: str = "text",
                 valid_fraction: float = DEFAULT_FRACTIONS[0], test_fraction: float = DEFAULT_FRACTIONS[1],
                 num_test_examples: int = 64, num_valid_examples: int | None = None,
                 hf_config: str | None = None, hf_split: str = "train", streaming: bool = False,
                 max_documents: int = 0):
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.num_test_examples = check_int("num_test_examples", num_test_examples, 0)
        self.num_valid_examples = (self.num_test_examples if num_valid_examples is None
                                   else check_int("num_valid_examples", num_valid_examples, 0))
        if not isinstance(tokenizer, str) or not tokenizer:
            raise ValueError("lm: tokenizer must be 'bytes', 'char', 'bpe', or a tokenizer folder / hub id")
        self.tokenizer_name = tokenizer
        self.rows: int | None = None   # a pretrained tokenizer's embedding rows, when given
        if tokenizer == "bpe":
            self.bpe_vocab = check_int("vocab_size", BPE_DEFAULT_VOCAB if vocab_size is None else vocab_size,
                                       258, 1 << 20)   # 256 bytes + end of text + a merge
        elif vocab_size is not None and tokenizer in toks.BUILTIN:
            raise ValueError(f"lm: vocab_size is the size of a trained BPE (tokenizer = 'bpe') or a "
                             f"pretrained tokenizer's embedding rows; tokenizer {tokenizer!r} has its own "
                             f"(to pair tokenizers and sizes in a grid: \"task.tokenizer\" = [\"bytes\", "
                             f"{{name = \"bpe\", vocab_size = 2048}}])")
        elif vocab_size is not None:
            # a pretrained tokenizer's rows of the embedding and head, at least its ids: Mamba
            # pads GPT-NeoX-20B's 50,277 ids to 50,280 (a multiple of 8). Known without the
            # tokenizer, so a dry run sizes the model offline; checked when the data is made.
            self.rows = check_int("vocab_size", vocab_size, 1, 1 << 31)
        for name, v in (("text_column", text_column), ("hf_split", hf_split)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"lm: {name} must be a non-empty string, got {v!r}")
        if hf_config is not None and not isinstance(hf_config, str):
            raise ValueError(f"lm: hf_config must be a string, got {hf_config!r}")
        self.split = SplitRule(valid_fraction, test_fraction)
        self.source = Source(source, text_column=text_column, document=document, hf_config=hf_config,
                             hf_split=hf_split, streaming=check_bool("streaming", streaming),
                             max_documents=check_int("max_documents", max_documents, 0),
                             fractions=(valid_fraction, test_fraction))
        self.fixed_train = False
        self.num_train_examples = 0   # fresh windows every step: budgets are steps (or tokens)
        self.tokens_per_example = self.seq_len   # a target at every position
        self._tok: toks.LMTokenizer | None = None
        self._data: tokenfile.Prepared | None = None
        self._params = dict(source=source, tokenizer=tokenizer, vocab_size=vocab_size, seq_len=seq_len,
                            document=document, text_column=text_column, valid_fraction=valid_fraction,
                            test_fraction=test_fraction, num_test_examples=num_test_examples,
                            num_valid_examples=num_valid_examples, hf_config=hf_config,
                            hf_split=hf_split, streaming=streaming, max_documents=max_documents)

    # -- tokenizer and data, made on first use --------------------------------------------
    def _train_texts(self):
        for doc in self.source.documents():
            if self.split.of(doc.key) == "train":
                yield from doc.pieces()

    def _fit_key(self) -> str:
        """The cache name of a fitted ``char`` / ``bpe`` tokenizer of this corpus and split."""
        kind = self.tokenizer_name
        key = tokenfile.key_of({"fit": kind, "source": self.source.fingerprint(),
                                "split": self.split.identity(),
                                "bpe": [getattr(self, "bpe_vocab", None), toks.BPE_VERSION]})
        return f"{kind}-{key}"

    def _data_key(self, tok: toks.LMTokenizer) -> tuple[dict, str]:
        identity = {"source": self.source.fingerprint(), "split": self.split.identity(),
                    "tokenizer": tok.identity()}
        return identity, f"{tok.kind}-{tokenfile.key_of(identity)}"

    def _cached_prepared(self) -> tokenfile.Prepared | None:
        """The prepared token cache when it exists already, else None; fits and tokenises
        nothing (a ``char`` / ``bpe`` tokenizer is used only when its fit is cached:
        tokenfile.cached_fit keeps it at ``<cache>/tokenizers/<name>.json``)."""
        if self._data is not None:
            return self._data
        try:
            if self._tok is None and self.tokenizer_name in ("char", "bpe"):
                fit = tokenfile.cache_root() / "tokenizers" / f"{self._fit_key()}.json"
                if not fit.is_file():
                    return None
            _, key = self._data_key(self.tokenizer)
            found, _ = tokenfile.load(tokenfile.cache_root() / key, key)
        except (OSError, ValueError, KeyError):
            return None
        return found

    def cached_split_tokens(self) -> dict[str, int] | None:
        """Tokens per split from the prepared token cache when it exists already, else None
        (:meth:`_cached_prepared`: nothing is fitted or tokenised)."""
        found = self._cached_prepared()
        return None if found is None else {s: len(f) for s, f in found.tokens.items()}

    @staticmethod
    def _bytes_per_token(meta: dict) -> float:
        train = meta["splits"]["train"]
        return train["text_bytes"] / max(train["tokens"], 1)

    def train_bytes_per_token(self) -> float:
        """UTF-8 bytes of text per token of the training split (its text bytes / its tokens,
        end-of-text tokens included, as the training windows hold them; meta.json's counts):
        what turns a budget in bytes of text (``train.bytes``) into tokens, so runs of
        different tokenizers see the same text. Prepares the data when it is not yet."""
        return self._bytes_per_token(self.data.meta)

    def cached_train_bytes_per_token(self) -> float | None:
        """:meth:`train_bytes_per_token` from the prepared cache when present, else None
        (tokenises nothing: for a dry run)."""
        found = self._cached_prepared()
        return None if found is None else self._bytes_per_token(found.meta)

    def preflight(self) -> str:
        """Before launch (tasks/lm/preflight.py): a ValueError naming the source and the
        tokens each split would get when the corpus cannot train this task (empty, binary,
        a split shorter than seq_len + 1); else one line of what each split gets."""
        from tasks.lm import preflight

        return preflight.check(self)

    @property
    def tokenizer(self) -> toks.LMTokenizer:
        if self._tok is None:
            kind = self.tokenizer_name
            if kind == "bytes":
                self._tok = toks.BytesTokenizer()
            elif kind in ("char", "bpe"):
                fitted = tokenfile.cached_fit(tokenfile.cache_root(), self._fit_key(),
                                              lambda: toks.fit(kind, self._train_texts,
                                                               getattr(self, "bpe_vocab", None)))
                self._tok = toks.from_fitted(kind, fitted)
            else:
                self._tok = toks.load_pretrained(kind)
        return self._tok

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        # a BPE's size is its parameter (a tiny corpus may leave it a few merges short):
        # known without training it, so checks and estimates stay cheap
        if self.tokenizer_name == "bpe":
            return self.bpe_vocab
        if self.rows is not None:  # a pretrained tokenizer's embedding rows, as given
            return self.rows
        return self.tokenizer.vocab_size

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self.vocab_size

    @property
    def data(self) -> tokenfile.Prepared:
        if self._data is None:
            tok = self.tokenizer
            identity, key = self._data_key(tok)
            data = tokenfile.prepare(
                tokenfile.cache_root(), key, self.source.documents, self.split,
                lambda: tok, identity, total=self.source.size_hint(),
                label=f"lm: tokenising {self.source.spec} ({tok.kind})")
            if tok.vocab_size > self.vocab_size:
                raise ValueError(f"lm: the tokenizer has {tok.vocab_size} ids, more than vocab_size "
                                 f"{self.vocab_size} (the embedding rows): give vocab_size >= "
                                 f"{tok.vocab_size}, or leave it out")
            for split, f in data.tokens.items():
                n = len(f)
                if n < self.seq_len + 1:
                    raise ValueError(
                        f"lm: the {split} split of {self.source.spec!r} has {n} tokens, fewer than "
                        f"seq_len + 1 = {self.seq_len + 1}; use a larger corpus or "
                        f"{'larger' if split != 'train' else 'smaller'} valid_fraction / test_fraction")
            self._data = data
        return self._data

    def split_tokens(self) -> dict[str, int]:
        return {s: len(f) for s, f in self.data.tokens.items()}

    def encode(self, text: str) -> np.ndarray:
        return self.tokenizer.encode(text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    # -- batches -------------------------------------------------------------------------
    def _generate(self, n, rng):
        train = self.data.tokens["train"]
        starts = rng.integers(0, len(train) - self.seq_len, size=n)
        w = train.windows(starts, self.seq_len + 1)
        return w[:, :-1], w[:, 1:]

    def _avoid_test(self, n, rng, seed, max_rounds=0):
        # the splits are disjoint by document: a training window holds no test text
        return self._generate(n, rng)

    def _fixed_windows(self, split: str, limit: int) -> LMBatch:
        f = self.data.tokens[split]
        avail = (len(f) - 1) // self.seq_len
        n = avail if limit == 0 else min(avail, limit)
        # evenly spread over the split (whole windows of the seq_len grid: never overlapping)
        starts = (np.arange(n, dtype=np.int64) * avail // max(n, 1)) * self.seq_len
        w = f.windows(starts, self.seq_len + 1)
        nbytes = self.data.window_bytes(split, starts + 1, self.seq_len)
        batch = self._to_batch(w[:, :-1], w[:, 1:])
        return LMBatch(batch.inputs, batch.targets, target_bytes=nbytes)

    def eval_sets(self, seed):
        return {"": self._fixed_windows("test", self.num_test_examples)}

    def valid_set(self, seed):
        if self.num_valid_examples == 0:
            return LMBatch(*self._to_batch(np.zeros((0, self.seq_len), np.int64),
                                           np.zeros((0, self.seq_len), np.int64)))
        return self._fixed_windows("valid", self.num_valid_examples)

    # -- metrics -------------------------------------------------------------------------
    def extra_metrics(self, counts: AccuracyCounts, batch: Batch | None = None) -> dict[str, float]:
        out = {"perplexity": math.exp(min(counts.loss, 700.0)) if counts.token_total else float("nan")}
        nbytes = getattr(batch, "target_bytes", 0)
        if nbytes:
            out["bits_per_byte"] = counts.loss_sum / math.log(2) / nbytes
        return out
