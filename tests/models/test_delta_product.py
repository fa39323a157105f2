"""Issue 35 item 1: Gated DeltaProduct (``delta_product.gated_delta_product``), negative
eigenvalues (``allow_neg_eigval`` on DeltaNet, Gated DeltaNet, Gated DeltaProduct and Mamba)
and grouped value heads (``num_v_heads``): every fast form against its step-by-step
``*_ref`` in float64 (outputs, final state and gradients, with an initial state, at odd
lengths), the identities between them, the layers' streaming, sizes, and fla's naive
reference where fla imports."""
from __future__ import annotations

import importlib

import pytest
import torch

import models
from models.kernels import delta_product as dp
from models.kernels import linear_rnn as lr
from models.kernels import linear_rnn_cpu as lc
from models.kernels import selective_scan as ss
from models.kernels.linear_rnn_ops import ALL_OPS, make_inputs
from models.linear_rnn.delta_mixers import DeltaNet, GatedDeltaNet, GatedDeltaProduct
from helpers import assert_mixer_streams, assert_results_close, op_outputs_and_grads, op_state, run_steps

F64 = torch.float64
HAS_C = lc.available()


_state, _run, _close = op_state, op_outputs_and_grads, assert_results_close


FAST = [("torch", lambda *a, **kw: dp.gated_delta_product(*a, chunk_size=8, **kw)),
        ("torch-default-chunk", dp.gated_delta_product)]
if HAS_C:
    FAST.append(("cpu", lc.gated_delta_product))


# ---------------------------------------------------------------------------------------
# the operator
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", [f[0] for f in FAST])
@pytest.mark.parametrize("n, value_heads, gated", [(2, 2, True), (3, 4, True), (2, 2, False),
                                                   (1, 2, True)])
def test_product_equals_ref(backend, n, value_heads, gated):
    # T = 13 (odd; 13 n not a multiple of the chunk), beta in (0, 2): negative eigenvalues
    args = make_inputs("gated_delta_product", time=13, num_householder=n,
                          value_heads=value_heads, gate_range=(-2.0, 0.0), beta_range=(0.0, 2.0))
    if not gated:
        args[3] = None
    fast = dict(FAST)[backend]
    _close(_run(fast, args, _state(args)), _run(dp.gated_delta_product_ref, args, _state(args)))


def test_product_with_l2norm_in_kernel_equals_ref():
    args = make_inputs("gated_delta_product", time=9, num_householder=2)
    args[1] = (args[1].detach() * 3).requires_grad_()          # un-normalised keys
    kw = {"use_qk_l2norm_in_kernel": True}
    want = _run(dp.gated_delta_product_ref, args, _state(args), **kw)
    for _, fast in FAST:
        _close(_run(fast, args, _state(args), **kw), want)


def test_one_householder_step_is_the_gated_delta_rule():
    q, k, v, g, beta = make_inputs("gated_delta_rule", time=11, beta_range=(0.0, 2.0))
    S0 = _state([q, k, v])
    want = _run(lr.gated_delta_rule_ref, [q, k, v, g, beta], S0)
    _close(_run(dp.gated_delta_product_ref, [q, k, v, g, beta], S0), want)
    _close(_run(dp.gated_delta_product, [q, k, v, g, beta], S0), want)
    # and without decay: the delta rule
    want = _run(lr.delta_rule_ref, [q, k, v, beta], S0)
    _close(_run(lambda q, k, v, b, **kw: dp.gated_delta_product_ref(q, k, v, None, b, **kw),
                [q, k, v, beta], S0), want)


def test_product_writes_its_rows_in_order_then_reads():
    """n = 2 by hand: decay, then row 0's delta step, then row 1's, then o = scale S^T q."""
    q, k, v, g, beta = (a.detach() for a in make_inputs(
        "gated_delta_product", batch=1, time=1, heads=1, key_dim=4, value_dim=3,
        num_householder=2, beta_range=(0.0, 2.0)))
    S = torch.randn(1, 1, 4, 3, dtype=F64)
    o, S1 = dp.gated_delta_product_ref(q, k, v, g, beta, initial_state=S,
                                       output_final_state=True)
    H = S[0, 0] * g[0, 0, 0].exp()
    for j in range(2):
        kj, vj, bj = k[0, j, 0], v[0, j, 0], beta[0, j, 0]
        H = H + bj * torch.outer(kj, vj - H.T @ kj)
    torch.testing.assert_close(S1[0, 0], H)
    torch.testing.assert_close(o[0, 0, 0], 0.5 * H.T @ q[0, 0, 0])


