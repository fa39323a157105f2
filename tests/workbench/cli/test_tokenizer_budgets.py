"""Budgets that make tokenizers comparable (issue 42 item 6): tokenizer and vocabulary size as
one grid axis (``"task.tokenizer" = ["bytes", {name = "bpe", vocab_size = 512}]``), and a
budget in bytes of text (``train.bytes``) that gives every tokenizer the same text, its
steps resolved from the tokenizer's bytes per token on the training split."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from helpers import toml_value
from workbench.results.aggregate import pooled_keys
from workbench.spec.budget import resolve_bytes, run_compute
from workbench.spec.profile import ProfileError, expand, loads
from workbench.spec.run_spec import spec_key

pytest.importorskip("tokenizers")

TABLES = '["bytes", {name = "bpe", vocab_size = 512}, {name = "bpe", vocab_size = 1024}]'


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSM_WORKBENCH_DATA", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path):
    """40 short documents over 400 made-up words (a BPE of 512 ids merges them into tokens of
    several bytes, one of 1,024 into longer ones)."""
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnoprstuvwy") for _ in range(rng.randint(3, 9))) for _ in range(400)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(40):
        lines = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(12)]
        (folder / f"doc{i:02d}.txt").write_text("\n".join(lines) + "\n", "utf-8")
    return folder


def profile(corpus, grid=TABLES, budget="bytes = 20000", task="", models='["lstm"]', name="tok") -> str:
    return f"""
