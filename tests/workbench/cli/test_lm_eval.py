"""``ssm-workbench eval`` (issue 34 item 1): the lm-eval adapter against lm-eval's own ``hf``
model, Mamba checkpoints on the workbench's Mamba, streamed against recomputed generation,
an evaluation as a run of the store (resumed per task), and a workbench-trained LM evaluated
end to end. Everything is made in the test: a tiny GPT-NeoX and a tiny Mamba checkpoint with
a byte-level BPE tokenizer, and a task folder (lm-eval YAML + JSON lines) of four tasks, one
per request type: multiple choice (acc, acc_norm), LAMBADA-style last word (perplexity, acc),
rolling log-likelihood (word/byte perplexity, bits per byte) and greedy generation."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from helpers import tiny_lm_corpus, tiny_lm_profile_text

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed: pip install 'ssm-workbench[eval]'")
pytest.importorskip("transformers", reason="the tiny checkpoints need transformers (extra 'pretrained')")

TEXT = ("the cat sat on the mat . the dog ran to the park . a bird sang in the tree . "
        "the sun is hot and the sea is blue . we like to read a good book at night . ")
TASKS = ["tiny_mc", "tiny_lambada", "tiny_ppl", "tiny_gen"]


# ------------------------------------------------------------------ what the tests evaluate
def write_tokenizer(folder: Path):
    """A byte-level BPE (120 ids) with <|endoftext|> as BOS and EOS, as save_pretrained writes it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT * 4], trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    return fast


def train_briefly(model, fast, steps: int = 40) -> None:
    """A few steps on TEXT, so that the tasks' choices get different, non-trivial scores."""
    ids = torch.tensor([fast.encode(TEXT * 3)[:96]])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def write_neox(folder: Path) -> Path:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    fast = write_tokenizer(folder)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=48, eos_token_id=fast.eos_token_id,
        bos_token_id=fast.bos_token_id))
    train_briefly(model, fast, steps=25)
    model.save_pretrained(str(folder))
    return folder


def write_mamba(folder: Path) -> Path:
    from transformers import MambaConfig, MambaForCausalLM

    fast = write_tokenizer(folder)
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(
        vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, state_size=8,
        eos_token_id=fast.eos_token_id, bos_token_id=fast.bos_token_id))
    train_briefly(model, fast, steps=20)
    model.save_pretrained(str(folder))
    return folder


def write_tasks(folder: Path, cache: Path) -> Path:
    """Four lm-eval tasks over JSON-lines files in ``folder`` (datasets' cache in ``cache``)."""
    folder.mkdir(parents=True, exist_ok=True)
    mc = [{"question": "the cat sat on the", "choices": ["mat", "sea", "book"], "label": 0},
          {"question": "the dog ran to the", "choices": ["night", "park"], "label": 1},
          {"question": "a bird sang in the", "choices": ["tree", "cat", "blue sea"], "label": 0},
          {"question": "the sun is", "choices": ["cold", "hot"], "label": 1},
          {"question": "we like to read a good", "choices": ["book", "dog", "mat"], "label": 0}]
    # the last document is longer than the checkpoints' context (48): truncation and several
    # rolling windows are exercised
    docs = [{"text": "the cat sat on the mat"}, {"text": "the dog ran to the park"},
            {"text": "a bird sang in the tree"}, {"text": "the sea is blue"},
            {"text": "we like to read a good book at night . " * 6 + "the end"}]
    gen = [{"question": "the cat sat on", "answer": " the mat"}, {"question": "the sun is", "answer": " hot"},
           {"question": "a bird", "answer": " sang"}]
    for name, rows in (("mc", mc), ("docs", docs), ("gen", gen)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def head(task: str, data: str) -> str:
        return (f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  cache_dir: {cache}\n  data_files:\n"
                f"    test: {folder / data}\ntest_split: test\n")

    (folder / "tiny_mc.yaml").write_text(
        head("tiny_mc", "mc.jsonl") + "output_type: multiple_choice\n"
        "doc_to_text: \"{{question}}\"\ndoc_to_target: \"{{label}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    (folder / "tiny_lambada.yaml").write_text(
        head("tiny_lambada", "docs.jsonl") + "output_type: loglikelihood\n"
        "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\ndoc_to_target: \"{{' '+text.split(' ')[-1]}}\"\n"
        "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    (folder / "tiny_ppl.yaml").write_text(
        head("tiny_ppl", "docs.jsonl") + "output_type: loglikelihood_rolling\n"
        "doc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    (folder / "tiny_gen.yaml").write_text(
        head("tiny_gen", "gen.jsonl") + "output_type: generate_until\n"
        "doc_to_text: \"{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\".\"]\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The checkpoints and the task folder, each made on first use (the Mamba only for the
    tests that ask for it: transformers' Mamba trains slowly on a CPU)."""
    root = tmp_path_factory.mktemp("lm-eval")
    makers = {"neox": lambda: write_neox(root / "neox"), "mamba": lambda: write_mamba(root / "mamba"),
              "tasks": lambda: write_tasks(root / "tasks", root / "datasets-cache")}

    class Made(dict):
        def __missing__(self, key):
            self[key] = makers[key]()
            return self[key]

    return Made()


def evaluate(model, tasks_dir: Path, names=TASKS) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    # the folder's tasks alone: indexing lm-eval's own ~15,000 takes 10-50 s
    manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=list(names), task_manager=manager,
                                   bootstrap_iters=50, log_samples=True)


def numbers(res: dict) -> dict:
    """{task: {metric: value}} of a simple_evaluate result, numbers only."""
    return {t: {k: float(v) for k, v in vals.items() if "," in k and isinstance(v, (int, float))}
            for t, vals in res["results"].items()}


def responses(res: dict, task: str) -> list:
    return [s["resps"] for s in sorted(res["samples"][task], key=lambda s: s["doc_id"])]


def same_responses(a, b, where: str) -> None:
    """Nested responses equal: floats (log-likelihoods) to 1e-5, the rest (greedy flags,
    generated text) exactly."""
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for x, y in zip(a, b):
            same_responses(x, y, where)
    elif isinstance(a, float) and not isinstance(a, bool):
        assert a == pytest.approx(b, rel=1e-5), where
    else:
        assert a == b, where


def hf_lm(folder: Path):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(folder), device="cpu", batch_size=3, dtype="float32")


