"""`hybrid` (parallel attention / Mamba branches) and `mambaformer` (interleaved)."""
from __future__ import annotations

import pytest
import torch

import models
from models.hybrid.hybrid import Combiner, HybridBlock, pad_to

D = 16


def _causal_check(m, length=20, t=8):
    x = torch.randn(2, length, D, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, t + 1:] = torch.randn_like(x2[:, t + 1:])
    y2 = m(x2)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-9)
    assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:])
    return y


@pytest.mark.parametrize("combiner", ["null", "res", "gated-res"])
@pytest.mark.parametrize("split", ["same", "linear"])
def test_hybrid_variants_shape_causal_backend(combiner, split):
    torch.manual_seed(0)
    m = models.build("hybrid", d_model=D, n_layers=2, combiner=combiner, split=split,
                     n_heads=2, backend="torch").double()
    y = _causal_check(m)
    assert y.shape == (2, 20, D)
    assert m.state_size() is None
    assert m.backend == m.layers[0].mixer.mamba_branch[0].mixer.backend == "torch"


def test_hybrid_layer_counts_and_split_widths():
    m = models.build("hybrid", d_model=32, n_layers=3, t_layers=2, m_layers=3, split="linear",
                     split_ratio=0.25, n_heads=2, pos="rope")
    assert len(m.layers) == 3
    block = m.layers[0].mixer
    assert isinstance(block, HybridBlock)
    assert len(block.attn_branch) == 2 * 2          # attention + MLP per Transformer layer
    assert len(block.mamba_branch) == 3
    assert (block.d_a, block.d_m) == (8, 24)        # 0.25 * 32, multiple of 2 * n_heads
    assert block.splitter.out_features == 32
    same = models.build("hybrid", d_model=32, n_layers=1, n_heads=2).layers[0].mixer
    assert (same.d_a, same.d_m) == (32, 32) and same.splitter is None


def test_combiners_maths():
    torch.manual_seed(0)
    ya, ym = torch.randn(2, 3, 4), torch.randn(2, 3, 8)
    d = 6
    null = Combiner("null", [4, 8], d)
    torch.testing.assert_close(null([ya, ym]), (pad_to(ya, d) + pad_to(ym, d)) / 2)
    assert pad_to(ya, d)[..., 4:].abs().sum() == 0 and pad_to(ym, d).shape[-1] == d
    res = Combiner("res", [4, 8], d)
    expected = (res.proj[0](ya) + pad_to(ya, d) + res.proj[1](ym) + pad_to(ym, d)) / 2
    torch.testing.assert_close(res([ya, ym]), expected)
    gr = Combiner("gated-res", [4, 8], d)
    with torch.no_grad():
        gr.gate_logits.normal_()
        gr.branch_logits.normal_()
    g = torch.sigmoid(gr.gate_logits)
    w = torch.softmax(gr.branch_logits, 0)
    expected = sum(w[b] * (g[b] * gr.proj[b](y) + (1 - g[b]) * pad_to(y, d))
                   for b, y in enumerate([ya, ym]))
    torch.testing.assert_close(gr([ya, ym]), expected)
    # gradients reach gates and branch weights
    gr([ya, ym]).sum().backward()
    assert gr.gate_logits.grad.abs().sum() > 0 and gr.branch_logits.grad.abs().sum() > 0


def test_hybrid_option_errors():
    with pytest.raises(ValueError, match="combiner"):
        models.build("hybrid", d_model=D, n_layers=1, combiner="concat")
    with pytest.raises(ValueError, match="split"):
        models.build("hybrid", d_model=D, n_layers=1, split="halves")
    with pytest.raises(ValueError, match="m_layers"):
        models.build("hybrid", d_model=D, n_layers=1, m_layers=0)
    with pytest.raises(ValueError, match="n_heads"):
        models.build("hybrid", d_model=18, n_layers=1, n_heads=4)
    with pytest.raises(TypeError, match="t_layer\\b"):
        models.build("hybrid", d_model=D, n_layers=1, t_layer=2)


def test_mambaformer_layout_and_causality():
    torch.manual_seed(0)
    m = models.build("mambaformer", d_model=D, n_layers=2, n_heads=2, backend="torch").double()
    from models.attention.attention import CausalSelfAttention
    from models.ssm.mamba import Mamba

    kinds = [type(layer.mixer) for layer in m.layers]
    assert kinds == [Mamba, CausalSelfAttention, Mamba, CausalSelfAttention, Mamba]
    assert all(layer.mixer.pos == "none" for layer in m.layers if isinstance(layer.mixer, CausalSelfAttention))
    _causal_check(m)
    assert m.state_size() is None and m.backend == "torch"


def test_mambaformer_is_order_sensitive_without_positional_encoding():
    """The leading Mamba supplies order: swapping two earlier tokens changes the last output
    (attention alone, with no positions, would be blind to it at the first layer)."""
    torch.manual_seed(0)
    m = models.build("mambaformer", d_model=D, n_layers=1, n_heads=2, backend="torch").double()
    x = torch.randn(2, 12, D, dtype=torch.float64)
    xs = x.clone()
    xs[:, [2, 5]] = x[:, [5, 2]]
    assert not torch.allclose(m(x)[:, -1], m(xs)[:, -1], atol=1e-6)


