"""``ssm-workbench sample`` and the run view's sample window (issue 42 item 2).

What is generated is checked against a decode written here from the model's full forward
pass: at every token the whole sequence is run again (``LoadedLM.logits``) and the next
token is the argmax, or a ``torch.multinomial`` draw from a seeded generator over the top-k
softmax of logits / temperature. ``sample`` carries the recurrent state (a Mamba run) or the
key/value cache (a Hugging Face Llama) instead, and must give the same tokens; the
Transformer run carries its key/value cache; a model without start/step must say that it recomputes. Runs are trained in
this process (d_model 16, 4 steps on the CPU); the Llama is a random tiny checkpoint written
to a temporary folder (tests/workbench/train/test_generation_equals_hf.py's)."""
from __future__ import annotations

import io
import os
import shutil

import pytest
import torch

from helpers import screen_lines, tiny_lm_corpus, tiny_lm_profile_text, workers_done
from workbench.execute import launch, scheduler
from workbench.spec.profile import expand, loads
from workbench.store import Store
from workbench.train import checkpoint, eval_models, worker
from workbench.train.decode import TextStream, decode, prompt_ids

pytest.importorskip("lm_eval", reason="sample loads models through the eval extra (lm-eval)")

TEXT = ("the cat sat on the mat . a bird sang in the tree . we like the sun and the sea . "
        "the dog ran to the park and the cat ran after it . ") * 3
PROMPT = "the cat "


