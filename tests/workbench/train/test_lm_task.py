"""The token-level LM task (tasks/lm, issue 33 item 1): tokenisation round trips for every
tokenizer, exact byte counts and bits per byte against a hand count, disjoint splits by
document, the token cache (reused; a partial or damaged one never), Hugging Face datasets
from local folders and files, and a tiny run through the real worker.

Every corpus is made here; the token cache goes to a folder of the test (SSM_WORKBENCH_DATA).
Memory over large token files is shown by ``python -m tasks.lm.bench``, not asserted here.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import tasks
from helpers import tiny_lm_profile_text
from tasks.lm import tokenfile
from tasks.lm.split import SplitRule
from tasks.metrics import AccuracyCounts

pytest.importorskip("tokenizers")

RULE = SplitRule(0.2, 0.2)   # large fractions: a handful of documents reach every split
LINES = [f"{i}: the {['quick', 'lazy', 'naïve'][i % 3]} fox {i * 7 % 13} — café € {'😀' * (i % 3)}"
         for i in range(120)]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("SSM_WORKBENCH_DATA", str(d))
    return d / "lm"


@pytest.fixture
def corpus(tmp_path):
    """A folder of 30 small text files (non-ASCII included), one document each."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(30):
        (folder / f"doc{i:02d}.txt").write_text("\n".join(LINES[i * 4:(i + 1) * 4]) + "\n", "utf-8")
    return folder


def build(source, **kw):
    params = dict(source=str(source), seq_len=8, valid_fraction=0.2, test_fraction=0.2,
                  num_test_examples=4)
    return tasks.build("lm", **{**params, **kw})


def split_documents(t, split: str) -> list[str]:
    """The split's token file cut at end-of-text and decoded: its documents, in order."""
    ids = t.data.tokens[split].memmap()
    eot = t.tokenizer.eot_id
    ends = np.flatnonzero(ids == eot)
    assert len(ends) and ends[-1] == len(ids) - 1   # every document ends with end-of-text
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [t.decode(ids[s:e]) for s, e in zip(starts, ends)]


