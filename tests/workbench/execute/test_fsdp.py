"""Fully sharded data parallelism (train.sharding = "fsdp"; workbench/train/sharded.py) on
the CPU with gloo: two FSDP ranks train the 1-rank run's curve to float round-off (same
global batch), each holding half of the parameters; a run stopped on two FSDP ranks
resumes on one, and one stopped under DDP resumes under FSDP, continuing the curve: a
checkpoint holds the whole model and optimizer state as one process writes them, under
DDP or FSDP; a bad sharding value is refused in one line. Rank 0 runs in this process and starts rank 1
as a real child process (tests/workbench/execute/test_distributed.py's helpers)."""
from __future__ import annotations

import os
import re
import signal

import pytest
import torch
from helpers import tiny_lm_corpus, tiny_lm_profile_text

from test_distributed import TOL, at_step, curve, launched, spec, train  # noqa: F401  (launched: a fixture)
from workbench.execute import resume, scheduler
from workbench.spec.profile import ProfileError
from workbench.spec.run_spec import spec_key
from workbench.train import checkpoint, sharded

FSDP = 'sharding = "fsdp"'


# --------------------------------------------------------------------------- the profile key
def test_sharding_is_checked_and_does_not_change_a_runs_identity():
    with pytest.raises(ProfileError) as e:
        spec(devices=2, extra='sharding = "zero3"')
    lines = str(e.value).splitlines()  # the profile's name, then one line per error
    assert len(lines) == 2 and re.fullmatch(r"  'train.sharding' \(line \d+\): Input should be 'ddp' or 'fsdp'; "
                                            r"got 'zero3'", lines[1])
    with pytest.raises(ProfileError, match='sharding = "fsdp" splits the model between ranks: set train.devices'):
        spec(extra=FSDP)
    one, ddp, fsdp = spec(), spec(devices=2), spec(devices=2, extra=FSDP)
    assert "sharding" not in ddp["train"] and fsdp["train"]["sharding"] == "fsdp"
    assert spec_key(one) == spec_key(ddp) == spec_key(fsdp)  # the same computation


def test_blocks_are_the_backbones_layers():
    from tasks import build
    from workbench.train.compose import build_model

    model = build_model(build("mad_selective_copying", vocab_size=8, num_tokens_to_copy=2), "transformer",
                        d_model=16, n_layers=2)
    units = sharded.units(model)
    assert units[:-1] == list(model.backbone.stack.layers) and units[-1] is model  # 2 x (attention, MLP)
    assert len(units) == 5


# --------------------------------------------------------------------------- training
def test_two_fsdp_ranks_train_the_one_rank_curve(tmp_path, launched):
    s1, rid1 = train(tmp_path / "one", spec())
    s2, rid2 = train(tmp_path / "two", spec(devices=2, extra=FSDP))
    assert s2.get(rid2).state == "finished", s2.get(rid2).error
    assert len(launched) == 1 and all(p.returncode == 0 for p in launched[0].children.values())
    one, two = curve(s1, rid1), curve(s2, rid2)
    assert [s for s, _ in two] == list(range(1, 11))
    assert [v for _, v in two] == pytest.approx([v for _, v in one], **TOL)
    assert [v for _, v in curve(s2, rid2, "eval")] == pytest.approx([v for _, v in curve(s1, rid1, "eval")], **TOL)
    assert s2.get(rid2).info["ranks"]["sharding"] == "fsdp"
    # the final results (rank 0 alone, on the gathered weights) are the 1-rank run's
    assert s2.results([rid2])[rid2][""]["loss"] == pytest.approx(s1.results([rid1])[rid1][""]["loss"], **TOL)
    # each rank held about half of the parameters (dim-0 shards: an odd row count splits unevenly)
    fs = s2.get(rid2).info["fsdp"]
    assert fs["param_bytes_rank0"] == pytest.approx(fs["param_bytes"] / 2, rel=0.05)


@pytest.fixture
def one_rank_group():
    """A process group of this process alone (gloo), for sharding in place in a test."""
    import torch.distributed as dist

    from workbench.train.distributed import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_weight_decay_marks_survive_sharding(one_rank_group):
    """Mamba's A_log and D opt out of weight decay (optim.param_groups reads the mark on
    the parameter): the sharded model's groups are the plain model's, name for name."""
    from tasks import build
    from workbench.train.compose import build_model
    from workbench.train.optim import param_groups

    torch.manual_seed(0)
    model = build_model(build("mad_selective_copying", vocab_size=8, num_tokens_to_copy=2), "mamba",
                        d_model=16, n_layers=2)
    names = {id(p): n for n, p in model.named_parameters()}
    before = [[names[id(p)] for p in g["params"]] for g in param_groups(model, 0.1)]
    assert any("A_log" in n for n in before[1])  # the marked ones are there to lose
    sharded.shard(model, torch.device("cpu"), 1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in param_groups(model, 0.1)] == before


def stop_at(tmp_path, monkeypatch, name, k, **kw):
    """A 12-step run on two ranks stopped by SIGTERM during step k: (store, run id)."""
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)  # the attempt's worker (this test) is gone
    at_step(monkeypatch, k, lambda: os.kill(os.getpid(), signal.SIGTERM))
    store, rid = train(tmp_path / name, spec(devices=2, steps=12, **kw))
    assert store.get(rid).state == "preempted" and store.get(rid).info["checkpoint"]["step"] == k
    monkeypatch.undo()
    return store, rid


