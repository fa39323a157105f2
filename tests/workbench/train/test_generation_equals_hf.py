"""``ssm-workbench eval``'s generation is the model's own (issue 41 item 3).

For every family ``eval`` accepts (Llama and GPT-NeoX through transformers, Mamba on the
workbench's own Mamba, Mamba-2 through transformers), greedy generation through the
adapter's ``generate_until`` gives, token for token, what ``model.generate(do_sample=False)``
gives when called as lm-eval's ``hf`` model calls it (its stopping criteria for the stop
strings, ``max_length`` = context + budget), and the same text as lm-eval's ``hf`` model.
Each checkpoint is made in the test: random weights, tiny, a byte-level BPE tokenizer with
``<s>`` / ``</s>`` beside it, and the ``</s>`` row of the output layer set to 1.05 times the
row of a token the model often emits, so that about half the generations end at
end-of-text (the case where stopping on decoded text without special tokens ran on).
Also: a budget the context window cannot hold and a continuation longer than the window
are refused in one line (lm-eval's ``hf`` model refuses both, with a bare assertion), and
a model whose ``forward`` takes no known cache keyword is refused rather than run without
its state.

The same comparison on 40 prompts per family, printed side by side:
``.venv/bin/python tests/workbench/train/test_generation_equals_hf.py``.
"""
from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the tiny checkpoints need transformers (extra 'pretrained')")
if importlib.util.find_spec("lm_eval") is None:  # pragma: no cover
    pytest.skip("lm-eval is not installed: pip install 'ssm-workbench[eval]'", allow_module_level=True)

TEXT = ("the cat sat on the mat . the dog ran to the park . a bird sang in the tree . "
        "the sun is hot and the sea is blue . we like to read a good book at night . ")
WORDS = TEXT.split()
FAMILIES = ("llama", "gpt_neox", "mamba", "mamba2")
CONTEXT = 64  # the attention models' max_position_embeddings: lm-eval's max_length for them


