"""The LM scaling profiles (issue 33, item 6) and what `run --dry-run` says about compute.

- profiles/lm-scaling-paper-gpu.toml: the Mamba paper's Figure 4 shapes. Every run's
  parameters (the composed model, tied 50,280-row embedding, counted on the meta device as
  the dry run counts them) lie within 5% of its nominal size: GPT-3's (Brown et al. 2020,
  Table 2.1) for attention and Gated DeltaNet, the released Mamba checkpoints' for Mamba
  (state-spaces/mamba-130m .. -1.4b) and Mamba-2 (state-spaces/mamba2-130m .. -1.3b).
- profiles/lm-scaling-reduced.toml: REDUCED, the four architectures at three widths on the
  standard library at 20 tokens per parameter.
- the dry run's budget lines give FLOPs per token and in all for every budget, steps too.
- a pretrained tokenizer's ``vocab_size`` (embedding rows) is known without the tokenizer
  (so the paper profile is sized offline) and checked against it when the data is made.
No network: the hub tokenizer is never loaded (vocab_size is given). The paper profile's
tests are in the slow group (loading and counting its 20 models takes ~15 s of CPU).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import tasks
from workbench.spec import profile as P
from workbench.spec.budget import run_compute

ROOT = Path(__file__).resolve().parents[3]
PAPER = ROOT / "profiles" / "lm-scaling-paper-gpu.toml"
REDUCED = ROOT / "profiles" / "lm-scaling-reduced.toml"

M = 1e6
GPT3 = {"125m": 125 * M, "350m": 350 * M, "760m": 760 * M, "1.3b": 1300 * M}
NOMINAL = {
    "transformer": GPT3, "transformer++": GPT3, "gated_deltanet": GPT3,
    "mamba": {"125m": 130 * M, "350m": 370 * M, "760m": 790 * M, "1.3b": 1400 * M},
    "mamba2": {"125m": 130 * M, "350m": 370 * M, "760m": 780 * M, "1.3b": 1300 * M},
}


def load(path: Path):
    """The profile, also where its hub data counts as absent (offline, not cached)."""
    try:
        return P.load(str(path))
    except P.DataAbsent as e:
        return e.profile


@pytest.fixture(scope="module")
def paper_specs(tmp_path_factory):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # never the network (nothing here needs it)
    return P.expand(load(PAPER))


@pytest.mark.slow   # the paper profile's 20 models counted on meta: ~15 s of CPU
def test_paper_profile_is_figure_4s_shape(paper_specs):
    p = load(PAPER)
    t = p.task.params()
    assert t["tokenizer"] == "EleutherAI/gpt-neox-20b" and t["vocab_size"] == 50280
    assert t["source"].startswith("hf:") and t["streaming"] is True
    assert "why" in PAPER.read_text().lower() and t["source"][3:] in p.description
    assert {s.seq_len for s in paper_specs} == {2048}
    assert {s.label for s in paper_specs} == set(NOMINAL)
    assert {s.size for s in paper_specs} == set(GPT3)
    assert all(s.budget["asked"] == {"tokens_per_param": 20} for s in paper_specs)
    assert all(s.budget["tokens_per_step"] == 256 * 2048 for s in paper_specs)
    recipes = {s.label: s.recipe["name"] for s in paper_specs}
    assert recipes["transformer"] == "gpt3" and recipes["transformer++"] == "transformer++"
    assert recipes["mamba"] == recipes["mamba2"] == "mamba"
    # one-mixer models at twice the depth of the Transformer of the same size
    depth = {(s.label, s.size): s.n_layers for s in paper_specs}
    assert depth[("mamba", "1.3b")] == 2 * depth[("transformer++", "1.3b")] == 48


@pytest.mark.slow   # the paper profile's 20 models counted on meta: ~15 s of CPU
def test_paper_profile_sizes_are_within_5_percent_of_nominal(paper_specs):
    from workbench.spec.cost_probe import _weights_on_meta, run_task

    off = {}
    for s in paper_specs:
        task = run_task(s)
        params = _weights_on_meta(task, s.model, s.d_model, s.n_layers, s.model_options)[0]
        nominal = NOMINAL[s.label][s.size]
        off[(s.label, s.size)] = params / nominal - 1
    assert len(off) == 20
    bad = {k: f"{v:+.1%}" for k, v in off.items() if abs(v) > 0.05}
    assert not bad, bad


@pytest.mark.slow   # the paper profile's 20 models counted on meta: ~15 s of CPU
def test_dry_run_lines_give_flops_for_the_paper_profile(paper_specs):
    from workbench.cli.run import _budget_lines

    lines = _budget_lines(paper_specs)
    assert len(lines) == 20
    for s, line in zip(paper_specs, lines):
        b = s.budget
        assert b["flops_per_token"] > 6 * b["params_non_embedding"]   # 6N plus attention / scan and the head
        assert f"{b['flops_per_token']:.3g} FLOPs/token" in line and f"{b['flops']:.3g} FLOPs," in line
        assert b["flops"] == pytest.approx(b["flops_per_token"] * b["tokens"])


def test_dry_run_gives_flops_for_step_and_epoch_budgets():
    from workbench.cli.run import _budget_lines

    text = REDUCED.read_text().replace("tokens_per_param = 20", "steps = 7").replace("warmup_steps = 20", "warmup_steps = 2")
    specs = P.expand(P.loads(text))
    (s, *_), lines = specs, _budget_lines(specs)
    c = run_compute(s)
    assert c["asked"] == {"steps": 7} and c["tokens"] == 7 * 16 * 128
    assert c["flops"] == pytest.approx(c["flops_per_token"] * 7 * 16 * 128)
    assert lines[0].startswith(f"  {s.label} L=128 d_model=32: steps 7 x 2,048 = 14,336 tokens, "
                               f"{c['flops_per_token']:.3g} FLOPs/token, {c['flops']:.3g} FLOPs")
    assert len(lines) == 12 and all("FLOPs/token" in x for x in lines)
    epochs = P.expand(P.loads((ROOT / "profiles" / "mqar-grid-reduced.toml").read_text()))
    line = _budget_lines(epochs)[0]
    assert "epochs 8: " in line and "FLOPs/token" in line and "tokens," not in line


def test_reduced_profile_is_labelled_and_four_architectures_at_three_sizes():
    text = REDUCED.read_text()
    p = P.load(str(REDUCED))
    assert "REDUCED" in p.description and "REDUCED" in text
    assert p.task.params()["source"] == "stdlib" and p.task.params()["tokenizer"] == "bpe"
    specs = P.expand(p)
    assert {s.model for s in specs} == {"transformer", "mamba", "mamba2", "gated_deltanet"}
    assert len(specs) == 12 and {s.d_model for s in specs} == {32, 48, 64}
    assert all(s.budget["asked"] == {"tokens_per_param": 20} for s in specs)
    by = {(s.model, s.d_model): s for s in specs}
    assert by[("transformer", 64)].model_options["pos"] == "rope"           # transformer++
    assert by[("mamba2", 32)].recipe["name"] == "mamba"
    # more parameters, more tokens, more FLOPs: each architecture's points spread in compute
    for m in ("transformer", "mamba", "mamba2", "gated_deltanet"):
        flops = [by[(m, d)].budget["flops"] for d in (32, 48, 64)]
        assert flops == sorted(flops) and flops[-1] > 5 * flops[0]


def test_a_pretrained_tokenizers_rows_are_known_without_it_and_checked_against_it(tmp_path, monkeypatch):
    from test_lm_task import LINES, save_pretrained_tokenizer

    monkeypatch.setenv("SSM_WORKBENCH_DATA", str(tmp_path / "cache"))
    absent = tasks.build("lm", tokenizer=str(tmp_path / "no-such-tokenizer"), vocab_size=50280)
    assert absent.vocab_size == 50280 and absent.num_classes == 50280    # nothing was read
    with pytest.raises(ValueError, match="vocab_size"):
        tasks.build("lm", tokenizer="char", vocab_size=300)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(10):
        (corpus / f"d{i}.txt").write_text("\n".join(LINES[i * 4:(i + 1) * 4]) + "\n", "utf-8")
    save_pretrained_tokenizer(tmp_path / "tok", LINES)
    kw = dict(source=str(corpus), tokenizer=str(tmp_path / "tok"), seq_len=8, valid_fraction=0.2,
              test_fraction=0.2)
    ids = tasks.build("lm", **kw).tokenizer.vocab_size
    padded = tasks.build("lm", vocab_size=ids + 3, **kw)
    assert padded.vocab_size == ids + 3
    x, _ = padded.sample(2, seed=0)
    assert int(x.max()) < ids
    with pytest.raises(ValueError, match=f"more than vocab_size {ids - 1}"):
        tasks.build("lm", vocab_size=ids - 1, **kw).data
