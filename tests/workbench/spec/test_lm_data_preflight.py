"""The ``lm`` task's data, caught before launch (issue 41 items 4 and 5d).

- One text file is a corpus: ``document = "auto"`` (the default) splits a single text file
  by paragraph when it has enough paragraphs, else cuts it by position (nanoGPT's 90/5/5
  style: contiguous slices, cut after a newline); a folder keeps one document a file, and
  its token-cache key is the one it had before ``auto`` existed.
- ``profile check`` / ``run --dry-run`` / ``run`` / the sweep form's check refuse, in one
  line naming the source and what each split would get: an empty file, a folder of empty
  files, a corpus shorter than one context, a ``.jsonl`` or text file holding binary; the
  counts (from bytes, never tokenising) equal what tokenising gives.
- ``--set task.streaming=0.5`` / ``task.vocab_size=3.5`` on the paper profile whose hub
  data is absent: one line naming the key, no traceback.

Every corpus is made here; the token cache goes to a folder of the test.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from helpers import tiny_lm_profile_text
from tasks.lm import preflight, sources, tokenfile
from workbench.spec import profile as P

ROOT = Path(__file__).resolve().parents[3]
PAPER = ROOT / "profiles" / "lm-scaling-paper-gpu.toml"
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at".split()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("SSM_WORKBENCH_DATA", str(d))
    preflight._MEMO.clear()
    return d / "lm"


def paragraphs(n: int, seed: int = 0) -> str:
    """``n`` paragraphs of ~70-100 words (about 290 bytes each: 400 make ~116 kB, as the
    issue's corpus), blank-line separated, each on several lines."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(65, 95))]
        out.append(" ".join(words[:25]) + "\n" + " ".join(words[25:]) + ".")
    return "\n\n".join(out) + "\n"


def build(source, **kw):
    return tasks.build("lm", **{"source": str(source), "seq_len": 64, **kw})


def check_text(tmp_path, source, **task) -> str:
    """A profile on ``source`` (bytes tokenizer, L 256, the task's default fractions) loaded
    as `profile check` / `run` load it (check_data): '' when valid, else the error text."""
    text = tiny_lm_profile_text(source, "pre", schema_version=2, seq_len=256, task=task)
    text = text.replace("valid_fraction = 0.2\n", "").replace("test_fraction = 0.2\n", "")
    path = tmp_path / "p.toml"
    path.write_text(text)
    try:
        P.load(str(path), check_data=True)
        return ""
    except P.ProfileError as e:
        return str(e)


def the_problem(err: str) -> str:
    """The one problem line of a one-problem error text."""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].endswith("invalid profile"), err
    assert "Traceback" not in err
    return lines[1]