@pytest.mark.slow  # six runs, four of them two processes: ~50 s on a loaded 2-core box
def test_an_fsdp_checkpoint_is_whole_and_resumes_on_one_rank_and_a_ddp_one_under_fsdp(tmp_path, launched, monkeypatch):
    base, brid = train(tmp_path / "base", spec(steps=12))
    ddp, drid = stop_at(tmp_path, monkeypatch, "ddp", 7)
    store, rid = stop_at(tmp_path, monkeypatch, "fsdp", 7, extra=FSDP)
    # the checkpoint holds what one process's (and DDP's) holds: whole tensors, integer ids
    a = checkpoint.load_for_run(store.root, rid, store.get(rid).spec)
    b = checkpoint.load_for_run(ddp.root, drid, ddp.get(drid).spec)
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert a["model"][k].shape == b["model"][k].shape
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            torch.testing.assert_close(v, b["optimizer"]["state"][i][k], rtol=1e-4, atol=1e-7)
    # ... and goes on on one rank, continuing the uninterrupted curve
    monkeypatch.setattr(resume, "pid_alive", lambda *a: False)
    monkeypatch.setattr(scheduler, "spawn", lambda *a, **k: None)  # this test is the worker
    done, errors = resume.resume_runs(store, [rid], devices=1)
    assert done == [rid] and not errors
    train(tmp_path / "fsdp", None, rid)
    r = store.get(rid)
    assert r.state == "finished", r.error
    assert r.info["resumed"][-1]["from_ranks"] == 2 and r.info["resumed"][-1]["ranks"] == 1
    assert [s for s, _ in curve(store, rid)] == list(range(1, 13))
    assert [v for _, v in curve(store, rid)] == pytest.approx([v for _, v in curve(base, brid)], **TOL)
    # the DDP run's checkpoint goes on under FSDP (resume --sharding fsdp), on two ranks
    done, errors = resume.resume_runs(ddp, [drid], sharding="fsdp")
    assert done == [drid] and not errors
    train(tmp_path / "ddp", None, drid)
    r = ddp.get(drid)
    assert r.state == "finished", r.error
    assert (r.info["resumed"][-1]["from_sharding"], r.info["resumed"][-1]["sharding"]) == ("ddp", "fsdp")
    assert r.info["ranks"]["sharding"] == "fsdp"
    assert [v for _, v in curve(ddp, drid)] == pytest.approx([v for _, v in curve(base, brid)], **TOL)


def test_the_memory_estimate_shards_the_training_state():
    """Under fsdp each device holds 1/N of the weights, gradients and optimizer moments
    (under ddp all of them), plus the blocks it gathers and, for rank 0's evaluations, a
    whole replica of the weights."""
    from workbench.spec import estimate
    from workbench.spec.run_spec import RunSpec

    def run(extra=""):
        d = spec(devices=2, extra=extra)
        return estimate.estimate_run(RunSpec.from_dict(d), estimate.Limit(device="cpu", bytes=None, what=""))

    ddp, fsdp = run(), run(FSDP)
    for part in ("weights", "grads", "optimizer"):
        assert fsdp.parts[part] == pytest.approx(ddp.parts[part] / 2)
    assert "gathered" in fsdp.parts and "gathered" not in ddp.parts


@pytest.mark.parametrize("extra,says", [("", "sharding ddp (every rank holds the whole model"),
                                        (FSDP, "sharding fsdp (each rank holds 1/N of the weights")])
def test_dry_run_says_how_the_ranks_hold_the_model(tmp_path, extra, says):
    import json

    from test_distributed import profile_text
    from test_estimate import cli

    prof = tmp_path / "p.toml"
    prof.write_text(profile_text("lstm", 4, "devices = 2\n" + extra))
    r = cli(tmp_path, "run", "--dry-run", str(prof))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"  ranks: 2 per run, {says}" in r.stdout
    r = cli(tmp_path, "run", "--dry-run", "--format", "json", str(prof))
    (row,) = json.loads(r.stdout)
    assert (row["devices"], row["sharding"]) == (2, "fsdp" if extra else "ddp")


@pytest.mark.slow  # two lm runs, one of them two processes: ~25 s on a loaded 2-core box
def test_a_finished_fsdp_lm_keeps_whole_weights_that_eval_loads(tmp_path, launched):
    """An lm run trained on two FSDP ranks keeps its final weights like any run: whole
    tensors that `eval run:N`'s loader reads into a plain model, equal to the 1-rank run's."""
    from workbench.spec.profile import expand, loads
    from workbench.train.eval_models import load_run

    corpus = tiny_lm_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog. " * 6)
    text = tiny_lm_profile_text(corpus, "lm-fsdp", models=("transformer",), n_layers=2, lr=3e-3)
    s1, r1 = train(tmp_path / "one", expand(loads(text))[0].to_dict())
    s2, r2 = train(tmp_path / "two", expand(loads(text + 'devices = 2\nsharding = "fsdp"\n'))[0].to_dict())
    assert s2.get(r2).state == "finished", s2.get(r2).error
    kept = checkpoint.load(checkpoint.weights_path(s2.root, r2), r2, s2.get(r2).spec)["model"]
    assert all(type(v) is torch.Tensor for v in kept.values())  # whole tensors, no DTensor shards
    ids = torch.arange(64).reshape(2, 32) % 200
    one = load_run(s1.root, r1, torch.device("cpu")).logits(ids)
    two = load_run(s2.root, r2, torch.device("cpu")).logits(ids)
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-5)