# --------------------------------------------------------------------------------------
# hybrid_parallel: the hybrid-model reference's structure and projector family
# --------------------------------------------------------------------------------------
def test_projector_maths():
    from models.hybrid.projectors import Combiner as C2, Splitter

    torch.manual_seed(0)
    x, y1, y2 = torch.randn(3, 2, 5, 6).unbind(0)
    assert all(s is x for s in Splitter("null", 6)(x))
    torch.testing.assert_close(C2("null", 6)([y1, y2]), (y1 + y2) / 2)
    sp, cb = Splitter("res", 6), C2("res", 6)
    torch.testing.assert_close(sp(x)[1], sp.proj[1](x) + x)
    torch.testing.assert_close(cb([y1, y2]), (cb.proj[0](y1) + y1 + cb.proj[1](y2) + y2) / 2)
    sp, cb = Splitter("gres", 6), C2("gres", 6)
    # at the start: a pure residual split, an equal-weight residual merge
    assert all(torch.equal(s, x) for s in sp(x))
    torch.testing.assert_close(cb([y1, y2]), (y1 + y2) / 2)
    with torch.no_grad():
        sp.alpha.copy_(torch.tensor([0.25, 2.0]))
        cb.gamma.copy_(torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(sp(x)[0], 0.75 * sp.proj[0](x) + 0.25 * x)
    torch.testing.assert_close(sp(x)[1], -1.0 * sp.proj[1](x) + 2.0 * x)
    w = torch.softmax(torch.tensor([0.0, 1.0]), 0)
    torch.testing.assert_close(cb([y1, y2]), w[0] * cb.proj[0](y1) + w[1] * y2)
    soft = C2("gres-soft", 6)
    with torch.no_grad():
        soft.gamma.fill_(0.3)
    t = torch.softmax(torch.tensor([0.3, 0.7]), 0)
    torch.testing.assert_close(soft([y1, y2]), sum(
        t[b] * ((1 - t[b]) * soft.proj[b](y) + t[b] * y) for b, y in enumerate((y1, y2))))
    with pytest.raises(ValueError, match="projector"):
        Splitter("concat", 6)


def test_hybrid_parallel_structure():
    from models.hybrid.hybrid_parallel import ParallelHybrid

    torch.manual_seed(0)
    m = models.build("hybrid_parallel", d_model=D, n_layers=2, t_layers=2, m_layers=3,
                     projector="null", n_heads=2, d_inner=40, dt_rank=5, backend="torch").double()
    assert isinstance(m, ParallelHybrid) and len(m.blocks) == 2
    block = m.blocks[0]
    assert len(block.attn_branch) == 4 and len(block.mamba_branch) == 3
    assert block.mamba_branch[0].mixer.in_proj.out_features == 80          # d_inner 40
    assert isinstance(block.attn_branch[0].norm, torch.nn.LayerNorm)       # GPT-Neo's LN
    assert block.attn_branch[0].mixer.scale == 1.0                         # unscaled scores
    _causal_check(m)
    # the block's output replaces the stream (no residual around it), and no final norm
    x = torch.randn(2, 7, D, dtype=torch.float64)
    h = x + m.pos_emb[:7]
    for b in m.blocks:
        h = (b.attn_branch(h) + b.mamba_branch(h)) / 2
    torch.testing.assert_close(m(x), h)
    with pytest.raises(ValueError, match="max_len"):
        models.build("hybrid_parallel", d_model=D, n_layers=1, n_heads=2, max_len=8)(torch.randn(1, 9, D))


def test_hybrid_parallel_hf_init_leaves_projectors_at_torch_default():
    import tasks
    from workbench.train.compose import build_model

    t = tasks.build("mad_selective_copying", seq_len=20, num_tokens_to_copy=5,
                    num_train_examples=8, num_test_examples=8)
    m = build_model(t, "hybrid_parallel", d_model=32, n_layers=1, projector="res", n_heads=2)
    assert m.init_choice["init_scheme"] == "hf" and m.head.weight is m.encoder.weight
    block = m.backbone.blocks[0]
    proj = block.split.proj[0]
    assert proj.bias.abs().sum() > 0                       # PyTorch default, not zeroed
    assert proj.weight.abs().max() > 0.1                   # U(+-1/sqrt(32)), not N(0, 0.02)
    assert abs(block.attn_branch[1].mixer.fc1.weight.std().item() - 0.02) < 0.004


def test_gres_projections_learn_once_the_gates_move():
    from models.hybrid.projectors import Splitter

    torch.manual_seed(0)
    sp = Splitter("gres", 4)
    opt = torch.optim.SGD(sp.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    for step in range(2):
        opt.zero_grad()
        sum(s.pow(2).sum() for s in sp(x)).backward()
        grad = sp.proj[0].weight.grad.abs().sum().item()
        assert (grad == 0) == (step == 0)       # zero at the start (gate = 1), then not
        opt.step()