def adapter(folder_or_ref: str, **kw):
    from workbench.train.eval_models import load
    from workbench.train.lm_eval_adapter import WorkbenchLM

    return WorkbenchLM(load(str(folder_or_ref), torch.device("cpu"), **kw), batch_size=2)


def assert_close(ours: dict, theirs: dict, rel: float) -> None:
    assert ours.keys() == theirs.keys()
    for task in theirs:
        assert ours[task].keys() == theirs[task].keys(), task
        for k, v in theirs[task].items():
            assert ours[task][k] == pytest.approx(v, rel=rel, abs=1e-9), (task, k)


# ------------------------------------------------------------------------- the adapter
@needs_lm_eval
def test_adapter_equals_lm_evals_hf_model(made):
    """The adapter's numbers, and every per-document response (log-likelihoods, greedy
    flags, generated text), equal lm-eval's own hf model on the same checkpoint and tasks."""
    ours = evaluate(adapter(made["neox"]), made["tasks"])
    theirs = evaluate(hf_lm(made["neox"]), made["tasks"])
    assert_close(numbers(ours), numbers(theirs), rel=1e-5)
    for task in TASKS:
        same_responses(responses(ours, task), responses(theirs, task), task)
    # the trained model tells the choices apart: not a test of all-equal scores
    assert numbers(ours)["tiny_mc"]["acc,none"] > 0.5
    print("\nadapter vs lm-eval hf (GPT-NeoX):")
    for task in TASKS:
        for k, v in numbers(theirs)[task].items():
            if "stderr" not in k:
                print(f"  {task:13s} {k:22s} adapter {numbers(ours)[task][k]:.10g}  hf {v:.10g}")


@needs_lm_eval
@pytest.mark.slow
def test_mamba_checkpoint_runs_on_the_workbench_mamba_and_matches_transformers(made):
    """A Mamba -hf checkpoint is scored on the workbench's own Mamba (generating from its
    recurrent state), and agrees with lm-eval's hf model running transformers' Mamba."""
    ours_lm = adapter(made["mamba"])
    assert ours_lm.lm.info["kind"] == "workbench-mamba"
    ours = evaluate(ours_lm, made["tasks"])
    theirs = evaluate(hf_lm(made["mamba"]), made["tasks"])
    assert_close(numbers(ours), numbers(theirs), rel=1e-4)
    assert responses(ours, "tiny_gen") == responses(theirs, "tiny_gen")
    assert ours_lm.generation == {"streamed": 3, "recomputed": 0}


