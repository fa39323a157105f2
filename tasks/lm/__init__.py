"""Token-level language modelling (the ``lm`` task): corpora, tokenizers, token files.

sources.py    where documents come from (files, folders, globs, JSONL/Parquet, HF datasets, stdlib)
split.py      train / valid / test by a hash of each document (or pinned: one file cut by position)
fingerprint.py a corpus's identity, for the token cache's key and a run's record
digest.py     the files' content digest, cached by path, size and mtime
preflight.py  before launch: an empty, binary or too-small corpus refused; tokens per split from bytes
tokenizer.py  bytes, char, BPE (trained with ``tokenizers``), pretrained; bytes per token
tokenfile.py  tokenise once into cached flat token files (atomic, locked), read by window
task.py       the registered task: random training windows, fixed eval windows, bits per byte
bench.py      ``python -m tasks.lm.bench``: memory while tokenising and sampling (RSS printed)
"""
from tasks.lm.task import LMBatch, LMTask  # noqa: F401  (registers "lm")