def test_beta_two_reflects_the_state():
    """beta = 2 and v = 0: S -> (I - 2 k k^T) S, the eigenvalue -1 along k (a reflection);
    every fast form computes it (no clipping of beta to [0, 1])."""
    q, k, v, beta = (a.detach() for a in make_inputs("delta_rule", time=1))
    v, beta = torch.zeros_like(v), torch.full_like(beta, 2.0)
    S0 = torch.randn(2, 2, 8, 8, dtype=F64)
    kk = k[:, 0]                                                        # (B, H, K), |k| = 1
    want = S0 - 2 * kk[..., :, None] * torch.einsum("bhk,bhkv->bhv", kk, S0)[..., None, :]
    ops = [lr.delta_rule_ref, lr.delta_rule] + ([lc.delta_rule] if HAS_C else [])
    for op in ops:
        _, S1 = op(q, k, v, beta, initial_state=S0, output_final_state=True)
        torch.testing.assert_close(S1, want)
    eig = torch.linalg.eigvalsh(torch.eye(8, dtype=F64) - 2 * torch.outer(kk[0, 0], kk[0, 0]))
    assert eig.min().item() == pytest.approx(-1.0)


@pytest.mark.parametrize("name", ["delta_rule", "gated_delta_rule"])
def test_betas_up_to_two_fast_forms_equal_ref(name):
    args = make_inputs(name, time=21, beta_range=(1.0, 2.0), gate_range=(-1.0, 0.0))
    want = _run(lr.OPS[name][1], args, _state(args))
    _close(_run(lambda *a, **kw: lr.OPS[name][0](*a, chunk_size=8, **kw), args, _state(args)),
           want)
    if HAS_C:
        _close(_run(lc.OPS[name], args, _state(args)), want)


@pytest.mark.parametrize("name", ["delta_rule", "gated_delta_rule", "gated_delta_product",
                                  "gla", "simple_gla"])
def test_grouped_value_heads_equal_repeated_heads(name):
    """v (and g, beta, the state) with 4 heads, q and k with 2: value head h reads q/k head
    h // 2; the same as q and k repeat-interleaved to 4 heads, on every form."""
    args = make_inputs(name, time=13, heads=2, value_heads=4)
    rep = [args[0].repeat_interleave(2, 2), args[1].repeat_interleave(2, 2), *args[2:]]
    fast, ref = ALL_OPS[name][:2]
    forms = [ref, fast] + ([lc.OPS[name]] if HAS_C else [])
    want = _run(ref, rep, _state(rep))[:2]
    for op in forms:
        got = _run(op, args, _state(args))
        _close(got[:2], want)
        # gradients of q, k come back summed over each group (the repeat's adjoint)
        g_rep = _run(op, rep, _state(rep))
        _close([got[2], got[3]], [g_rep[2].unflatten(2, (2, 2)).sum(3),
                                  g_rep[3].unflatten(2, (2, 2)).sum(3)])
    # a tiled (not interleaved) repeat is a different model: the test can tell them apart
    tiled = [args[0].repeat(1, 1, 2, 1), args[1].repeat(1, 1, 2, 1), *args[2:]]
    assert not torch.allclose(ref(*tiled)[0], want[0])


def test_product_streams_in_pieces():
    n = 3
    args = [a.detach() for a in make_inputs("gated_delta_product", time=17,
                                               num_householder=n, value_heads=4)]
    q, k, v, g, beta = args
    for op in [dp.gated_delta_product] + ([lc.gated_delta_product] if HAS_C else []):
        o, S = op(*args, output_final_state=True)
        state, outs = None, []
        for lo, hi in [(0, 5), (5, 6), (6, 17)]:
            o_p, state = op(q[:, lo:hi], k[:, n * lo:n * hi], v[:, n * lo:n * hi],
                            g[:, lo:hi], beta[:, n * lo:n * hi], initial_state=state,
                            output_final_state=True)
            outs.append(o_p)
        torch.testing.assert_close(torch.cat(outs, 1), o)
        torch.testing.assert_close(state, S)