def prompts(n: int) -> list[str]:
    """n contexts of 1-8 words of TEXT (deterministic)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        start, length = int(torch.randint(0, len(WORDS) - 8, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        out.append(" ".join(WORDS[start:start + length]))
    return out


# ------------------------------------------------------------------ the tiny checkpoints
def write_tokenizer(folder: Path):
    """A byte-level BPE (~100 ids) with ``<s>`` (BOS) and ``</s>`` (EOS), as save_pretrained writes it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT * 4], trainers.BpeTrainer(
        vocab_size=100, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return fast


def hf_model(family: str, vocab: int, eos: int, bos: int):
    """A tiny random transformers causal LM of ``family``."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, eos_token_id=eos, bos_token_id=bos)
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common, intermediate_size=64, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=CONTEXT))
    if family == "gpt_neox":
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**common, intermediate_size=64, num_attention_heads=4,
                                                      max_position_embeddings=CONTEXT))
    if family == "mamba":
        return tf.MambaForCausalLM(tf.MambaConfig(**common, state_size=8))
    if family == "mamba2":
        return tf.Mamba2ForCausalLM(tf.Mamba2Config(**common, state_size=8, num_heads=4, head_dim=16, expand=2,
                                                    n_groups=1, chunk_size=16))
    raise ValueError(family)


@torch.no_grad()
def write_checkpoint(family: str, folder: Path, seed: int = 0) -> Path:
    """A random ``family`` checkpoint whose ``</s>`` logit is 1.05 times that of the token it
    emits most often after its first two (so it often ends at end-of-text, module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    fast = write_tokenizer(folder)
    torch.manual_seed(seed)
    model = hf_model(family, len(fast), fast.eos_token_id, fast.bos_token_id).eval()
    seen = collections.Counter()
    for text in prompts(12):
        ids = torch.tensor([fast.encode(text)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             pad_token_id=fast.eos_token_id)
        seen.update(set(out[0, ids.shape[1] + 2:].tolist()))
    often = next(t for t, _ in seen.most_common() if t not in (fast.eos_token_id, fast.bos_token_id))
    head = model.get_output_embeddings().weight
    head[fast.eos_token_id] = 1.05 * head[often]
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The four checkpoints, each made on first use."""
    root = tmp_path_factory.mktemp("gen-equals-hf")

    class Made(dict):
        def __missing__(self, family):
            self[family] = write_checkpoint(family, root / family)
            return self[family]

    return Made()


# ------------------------------------------------------------------ the two generations
def requests(texts: list[str], until: list[str], budget: int):
    from lm_eval.api.instance import Instance

    return [Instance("generate_until", {}, (t, {"until": list(until), "max_gen_toks": budget, "do_sample": False}), i)
            for i, t in enumerate(texts)]


def ours(folder: Path, texts: list[str], until: list[str], budget: int):
    """(texts, tokens) of the workbench's eval on ``folder``, and its adapter."""
    from workbench.train.eval_models import load
    from workbench.train.lm_eval_adapter import WorkbenchLM

    lm = WorkbenchLM(load(str(folder), torch.device("cpu")), batch_size=1)
    answers = lm.generate_until(requests(texts, until, budget))
    return answers, [list(t) for t in lm.generated], lm


@torch.no_grad()
def theirs(folder: Path, texts: list[str], until: list[str], budget: int):
    """(texts, tokens) of ``model.generate(do_sample=False)`` called as lm-eval's hf model
    calls it (stopping criteria for ``until`` + the EOS text, max_length = context + budget,
    the answer decoded without special tokens and cut before the first stop string)."""
    from lm_eval.models.utils import handle_stop_sequences, postprocess_generated_text
    from lm_eval.models.utils_hf import stop_sequences_criteria
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    stops = handle_stop_sequences(list(until), eos=tok.decode(tok.eos_token_id, skip_special_tokens=False))
    answers, tokens = [], []
    for text in texts:
        ids = torch.tensor([tok.encode(text)])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                             max_length=ids.shape[1] + budget, pad_token_id=tok.pad_token_id,
                             stopping_criteria=stop_sequences_criteria(tok, stops, ids.shape[1], 1))
        new = out[0, ids.shape[1]:].tolist()
        tokens.append(new)
        answers.append(postprocess_generated_text(tok.decode(new, skip_special_tokens=True), stops, None))
    return answers, tokens, tok


def how_ended(tokens: list[int], answer: str, tok, budget: int) -> str:
    """'eos', 'stop' (a stop string) or 'budget'."""
    if tokens and tokens[-1] == tok.eos_token_id:
        return "eos"
    return "budget" if len(tokens) == budget and answer == tok.decode(tokens, skip_special_tokens=True) else "stop"


def stop_piece(folder: Path, texts: list[str], budget: int) -> str:
    """A two-character piece of text that some, not all, of the model's generations hold:
    a stop string that stops some of them, often spread over two tokens."""
    answers = theirs(folder, texts, [], budget)[0]
    pieces = collections.Counter(p for s in answers for p in {s[i:i + 2] for i in range(len(s) - 1)})
    return next(p for p, c in pieces.most_common() if c < len(texts) // 2 and p.strip() and "<" not in p)


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_equals_model_generate_token_for_token(made, family):
    """generate_until's tokens are model.generate's, with end-of-text, stop strings (one
    that is a word, one that is the EOS text) and the budget all ending some generations."""
    texts, until, budget = prompts(12), [" a"], 14
    a_text, a_toks, lm = ours(made[family], texts, until, budget)
    b_text, b_toks, tok = theirs(made[family], texts, until, budget)
    assert lm.lm.info["kind"] == ("workbench-mamba" if family == "mamba" else "transformers")
    assert lm.generation == {"streamed": len(texts), "recomputed": 0}  # carried by the state
    assert a_toks == b_toks
    assert a_text == b_text
    ended = collections.Counter(how_ended(t, s, tok, budget) for t, s in zip(b_toks, b_text))
    assert ended["eos"] >= 2 and ended["eos"] + ended["stop"] < len(texts), ended  # the checkpoint ends some at EOS
    assert all(tok.eos_token not in s for s in a_text)


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_stop_strings_equal_model_generate_and_lm_evals_hf_model(made, family):
    """Stop strings that several tokens make up, one of them the EOS text written out: the
    tokens are model.generate's and the text lm-eval's own hf model's."""
    from lm_eval.models.huggingface import HFLM

    texts, budget = prompts(8), 10
    until = [stop_piece(made[family], texts, budget), "</s>"]
    a_text, a_toks, _ = ours(made[family], texts, until, budget)
    b_text, b_toks, _ = theirs(made[family], texts, until, budget)
    assert a_toks == b_toks and a_text == b_text
    assert any(len(t) < budget for t in b_toks)  # the stop string stopped some
    hf = HFLM(pretrained=str(made[family]), device="cpu", batch_size=1, dtype="float32")
    assert hf.generate_until(requests(texts, until, budget)) == a_text


def test_the_cache_goes_by_the_keyword_each_forward_takes(made):
    """Each family's step passes its cache by the name its forward's signature has."""
    import inspect

    from workbench.train.eval_models import load

    for family in ("llama", "gpt_neox", "mamba2"):
        lm = load(str(made[family]), torch.device("cpu"))
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(made[family]))
        assert lm.info["cache_keyword"] in inspect.signature(model.forward).parameters, family


def test_a_forward_without_a_known_cache_keyword_is_refused_not_recomputed(made, monkeypatch):
    """A transformers whose forward takes its cache by an unknown name: generation stops
    with one line naming the class, instead of running every step without state."""
    from workbench.train import eval_models
    from workbench.train.eval_models import ModelRefError

    monkeypatch.setattr(eval_models, "CACHE_KEYWORDS", ("kv_state",))
    texts = prompts(1)
    with pytest.raises(ModelRefError, match=r"Mamba2ForCausalLM.forward .* takes none of the cache keywords kv_state") as e:
        ours(made["mamba2"], texts, [" a"], 4)
    assert "\n" not in str(e.value)


def test_a_budget_the_context_cannot_hold_is_refused_as_hf_refuses_it(made):
    from lm_eval.models.huggingface import HFLM

    with pytest.raises(ValueError, match=rf"max_gen_toks = {CONTEXT} leaves no room for a context in the model's window of {CONTEXT} tokens") as e:
        ours(made["llama"], prompts(1), [" a"], CONTEXT)
    assert "\n" not in str(e.value)
    hf = HFLM(pretrained=str(made["llama"]), device="cpu", batch_size=1, dtype="float32")
    with pytest.raises(AssertionError, match="must be less than model's maximum sequence length"):
        hf.generate_until(requests(prompts(1), [" a"], CONTEXT))
    ours(made["llama"], prompts(1), [" a"], CONTEXT - 1)  # one token of context is room enough


def test_a_continuation_longer_than_the_context_is_refused_in_one_line(made):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from workbench.train.eval_models import load
    from workbench.train.lm_eval_adapter import WorkbenchLM

    lm = WorkbenchLM(load(str(made["llama"]), torch.device("cpu")), batch_size=2)
    long = " ".join(WORDS * 3)  # > 64 tokens
    assert len(lm.tok_encode(long)) > CONTEXT
    reqs = [Instance("loglikelihood", {}, ("the cat", " sat"), 0), Instance("loglikelihood", {}, ("the cat", " " + long), 1)]
    with pytest.raises(ValueError, match=rf"a continuation of \d+ tokens is longer than the model's context window of {CONTEXT} tokens") as e:
        lm.loglikelihood(reqs)
    assert "\n" not in str(e.value)
    assert len(lm.loglikelihood(reqs[:1])) == 1
    hf = HFLM(pretrained=str(made["llama"]), device="cpu", batch_size=1, dtype="float32")
    with pytest.raises(AssertionError):
        hf.loglikelihood(reqs)


# ------------------------------------------------------------------ side by side, by hand
def ours_by_decode(folder: Path, texts: list[str], until: list[str], budget: int):
    """(texts, tokens) of the adapter, the tokens read from its last decode without special
    tokens of each request (works on the adapter before issue 41 too, which kept none)."""
    from workbench.train.eval_models import load
    from workbench.train.lm_eval_adapter import WorkbenchLM

    lm = WorkbenchLM(load(str(folder), torch.device("cpu")), batch_size=1)
    seen, decode = [], lm.tok_decode

    def recording(ids, skip_special_tokens=True):
        if skip_special_tokens:
            seen.append(list(ids))
        return decode(ids, skip_special_tokens)

    lm.tok_decode = recording
    answers, tokens = [], []
    for req in requests(texts, until, budget):
        seen.clear()
        answers += lm.generate_until([req])
        tokens.append(seen[-1])
    return answers, tokens


def main(n: int = 40) -> None:  # pragma: no cover - run by hand, see module doc
    import tempfile

    texts, budget = prompts(n), 14
    print(f"{n} prompts per family, until = [a piece of text some generations hold] + '</s>', "
          f"max_gen_toks = {budget}")
    print(f"{'family':9s} {'identical tokens':>17s} {'identical text':>15s} {'mean len ours':>14s} "
          f"{'mean len hf':>12s}  hf ended by")
    with tempfile.TemporaryDirectory() as root:
        for family in FAMILIES:
            folder = write_checkpoint(family, Path(root) / family)
            until = [stop_piece(folder, texts, budget)]
            a_text, a_toks = ours_by_decode(folder, texts, until, budget)
            b_text, b_toks, tok = theirs(folder, texts, until, budget)
            same_t = sum(x == y for x, y in zip(a_toks, b_toks))
            same_s = sum(x == y for x, y in zip(a_text, b_text))
            ended = collections.Counter(how_ended(t, s, tok, budget) for t, s in zip(b_toks, b_text))
            print(f"{family:9s} {same_t:>8d} of {n:<6d} {same_s:>6d} of {n:<6d} "
                  f"{sum(map(len, a_toks)) / n:>14.1f} {sum(map(len, b_toks)) / n:>12.1f}  {dict(ended)}  until {until}")


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path.cwd()))  # the checkout the command runs in (PYTHONPATH may name another)
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)


