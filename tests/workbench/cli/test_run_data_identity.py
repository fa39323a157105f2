"""A run keeps what it was trained on (issue 41 items 5a and 5c).

- ``eval run:N`` reads the tokenizer kept beside the run's weights: after the corpus is
  edited, a BPE fitted again would give other ids to the same weights; the kept one gives
  the numbers of before. A run that kept none (trained before tokenizers were kept) is
  rebuilt only while its corpus is unchanged, else refused in one line.
- The corpus' fingerprint is a hash of its contents (tasks/lm/fingerprint.py), recorded in
  the run's info and shown by ``show``; a replay whose corpus changed trains the finished
  runs again as new runs and says so, a touched but unchanged corpus changes nothing.

Runs train in this process through the worker (a d_model 16 Mamba, 4 steps on the CPU).
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_lm_corpus, tiny_lm_profile_text
from workbench.execute import launch, scheduler
from workbench.spec.profile import loads
from workbench.store import Store
from workbench.train import checkpoint, worker
from workbench.train.eval_models import ModelRefError, load_run

pytest.importorskip("tokenizers")

TEXT = ("the cat sat on the mat . a bird sang in the tree . we like the sun and the sea . "
        "the dog ran to the park and the cat ran after it . ") * 3
EDITED = ("zebras quietly munch crunchy kiwis while quokkas juggle vivid yellow xylophones ; "
          "jovial wizards box fjords quickly . ") * 3
PROBE = "the cat sat on the mat . the dog ran to the park ."


class FakePopen:
    """The scheduler process a submission would start: not started (the test runs the
    queued runs itself, in this process)."""

    def __init__(self, cmd, **kw):
        self.cmd, self.pid = cmd, os.getpid()


def submit(store: Store, prof):
    """``launch.submit`` with its scheduler process left unstarted (Popen is patched for
    the call only: the worker run in this process needs the real one)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler.subprocess, "Popen", FakePopen)
        return launch.submit(store, prof)


def profile(corpus, name: str = "identity"):
    text = tiny_lm_profile_text(corpus, name, lr=3e-3, checkpoint_every=2)
    return loads(text.replace('tokenizer = "bytes"', 'tokenizer = "bpe"\nvocab_size = 300'))


def train(store: Store, rid: int) -> None:
    store.mark_started(rid, os.getpid(), "cpu", None)
    worker.run(str(store.root), rid)
    r = store.get(rid)
    assert r.state == "finished", r.error


def edit(corpus) -> None:
    for i, f in enumerate(sorted(corpus.iterdir())):
        f.write_text(f"{i} . " + EDITED)


def numbers(store: Store, rid: int) -> tuple[list[int], float]:
    """What eval scores with: the ids of PROBE and its total log-likelihood under run rid."""
    lm = load_run(store.root, rid, torch.device("cpu"))
    ids = lm.encode(PROBE)
    x = torch.tensor([[lm.prefix_id] + ids])
    with torch.no_grad():
        logp = F.log_softmax(lm.logits(x)[0, :-1].float(), -1)
    return ids, float(logp.gather(1, x[0, 1:, None]).sum())


def test_eval_after_the_corpus_changed_gives_the_numbers_of_before(tmp_path, capsys):
    from workbench.cli import main

    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT, docs=40)
    store = Store(tmp_path / "st")
    (rid,) = submit(store, profile(corpus))
    train(store, rid)
    folder = checkpoint.tokenizer_folder(store.root, rid)
    assert {"tokenizer.json", "tokenizer_config.json", "weights.pt"} <= {p.name for p in folder.iterdir()}
    data = store.get(rid).info["data"]
    assert data["source"] == str(corpus) and len(data["fingerprint"]) == 24
    assert data["tokenizer"]["kind"] == "bpe" and data["tokens"]["train"] > 0

    before = numbers(store, rid)
    edit(corpus)
    after = numbers(store, rid)
    assert after == before  # the kept tokenizer: same ids, same log-likelihood
    assert load_run(store.root, rid, torch.device("cpu")).info["tokenizer_from"] == "kept"

    # `show` prints the fingerprint and where the tokenizer is kept
    assert main(["--store", str(store.root), "show", str(rid)]) == 0
    out = capsys.readouterr().out
    assert f"fingerprint {data['fingerprint']}" in out and f"kept in {folder}" in out


def test_a_run_that_kept_no_tokenizer_is_rebuilt_only_from_its_unchanged_corpus(tmp_path):
    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT, docs=40)
    store = Store(tmp_path / "st")
    (rid,) = submit(store, profile(corpus))
    train(store, rid)
    before = numbers(store, rid)
    folder = checkpoint.tokenizer_folder(store.root, rid)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # as a run of an earlier version
        (folder / name).unlink()
    os.utime(next(corpus.iterdir()))  # touched, not changed: the content fingerprint holds
    assert numbers(store, rid) == before
    assert load_run(store.root, rid, torch.device("cpu")).info["tokenizer_from"] == "rebuilt"
    edit(corpus)
    with pytest.raises(ModelRefError, match=r"kept no tokenizer .* changed since the run trained") as e:
        load_run(store.root, rid, torch.device("cpu"))
    assert "\n" not in str(e.value)
    # trained before fingerprints were kept either: a corpus file newer than the run says so
    store.set_info(rid, {"data": None})
    with pytest.raises(ModelRefError, match=r"modified after it was queued"):
        load_run(store.root, rid, torch.device("cpu"))