# --------------------------------------------------------------------- one file is a corpus
def test_one_text_file_of_400_paragraphs_is_cut_by_position_and_trains(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(paragraphs(400))
    t = build(f)
    assert t.source.mode == "position"          # 400 < 20 / 0.02 paragraphs
    got = t.split_tokens()                       # before the change: "valid split ... has 0 tokens"
    assert all(n >= 65 for n in got.values())
    # contiguous slices, in order, cut just after a newline, covering the file once
    raw = f.read_bytes()
    cuts = sources.position_cuts(str(f), 0.02, 0.02)
    assert [c[0] for c in cuts] == ["train", "valid", "test"]
    assert cuts[0][1] == 0 and cuts[0][2] == cuts[1][1] and cuts[1][2] == cuts[2][1] and cuts[2][2] == len(raw)
    assert raw[cuts[0][2] - 1:cuts[0][2]] == b"\n" and raw[cuts[1][2] - 1:cuts[1][2]] == b"\n"
    assert abs(cuts[1][2] - cuts[1][1] - 0.02 * len(raw)) < 400   # about 2%: one paragraph of slack
    # bytes tokenizer: each split's tokens are its slice's bytes + one end-of-text
    assert got == {s: e - b + 1 for s, b, e in cuts}
    # the preflight's count equals the tokens, before anything was tokenised
    t2 = build(f)
    assert t2.preflight().startswith(f"data {str(f)!r}: train {got['train']:,}, valid {got['valid']:,}, "
                                     f"test {got['test']:,} tokens (one file cut by position")


def test_one_text_file_with_many_paragraphs_splits_by_paragraph_with_that_key(tmp_path):
    f = tmp_path / "many.txt"
    f.write_text(paragraphs(1200))
    auto, explicit = build(f), build(f, document="paragraph")
    assert auto.source.mode == "paragraph"
    assert auto.source.fingerprint() == explicit.source.fingerprint()   # the same cache
    assert auto.split_tokens() == explicit.split_tokens()
    assert min(auto.split_tokens().values()) > 1000
    # fewer paragraphs than 20 per eval split expects: by position, a key of its own
    assert build(f, valid_fraction=0.01, test_fraction=0.01).source.mode == "position"
    whole = build(f, document="file")
    assert whole.source.fingerprint() != auto.source.fingerprint()


def test_a_folder_keeps_one_document_a_file_and_its_cache_key(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(30):
        (folder / f"d{i:02d}.txt").write_text(paragraphs(3, seed=i))
    t = build(folder, valid_fraction=0.2, test_fraction=0.2)
    assert t.source.mode == "file"
    fp = t.source.fingerprint()
    assert fp["document"] == "file" and "fractions" not in fp
    # the key of a folder is what it was before "auto": the one document = "file" gives
    assert fp == build(folder, document="file", valid_fraction=0.2, test_fraction=0.2).source.fingerprint()
    identity = {"source": fp, "split": t.split.identity(), "tokenizer": {"kind": "bytes"}}
    assert t.data.folder.name == f"bytes-{tokenfile.key_of(identity)}"
    # and the preflight counts equal the tokens
    pre = build(folder, valid_fraction=0.2, test_fraction=0.2).preflight()
    got = t.split_tokens()
    assert f"train {got['train']:,}, valid {got['valid']:,}, test {got['test']:,} tokens" in pre


def test_position_is_for_one_text_file_only(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    with pytest.raises(ValueError, match="document = 'position' cuts one text file"):
        build(tmp_path, document="position")


def test_counts_equal_tokens_for_records_and_chars(tmp_path):
    f = tmp_path / "c.jsonl"
    with open(f, "w", encoding="utf-8") as fh:
        for i in range(300):
            fh.write(json.dumps({"text": f"{i}: café € 😀 " + paragraphs(1, seed=i)[:80]}) + "\n")
    for kind in ("bytes", "char"):
        t = build(f, tokenizer=kind, seq_len=16, valid_fraction=0.1, test_fraction=0.1)
        note = build(f, tokenizer=kind, seq_len=16, valid_fraction=0.1, test_fraction=0.1).preflight()
        got = t.split_tokens()
        assert f"train {got['train']:,}, valid {got['valid']:,}, test {got['test']:,} tokens" in note, (kind, note)
        assert "at most" not in note


# --------------------------------------------------------------------- refused before launch
def test_an_empty_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    line = the_problem(check_text(tmp_path, tmp_path / "empty.txt"))
    assert f"source '{tmp_path / 'empty.txt'}' is an empty file (0 bytes)" in line
    assert "0 tokens" in line


def test_a_folder_of_twenty_empty_files_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "empties"
    folder.mkdir()
    for i in range(20):
        (folder / f"f{i:02d}.txt").write_text("")
    line = the_problem(check_text(tmp_path, folder))
    assert f"source '{folder}' holds 20 files and 0 bytes of text" in line


def test_a_corpus_shorter_than_one_context_is_refused_with_each_splits_tokens(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text(paragraphs(2))   # ~600 bytes: no split can hold 257 tokens but train
    line = the_problem(check_text(tmp_path, f))
    cuts = sources.position_cuts(str(f), 0.02, 0.02)
    counts = ", ".join(f"{s} {e - b + 1:,}" for s, b, e in cuts)
    assert f"source '{f}' is too small for seq_len 256: its splits would get {counts} tokens" in line
    assert "seq_len + 1 = 257" in line


def test_one_file_read_as_one_document_is_refused_with_the_way_out(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(paragraphs(400))
    line = the_problem(check_text(tmp_path, f, document="file"))
    assert "is too small for seq_len 256" in line and "leave document out" in line
    assert check_text(tmp_path, f) == ""   # the default (auto) is a corpus


@pytest.mark.parametrize("name,content", [
    ("binary.jsonl", random.Random(1).randbytes(50_000)),
    ("latin.jsonl", b"".join(b'{"text": "' + bytes(b | 0x80 for b in random.Random(i).randbytes(200))
                             + b'"}\n' for i in range(100))),
    ("binary.txt", b"text at first\n" * 10 + bytes(range(256)) * 100),
], ids=["random-jsonl", "high-bytes-in-jsonl-strings", "text-then-binary"])
def test_binary_data_is_refused_before_it_becomes_replacement_characters(tmp_path, name, content):
    f = tmp_path / name
    f.write_bytes(content)
    line = the_problem(check_text(tmp_path, f))
    assert f"source '{f}' is not text:" in line
    assert "NUL byte" in line or "are not UTF-8" in line


def test_one_binary_file_in_a_folder_is_named(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(5):
        (folder / f"d{i}.txt").write_text(paragraphs(20, seed=i))
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    line = the_problem(check_text(tmp_path, folder))
    assert f"1 of its 6 files are not text, e.g. {folder / 'logo.png'}" in line


def test_a_few_stray_bytes_and_the_stdlib_pass(tmp_path):
    f = tmp_path / "mostly.txt"
    f.write_bytes(paragraphs(400).encode() + b"caf\xe9\n")   # one latin-1 byte: read as today
    assert check_text(tmp_path, f) == ""
    note = tasks.build("lm", source="stdlib", seq_len=128).preflight()
    assert note.startswith("data 'stdlib': train ") and "one document a file" in note


def test_bpe_uses_the_prepared_cache_else_a_bound_that_refuses_only_when_sure(tmp_path):
    f = tmp_path / "small.txt"
    f.write_text(paragraphs(30))   # ~5.5 kB: valid ~500 bytes, enough bytes for L 400, not BPE tokens
    kw = dict(tokenizer="bpe", vocab_size=300, seq_len=400, valid_fraction=0.1, test_fraction=0.1)
    t = build(f, **kw)
    bound = t.preflight()   # nothing fitted: at most one token a byte, and that is enough
    assert bound.startswith(f"data {str(f)!r}: at most train") and "not fitted yet" in bound
    with pytest.raises(ValueError, match="fewer than seq_len"):
        t.data   # the run would fail here, after the cache is written
    preflight._MEMO.clear()
    with pytest.raises(ValueError) as e:
        build(f, **kw).preflight()
    meta = json.loads(next(tokenfile.cache_root().glob("bpe-*/meta.json")).read_text())
    counts = ", ".join(f"{s} {meta['splits'][s]['tokens']:,}" for s in ("train", "valid", "test"))
    assert f"its splits would get {counts} tokens" in str(e.value) and "prepared token cache" in str(e.value)


# --------------------------------------------------------------------- every path refuses
def test_run_and_dry_run_refuse_before_queuing_and_the_form_names_the_source(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    prof = tmp_path / "p.toml"
    prof.write_text(tiny_lm_profile_text(tmp_path / "empty.txt", "pre", schema_version=2))
    store = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["run", "--dry-run", str(prof)], ["run", str(prof)], ["profile", "check", str(prof)]):
        r = subprocess.run([sys.executable, "-m", "workbench.cli", "--store", str(store), *args],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "is an empty file (0 bytes)" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not store.exists()   # nothing was queued
    from workbench.spec.check import registry_problems

    p = P.load(str(prof), check_registries=False)
    (loc, msg), = registry_problems(p)   # the form's launch: under the source field
    assert loc == ("task", "source") and "is an empty file (0 bytes)" in msg
    assert registry_problems(p, need_data=False) == []   # its save: the profile is not wrong
    assert P.load(str(prof)).task.name == "lm"   # and it opens, to be edited (the form's load)


def test_profile_check_shows_the_tokens_each_split_gets(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(paragraphs(400))
    prof = tmp_path / "p.toml"
    prof.write_text(tiny_lm_profile_text(f, "pre", schema_version=2, seq_len=256).replace(
        "valid_fraction = 0.2\n", "").replace("test_fraction = 0.2\n", ""))
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "--store", str(tmp_path / "s"), "profile", "check",
                        str(prof)], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cuts = sources.position_cuts(str(f), 0.02, 0.02)
    counts = ", ".join(f"{s} {e - b + 1:,}" for s, b, e in cuts)
    assert f"  data {str(f)!r}: {counts} tokens (one file cut by position" in r.stdout, r.stdout


# --------------------------------------------------------------------- a bad value, data absent
@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize("setting,key", [("task.streaming=0.5", "streaming"), ("task.vocab_size=3.5", "vocab_size")])
def test_a_bad_value_of_a_profile_whose_hub_data_is_absent_is_one_line(tmp_path, monkeypatch, offline, setting,
                                                                      key):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))   # nothing cached
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(P.ProfileError) as e:
        P.load(str(PAPER), overrides=[setting])
    assert not isinstance(e.value, P.DataAbsent)
    line = the_problem(str(e.value))
    assert f"--set {setting}" in line and f"{key} must be" in line