schema_version = 2
name = "{name}"
[task]
name = "lm"
source = {toml_value(str(corpus))}
valid_fraction = 0.2
test_fraction = 0.2
num_test_examples = 2
{task}
[sweep]
models = {models}
seq_lens = [16]
[sweep.grid]
"task.tokenizer" = {grid}
[model]
d_model = 16
n_layers = 1
[train]
batch_size = 4
eval_every = 1000
log_every = 1000
device = "cpu"
{budget}
"""


# ----------------------------------------------------------------------------- one grid axis
def test_a_tokenizer_table_sets_tokenizer_and_vocab_size_together(corpus):
    specs = expand(loads(profile(corpus)))
    assert len(specs) == 3
    got = [(s.task_params.get("tokenizer"), s.task_params.get("vocab_size")) for s in specs]
    assert got == [("bytes", None), ("bpe", 512), ("bpe", 1024)]
    for s, (tok, size) in zip(specs, got):
        assert s.fields["task.tokenizer"] == tok and s.fields.get("task.vocab_size") == size
        assert s.grid == ({"task.tokenizer": tok} if size is None
                          else {"task.tokenizer": tok, "task.vocab_size": size})
        assert json.loads(json.dumps(s.to_dict())) == s.to_dict()   # plain JSON, as the store keeps it
    # results never pool the two BPE sizes: the no-pooling rule sees vocab_size differ
    recs = [dict(s.fields) for s in specs]
    assert pooled_keys(recs, ["model", "task.tokenizer"]) == {"task.vocab_size": [512, 1024]}


def test_a_string_tokenizer_grid_keeps_its_runs_identity(corpus):
    """A grid of plain strings expands as before: its grid, fields and train (no bytes key),
    so its spec_key (replay's identity) is what it was (frozen here from before item 6)."""
    specs = expand(loads(profile(corpus, grid='["bytes", "char"]', budget="steps = 3", name="tok-str")))
    assert [s.grid for s in specs] == [{"task.tokenizer": "bytes"}, {"task.tokenizer": "char"}]
    assert ["bytes" not in s.to_dict()["train"] for s in specs] == [True, True]
    keys = [spec_key(s.to_dict()).replace(str(corpus), "CORPUS") for s in specs]
    assert [hashlib.sha256(k.encode()).hexdigest()[:16] for k in keys] == FROZEN_STRING_GRID_KEYS


# sha256 of spec_key (the corpus path replaced by "CORPUS"), computed with the code before item 6
FROZEN_STRING_GRID_KEYS = ["d7338637588ca6b7", "b77d12e8b1f2298e"]


@pytest.mark.parametrize("value,says", [
    ('{name = "bytes", vocab_size = 512}',
     "'sweep.grid.task.tokenizer[1].vocab_size' (line 15): tokenizer 'bytes' has its own vocabulary"),
    ('{name = "bpe", vocab = 512}',
     "'sweep.grid.task.tokenizer[1].vocab' (line 15): unknown key 'vocab' in a task.tokenizer table"),
    ('{vocab_size = 512}', "a task.tokenizer table needs name"),
    ('{name = "bpe", vocab_size = "512"}', "vocab_size must be an integer"),
])
def test_a_bad_tokenizer_table_is_refused_in_one_line_naming_file_and_key(corpus, value, says):
    with pytest.raises(ProfileError) as e:
        loads(profile(corpus, grid=f'["bpe", {value}]'), "tok.toml")
    msg = str(e.value)
    assert msg.startswith("tok.toml: invalid profile\n") and says in msg
    assert len(msg.splitlines()) == 2        # the file, then one line for the problem


def test_a_tokenizer_table_beside_a_vocab_size_axis_is_refused(corpus):
    text = profile(corpus).replace("[model]", '"task.vocab_size" = [512]\n[model]')
    with pytest.raises(ProfileError, match="also has 'task.vocab_size': vary it in one place"):
        loads(text, "tok.toml")


def test_vocab_size_in_the_task_with_a_bytes_point_says_how_to_pair_them(corpus):
    with pytest.raises(ProfileError) as e:
        loads(profile(corpus, grid='["bytes", "bpe"]', task="vocab_size = 512"), "tok.toml")
    assert "tokenizer 'bytes' has its own" in str(e.value) and '{name = "bpe", vocab_size = 2048}' in str(e.value)


# ----------------------------------------------------------------------------- train.bytes
def test_a_bytes_budget_gives_every_tokenizer_the_same_text(corpus):
    """steps x batch x seq_len x bytes per token (the text a run sees) is the budget, up to
    one step's worth, for bytes and both BPEs; a token budget gives the BPEs several times
    the text of bytes."""
    import tasks

    budget = 20000
    specs = expand(loads(profile(corpus, budget=f"bytes = {budget}")))
    seen, rates = {}, {}
    for s in specs:
        assert s.budget["asked"] == {"bytes": budget} and s.budget["steps"] is None   # known at launch
        task = tasks.build(s.task, **s.task_params)
        rate = task.train_bytes_per_token()
        meta = task.data.meta["splits"]["train"]
        assert rate == pytest.approx(meta["text_bytes"] / meta["tokens"])
        r = resolve_bytes(s.budget, rate)
        per_step = 4 * 16
        assert r["tokens_per_step"] == per_step and r["tokens"] == r["steps"] * per_step
        text = r["steps"] * per_step * rate
        assert budget <= text < budget + per_step * rate + 1e-6        # the budget, by less than a step
        assert r["bytes"] == pytest.approx(text)
        seen[s.fields.get("task.vocab_size", "bytes")] = text
        rates[s.fields.get("task.vocab_size", "bytes")] = rate
    assert rates[512] > 1.5 * rates["bytes"] and rates[1024] > 1.2 * rates[512]   # BPE tokens hold more text
    assert max(seen.values()) - min(seen.values()) < 4 * 16 * max(rates.values())
    # the same grid with a token budget: each tokenizer sees tokens x its own bytes per token
    by_tokens = expand(loads(profile(corpus, budget="tokens = 20000")))
    text_t = [s.budget["tokens"] * rates[s.fields.get("task.vocab_size", "bytes")] for s in by_tokens]
    assert text_t[1] > 1.5 * text_t[0] and text_t[2] > 1.2 * text_t[1]


def test_a_bytes_budget_shows_at_launch_or_from_the_prepared_cache(corpus):
    import tasks
    from workbench.cli.run import _budget_lines

    specs = expand(loads(profile(corpus, grid='["bytes", {name = "bpe", vocab_size = 512}]')))
    lines = _budget_lines(specs)
    assert len(lines) == 2 and all("bytes 20,000: steps from bytes, resolved at launch" in x for x in lines)
    assert "task.tokenizer=bpe task.vocab_size=512" in lines[1]
    bpe = specs[1]
    rate = tasks.build(bpe.task, **bpe.task_params).train_bytes_per_token()   # tokenise: the cache is there
    got = run_compute(bpe)
    assert got["resolved"] == "prepared cache" and got["bytes_per_token"] == pytest.approx(rate)
    assert got["steps"] == resolve_bytes(bpe.budget, rate)["steps"]
    assert f"at {rate:.3f} bytes/token (prepared cache)" in _budget_lines([bpe])[0]
    assert bpe.budget["steps"] is None       # the spec (and its identity) never holds the cache's numbers


def test_a_bytes_budget_needs_a_task_with_text():
    text = """
schema_version = 2
name = "no-text"
[task]
name = "induction_heads"
vocab_size = 16
[sweep]
models = ["gated_mlp"]
seq_lens = [64]
[model]
d_model = 16
n_layers = 2
[train]
batch_size = 8
bytes = 5000
"""
    with pytest.raises(ProfileError, match="train.bytes: task 'induction_heads' has no text to count bytes of"):
        loads(text, "no-text.toml")


def test_a_bytes_budget_is_resolved_by_the_worker_and_recorded(corpus, tmp_path):
    """A short real run per tokenizer: the worker measures bytes per token on the prepared
    data, trains those steps, and records them (info ``budget``) with the rate."""
    import tasks
    from workbench.store import Store
    from workbench.train import worker

    budget = 3000
    specs = expand(loads(profile(corpus, grid='["bytes", {name = "bpe", vocab_size = 512}]',
                                 budget=f"bytes = {budget}")))
    store = Store(tmp_path / "st")
    ids = store.add_runs([s.to_dict() for s in specs])
    seen = []
    for s, rid in zip(specs, ids):
        store.mark_started(rid, os.getpid(), "cpu", "cpu0")
        worker.run(str(store.root), rid)
        run = store.get(rid)
        assert run.state == "finished", run.error
        b = run.info["budget"]
        rate = tasks.build(s.task, **s.task_params).train_bytes_per_token()
        assert b["bytes_per_token"] == pytest.approx(rate)
        summary = store.results([rid])[rid][""]
        assert summary["steps"] == b["steps"] and summary["tokens_trained"] == b["tokens"] == b["steps"] * 64
        assert budget <= b["tokens"] * rate < budget + 64 * rate + 1e-6
        seen.append((b["steps"], b["tokens"] * rate))
    assert seen[0][0] > 1.5 * seen[1][0]         # bytes takes more steps than the BPE for the same text


def test_a_warmup_longer_than_the_resolved_steps_fails_the_run_in_one_line():
    b = {"asked": {"bytes": 1000}, "steps": None, "tokens_per_step": 64, "flops_per_token": 10.0}
    assert resolve_bytes(b, 4.0)["steps"] == 4 and resolve_bytes(b, 4.0)["flops"] == 10.0 * 256
    with pytest.raises(ValueError, match="warmup_steps = 9 is longer than the whole run: train.bytes = 1,000 "
                                         "at 4 bytes per token is 4 step"):
        resolve_bytes(b, 4.0, warmup_steps=9)


def test_the_form_reads_a_bytes_budget_and_says_when_its_steps_are_known(corpus):
    from workbench.tui.form_checks import budget_steps_text
    from workbench.tui.form_fields import BUDGET_KINDS, parse_budget

    assert ("bytes of text", "bytes") in BUDGET_KINDS
    assert [parse_budget(t, "bytes") for t in ("50MB", "50M", "2GB", "1,000")] == [50_000_000, 50_000_000,
                                                                                  2_000_000_000, 1000]
    with pytest.raises(ValueError, match="'1.5' is not a whole number of bytes"):
        parse_budget("1.5", "bytes")
    text, ok, steps = budget_steps_text(expand(loads(profile(corpus))))
    assert ok and steps is None and text.startswith("= steps from bytes of text, resolved at launch")


def test_the_forms_grid_axes_write_and_read_tokenizer_tables(corpus):
    from workbench.tui.form_fields import format_grid_values, parse_grid_axes

    values = loads(profile(corpus)).sweep.grid["task.tokenizer"]
    text = format_grid_values(values)
    assert text == '"bytes", {name = "bpe", vocab_size = 512}, {name = "bpe", vocab_size = 1024}'
    assert parse_grid_axes(f"task.tokenizer = {text}; train.lr = 1e-3, 2e-3") == {
        "task.tokenizer": values, "train.lr": [1e-3, 2e-3]}