@needs_lm_eval
@pytest.mark.parametrize("kind", ["neox", pytest.param("mamba", marks=pytest.mark.slow)])
def test_generation_from_the_state_equals_recomputing_the_whole_sequence(made, kind):
    """Greedy generation carried by the KV cache (GPT-NeoX) or the recurrent state (Mamba)
    gives the text that re-running the model over the whole sequence for every token gives."""
    from lm_eval.api.instance import Instance

    streamed = adapter(made[kind])
    recomputed = adapter(made[kind])
    recomputed.lm.start = recomputed.lm.step = None
    reqs = [Instance("generate_until", {}, (ctx, {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}), i)
            for i, ctx in enumerate(["the cat sat on", "we like", "a bird sang in the tree . the"])]
    a, b = streamed.generate_until(reqs), recomputed.generate_until(reqs)
    assert a == b and any(len(t) > 3 for t in a)
    assert streamed.generation["streamed"] == 3 and recomputed.generation["recomputed"] == 3


# --------------------------------------------------------------- evaluation runs in the store
def eval_run(store, spec: dict) -> int:
    from workbench.train import worker

    (rid,) = store.add_runs([spec])
    store.mark_started(rid, os.getpid(), "cpu", None)
    worker.run(str(store.root), rid)
    return rid


@needs_lm_eval
@pytest.mark.slow
def test_an_eval_run_stores_metrics_per_task_and_resumes_at_the_next_task(made, tmp_path, monkeypatch):
    """The run's numbers land as results with eval set = task (what export and report read);
    stopped after its first task, it is preempted with that task kept, and resumed it
    evaluates only the rest."""
    import lm_eval

    from workbench.execute.resume import requeue
    from workbench.results.aggregate import records
    from workbench.store import Store
    from workbench.train import worker
    from workbench.train.eval_run import eval_spec

    real, calls = lm_eval.simple_evaluate, []

    def stopped_at_second(*a, **kw):
        calls.append(kw["tasks"])
        if len(calls) == 2:  # as if SIGTERM arrived while the second task ran
            raise worker.Stopped(signal.SIGTERM)
        return real(*a, **kw)

    monkeypatch.setattr(lm_eval, "simple_evaluate", stopped_at_second)
    store = Store(tmp_path / "st")
    spec = eval_spec(str(made["neox"]), ["tiny_mc", "tiny_lambada"], include=[str(made["tasks"])],
                     bootstrap_iters=50, device="cpu")
    rid = eval_run(store, spec)
    run = store.get(rid)
    assert run.state == "preempted" and "after 1 task" in run.error
    assert set(store.results([rid])[rid]) == {"tiny_mc"}
    # the in-process worker's pid is this test's: as if it had exited
    monkeypatch.setattr("workbench.execute.resume.pid_alive", lambda *a: False)
    assert requeue(store, rid) == "resumed"
    store.mark_started(rid, os.getpid(), "cpu", None)
    worker.run(str(store.root), rid)
    run = store.get(rid)
    assert run.state == "finished", run.error
    assert calls == [["tiny_mc"], ["tiny_lambada"], ["tiny_lambada"]]
    res = store.results([rid])[rid]
    assert set(res) == {"", "tiny_mc", "tiny_lambada"}
    direct = numbers(evaluate(adapter(made["neox"]), made["tasks"], ["tiny_mc", "tiny_lambada"]))
    assert res["tiny_mc"]["acc"] == pytest.approx(direct["tiny_mc"]["acc,none"])
    assert res["tiny_mc"]["acc_norm_stderr"] == pytest.approx(direct["tiny_mc"]["acc_norm_stderr,none"])
    assert res["tiny_lambada"]["perplexity"] == pytest.approx(direct["tiny_lambada"]["perplexity,none"], rel=1e-5)  # batch 8 vs 2: float sums differ
    assert res["tiny_lambada"]["samples"] == 5 and res[""]["params"] > 0
    recs = {r["eval_set"]: r for r in records(store, profile="eval")}
    assert recs["tiny_mc"]["acc"] == res["tiny_mc"]["acc"] and recs["tiny_mc"]["model"] == str(made["neox"])
    assert run.step == run.total_steps == 2 and run.progress == 1.0


@needs_lm_eval
@pytest.mark.slow
def test_a_workbench_trained_lm_is_evaluated_end_to_end(made, tmp_path):
    """A Mamba trained on the lm task through the worker keeps its weights; `eval run:N`
    scores it with the task's own tokenizer (bytes), generating from its recurrent state."""
    from workbench.spec.profile import expand, loads
    from workbench.store import Store
    from workbench.train import checkpoint
    from workbench.train.eval_run import eval_spec

    corpus = tiny_lm_corpus(tmp_path / "corpus", TEXT * 2)
    profile = tiny_lm_profile_text(corpus, "lm-eval-tiny", lr=3e-3)
    store = Store(tmp_path / "st")
    trained = eval_run(store, expand(loads(profile))[0].to_dict())
    assert store.get(trained).state == "finished", store.get(trained).error
    assert checkpoint.weights_path(store.root, trained).is_file()
    rid = eval_run(store, eval_spec(f"run:{trained}", TASKS, include=[str(made["tasks"])],
                                    bootstrap_iters=50, device="cpu"))
    run = store.get(rid)
    assert run.state == "finished", run.error
    res = store.results([rid])[rid]
    assert 0 <= res["tiny_mc"]["acc"] <= 1 and res["tiny_lambada"]["perplexity"] > 1
    assert res["tiny_ppl"]["bits_per_byte"] > 0 and "exact_match" in res["tiny_gen"]
    assert run.info["eval_model"]["kind"] == "workbench-run" and run.info["eval_model"]["tokenizer"] == "bytes"
    assert run.info["generation"] == {"streamed": 3, "recomputed": 0}
    assert run.info["max_length"] == 32


