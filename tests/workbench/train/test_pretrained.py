"""Pretrained backbones from local checkpoint folders (models.pretrained, issue 11).

Tiny random checkpoints are written in the test with transformers' save_pretrained; nothing
downloads."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import models
import tasks
from models.pretrained import CheckpointError
from workbench.train.compose import build_model
from workbench.train.optim import make_optimizer

transformers = pytest.importorskip("transformers")
from test_registry_contract import check_causal, check_gradients, check_shape  # noqa: E402

VOCAB = 50


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory):
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, state_size=8,
                      intermediate_size=40, time_step_rank=5, layer_norm_epsilon=1e-6)
    model = MambaForCausalLM(cfg)
    with torch.no_grad():  # non-trivial D and biases, so a mis-mapped tensor shows
        for layer in model.backbone.layers:
            layer.mixer.D.normal_()
            layer.mixer.conv1d.bias.normal_()
            layer.norm.weight.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-mamba"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gptneo_dir(tmp_path_factory):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2,
                       attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
                       window_size=8)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-gptneo"
    GPTNeoForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize("backend", ["torch", "ref"])
def test_mamba_checkpoint_matches_transformers(mamba_dir, backend):
    from transformers import MambaModel

    ref = MambaModel.from_pretrained(mamba_dir).eval()
    ours = models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba_dir),
                        backend=backend).eval()
    ids = torch.randint(0, VOCAB, (3, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids).last_hidden_state
        got = ours(ours.token_embedding(ids))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert ours.d_model == 16 and len(ours.layers) == 2
    assert ours.layers[0].mixer.in_proj.out_features == 80 and ours.layers[0].norm.eps == 1e-6


def test_pretrained_mamba_keeps_the_registry_contract(mamba_dir):
    torch.manual_seed(0)
    m = models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba_dir), backend="torch")
    del m.token_embedding  # the contract is about the backbone: (batch, length, d) -> same
    check_shape(m, d_model=16)
    check_gradients(m, d_model=16)
    check_causal(m, d_model=16)


def test_causal_lm_checkpoint_matches_transformers(gptneo_dir):
    from transformers import GPTNeoModel

    ref = GPTNeoModel.from_pretrained(gptneo_dir).eval()
    ours = models.build("pretrained_causal_lm", d_model=1, n_layers=1, path=str(gptneo_dir)).eval()
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ours.token_embedding(ids)), ref(ids).last_hidden_state)


def _copy_task():
    return tasks.build("mad_selective_copying", seq_len=12, vocab_size=16, num_tokens_to_copy=3,
                       num_train_examples=16, num_test_examples=8)


@pytest.mark.parametrize("name,fixture", [("pretrained_mamba", "mamba_dir"),
                                          ("pretrained_causal_lm", "gptneo_dir")])
def test_freeze_trains_only_the_head(name, fixture, request):
    path = request.getfixturevalue(fixture)
    task = _copy_task()
    m = build_model(task, name, path=str(path), train_mode="freeze")
    assert m.encoder.weight.shape == (VOCAB, 16)           # the checkpoint's own embedding
    assert m.init_choice["init_scheme"] == "pretrained"
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
    opt = make_optimizer(m, "adamw", lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(m.head.weight), id(m.head.bias)}
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    x, y = task.train_set(0).inputs[:4], task.train_set(0).targets[:4]
    tasks.metrics.loss(m(x), y).backward()
    opt.step()
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n]) == (n not in trainable), n
        if n not in trainable:
            assert p.grad is None, n


def test_full_finetuning_trains_everything(mamba_dir):
    m = build_model(_copy_task(), "pretrained_mamba", path=str(mamba_dir))
    assert all(p.requires_grad for p in m.parameters())


@pytest.mark.parametrize("layout, message", [
    ("missing", "does not exist"),
    ("no_config", "config.json is missing"),
    ("no_weights", "no weights in"),
    ("gptneo", "model_type 'gpt_neo'"),
])
def test_bad_checkpoint_folders_say_what_was_expected(tmp_path, gptneo_dir, layout, message):
    path = tmp_path / "ckpt"
    if layout == "no_config":
        path.mkdir()
    elif layout == "no_weights":
        path.mkdir()
        (path / "config.json").write_text('{"model_type": "mamba"}')
    elif layout == "gptneo":
        path = gptneo_dir
    with pytest.raises(CheckpointError, match=message) as e:
        models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(path))
    assert str(path) in str(e.value)
    if layout != "gptneo":
        assert "or a Hub id such as" in str(e.value) and "`hf download state-spaces/mamba-130m-hf --local-dir" in str(e.value)


def test_task_vocabulary_must_fit_the_checkpoint(mamba_dir):
    task = tasks.build("induction_heads", seq_len=16, vocab_size=64, eval_lens=[16])
    with pytest.raises(ValueError, match="checkpoint's own tokenizer"):
        build_model(task, "pretrained_mamba", path=str(mamba_dir))


PROFILE = """
schema_version = 1
name = "frozen"
[task]
name = "mad_selective_copying"
vocab_size = 16
num_tokens_to_copy = 3
num_train_examples = 32
num_test_examples = 8
[sweep]
models = [{{ name = "pretrained_mamba", path = "{path}", train_mode = "freeze" }}]
seq_lens = [12]
[train]
steps = 6
batch_size = 4
log_every = 2
eval_every = 3
"""


def test_frozen_pretrained_run_through_the_worker(tmp_path, mamba_dir):
    from workbench.store import Store

    prof = tmp_path / "frozen.toml"
    prof.write_text(PROFILE.format(path=mamba_dir))
    out = subprocess.run([sys.executable, "-m", "workbench", "--store", str(tmp_path / "st"),
                          "run", "--quiet", str(prof)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = Store(tmp_path / "st").runs()
    res = Store(tmp_path / "st").results([run.id])[run.id][""]
    assert run.state == "finished" and res["params_trainable"] == 16 * 16 + 16
    assert run.info["params_total"] > res["params_trainable"] and run.info["init_scheme"] == "pretrained"


@pytest.mark.parametrize("name,fixture,targets", [
    ("pretrained_mamba", "mamba_dir", None),
    ("pretrained_mamba", "mamba_dir", ["in_proj", "out_proj", "x_proj"]),
    ("pretrained_causal_lm", "gptneo_dir", None),
])
def test_lora_trains_only_adapters_and_head(name, fixture, targets, request):
    pytest.importorskip("peft")
    path = request.getfixturevalue(fixture)
    task = _copy_task()
    torch.manual_seed(0)
    plain = build_model(task, name, path=str(path), train_mode="freeze")
    torch.manual_seed(0)
    m = build_model(task, name, path=str(path), train_mode="lora", lora_r=4, lora_alpha=8,
                    lora_dropout=0.0, lora_targets=targets)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable if "lora_" in n}
    expected = set(targets or (["in_proj", "out_proj"] if name == "pretrained_mamba" else
                               ["q_proj", "k_proj", "v_proj", "out_proj", "c_fc", "c_proj"]))
    assert wrapped == expected
    x, y = task.train_set(0).inputs[:4], task.train_set(0).targets[:4]
    with torch.no_grad():  # LoRA's B starts at zero: the adapted model starts as the base one
        m.head.load_state_dict(plain.head.state_dict())
        torch.testing.assert_close(m.eval()(x), plain.eval()(x))
    m.train()
    opt = make_optimizer(m, "adamw", lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    for _ in range(2):  # B moves on step 1, then A gets gradient too
        opt.zero_grad()
        tasks.metrics.loss(m(x), y).backward()
        opt.step()
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable


def test_lora_option_errors(mamba_dir):
    pytest.importorskip("peft")
    with pytest.raises(ValueError, match="dt_proj"):
        models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba_dir),
                     train_mode="lora", lora_targets=["dt_proj"])
    with pytest.raises(ValueError, match="name no Linear layer"):
        models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba_dir),
                     train_mode="lora", lora_targets=["q_proj"])
    with pytest.raises(ValueError, match="train_mode"):
        models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba_dir), train_mode="adapters")


@pytest.fixture(scope="module")
def mamba4_dir(tmp_path_factory):
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(1)
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, state_size=8,
                      intermediate_size=32, time_step_rank=4)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-mamba4"
    MambaForCausalLM(cfg).save_pretrained(path)
    return path


def test_stitched_hybrid_structure_and_contract(gptneo_dir, mamba4_dir):
    from models.pretrained_hybrid import StitchedHybrid
    from transformers import GPTNeoModel

    torch.manual_seed(0)
    m = models.build("pretrained_hybrid", d_model=1, n_layers=1, gptneo_path=str(gptneo_dir),
                     mamba_path=str(mamba4_dir), projector="null", backend="torch")
    assert isinstance(m, StitchedHybrid) and len(m.attn_layers) == 2 and len(m.mamba_layers[1]) == 2
    # with the null projector: h <- (GPT-Neo layer(h) + Mamba layers(h)) / 2, then GPT-Neo's ln_f
    neo = GPTNeoModel.from_pretrained(gptneo_dir).eval()
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        h = neo.wte(ids) + neo.wpe(torch.arange(9))[None]
        for i, layer in enumerate(neo.h):
            h = (layer(h)[0] + m.mamba_layers[i](h)) / 2
        torch.testing.assert_close(m.eval()(m.token_embedding(ids)), neo.ln_f(h))
    emb = m.token_embedding
    del m.token_embedding
    check_shape(m, d_model=16)
    check_causal(m, d_model=16)
    m.token_embedding = emb


def test_stitched_hybrid_frozen_trains_projectors_and_head(gptneo_dir, mamba4_dir):
    m = build_model(_copy_task(), "pretrained_hybrid", gptneo_path=str(gptneo_dir),
                    mamba_path=str(mamba4_dir), projector="res", train_mode="freeze", backend="torch")
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("backbone.splitters", "backbone.combiners", "head."))
                             for n in trainable)
    assert any(n.startswith("backbone.splitters") for n in trainable)
    x, y = _copy_task().train_set(0).inputs[:2], _copy_task().train_set(0).targets[:2]
    tasks.metrics.loss(m(x), y).backward()
    assert all(p.grad is not None for n, p in m.named_parameters() if n in trainable)


def test_stitched_hybrid_errors(gptneo_dir, mamba_dir, mamba4_dir):
    with pytest.raises(CheckpointError, match="need 4 Mamba layers"):
        models.build("pretrained_hybrid", d_model=1, n_layers=1, gptneo_path=str(gptneo_dir),
                     mamba_path=str(mamba_dir))
    with pytest.raises(CheckpointError, match="GPT-Neo checkpoint"):
        models.build("pretrained_hybrid", d_model=1, n_layers=1, gptneo_path=str(mamba4_dir),
                     mamba_path=str(mamba4_dir))


@pytest.mark.slow  # end to end (run -> scheduler -> worker, transformers imported in each): ~1 min
@pytest.mark.parametrize("profile, sets", [
    ("imdb-mamba-frozen.toml", ["model.options.pretrained_mamba.path={mamba}", "task.tokenizer={mamba}"]),
    ("imdb-hybrid-frozen.toml", ["model.options.pretrained_hybrid.gptneo_path={neo}",
                                 "model.options.pretrained_hybrid.mamba_path={mamba}",
                                 "task.tokenizer={neo}"]),
])
def test_shipped_imdb_profile_runs_through_the_worker(tmp_path, profile, sets):
    """The shipped profile, pointed with --set at a tiny aclImdb folder and tiny checkpoints."""
    pytest.importorskip("tokenizers")
    from pathlib import Path

    from helpers import write_imdb, write_tiny_checkpoints
    from workbench.store import Store

    write_imdb(tmp_path / "aclImdb")
    neo, mamba = write_tiny_checkpoints(tmp_path / "ck")
    args = [f"--set={s.format(neo=neo, mamba=mamba)}" for s in sets] + [
        f"--set=task.data_path={tmp_path / 'aclImdb'}", "--set=task.num_train_examples=8",
        "--set=task.num_test_examples=8", "--set=sweep.seq_lens=[16]"]
    shipped = Path(__file__).resolve().parents[3] / "profiles" / profile
    out = subprocess.run([sys.executable, "-m", "workbench", "--store", str(tmp_path / "st"), "run",
                          "--quiet", str(shipped), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    store = Store(tmp_path / "st")
    (run,) = store.runs()
    res = store.results([run.id])[run.id][""]
    assert run.state == "finished" and res["steps"] == 8 and 0 <= res["accuracy"] <= 1
    head = 16 * 2 + 2                              # the classification head over 2 labels
    projectors = res["params_trainable"] - head    # the hybrid's splitters/combiners also train
    assert projectors == 0 if "mamba" in profile else projectors > 0
    assert run.info["params_total"] > res["params_trainable"]