class FakePopen:
    """The scheduler process a submission would start: not started (the runs are trained here)."""

    def __init__(self, cmd, **kw):
        self.cmd, self.pid = cmd, os.getpid()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A store with a finished Mamba (state) and a finished Transformer (no state) lm run,
    bytes tokenizer, window 32: {"root", "mamba", "transformer", "corpus"}."""
    tmp = tmp_path_factory.mktemp("sample")
    corpus = tiny_lm_corpus(tmp / "corpus", TEXT, docs=40)
    store = Store(tmp / "st")
    prof = loads(tiny_lm_profile_text(corpus, "sample", models=("mamba", "transformer"), lr=3e-3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler.subprocess, "Popen", FakePopen)
        ids = launch.submit(store, prof)
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
        worker.run(str(store.root), rid)
        assert store.get(rid).state == "finished", store.get(rid).error
    out = {"root": store.root, "corpus": corpus, **{store.get(rid).spec["model"]: rid for rid in ids}}
    store.close()
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_generation_equals_hf import write_checkpoint

    return write_checkpoint("llama", tmp_path_factory.mktemp("sample-llama") / "llama")


def load(ref: str, root=None):
    return eval_models.load(ref, torch.device("cpu"), store_root=root)


@torch.no_grad()
def recomputed(lm, ids: list[int], n: int, temperature: float, top_k: int, seed: int, stops=()) -> list[int]:
    """The reference decode (module doc): the full forward pass again for every token."""
    g = torch.Generator().manual_seed(seed)
    seq, out = list(ids), []
    for _ in range(n):
        logits = lm.logits(torch.tensor([seq[-lm.max_length:]]))[0, -1].float()   # (vocab,)
        if temperature == 0:
            tok = int(logits.argmax())
        else:
            x = logits / temperature
            if top_k:
                x[x < torch.topk(x, top_k).values[-1]] = float("-inf")
            tok = int(torch.multinomial(torch.softmax(x, -1)[None], 1, generator=g)[0, 0])
        out.append(tok)
        seq.append(tok)
        if tok in stops:
            break
    return out


def sample(capsys, *args, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    from workbench.cli import main

    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    args = list(args)
    store = args[:2] if args[:1] == ["--store"] else []  # a global option: before the command
    rc = main([*store, "sample", *args[len(store):]])
    out, err = capsys.readouterr()
    return rc, out, err


def text_of(lm, prompt: str, new: list[int], stops) -> str:
    """What ``sample`` prints for ``new`` after ``prompt``: the prompt, then the text the new
    ids add (the stop token is not text), then a newline."""
    kept = [t for t in new if t not in stops]
    ids = prompt_ids(lm, prompt)
    return prompt + lm.decode(ids + kept, True)[len(lm.decode(ids, True)):] + "\n"


class Counted:
    """``lm`` with its logits / start / step calls counted."""

    def __init__(self, lm):
        self.lm, self.calls = lm, {"logits": 0, "start": 0, "step": 0}
        for name in self.calls:
            fn = getattr(lm, name)
            if fn is not None:
                setattr(lm, name, self._counting(name, fn))

    def _counting(self, name, fn):
        def call(*a, **kw):
            self.calls[name] += 1
            return fn(*a, **kw)
        return call


def counting_load(monkeypatch) -> list[Counted]:
    """eval_models.load patched so that the models ``sample`` loads are Counted (returned list)."""
    made, real = [], eval_models.load

    def patched(*a, **kw):
        c = Counted(real(*a, **kw))
        made.append(c)
        return c.lm

    monkeypatch.setattr(eval_models, "load", patched)
    return made


# ------------------------------------------------------------------ equal to a full recompute
@pytest.mark.parametrize("temperature,top_k,seed", [(0, 0, 0), (1.0, 5, 3), (0.7, 0, 11)],
                         ids=["greedy", "top5-t1", "all-t0.7"])
@pytest.mark.parametrize("model", ["mamba", "transformer"])
def test_sample_of_a_run_equals_decoding_by_full_recompute(runs, capsys, model, temperature, top_k, seed):
    ref = f"run:{runs[model]}"
    lm = load(ref, runs["root"])
    stops = (lm.eot_id,)
    want = recomputed(lm, prompt_ids(lm, PROMPT), 20, temperature, top_k, seed, stops)
    rc, out, err = sample(capsys, "--store", str(runs["root"]), ref, "--prompt", PROMPT, "--tokens", "20",
                          "--temperature", str(temperature), "--top-k", str(top_k), "--seed", str(seed))
    assert rc == 0, err
    assert out == text_of(lm, PROMPT, want, stops)
    assert ("recurrent state carried" if model == "mamba" else "key/value cache carried") in err
    # the function bench --generate reuses gives the same ids
    g = torch.Generator().manual_seed(seed)
    assert decode(lm, prompt_ids(lm, PROMPT), 20, temperature, top_k or None, g) == want


@pytest.mark.parametrize("temperature,top_k,seed", [(0, 0, 0), (1.0, 20, 5)], ids=["greedy", "top20-t1"])
def test_sample_of_a_hugging_face_llama_equals_decoding_by_full_recompute(llama, capsys, temperature, top_k, seed):
    lm = load(str(llama))
    stops = tuple(lm.eos_ids)
    for prompt in ("the cat sat on", "we like", ""):
        want = recomputed(lm, prompt_ids(lm, prompt), 24, temperature, top_k, seed, stops)
        rc, out, err = sample(capsys, str(llama), "--prompt", prompt, "--tokens", "24", "--temperature",
                              str(temperature), "--top-k", str(top_k), "--seed", str(seed))
        assert rc == 0, err
        assert out == text_of(lm, prompt, want, stops), prompt
        assert "key/value cache carried" in err


def test_an_empty_prompt_starts_from_the_prefix_token(runs):
    lm = load(f"run:{runs['mamba']}", runs["root"])
    assert prompt_ids(lm, "") == [lm.prefix_id] == [lm.eot_id]
    g = torch.Generator().manual_seed(1)
    assert decode(lm, prompt_ids(lm, ""), 12, 1.0, None, g) == recomputed(lm, [lm.eot_id], 12, 1.0, 0, 1, (lm.eot_id,))


def test_generation_stops_at_end_of_text_unless_ignore_eos(llama, capsys):
    """The checkpoint often emits </s> (test_generation_equals_hf's): greedy ends there, and
    --ignore-eos goes on to the full budget."""
    lm = load(str(llama))
    ended = [p for p in ("the cat sat on", "we like", "a bird", "the sun is", "the dog ran")
             if (w := recomputed(lm, prompt_ids(lm, p), 30, 0, 0, 0, tuple(lm.eos_ids))) and w[-1] in lm.eos_ids
             and len(w) < 30]
    assert ended, "no prompt ends at </s> greedily: the checkpoint no longer tests the stop"
    calls = []
    rc, _, err = sample(capsys, str(llama), "--prompt", ended[0], "--tokens", "30", "--temperature", "0")
    assert rc == 0 and "stopped at end-of-text" in err, err
    g = torch.Generator()
    new = decode(lm, prompt_ids(lm, ended[0]), 30, 0, None, g, on_token=calls.append, stop_ids=())
    assert len(new) == 30 and calls == new
    rc, _, err = sample(capsys, str(llama), "--prompt", ended[0], "--tokens", "30", "--temperature", "0",
                        "--ignore-eos")
    assert rc == 0 and "30 tokens in" in err and "stopped at 30 tokens" in err, err


# ------------------------------------------------------------------ seeds
def test_the_same_seed_gives_the_same_text_and_another_seed_other_text(runs, capsys):
    args = ["--store", str(runs["root"]), f"run:{runs['mamba']}", "--prompt", PROMPT, "--tokens", "40",
            "--temperature", "1.5", "--top-k", "0"]
    texts = {seed: [sample(capsys, *args, "--seed", str(seed))[1] for _ in range(2)] for seed in (0, 1, 2)}
    assert all(a == b for a, b in texts.values())
    assert len({a for a, _ in texts.values()}) == 3


# ------------------------------------------------------------------ the state is carried
def test_the_state_is_carried_not_recomputed(runs, llama, capsys, monkeypatch):
    made = counting_load(monkeypatch)
    for ref, root in ((f"run:{runs['mamba']}", runs["root"]), (str(llama), None)):
        store = ["--store", str(root)] if root else []
        rc, out, err = sample(capsys, *store, ref, "--prompt", "the", "--tokens", "10", "--ignore-eos")
        assert rc == 0, err
        assert made[-1].calls == {"logits": 0, "start": 1, "step": 9}, ref  # 10 tokens: one start, 9 steps
    # the Transformer run carries its key/value cache (issue 43) the same way
    rc, out, err = sample(capsys, "--store", str(runs["root"]), f"run:{runs['transformer']}", "--prompt", "the",
                          "--tokens", "10", "--ignore-eos")
    assert rc == 0 and made[-1].calls == {"logits": 0, "start": 1, "step": 9}
    assert "key/value cache carried" in err
    # a model without start/step: the window again for every token, and it says so
    real = eval_models.load

    def stateless(*a, **kw):
        lm = real(*a, **kw)
        lm.start = lm.step = None
        return lm

    monkeypatch.setattr(eval_models, "load", stateless)
    made = counting_load(monkeypatch)
    rc, out, err = sample(capsys, "--store", str(runs["root"]), f"run:{runs['transformer']}", "--prompt", "the",
                          "--tokens", "10", "--ignore-eos")
    assert rc == 0 and made[-1].calls["logits"] == 10
    assert "no state to carry (transformer has no start/step): the whole window is recomputed" in err


def test_text_is_streamed_token_by_token(runs, monkeypatch):
    """Each token's text is written (and flushed) as it comes, not at the end."""
    from workbench.cli import main

    writes = []

    class Out(io.StringIO):
        def write(self, s):
            writes.append(s)
            return super().write(s)

        def flush(self):
            writes.append("<flush>")

    monkeypatch.setattr("sys.stdout", Out())
    assert main(["--store", str(runs["root"]), "sample", f"run:{runs['mamba']}", "--prompt", PROMPT,
                 "--tokens", "12", "--temperature", "0", "--ignore-eos"]) == 0
    pieces = [w for w in writes if w not in ("<flush>", PROMPT)]
    assert len(pieces) >= 10 and writes.count("<flush>") >= 10


def test_text_stream_holds_back_an_unfinished_character():
    from tasks.lm.tokenizer import BytesTokenizer

    tok = BytesTokenizer()
    ids = list("é ü!".encode())
    s = TextStream(tok.decode, context=list(b"ab"))
    pieces = [s.push(i) for i in ids]
    assert pieces == ["", "é", " ", "", "ü", "!"] and s.flush() == ""
    s = TextStream(tok.decode)
    assert s.push(0xC3) == "" and s.flush() == "\ufffd"


# ------------------------------------------------------------------ refusals
def test_refusals_are_one_line(runs, llama, tmp_path, capsys, monkeypatch):
    root = str(runs["root"])
    store = Store(root)
    spec = store.get(runs["mamba"]).spec
    (running,) = store.add_runs([spec])
    store.mark_started(running, os.getpid(), "cpu", None)
    other = expand(loads('schema_version = 1\nname = "copy"\n[task]\nname = "mad_selective_copying"\n'
                         'vocab_size = 8\nnum_tokens_to_copy = 2\n[sweep]\nmodels = ["lstm"]\nseq_lens = [16]\n[train]\nsteps = 1\n'))[0]
    (copying,) = store.add_runs([other.to_dict()])
    store.close()

    def refused(*args, stdin=None) -> str:
        rc, out, err = sample(capsys, *args, stdin=stdin, monkeypatch=monkeypatch)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (rc, out, err)
        return err.strip()

    line = refused("--store", root, f"run:{running}", "--prompt", "a")
    assert line.startswith(f"sample: model run:{running} is running, not finished (it has no checkpoint)")
    assert "--allow-unfinished" in line
    assert "only runs of the lm task" in refused("--store", root, f"run:{copying}")
    assert refused("--store", root, "run:999") == f"sample: model run:999: no such run in {root}"
    assert "no such run (no store at" in refused("--store", str(tmp_path / "none"), "run:1")
    assert "no such folder, and not a hub id" in refused("--store", root, str(tmp_path / "nothing"))
    assert refused("--store", root, f"run:{runs['mamba']}", "--prompt", "x" * 33) == (
        f"sample: the prompt is 33 tokens, longer than run:{runs['mamba']}'s window of 32 tokens: shorten it "
        "(its first tokens would be outside what the model was trained to see)")
    # read from stdin (one trailing newline is not part of it): too long there too
    assert "the prompt is 40 tokens" in refused("--store", root, f"run:{runs['mamba']}", "--prompt", "-",
                                                stdin="y" * 40 + "\n")
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(llama, broken)
    for f in broken.glob("tokenizer*"):
        f.unlink()
    assert "tokenizer" in refused(str(broken))
    for bad in (["--tokens", "0"], ["--temperature", "-1"], ["--top-k", "-2"]):
        with pytest.raises(SystemExit) as e:
            sample(capsys, "--store", root, f"run:{runs['mamba']}", *bad)
        assert e.value.code == 2


def test_an_unfinished_run_is_sampled_from_its_checkpoint_when_allowed(runs, capsys, monkeypatch):
    root = str(runs["root"])
    store = Store(root)
    (running,) = store.add_runs([store.get(runs["mamba"]).spec])
    store.mark_started(running, os.getpid(), "cpu", None)
    store.close()
    state = checkpoint.load(checkpoint.weights_path(root, runs["mamba"]))
    state.update(run_id=running, step=2)
    checkpoint.save(state, checkpoint.path_for(root, running))
    rc, out, err = sample(capsys, "--store", root, f"run:{running}", "--prompt", "the", "--allow-unfinished",
                          "--tokens", "8", "--seed", "4")
    assert rc == 0, err
    assert f"run:{running} has not finished: sampling its checkpoint at step 2" in err
    # the same weights as the finished run: the same text
    assert out == sample(capsys, "--store", root, f"run:{runs['mamba']}", "--prompt", "the", "--tokens", "8",
                         "--seed", "4")[1]


def test_stdin_prompt(runs, capsys, monkeypatch):
    args = ["--store", str(runs["root"]), f"run:{runs['mamba']}", "--tokens", "10", "--temperature", "0"]
    rc, out, _ = sample(capsys, *args, "--prompt", "-", stdin=PROMPT + "\n", monkeypatch=monkeypatch)
    assert rc == 0 and out == sample(capsys, *args, "--prompt", PROMPT)[1] and out.startswith(PROMPT)


# ------------------------------------------------------------------ the run view's window
async def test_the_run_view_samples_a_finished_lm_run_in_a_window(runs, tmp_path):
    from test_tui import make_app
    from textual.widgets import Input, Static

    from workbench.tui.run_view import RunScreen
    from workbench.tui.sample_screen import SampleScreen

    store = Store(runs["root"])
    lm = load(f"run:{runs['mamba']}", runs["root"])
    want = recomputed(lm, prompt_ids(lm, PROMPT), 16, 0, 0, 0, (lm.eot_id,))
    (pending,) = store.add_runs([store.get(runs["mamba"]).spec])
    app = make_app(store, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(RunScreen(store, pending, app.store_lock))
        await workers_done(app)
        await pilot.pause()
        await pilot.press("g")  # a pending run offers no text: a notification says why
        await pilot.pause()
        assert not isinstance(app.screen, SampleScreen)
        assert any("is pending: sample it once it has finished" in n.message for n in app._notifications)
        app.pop_screen()
        app.push_screen(RunScreen(store, runs["mamba"], app.store_lock))
        await workers_done(app)
        await pilot.pause()
        await pilot.press("g")
        await pilot.pause()
        window = app.screen
        assert isinstance(window, SampleScreen)
        window.query_one("#sample-tokens", Input).value = "16"
        window.query_one("#sample-temperature", Input).value = "0"
        await pilot.press(*PROMPT, "enter")
        await workers_done(app)
        await pilot.pause()
        assert window.tokens == want and window.mode == "state"
        shown = str(window.query_one("#sample-text", Static).render())
        assert shown == text_of(lm, PROMPT, want, (lm.eot_id,))[:-1]
        status = str(window.query_one("#sample-status", Static).render())
        assert "16 tokens in" in status and "recurrent state carried" in status, status
        assert any(PROMPT.strip() in line for line in screen_lines(app))
        # a bad field is named, nothing generated
        window.query_one("#sample-temperature", Input).value = "hot"
        await pilot.press("enter")
        await pilot.pause()
        assert "temperature: expected a number >= 0" in str(window.query_one("#sample-status", Static).render())
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)
    store.close()


def test_a_key_value_cache_is_kept_within_the_window(llama, capsys):
    """A transformers model's cache has positions up to its window (64 here): prompt +
    tokens past it generates what fits, said in one line."""
    lm = load(str(llama))
    n = len(prompt_ids(lm, "the cat sat on"))
    rc, out, err = sample(capsys, str(llama), "--prompt", "the cat sat on", "--tokens", "100", "--temperature", "0",
                          "--ignore-eos")
    assert rc == 0, err
    assert f"100 tokens after a {n}-token prompt pass {llama}'s window of 64 tokens: generating {64 - n}" in err
    assert f"sample: {64 - n} tokens in" in err