def test_bad_product_shapes_are_refused():
    q, k, v, g, beta = make_inputs("gated_delta_product", time=5, num_householder=2,
                                      requires_grad=False)
    with pytest.raises(ValueError, match="num_householder"):
        dp.gated_delta_product(q, k, v, g, beta, 3)
    with pytest.raises(ValueError, match="beta must have time"):
        dp.gated_delta_product(q, k, v, g, beta[:, :-1])
    with pytest.raises(ValueError, match="multiple of"):
        lr.gated_delta_rule(q, k[:, ::2], v[:, ::2, :1].expand(-1, -1, 3, -1), g[..., :1]
                            .expand(-1, -1, 3), beta[:, ::2, :1].expand(-1, -1, 3))


# ---------------------------------------------------------------------------------------
# the layers
# ---------------------------------------------------------------------------------------

def _beta_of(m, x):
    return m._qkv_beta(x, None)[3]


@pytest.mark.parametrize("make", [lambda **kw: DeltaNet(16, n_heads=2, **kw),
                                  lambda **kw: GatedDeltaNet(16, n_heads=2, **kw),
                                  lambda **kw: GatedDeltaProduct(16, n_heads=2, **kw)])
def test_allow_neg_eigval_puts_beta_in_zero_two(make):
    torch.manual_seed(0)
    x = torch.randn(2, 64, 16, dtype=F64)
    on, off = make(allow_neg_eigval=True).to(F64), make().to(F64)
    off.load_state_dict(on.state_dict())
    with torch.no_grad():
        on.b_proj.weight.mul_(8)                                   # near the sigmoid's ends
        off.b_proj.weight.mul_(8)
        b_on, b_off = _beta_of(on, x), _beta_of(off, x)
    assert 0 < b_on.min() and b_on.max() < 2 and b_on.max() > 1.9
    assert 0 < b_off.min() and b_off.max() < 1
    torch.testing.assert_close(b_on, 2 * b_off)


def _repeat_heads_model(m, cls, **kw):
    """The model with q, k (their projections and conv filters) repeated to num_v_heads
    heads: what grouped value heads must equal."""
    G = m.num_v_heads // m.n_heads
    n = m.num_householder
    big = cls(m.d_model, n_heads=m.num_v_heads, expand_k=G * m.key_dim / m.d_model,
              expand_v=m.value_dim / m.d_model, **kw).to(F64)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    d, dk = m.d_model, m.head_k_dim

    def rep(w, rows):          # (rows * H * dk, ...) -> heads repeated G times in a row
        return w.unflatten(0, (rows, m.n_heads, dk)).repeat_interleave(G, 1).flatten(0, 2)
    sd["q_proj.weight"] = rep(sd["q_proj.weight"], 1)
    sd["k_proj.weight"] = rep(sd["k_proj.weight"], n)
    cw = sd["qkv_conv1d.weight"]
    kq = m.key_dim
    sd["qkv_conv1d.weight"] = torch.cat([rep(cw[:kq], 1), rep(cw[kq:kq * (1 + n)], n),
                                         cw[kq * (1 + n):]])
    big.load_state_dict(sd)
    assert d == big.d_model
    return big


@pytest.mark.parametrize("cls, kw", [(DeltaNet, {}), (GatedDeltaNet, {}),
                                     (GatedDeltaProduct, {"num_householder": 2})])
def test_grouped_value_head_layer_equals_repeated_heads_layer(cls, kw):
    torch.manual_seed(0)
    m = cls(16, n_heads=2, num_v_heads=4, expand_v=1.0, **kw).to(F64)
    big = _repeat_heads_model(m, cls, **kw)
    x = torch.randn(2, 9, 16, dtype=F64)
    torch.testing.assert_close(m(x), big(x))
    assert m.state_size() < big.state_size()                 # q/k conv cache not repeated
    assert m.init_state(2)[0].shape == big.init_state(2)[0].shape == (2, 4, m.head_k_dim, 4)