@pytest.mark.parametrize("family", ["llama", "mamba"])
def test_a_checkpoint_whose_generation_config_changes_greedy_decoding_is_refused_for_generation(made, family, tmp_path):
    """A generation_config.json with a repetition penalty: model.generate applies it to
    greedy decoding (its tokens differ from the plain argmax's on some prompts), so the
    adapter refuses generation in one line naming the setting instead of answering with
    other tokens; log-likelihoods, which no generation setting touches, are still scored.
    The configs save_pretrained writes by default change nothing (every other test here)."""
    import json
    import shutil

    from lm_eval.api.instance import Instance

    from workbench.train.eval_models import greedy_changes, load
    from workbench.train.lm_eval_adapter import WorkbenchLM

    folder = tmp_path / family
    shutil.copytree(made[family], folder)
    texts, budget = prompts(12), 14
    plain = theirs(folder, texts, [], budget)[1]
    gen_file = folder / "generation_config.json"
    cfg = json.loads(gen_file.read_text())
    cfg["repetition_penalty"] = 3.0
    gen_file.write_text(json.dumps(cfg))
    penalised = theirs(folder, texts, [], budget)[1]
    assert penalised != plain, "the penalty changes model.generate's greedy tokens"
    with pytest.raises(ValueError, match=r"generation config sets repetition_penalty = 3\.0, which model\.generate") as e:
        ours(folder, texts[:1], [], budget)
    assert "\n" not in str(e.value)
    lm = WorkbenchLM(load(str(folder), torch.device("cpu")), batch_size=1)
    (ll, _), = lm.loglikelihood([Instance("loglikelihood", {}, ("the cat", " sat"), 0)])
    assert ll < 0
    from transformers import GenerationConfig
    assert greedy_changes(GenerationConfig.from_pretrained(str(made[family]))) == ()
    assert greedy_changes(GenerationConfig(num_beams=4, no_repeat_ngram_size=3, suppress_tokens=[])) == (
        "no_repeat_ngram_size = 3", "num_beams = 4")
