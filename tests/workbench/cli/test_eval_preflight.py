"""Models checked before an evaluation is queued (issue 41 items 5b, 5e) and a failed run's
stored error as one line (item 5d).

- ``run:N`` must exist, be an ``lm`` run and have finished; an unfinished one is refused in
  one line unless ``--allow-unfinished`` / ``[eval] allow_unfinished``, which records the
  checkpoint's step (its own run ``run:N@stepS``, never the finished run's cached answer);
- a model folder must have a tokenizer whose ids fit config.json's vocab_size and whole
  weights (a truncated safetensors or torch zip is named);
- ``eval`` (its dry run too), the evaluation form's launch and the evaluation profile's own
  check refuse them before anything is queued;
- a failed run stores ``Type: message (file:line ...)``; the traceback goes to its log.

Everything is made in tmp_path: a hand-written checkpoint folder (config.json, a
tokenizer.json, a safetensors file) and runs added to a scratch store with a checkpoint file
of the step wanted; nothing is trained, no network."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import tiny_lm_corpus, tiny_lm_profile_text
from test_lm_eval_tasks import fake_index, needs_lm_eval, write_task

VOCAB = 8


# ------------------------------------------------------------------ what the tests check
def write_safetensors(path: Path, tensors: dict[str, tuple[int, ...]]) -> Path:
    """A safetensors file of float32 zeros, written by hand from the format (8-byte header
    length, JSON header, data): no library needed, and the check is tested against
    safetensors' own writer separately."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
    return path


def fake_checkpoint(folder: Path, vocab: int = VOCAB, tokens: int = VOCAB, tokenizer: bool = True) -> Path:
    """A checkpoint folder as the checks read it: config.json, model.safetensors (an
    embedding of ``vocab`` rows) and a WordLevel tokenizer.json of ``tokens`` ids."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "vocab_size": vocab}))
    write_safetensors(folder / "model.safetensors", {"embed.weight": (vocab, 4)})
    if tokenizer:
        words = {f"w{i}": i for i in range(tokens - 1)}
        (folder / "tokenizer.json").write_text(json.dumps({
            "added_tokens": [{"id": tokens - 1, "content": "</s>", "special": True}],
            "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"}}))
    return folder


def lm_run(store, tmp_path: Path, state: str, step: int | None = None) -> int:
    """An lm run of the store in ``state`` with a resumable checkpoint at ``step`` (and, when
    finished, its kept final weights at step 3000): as a worker leaves them, without training."""
    from workbench.spec.profile import expand, loads
    from workbench.train import checkpoint

    corpus = tmp_path / "corpus"
    if not corpus.exists():
        tiny_lm_corpus(corpus, "the cat sat on the mat . " * 4)
    spec = expand(loads(tiny_lm_profile_text(corpus, "lm", steps=3000)))[0].to_dict()
    (rid,) = store.add_runs([spec])
    if state != "pending":
        store.mark_started(rid, os.getpid(), "cpu", None)
    if step is not None:
        checkpoint.save({"run_id": rid, "step": step, "model": {}}, checkpoint.path_for(store.root, rid))
    if state == "finished":  # a finished run keeps its weights, not its checkpoint
        checkpoint.path_for(store.root, rid).unlink(missing_ok=True)
        checkpoint.save_weights(store.root, rid, "key", 3000, {})
    if state not in ("pending", "running"):
        assert store.finish(rid, state)
    return rid


@pytest.fixture
def tasks(tmp_path, monkeypatch) -> Path:
    """A task folder (``my_choice``) and lm-eval's names as a small fixed set."""
    fake_index(monkeypatch, ["hellaswag"])
    return write_task(tmp_path / "tasks")


def run_eval(tmp_path, tasks, *models, extra=()) -> int:
    from workbench.cli import main

    return main(["--store", str(tmp_path / "st"), "eval", *models, "--tasks", "my_choice", "--include", str(tasks),
                 "--device", "cpu", *extra])


def refusals(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("eval: ")]