LAYERS = {
    "deltanet_neg_gva": lambda: DeltaNet(16, n_heads=2, num_v_heads=4, allow_neg_eigval=True),
    "gated_deltanet_gva": lambda: GatedDeltaNet(16, n_heads=2, num_v_heads=4,
                                                allow_neg_eigval=True),
    "deltaproduct_3": lambda: GatedDeltaProduct(16, n_heads=2, num_householder=3,
                                                allow_neg_eigval=True),
    "deltaproduct_no_gate_gva": lambda: GatedDeltaProduct(16, n_heads=2, num_v_heads=4,
                                                          use_forget_gate=False),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_steps_and_chunks_equal_the_full_forward(name):
    torch.manual_seed(0)
    m = LAYERS[name]().to(F64)
    assert_mixer_streams(m, torch.randn(2, 11, 16, dtype=F64))


def test_gated_deltaproduct_entry_counts_and_sizes():
    d, H, n, HV = 32, 2, 3, 4
    m = models.build("gated_deltaproduct", d_model=d, n_layers=1, n_heads=H,
                     num_householder=n, num_v_heads=HV, allow_neg_eigval=True)
    mix = m.layers[0].mixer
    kd, vd = int(0.75 * d), int(1.5 * d)
    conv = (kd * (1 + n) + vd * n)
    want = (d * kd * (1 + n) + d * vd * n + d * HV * n      # q, k, v, b projections
            + d * HV + 2 * HV                               # a_proj, A_log, dt_bias
            + d * vd + vd // HV + vd * d                    # g_proj, gated norm, o_proj
            + conv * 4)                                     # short conv (no bias)
    assert sum(p.numel() for p in mix.parameters()) == want
    assert models.state_size(m) == HV * (kd // H) * (vd // HV) + conv * 3
    assert mix.backend in ("cpu", "torch")
    assert "Siems" in models.describe("gated_deltaproduct")
    for name in ("deltanet", "gated_deltanet", "gated_deltaproduct", "mamba"):
        assert models.entry(name).options()["allow_neg_eigval"] is False
    with pytest.raises(ValueError, match="num_v_heads"):
        models.build("gated_deltanet", d_model=32, n_heads=4, num_v_heads=6)


# ---------------------------------------------------------------------------------------
# Mamba with negative eigenvalues
# ---------------------------------------------------------------------------------------

def _scan_inputs(seed=0, b=2, d=6, L=23, N=4):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    A = -(torch.rand(d, N, generator=gen, dtype=F64) + 0.5)
    return [x.requires_grad_() for x in (r(b, d, L), r(b, d, L), A, r(b, N, L), r(b, N, L),
                                         r(d), r(b, d, L), r(d), r(b, d, N))]


def _scan_run(fn, ins, **kw):
    u, delta, A, B, C, D, z, bias, h0 = ins
    y, h = fn(u, delta, A, B, C, D, z, bias, True, True, initial_state=h0, **kw)
    gen = torch.Generator().manual_seed(3)
    loss = (y * torch.randn(y.shape, generator=gen, dtype=F64)).sum() + h.square().sum()
    return [y, h, *torch.autograd.grad(loss, ins)]


def test_mamba_negative_transition_torch_scan_equals_ref():
    ins = _scan_inputs()
    want = _scan_run(ss.selective_scan_ref, ins, neg_eigval=True)
    _close(_scan_run(ss.selective_scan_torch, ins, neg_eigval=True, block_len=8), want)
    _close(_scan_run(ss.selective_scan_fn, ins, neg_eigval=True), want)   # auto -> torch
    plain = _scan_run(ss.selective_scan_ref, ins)
    assert not torch.allclose(plain[0], want[0])


def test_mamba_negative_transition_is_two_exp_minus_one():
    """One step from h0 with u = 0: h1 = (2 exp(delta A) - 1) h0, in (-1, 1) and reaching
    below 0 for a large step (delta A -> -inf gives -1)."""
    d, N = 3, 2
    A = -torch.tensor([[1.0, 2.0]] * d, dtype=F64)
    delta = torch.tensor([[[0.01], [1.0], [30.0]]], dtype=F64)          # (1, d, 1)
    h0 = torch.ones(1, d, N, dtype=F64)
    u, B, C = torch.zeros(1, d, 1, dtype=F64), torch.ones(1, N, 1, dtype=F64), \
        torch.ones(1, N, 1, dtype=F64)
    for fn in (ss.selective_scan_ref, ss.selective_scan_torch):
        _, h1 = fn(u, delta, A, B, C, return_last_state=True, initial_state=h0,
                   neg_eigval=True)
        torch.testing.assert_close(h1[0], 2 * torch.exp(delta[0] * A) - 1)
        assert h1.min() < -0.99 and h1.max() < 1


def test_mamba_allow_neg_eigval_layer():
    torch.manual_seed(0)
    m = models.build("mamba", d_model=16, n_layers=2, allow_neg_eigval=True).to(F64)
    mix = m.layers[0].mixer
    assert mix.backend == "torch"
    x = torch.randn(2, 13, 16, dtype=F64)
    y = m(x)
    torch.testing.assert_close(run_steps(m, x), y)
    off = models.build("mamba", d_model=16, n_layers=2).to(F64)
    off.load_state_dict(m.state_dict())
    assert not torch.allclose(off(x), y)
    with pytest.raises(ValueError, match="negative-eigenvalue"):
        models.build("mamba", d_model=16, n_layers=1, allow_neg_eigval=True, backend="cpu")


# ---------------------------------------------------------------------------------------
# fla's naive reference, where fla imports (it needs triton)
# ---------------------------------------------------------------------------------------

def test_gated_delta_product_matches_fla_naive():
    try:
        mod = importlib.import_module("fla.ops.gated_delta_product.naive")
    except Exception as e:  # fla.ops imports Triton kernels; any failure means "not usable"
        pytest.skip(f"flash-linear-attention not importable here ({type(e).__name__}: {e})")
    fn = mod.naive_recurrent_gated_delta_product
    q, k, v, g, beta = (a.detach() for a in make_inputs(
        "gated_delta_product", time=37, num_householder=3, beta_range=(0.0, 2.0)))
    S0 = torch.randn(2, 2, 8, 8, dtype=F64)
    # fla's naive rounds q, k, v, beta to float32 (the state and gate stay float64 here)
    o_fla, s_fla = fn(q, k, v, g, beta, 8 ** -0.5, None, initial_state=S0,
                      output_final_state=True, num_householder=3)
    o, s = dp.gated_delta_product(q, k, v, g, beta, 3, initial_state=S0,
                                  output_final_state=True)
    torch.testing.assert_close(o, o_fla.to(F64), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_fla.to(F64), atol=1e-5, rtol=1e-5)


def test_bench_ops_measures_the_product_against_its_ref(capsys, bench_in_process):
    import json

    from workbench.cli import bench

    rc = bench.main(["--ops", "gated_delta_product", "--seq-lens", "9", "--batch", "1",
                     "--heads", "1", "--head-dim", "4", "--repeats", "1", "--warmup", "0",
                     "--householder", "3", "--op-backends", "ref,torch", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["ops"]
    assert rc == 0
    assert [(r["op"], r["backend"], r["householder"]) for r in rows] == [
        ("gated_delta_product", "ref", 3), ("gated_delta_product", "torch", 3)]
    assert rows[0]["x_ref"] == 1.0 and rows[1]["x_ref"] > 0


def test_fla_product_wrapper_calls_fla_product_only_where_it_runs():
    """fla's chunk_gated_delta_product asserts half precision, a decay and one head count;
    elsewhere the wrapper runs fla's delta-rule kernels on the interleaved sequence (here
    stood in for by the chunked forms, so the result is checked too)."""
    from models.kernels import linear_rnn_backends as lb

    calls = []

    def product(q, k, v, g, beta, n, **kw):
        calls.append(("product", q.dtype, n))
        return dp.gated_delta_product(q.double(), k.double(), v.double(), g.double(),
                                      beta.double(), n, **kw)

    def run(args):
        return lb._fla_delta_product(product, lr.delta_rule, lr.gated_delta_rule, *args,
                                     output_final_state=True)

    args = [a.detach() for a in make_inputs("gated_delta_product", time=7)]
    o, S = run(args)                                             # float64: interleaved
    o_ref, S_ref = dp.gated_delta_product_ref(*args, output_final_state=True)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(S, S_ref)
    assert calls == []
    run([a.to(torch.bfloat16) for a in args])
    assert calls == [("product", torch.bfloat16, 2)]
    run([a.to(torch.bfloat16) if a is not None else None for a in args[:3]] + [None]
        + [args[4].to(torch.bfloat16)])                          # no decay: interleaved
    assert len(calls) == 1
