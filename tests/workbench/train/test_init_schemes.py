"""Init schemes and tied heads of composed models (models.init_schemes, workbench.train.compose)."""
from __future__ import annotations

import math

import pytest
import torch

import models
import tasks
from models.init_schemes import apply_init, count_residual_branches
from workbench.spec import profile as prof
from workbench.train.compose import build_model, resolve_init


@pytest.fixture(scope="module")
def copy_task():
    return tasks.build("mad_selective_copying", seq_len=20, vocab_size=16, num_tokens_to_copy=5,
                       num_train_examples=16, num_test_examples=8)


def _mamba(task, **kw):
    torch.manual_seed(0)
    return build_model(task, "mamba", d_model=32, n_layers=2, **kw)


def test_published_mad_mamba_has_the_published_parameter_count(copy_task):
    # mamba-130m-hf's config with hidden 32, 2 layers, vocab 16: 759,392 parameters (issue 10)
    m = _mamba(copy_task, d_inner=1536, dt_rank=48, init_std=0.1)
    assert m.init_choice == {"init_scheme": "mamba", "init_std": 0.1, "tie_embeddings": True}
    assert models.param_count(m) == 759_392


def test_mamba_scheme(copy_task):
    m = _mamba(copy_task, init_std=0.1)
    emb = m.encoder.weight
    assert abs(emb.std().item() - 0.1) < 0.02
    # tied: the head is the embedding matrix itself, without bias
    assert m.head.weight is emb and m.head.bias is None
    n = count_residual_branches(m)
    assert n == 2
    for layer in m.backbone.layers:
        w = layer.mixer.out_proj.weight
        bound = 1 / math.sqrt(w.shape[1]) / math.sqrt(n)   # kaiming-uniform(a=sqrt 5) / sqrt(n)
        assert w.abs().max() <= bound + 1e-7
        assert w.abs().max() > 0.8 * bound                 # redrawn, not shrunk twice
        # the dt bias keeps its inverse-softplus init, conv bias is not a Linear bias
        assert layer.mixer.dt_proj.bias.abs().min() > 0


def test_hf_scheme_on_mamba_is_hugging_faces_mamba_init(copy_task):
    torch.manual_seed(0)
    ref = build_model(copy_task, "mamba", d_model=32, n_layers=2, init_scheme="torch")
    torch.manual_seed(0)
    m = build_model(copy_task, "mamba", d_model=32, n_layers=2, init_scheme="hf", init_std=0.1)
    assert abs(m.encoder.weight.std().item() - 0.1) < 0.02 and m.head.weight is m.encoder.weight
    for a, b in zip(ref.backbone.layers, m.backbone.layers):
        for name in ("dt_proj.weight", "dt_proj.bias", "A_log", "in_proj.weight", "x_proj.weight"):
            assert torch.equal(a.mixer.get_parameter(name), b.mixer.get_parameter(name)), name
        # no residual rescale: the out-projection is back at PyTorch's default scale
        w = b.mixer.out_proj.weight
        bound = 1 / math.sqrt(w.shape[1])
        assert 0.8 * bound < w.abs().max() <= bound + 1e-7


def test_hf_scheme_on_a_transformer_resets_norms_and_biases(copy_task):
    torch.manual_seed(0)
    m = build_model(copy_task, "transformer", d_model=32, n_layers=2, n_heads=2,
                    init_scheme="hf", pos="learned", max_len=32)
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
    for mod in m.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            assert torch.all(mod.weight == 1)
    assert abs(m.backbone.stack.layers[1].mixer.fc1.weight.std().item() - 0.02) < 0.003


def test_torch_scheme_changes_nothing(copy_task):
    torch.manual_seed(0)
    a = build_model(copy_task, "lstm", d_model=16, n_layers=1)
    torch.manual_seed(0)
    b = build_model(copy_task, "lstm", d_model=16, n_layers=1, init_scheme="torch")
    snapshot = {k: v.clone() for k, v in b.state_dict().items()}
    apply_init(b, "torch")
    for k, v in a.state_dict().items():
        assert torch.equal(v, snapshot[k]) and torch.equal(v, b.state_dict()[k]), k
    assert a.init_choice["tie_embeddings"] is False and a.head.bias is not None