# ------------------------------------------------------------------ model folders
def test_the_safetensors_check_agrees_with_safetensors_own_files(tmp_path):
    """A file written by safetensors passes; cut short, padded, or with a broken header it is
    refused naming the file; the library itself refuses each of them too."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    from models.checkpoint_check import safetensors_problem

    good = tmp_path / "good.safetensors"
    st.save_file({"a": torch.zeros(3, 5), "b": torch.ones(7)}, str(good))
    assert safetensors_problem(good) is None
    data = good.read_bytes()
    cases = {"cut": (data[:-9], "is truncated"), "padded": (data + b"\0" * 4, "is damaged"),
             "header": (data[:8] + b"[" + data[9:], "is damaged"), "tiny": (data[:5], "is truncated")}
    for name, (raw, words) in cases.items():
        f = tmp_path / f"{name}.safetensors"
        f.write_bytes(raw)
        msg = safetensors_problem(f)
        assert msg is not None and words in msg and str(f) in msg and "\n" not in msg, (name, msg)
        with pytest.raises(Exception):
            st.load_file(str(f))


def test_a_folder_is_checked_for_tokenizer_size_and_whole_weights(tmp_path):
    from models.checkpoint_check import folder_problems

    assert folder_problems(fake_checkpoint(tmp_path / "ok")) == []
    (no_tok,) = folder_problems(fake_checkpoint(tmp_path / "no-tok", tokenizer=False))
    assert "no tokenizer" in no_tok and str(tmp_path / "no-tok") in no_tok
    (big,) = folder_problems(fake_checkpoint(tmp_path / "big", vocab=8, tokens=12))
    assert "tokenizer.json has 12 tokens" in big and "vocab_size is 8" in big
    cut = fake_checkpoint(tmp_path / "cut")
    w = cut / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-20])
    (msg,) = folder_problems(cut)
    assert msg.startswith(f"{w} is truncated")
    torch = pytest.importorskip("torch")
    bin_ = tmp_path / "bin"
    fake_checkpoint(bin_)
    (bin_ / "model.safetensors").unlink()
    torch.save({"embed.weight": torch.zeros(VOCAB, 4)}, bin_ / "pytorch_model.bin")
    assert folder_problems(bin_) == []
    raw = (bin_ / "pytorch_model.bin").read_bytes()
    (bin_ / "pytorch_model.bin").write_bytes(raw[:len(raw) // 2])
    (msg,) = folder_problems(bin_)
    assert str(bin_ / "pytorch_model.bin") in msg and "truncated" in msg


@needs_lm_eval
def test_eval_refuses_a_bad_folder_before_anything_is_queued(tmp_path, tasks, monkeypatch, capsys):
    """No tokenizer, a tokenizer larger than the embedding, truncated weights: each one line
    naming the file, exit 2, no run in the store (dry run and real)."""
    from workbench.execute import eval_queue
    from workbench.store import Store

    started = []
    monkeypatch.setattr(eval_queue, "start", lambda *a: started.append(a))
    no_tok = fake_checkpoint(tmp_path / "no-tok", tokenizer=False)
    big = fake_checkpoint(tmp_path / "big", tokens=VOCAB + 3)
    cut = fake_checkpoint(tmp_path / "cut")
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:40])
    assert run_eval(tmp_path, tasks, str(no_tok), str(big), str(cut), extra=["--detach"]) == 2
    lines = refusals(capsys.readouterr().err)
    assert len(lines) == 3, lines
    assert "no tokenizer" in lines[0] and str(no_tok) in lines[0]
    assert f"{big / 'tokenizer.json'} has 11 tokens" in lines[1]
    assert lines[2].startswith(f"eval: {cut / 'model.safetensors'} is truncated")
    assert Store(tmp_path / "st").runs() == [] and started == []
    assert run_eval(tmp_path, tasks, str(no_tok), extra=["--dry-run"]) == 2
    assert "no tokenizer" in capsys.readouterr().err
    ok = fake_checkpoint(tmp_path / "ok")
    assert run_eval(tmp_path, tasks, str(ok), extra=["--dry-run"]) == 0


def test_an_evaluation_profile_refuses_a_folder_without_a_tokenizer(tmp_path):
    from workbench.spec import profile as P

    folder = fake_checkpoint(tmp_path / "m", tokenizer=False)
    text = (f'schema_version = 2\nname = "ev"\n[eval]\nmodels = [{{ label = "m", model = "{folder}" }}]\n'
            f'tasks = ["hellaswag"]\n')
    with pytest.raises(P.ProfileError) as e:
        P.loads(text, "ev.toml")
    assert f"eval.models[0].model (line 4): {folder}: no tokenizer" in str(e.value)
    fake_checkpoint(folder)
    assert P.loads(text, "ev.toml").eval.models[0].model == str(folder)


# ------------------------------------------------------------------ run:N
@needs_lm_eval
def test_eval_refuses_an_unfinished_run_unless_asked_and_records_the_step(tmp_path, tasks, capsys):
    from workbench.execute import eval_queue
    from workbench.spec.eval_spec import eval_spec
    from workbench.spec.run_spec import spec_key
    from workbench.store import Store

    store = Store(tmp_path / "st")
    running = lm_run(store, tmp_path, "running", step=660)
    killed = lm_run(store, tmp_path, "killed", step=900)
    done = lm_run(store, tmp_path, "finished", step=3000)
    fresh = lm_run(store, tmp_path, "pending")
    assert run_eval(tmp_path, tasks, f"run:{running}", extra=["--dry-run"]) == 2
    (line,) = refusals(capsys.readouterr().err)
    assert line.startswith(f"eval: model run:{running} is running, not finished (its last checkpoint is at step 660)")
    assert "--allow-unfinished" in line and f"run:{running}@step660" in line
    assert run_eval(tmp_path, tasks, f"run:{killed}", f"run:{fresh}", "run:99", f"run:{done}",
                    extra=["--dry-run"]) == 2
    lines = refusals(capsys.readouterr().err)
    assert len(lines) == 3, lines  # the finished run is fine
    assert lines[0].startswith(f"eval: model run:{killed} is killed, not finished (its last checkpoint is at step 900")
    assert lines[1].startswith(f"eval: model run:{fresh} is pending, not finished (it has no checkpoint)")
    assert lines[2].startswith("eval: model run:99: no such run")

    # asked for: the checkpoint's step is in the spec, the label and the checkpoint column
    assert run_eval(tmp_path, tasks, f"run:{running}", extra=["--dry-run", "--allow-unfinished"]) == 0
    assert f"run:{running}@step660" in capsys.readouterr().out
    plain = eval_spec(f"run:{running}", ["my_choice"])
    (s,) = eval_queue.preflight(store, [eval_spec(f"run:{running}", ["my_choice"], allow_unfinished=True)])
    assert s["eval"]["checkpoint_step"] == 660 and s["label"] == f"run:{running}@step660"
    assert s["fields"]["checkpoint"] == f"run:{running}@step660" and spec_key(s) != spec_key(plain)
    # a finished run asked with the flag: the same evaluation as without it
    (f,) = eval_queue.preflight(store, [eval_spec(f"run:{done}", ["my_choice"], allow_unfinished=True)])
    assert spec_key(f) == spec_key(eval_spec(f"run:{done}", ["my_choice"]))
    with pytest.raises(eval_queue.Refused, match=f"run:{fresh} is pending and has no checkpoint to score"):
        eval_queue.preflight(store, [eval_spec(f"run:{fresh}", ["t"], allow_unfinished=True)])


@needs_lm_eval
def test_an_eval_run_is_refused_as_a_model(tmp_path, tasks, capsys):
    from workbench.spec.eval_spec import eval_spec
    from workbench.store import Store

    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([eval_spec("x/y", ["t"])])
    assert run_eval(tmp_path, tasks, f"run:{rid}", extra=["--dry-run"]) == 2
    (line,) = refusals(capsys.readouterr().err)
    assert "only runs of the lm task" in line


def test_an_evaluation_of_a_mid_training_checkpoint_is_never_the_finished_runs(tmp_path):
    """Stored before this version: run:N scored at its resumable checkpoint under the plain
    spec. Once the run has finished, `eval run:N` does not answer with it."""
    from workbench.execute import eval_queue
    from workbench.spec.eval_spec import eval_spec
    from workbench.store import Store

    store = Store(tmp_path / "st")
    trained = lm_run(store, tmp_path, "finished", step=3000)
    spec = eval_spec(f"run:{trained}", ["my_choice"])
    (old,) = store.add_runs([spec])
    store.mark_started(old, os.getpid(), "cpu", None)
    store.set_info(old, {"eval_model": {"weights": str(tmp_path / "st/checkpoints/1/last.pt"), "step": 660}})
    store.finish(old, "finished")
    ids, notes = eval_queue.submit(store, [spec], fresh=False)
    assert ids != [old] and any("not counted" in n and "step 660" in n for n in notes), notes
    (good,) = ids  # a finished evaluation of the final weights is found again
    store.mark_started(good, os.getpid(), "cpu", None)
    store.set_info(good, {"eval_model": {"weights": str(tmp_path / "st/checkpoints/1/weights.pt"), "step": 3000}})
    store.finish(good, "finished")
    assert eval_queue.submit(store, [spec], fresh=False)[0] == [good]


@needs_lm_eval
def test_the_evaluation_fails_in_one_line_when_the_checkpoint_moved_on(tmp_path, monkeypatch):
    """Asked for step 660, the run's weights are at 700 by the time the evaluation loads them:
    it fails naming both steps instead of scoring step 700 as step 660."""
    from types import SimpleNamespace

    from workbench.spec.eval_spec import at_checkpoint, eval_spec
    from workbench.store import Store
    from workbench.train import eval_models, worker

    monkeypatch.setattr(eval_models, "load", lambda *a, **kw: SimpleNamespace(info={"step": 700}, max_length=32))
    store = Store(tmp_path / "st")
    spec = at_checkpoint(eval_spec("run:1", ["my_choice"], device="cpu", allow_unfinished=True), 660)
    (rid,) = store.add_runs([spec])
    store.mark_started(rid, os.getpid(), "cpu", None)
    assert worker.run(str(store.root), rid) == 1
    r = store.get(rid)
    assert r.state == "failed" and "at step 700 now, not the step 660" in r.error and "\n" not in r.error


# ------------------------------------------------------------------ the stored error
@needs_lm_eval
def test_a_failed_runs_error_is_one_line_and_the_traceback_goes_to_the_log(tmp_path, monkeypatch, capfd):
    from workbench.spec.eval_spec import eval_spec
    from workbench.store import Store
    from workbench.train import eval_models, worker

    def broken(*a, **kw):
        raise ValueError("the header is broken\n  in a second line")

    monkeypatch.setattr(eval_models, "load", broken)
    store = Store(tmp_path / "st")
    (rid,) = store.add_runs([eval_spec("x/y", ["my_choice"], device="cpu")])
    store.mark_started(rid, os.getpid(), "cpu", None)
    assert worker.run(str(store.root), rid) == 1
    err = store.get(rid).error
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("ValueError: the header is broken in a second line (cli/test_eval_preflight.py:")  # the last two parts of the path
    assert "traceback in the run's log" in err
    assert "Traceback (most recent call last)" in capfd.readouterr().err  # the worker's stderr: its log


# ------------------------------------------------------------------ the evaluation form
@needs_lm_eval
async def test_the_eval_form_refuses_an_unfinished_run_at_launch(tmp_path, monkeypatch):
    from textual.widgets import Input, Select, Static

    from test_tui import SIZE, make_app, settle, type_into
    from test_tui_eval_form import checked, open_form
    from workbench.execute import eval_queue
    from workbench.store import Store

    fake_index(monkeypatch, ["hellaswag"])
    started = []
    monkeypatch.setattr(eval_queue, "start", lambda *a: started.append(a))
    folder = write_task(tmp_path / "tasks")
    store = Store(tmp_path / "store")
    running = lm_run(store, tmp_path, "running", step=660)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(pilot)
        form.query_one("#ev-models", Input).value = f"run:{running}"
        form.query_one("#ev-include", Input).value = str(folder)
        await type_into(pilot, "#ev-name", "evtest")
        await type_into(pilot, "#ev-tasks", "my_choice")
        form.query_one("#ev-device", Select).value = "cpu"
        await checked(pilot, form)
        await pilot.press("ctrl+r")
        await settle(pilot)
        status = str(form.query_one("#eval-status", Static).render())
        assert status.startswith("not launched:") and f"run:{running} is running, not finished" in status, status
        assert "--allow-unfinished" in str(form.query_one("#err-ev-models", Static).render())
        assert store.runs(profile="evtest") == [] and started == []


@needs_lm_eval
def test_profile_check_and_run_dry_run_refuse_an_unfinished_run_of_an_evaluation_profile(tmp_path, tasks,
                                                                                         capsys):
    from workbench.cli import main
    from workbench.store import Store

    store = Store(tmp_path / "st")
    running = lm_run(store, tmp_path, "running", step=660)
    f = tmp_path / "ev.toml"
    body = (f'schema_version = 2\nname = "ev"\n[eval]\nmodels = [{{ label = "mine", model = "run:{running}" }}]\n'
            f'tasks = ["my_choice"]\ninclude = ["{tasks}"]\n')
    f.write_text(body)
    st = ["--store", str(tmp_path / "st")]
    assert main([*st, "profile", "check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: model run:{running} is running, not finished" in err, err
    assert main([*st, "run", str(f), "--dry-run"]) == 2
    assert f"model run:{running} is running, not finished" in capsys.readouterr().err
    f.write_text(body + "allow_unfinished = true\n")
    assert main([*st, "profile", "check", str(f)]) == 0
    capsys.readouterr()
    assert main([*st, "run", str(f), "--dry-run"]) == 0
    assert "mine@step660" in capsys.readouterr().out
    assert main(["--store", str(tmp_path / "none"), "profile", "check", str(f)]) == 2
    assert "no such run" in capsys.readouterr().err and not (tmp_path / "none").exists()


def test_an_unfinished_runs_checkpoint_is_kept_at_the_step_asked_for(tmp_path):
    """Training goes on after the evaluation is queued (its checkpoint replaced by a rename,
    as the trainer saves it): the evaluation still loads the step it was asked for, from
    the links ``submit`` made; a checkpoint replaced between the check and the queueing is
    recorded with the step actually kept."""
    from workbench.execute import eval_queue
    from workbench.spec.eval_spec import eval_spec
    from workbench.store import Store
    from workbench.train import checkpoint

    store = Store(tmp_path / "st")
    running = lm_run(store, tmp_path, "running", step=660)
    live = checkpoint.path_for(store.root, running)
    (s,) = eval_queue.preflight(store, [eval_spec(f"run:{running}", ["t"], allow_unfinished=True)])
    (rid,), _ = eval_queue.submit(store, [s], fresh=False)
    checkpoint.save({"run_id": running, "step": 720, "model": {}}, live)
    src = store.get(rid).info["eval_source"]
    assert src["run_id"] == running and src["files_root"] != str(store.root)
    assert checkpoint.read_header(checkpoint.path_for(src["files_root"], running)).step == 660
    assert checkpoint.read_header(live).step == 720
    (s,) = eval_queue.preflight(store, [eval_spec(f"run:{running}", ["t"], allow_unfinished=True)])
    checkpoint.save({"run_id": running, "step": 780, "model": {}}, live)  # between the check and the queueing
    (rid2,), notes = eval_queue.submit(store, [s], fresh=False)
    r = store.get(rid2)
    assert r.spec["eval"]["checkpoint_step"] == 780 and r.label == f"run:{running}@step780", notes
    assert checkpoint.read_header(checkpoint.path_for(r.info["eval_source"]["files_root"], running)).step == 780