@needs_lm_eval
def test_eval_command_inline_prints_the_table_and_does_not_evaluate_twice(made, tmp_path, capsys):
    from workbench.cli import main

    args = ["--store", str(tmp_path / "st"), "eval", str(made["neox"]), "--tasks", "tiny_mc",
            "--include", str(made["tasks"]), "--inline", "--bootstrap-iters", "10", "--device", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tiny_mc" in out and "acc" in out and "export --profile eval" in out
    assert main(args) == 0
    assert "evaluated on these tasks already" in capsys.readouterr().out


def test_eval_command_without_lm_eval_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    from workbench.cli import eval_cmd, main

    real = importlib.util.find_spec
    monkeypatch.setattr(eval_cmd.importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))
    assert main(["--store", str(tmp_path / "st"), "eval", "some/model", "--tasks", "hellaswag"]) == 2
    assert "pip install 'ssm-workbench[eval]'" in capsys.readouterr().err


@needs_lm_eval
def test_bad_references_fail_in_one_line(made, tmp_path):
    from workbench.store import Store
    from workbench.train.eval_run import eval_spec

    store = Store(tmp_path / "st")
    # (an unknown task name is not tried here: looking it up indexes lm-eval's ~15,000 tasks)
    for ref, words in (("run:99", "no such run"), (str(tmp_path / "nothing/here/x"), "no such folder")):
        rid = eval_run(store, eval_spec(ref, ["tiny_mc"], include=[str(made["tasks"])], device="cpu"))
        run = store.get(rid)
        assert run.state == "failed" and words in run.error and "\n" not in run.error
    with pytest.raises(ValueError, match="unknown option"):
        eval_spec("x/y", ["t"], batchsize=3)


@needs_lm_eval
def test_a_hub_id_is_read_from_the_hugging_face_cache_offline(made, tmp_path, monkeypatch):
    """`eval owner/name` loads the snapshot of the standard cache (offline: nothing fetched)
    and scores it as the folder it came from."""
    from test_hub import put

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snap = put(home, "tiny-org/tiny-neox", made["neox"])
    by_id = adapter("tiny-org/tiny-neox")
    assert by_id.lm.info["folder"] == str(snap)
    a = numbers(evaluate(by_id, made["tasks"], ["tiny_mc"]))
    b = numbers(evaluate(adapter(made["neox"]), made["tasks"], ["tiny_mc"]))
    assert a == b
    from workbench.train.eval_models import ModelRefError

    with pytest.raises(ModelRefError, match="HF_HUB_OFFLINE"):
        adapter("tiny-org/absent")


@needs_lm_eval
def test_the_adapter_reports_how_far_into_a_task_it_is():
    """progress(done, total) after each batch of log-likelihoods and each generation, up to
    (total, total): what an evaluation run turns into its progress within a task."""
    from lm_eval.api.instance import Instance

    from workbench.train.lm_eval_adapter import LoadedLM, WorkbenchLM

    torch.manual_seed(0)
    table = torch.randn(16, 16)
    lm = LoadedLM(name="bytes", logits=lambda ids: table[ids], eot_id=0, prefix_id=0, max_length=32,
                  encode=lambda text, special=None: [1 + ord(c) % 15 for c in text],
                  decode=lambda ids, skip=True: "".join(chr(96 + i) for i in ids), device=torch.device("cpu"))
    seen = []
    a = WorkbenchLM(lm, batch_size=2)
    a.progress = lambda done, total: seen.append((done, total))
    reqs = [Instance("loglikelihood", {}, (f"context {i}", " x"), i) for i in range(5)]
    assert len(a.loglikelihood(reqs)) == 5
    assert seen == [(2, 5), (4, 5), (5, 5)]
    seen.clear()
    gen = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 2}), i) for i, c in enumerate("ab")]
    a.generate_until(gen)
    assert seen == [(1, 2), (2, 2)]