def test_tied_weight_gets_both_gradients_and_is_one_parameter(copy_task):
    m = _mamba(copy_task)
    assert sum(p is m.encoder.weight for p in m.parameters()) == 1
    x, y = copy_task.train_set(0).inputs[:4], copy_task.train_set(0).targets[:4]
    m(x).sum().backward()
    grad_both = m.encoder.weight.grad.clone()
    # the gradient through the head alone reaches rows of tokens that never appear as input
    unused = torch.ones(16, dtype=torch.bool)
    unused[x.unique()] = False
    assert unused.any()  # the batch leaves some tokens out (fixed seed), so this checks something
    assert grad_both[unused].abs().sum() > 0


def test_tie_defaults_and_errors(copy_task):
    assert resolve_init(copy_task, "mamba")["tie_embeddings"] is True
    assert resolve_init(copy_task, "mamba", tie_embeddings=False)["tie_embeddings"] is False
    assert resolve_init(copy_task, "lstm")["tie_embeddings"] is False
    m = build_model(copy_task, "lstm", d_model=16, n_layers=1, tie_embeddings=True)
    assert m.head.weight is m.encoder.weight
    with pytest.raises(ValueError, match="init scheme"):
        resolve_init(copy_task, "mamba", init_scheme="xavier")
    with pytest.raises(ValueError, match="init_std"):
        resolve_init(copy_task, "mamba", init_std=0)


def test_tying_a_task_without_a_vocabulary_head_is_an_error():
    mqar = tasks.build("mqar", seq_len=24, vocab_size=24, num_kv_pairs=3, num_test_examples=8)
    assert resolve_init(mqar, "mamba")["tie_embeddings"] is True   # per position, same vocabulary
    # compression decodes every position from the last state: its head is no vocabulary matrix
    comp = tasks.build("mad_compression", seq_len=16, num_train_examples=8, num_test_examples=8)
    assert resolve_init(comp, "mamba")["tie_embeddings"] is False
    with pytest.raises(ValueError, match="tie_embeddings needs a per-position head"):
        build_model(comp, "mamba", d_model=16, n_layers=1, tie_embeddings=True)


PROFILE = """
schema_version = 1
name = "init-test"
[task]
name = "mad_selective_copying"
num_tokens_to_copy = 2
num_train_examples = 8
num_test_examples = 8
[sweep]
models = ["mamba", {name = "lstm", init_scheme = "hf"}]
seq_lens = [12]
[model]
d_model = 16
init_std = 0.1
[model.options.mamba]
tie_embeddings = false
[train]
steps = 2
"""


def test_profile_options_reach_the_runs():
    specs = prof.expand(prof.loads(PROFILE))
    by_model = {s.model: s.model_options for s in specs}
    assert by_model["mamba"] == {"init_std": 0.1, "tie_embeddings": False}
    assert by_model["lstm"] == {"init_std": 0.1, "init_scheme": "hf"}


@pytest.mark.parametrize("bad, message", [
    ('init_scheme = "xavier"', "init_scheme"),
    ("init_std = -1.0", "init_std"),
])
def test_profile_rejects_bad_shared_values(bad, message):
    text = PROFILE.replace("init_std = 0.1", bad)
    with pytest.raises(prof.ProfileError, match=message):
        prof.loads(text)


def test_profile_rejects_bad_per_model_values():
    text = PROFILE.replace("tie_embeddings = false", 'tie_embeddings = "yes"')
    with pytest.raises(prof.ProfileError, match="tie_embeddings must be true or false"):
        prof.loads(text)


def test_as_run_profile_builds_the_published_mamba():
    """The shipped as-run MAD profile builds what the published code built: 759,392
    parameters with Hugging Face's init at std 0.1 and the head tied (issue 10)."""
    from pathlib import Path

    p = prof.load(Path(__file__).resolve().parents[3] / "profiles" / "mad-selective-copying-as-run.toml")
    spec = next(s for s in prof.expand(p) if s.model == "mamba")
    task = tasks.build(spec.task, **spec.task_params)
    m = build_model(task, spec.model, d_model=spec.d_model, n_layers=spec.n_layers,
                    **spec.model_options)
    assert models.param_count(m) == 759_392
    assert m.init_choice == {"init_scheme": "hf", "init_std": 0.1, "tie_embeddings": True}
    assert task.placement == "mad" and p.train.optimizer == "adam" and p.train.grad_clip == 0


def test_models_command_shows_each_default_init():
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "workbench", "models"], capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "250"}).stdout
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip()
            for line in out.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["mamba"] == "mamba" and rows["s6"] == "mamba" and rows["lstm"] == "torch"
    assert rows["hybrid_parallel"] == "hf" and rows["pretrained_mamba"] == "checkpoint"