def test_a_checkpointed_run_keeps_its_tokenizer_beside_last_pt(tmp_path, monkeypatch):
    """A run stopped before its end is evaluated from last.pt: the trainer's checkpoint
    wrote the tokenizer there (here the finished run's last.pt is kept and its weights.pt
    not written, so only the checkpoint's copy can be read)."""
    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT, docs=40)
    store = Store(tmp_path / "st")
    (rid,) = submit(store, profile(corpus))
    monkeypatch.setattr(checkpoint, "remove", lambda root, run_id: None)  # keep last.pt
    monkeypatch.setattr(checkpoint, "save_weights", lambda *a, **k: (_ for _ in ()).throw(OSError("no")))
    train(store, rid)
    folder = checkpoint.tokenizer_folder(store.root, rid)
    assert (folder / "last.pt").is_file() and not (folder / "weights.pt").exists()
    assert (folder / "tokenizer.json").is_file()
    before = numbers(store, rid)
    edit(corpus)
    assert numbers(store, rid) == before


def test_a_replay_after_the_corpus_changed_trains_the_runs_again(tmp_path):
    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT, docs=40)
    store = Store(tmp_path / "st")
    (rid,) = submit(store, profile(corpus))
    train(store, rid)
    old = store.results([rid])[rid][""]["loss"]

    again = submit(store, profile(corpus))
    assert again.skipped == [rid] and again.queued == [] and again.data_note is None
    time.sleep(0.01)
    for f in corpus.iterdir():  # touched, same text: still the same data
        os.utime(f)
    again = submit(store, profile(corpus))
    assert again.skipped == [rid] and again.queued == []

    edit(corpus)
    changed = submit(store, profile(corpus))
    assert changed.skipped == [] and len(changed.queued) == 1 and list(changed) == changed.queued
    (new,) = changed.queued
    assert changed.data_changed and changed.data_changed[0][0] == rid
    note = changed.data_note
    assert note.startswith("profile identity: the corpus") and "changed since the run trained" in note
    assert note.endswith(f"finished run(s) {rid} trained again as new run(s) {new}") and "\n" not in note
    assert store.get(rid).info["superseded_by"]["run"] == new
    train(store, new)
    assert store.get(new).info["data"]["fingerprint"] != store.get(rid).info["data"]["fingerprint"]
    assert store.results([new])[new][""]["loss"] != old
    from workbench.results.aggregate import records  # the tables pool the new run alone
    assert {r["run_id"] for r in records(store, profile="identity")} == {new}

    last = submit(store, profile(corpus))  # the new run stands for the spec now
    assert last.skipped == [new] and last.queued == [] and last.data_note is None


def test_a_run_is_not_resumed_on_a_changed_corpus(tmp_path, monkeypatch):
    """Its weights so far learned the old text: resuming refuses, in one line naming the
    corpus; `resume --restart` is the way on."""
    import signal

    from workbench.execute import resume
    from workbench.train.stop import Stopped

    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT, docs=40)
    store = Store(tmp_path / "st")
    (rid,) = submit(store, profile(corpus))
    with pytest.MonkeyPatch.context() as mp:  # stopped once trained, before its final results
        mp.setattr(worker, "record_final", lambda *a, **k: (_ for _ in ()).throw(Stopped(signal.SIGTERM)))
        store.mark_started(rid, os.getpid(), "cpu", None)
        worker.run(str(store.root), rid)
    r = store.get(rid)
    assert r.state == "preempted" and checkpoint.path_for(store.root, rid).is_file(), (r.state, r.error)
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # this process was its worker
    edit(corpus)
    assert resume.requeue(store, rid) == "resumed"
    store.mark_started(rid, os.getpid(), "cpu", None)
    worker.run(str(store.root), rid)
    r = store.get(rid)
    assert r.state == "failed" and r.error.startswith("cannot resume: the corpus") and "\n" not in r.error
    assert "changed since the run started" in r.error and "resume --restart" in r.error


def test_every_tokenizer_kind_is_kept_and_read_back_with_the_same_ids(tmp_path):
    from tasks.lm import tokenizer as toks

    text = "the cat sat on the mat . zebras 🦓 munch kiwis é"
    bpe = toks.train_bpe([TEXT] * 4, 280)
    (tmp_path / "pre").mkdir()
    bpe.save(str(tmp_path / "pre" / "tokenizer.json"))
    made = {"bytes": toks.BytesTokenizer(), "char": toks.CharTokenizer(toks.train_chars([TEXT])),
            "bpe": toks.from_fitted("bpe", bpe.to_str()), "pretrained": toks.load_pretrained(str(tmp_path / "pre"))}
    for kind, tok in made.items():
        folder = tmp_path / "kept" / kind
        names = toks.save(tok, str(folder))
        assert names[-1] == "tokenizer_config.json" and toks.saved(str(folder))
        back = toks.load_saved(str(folder))
        assert back.kind == tok.kind and back.identity() == tok.identity(), kind
        assert (back.vocab_size, back.eot_id) == (tok.vocab_size, tok.eot_id), kind
        assert back.encode(text).tolist() == tok.encode(text).tolist(), kind
        assert back.encode_batch([text], True)[0][1].tolist() == tok.encode_batch([text], True)[0][1].tolist()
    (tmp_path / "kept" / "bpe" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"kept tokenizer .*tokenizer.json cannot be read"):
        toks.load_saved(str(tmp_path / "kept" / "bpe"))