def split_byte_counts(t, split: str) -> list[int]:
    """Per document, the bytes its tokens (and its end-of-text) are charged."""
    ids = t.data.tokens[split].memmap()
    counts = t.data.nbytes[split].memmap().astype(np.int64)
    ends = np.flatnonzero(ids == t.tokenizer.eot_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [int(counts[s:e + 1].sum()) for s, e in zip(starts, ends)]


def save_pretrained_tokenizer(folder, texts) -> None:
    """A tokenizer folder as save_pretrained writes one: a byte-level BPE with </s> as EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))


# ------------------------------------------------------------------- round trips, byte counts
@pytest.mark.parametrize("kind", ["bytes", "char", "bpe", "pretrained"])
def test_round_trip_and_exact_byte_counts(tmp_path, corpus, kind):
    if kind == "pretrained":
        save_pretrained_tokenizer(tmp_path / "tok", LINES)
        t = build(corpus, tokenizer=str(tmp_path / "tok"))
    else:
        t = build(corpus, tokenizer=kind, **({"vocab_size": 300} if kind == "bpe" else {}))
    texts = {f.name: f.read_text("utf-8") for f in sorted(corpus.iterdir())}
    found = []
    for split in ("train", "valid", "test"):
        docs = split_documents(t, split)
        if kind == "char" and split != "train":
            # characters are those of the training split; others are <unk>, decoded as U+FFFD
            assert all(d.replace("\ufffd", "") for d in docs)
        else:
            found += docs
        if split != "train":
            # each document's tokens are charged exactly its UTF-8 bytes
            assert split_byte_counts(t, split) == [len(d.encode()) for d in docs] or kind == "char"
            want = sum(len(x.encode()) for x in texts.values() if RULE.of(_file_key(corpus, x)) == split)
            assert t.data.meta["splits"][split]["text_bytes"] == want
            assert int(t.data.nbytes[split].memmap().sum(dtype=np.int64)) == want
    if kind != "char":
        assert sorted(found) == sorted(texts.values())
    else:
        assert sorted(split_documents(t, "train")) == sorted(
            x for x in texts.values() if RULE.of(_file_key(corpus, x)) == "train")
    sample = split_documents(t, "train")[0]
    assert t.decode(t.encode(sample)) == sample
    assert t.data.tokens["train"].dtype == np.dtype("<u2")
    x, y = t.sample(3, seed=0)
    assert x.shape == y.shape == (3, 8) and int(x.max()) < t.vocab_size
    assert np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())   # targets: the next token


def save_whitespace_tokenizer(folder, texts) -> None:
    """A tokenizer that drops text (its pre-tokenizer removes spaces): the dropped bytes are
    charged to the next token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("kind", ["bytes", "bpe", "pretrained", "drops-spaces"])
def test_every_prefix_of_a_document_is_charged_its_bytes(tmp_path, corpus, kind):
    # what bits per byte over any window needs: the bytes charged to tokens [0, k) of a
    # document are the UTF-8 bytes of the text up to the end of token k-1's span, checked
    # wherever the prefix decodes to whole characters (byte-level tokens may split one)
    if kind == "pretrained":
        save_pretrained_tokenizer(tmp_path / "tok", LINES)
    if kind == "drops-spaces":
        save_whitespace_tokenizer(tmp_path / "tok", LINES)
    t = build(corpus, tokenizer=str(tmp_path / "tok") if kind in ("pretrained", "drops-spaces") else kind,
              **({"vocab_size": 300} if kind == "bpe" else {}))
    texts = [f.read_text("utf-8") for f in sorted(corpus.iterdir())]
    checked = 0
    for split in ("valid", "test"):
        ids = t.data.tokens[split].memmap()
        counts = t.data.nbytes[split].memmap().astype(np.int64)
        ends = np.flatnonzero(ids == t.tokenizer.eot_id)
        docs = [x for x in texts if RULE.of(_file_key(corpus, x)) == split]   # corpus order
        assert len(docs) == len(ends)
        for s, e, doc in zip(np.concatenate([[0], ends[:-1] + 1]), ends, docs):
            enc = t.tokenizer.encode_batch([doc], with_bytes=True)[0]
            spans = [b for _, b in t.tokenizer.tok.encode(doc, add_special_tokens=False).offsets] \
                if kind in ("bpe", "pretrained", "drops-spaces") else None
            cum = np.cumsum(counts[s:e])
            for k in range(1, e - s + 1):
                if spans is not None:
                    want = len(doc[:max(spans[:k])].encode())
                else:
                    prefix = t.decode(ids[s:s + k])
                    if "\ufffd" in prefix:
                        continue
                    want = len(prefix.encode())
                assert cum[k - 1] == want, (split, k)
                checked += 1
            assert cum[-1] + counts[e] == len(doc.encode())   # the rest (dropped) goes to <eot>
            assert np.array_equal(enc[0], ids[s:e])
    assert checked > 100


def _file_key(folder, text: str) -> bytes:
    raw = text.encode()
    return raw[:64 << 10] + str(len(raw)).encode()


def test_bits_per_byte_against_a_hand_count(tmp_path):
    # one test document, e.g. "aé€😀": 1 + 2 + 3 + 4 = 10 UTF-8 bytes; char tokens a é € 😀 <eot>.
    # seq_len 2: windows at 0 and 2, targets (é, €) and (😀, <eot>): 2 + 3 + 4 + 0 = 9 bytes
    rule = SplitRule(0.2, 0.2)
    # (the first letter varies until the hash puts the document in test; the count is the same)
    test_doc = next(d for d in (f"{c}é€😀" for c in "abcdefghijklmnopqrstuvwxyz")
                    if rule.of(d.encode()) == "test")
    others = [f"line {i} aé€😀" for i in range(60)]
    lines = [x for x in others if rule.of(x.encode()) != "test"] + [test_doc]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n", "utf-8")
    t = build(tmp_path / "c.txt", tokenizer="char", document="line", seq_len=2, num_test_examples=0)
    ev = t.eval_sets(0)[""]
    assert [t.decode(row) for row in ev.targets.tolist()] == ["é€", "😀"]
    assert ev.target_bytes == 9
    c = AccuracyCounts(token_total=4, loss_sum=9 * math.log(2) * 1.5)
    m = t.extra_metrics(c, ev)
    assert m["bits_per_byte"] == pytest.approx(1.5)
    assert m["perplexity"] == pytest.approx(math.exp(c.loss))
    assert "bits_per_byte" not in t.extra_metrics(c)   # no batch, no bytes: not guessed


# ------------------------------------------------------------------------------- splits
def test_splits_are_disjoint_by_document_and_follow_the_hash(tmp_path):
    (tmp_path / "lines.txt").write_text("\n".join(LINES) + "\n", "utf-8")
    t = build(tmp_path / "lines.txt", document="line")
    got = {s: split_documents(t, s) for s in ("train", "valid", "test")}
    sets = {s: set(d) for s, d in got.items()}
    assert not sets["train"] & sets["valid"] and not sets["train"] & sets["test"]
    assert not sets["valid"] & sets["test"]
    assert sorted(sum(got.values(), [])) == sorted(LINES)   # every document, once
    for s, docs in got.items():
        assert all(RULE.of(d.encode()) == s for d in docs)
        assert docs == [x for x in LINES if RULE.of(x.encode()) == s]   # corpus order kept
    assert all(got.values())
    # the evaluation windows come from the test split only
    test_ids = t.data.tokens["test"].memmap()
    ev = t.eval_sets(0)[""]
    for row in ev.inputs.numpy():
        assert any(np.array_equal(test_ids[s:s + 8], row) for s in range(0, len(test_ids) - 8, 8))


def test_training_windows_are_a_function_of_seed_and_step(corpus):
    a, b = build(corpus), build(corpus)
    x1 = a.train_batch(4, 7, seed=3).inputs
    assert np.array_equal(x1.numpy(), b.train_batch(4, 7, seed=3).inputs.numpy())
    assert not np.array_equal(x1.numpy(), a.train_batch(4, 8, seed=3).inputs.numpy())
    assert not np.array_equal(x1.numpy(), a.train_batch(4, 7, seed=4).inputs.numpy())
    ev = a.eval_sets(0)[""]
    assert np.array_equal(ev.inputs.numpy(), a.eval_sets(1)[""].inputs.numpy())   # fixed windows
    starts = ev.inputs.shape[0]
    assert starts == 4 and len(a.valid_set(0)) == 4


# -------------------------------------------------------------------------------- the cache
def test_cache_is_reused_and_a_partial_or_damaged_one_is_not(corpus, cache, monkeypatch):
    first = build(corpus, tokenizer="bytes")
    folder = first.data.folder
    assert folder.parent == cache
    calls = []
    real = tokenfile.build
    monkeypatch.setattr(tokenfile, "build", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = build(corpus, tokenizer="bytes")
    assert again.data.folder == folder and calls == []   # reused, not tokenised again
    expected = first.data.tokens["train"].memmap().copy()

    # a truncated token file (a write cut short) is not reused
    with open(folder / "train.tokens", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    t = build(corpus, tokenizer="bytes")
    assert np.array_equal(t.data.tokens["train"].memmap(), expected) and calls == [1]
    # one byte changed inside a file
    with open(folder / "test.tokens", "r+b") as f:
        f.seek(3)
        b = f.read(1)
        f.seek(3)
        f.write(bytes([b[0] ^ 1]))
    build(corpus, tokenizer="bytes").data
    assert calls == [1, 1]
    # a folder without meta.json (renamed in place by hand, or from an older crash)
    (folder / "meta.json").unlink()
    build(corpus, tokenizer="bytes").data
    assert calls == [1, 1, 1]
    # a changed corpus is another key, a changed tokenizer too
    (corpus / "doc00.txt").write_text("changed\n", "utf-8")
    assert build(corpus, tokenizer="bytes").data.folder != folder
    assert len(calls) == 4


def test_two_preparing_at_once_tokenise_once(corpus, monkeypatch):
    # two runs of one profile start together: the second waits on the lock and reuses the
    # first's files (flock conflicts between two opens, also within one process)
    import threading

    calls = []
    real = tokenfile.build

    def slow_build(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        threading.Event().wait(0.3)   # hold the lock a little while the other thread waits
        return out

    monkeypatch.setattr(tokenfile, "build", slow_build)
    folders, errors = [], []

    def prepare():
        try:
            folders.append(build(corpus).data.folder)
        except Exception as e:  # shown by the assert below
            errors.append(e)

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(folders) == 2 and folders[0] == folders[1]
    assert calls == [1]


def test_leftover_temporary_folder_is_never_used(corpus, cache):
    t = build(corpus)
    folder = t.data.folder
    del t
    for p in folder.iterdir():   # make the finished folder look like a killed write
        p.unlink()
    folder.rmdir()
    stale = folder.with_name(folder.name + ".tmp-999999")
    stale.mkdir()
    (stale / "train.tokens").write_bytes(b"\0" * 10)
    t = build(corpus)
    assert t.data.folder == folder and not stale.exists()
    assert len(t.data.tokens["train"]) > 10


def test_bpe_fit_is_cached(corpus, cache):
    build(corpus, tokenizer="bpe", vocab_size=300).tokenizer
    fits = list((cache / "tokenizers").glob("bpe-*.json"))
    assert len(fits) == 1
    stamp = fits[0].stat().st_mtime_ns
    t = build(corpus, tokenizer="bpe", vocab_size=300)
    assert t.vocab_size == 300 and t.tokenizer.vocab_size <= 300
    assert fits[0].stat().st_mtime_ns == stamp
    build(corpus, tokenizer="bpe", vocab_size=320).tokenizer
    assert len(list((cache / "tokenizers").glob("bpe-*.json"))) == 2


# ------------------------------------------------------------------------------- sources
def test_jsonl_parquet_and_globs(tmp_path):
    rows = [{"text": x, "id": i} for i, x in enumerate(LINES)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    t = build(tmp_path / "d.jsonl")
    assert sorted(sum((split_documents(t, s) for s in ("train", "valid", "test")), [])) == sorted(LINES)
    t = build(tmp_path / "d.jsonl", max_documents=50, valid_fraction=0.3, test_fraction=0.3)
    assert sorted(sum((split_documents(t, s) for s in ("train", "valid", "test")), [])) == sorted(LINES[:50])
    # a glob over a folder tree: every matching file, records and text files alike
    g = tmp_path / "g"
    (g / "sub").mkdir(parents=True)
    (g / "d.jsonl").write_bytes((tmp_path / "d.jsonl").read_bytes())
    (g / "sub" / "a.txt").write_text("a text file\n", "utf-8")
    (g / "sub" / "skip.md").write_text("not matched\n", "utf-8")
    t = build(g / "**" / "*.[jt]*")
    assert t.source.files == [str(g / "d.jsonl"), str(g / "sub" / "a.txt")]
    assert sorted(sum((split_documents(t, s) for s in ("train", "valid", "test")), [])) == \
        sorted(LINES + ["a text file\n"])
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": LINES}), tmp_path / "d.parquet")
    t = build(tmp_path / "d.parquet", text_column="body")
    assert sorted(sum((split_documents(t, s) for s in ("train", "valid", "test")), [])) == sorted(LINES)
    with pytest.raises(ValueError, match="no text column 'text'"):
        build(tmp_path / "d.parquet").data
    with pytest.raises(ValueError, match="no file, folder or glob"):
        build(tmp_path / "missing.txt")


def test_hugging_face_dataset_from_local_folder_and_file(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="the lm extra (datasets) is not installed")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets.Dataset.from_dict({"text": LINES, "n": list(range(len(LINES)))}).save_to_disk(
        str(tmp_path / "saved"))
    t = build(f"hf:{tmp_path / 'saved'}")
    assert sorted(sum((split_documents(t, s) for s in ("train", "valid", "test")), [])) == sorted(LINES)
    # the same records as a JSON-lines file read by datasets' own loader (streamed: no cache)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"content": x}) + "\n" for x in LINES))
    t2 = build(f"hf:{tmp_path / 'd.jsonl'}", text_column="content", streaming=True)
    for s in ("train", "valid", "test"):
        assert split_documents(t2, s) == split_documents(t, s)
    with pytest.raises(ValueError, match="no text column"):
        build(f"hf:{tmp_path / 'saved'}", text_column="body").data


def test_stdlib_source_lists_the_standard_library():
    from tasks.lm.sources import Source

    s = Source("stdlib")
    assert len(s.files) > 500 and all(f.endswith(".py") for f in s.files)
    assert not any("site-packages" in f for f in s.files)
    assert any(f.endswith(os.path.join("", "json", "__init__.py")) for f in s.files)


# ------------------------------------------------------------------ parameters and the worker
def test_parameters_are_checked_when_built():
    with pytest.raises(TypeError, match="bogus"):
        tasks.build("lm", bogus=1)
    with pytest.raises(ValueError, match="vocab_size"):
        tasks.build("lm", tokenizer="bytes", vocab_size=300)
    with pytest.raises(ValueError, match="valid_fraction"):
        tasks.build("lm", valid_fraction=1.5)
    with pytest.raises(ValueError, match="document"):
        tasks.build("lm", document="sentence")
    assert "lm" in tasks.names() and "\n" not in tasks.describe("lm")


def profile_text(corpus, **task) -> str:
    """6 steps of an LSTM at L 16 on ``corpus``, evaluated twice; ``task``: more [task] keys."""
    return tiny_lm_profile_text(corpus, "lm-tiny-test", models=["lstm"], seq_len=16, num_test_examples=4, task=task,
                                steps=6, lr=3e-3, warmup_steps=1, eval_every=3, log_every=3)


def test_profile_validation_names_unknown_keys(corpus):
    from workbench.spec.profile import ProfileError, loads

    loads(profile_text(corpus))
    with pytest.raises(ProfileError, match="bogus"):
        loads(profile_text(corpus, bogus=1))


def test_a_tiny_run_through_the_worker_records_lm_metrics(tmp_path, corpus):
    from workbench.spec.profile import expand, loads
    from workbench.store import Store
    from workbench.train import worker

    spec = expand(loads(profile_text(corpus)))[0].to_dict()
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([spec])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    worker.run(str(store.root), rid)
    run = store.get(rid)
    assert run.state == "finished", run.error
    res = store.results([rid])[rid]
    test, valid, summary = res[""], res["valid"], res[""]
    for r in (test, valid):
        assert r["bits_per_byte"] > 0 and r["perplexity"] == pytest.approx(math.exp(r["loss"]))
    assert summary["tokens_trained"] == 6 * 4 * 16
    assert [r["value"] for r in store.metrics(rid, "train", "tokens_trained")] == [3 * 64, 6 * 64]
    assert len(store.metrics(rid, "eval", "bits_per_byte")) == 2

