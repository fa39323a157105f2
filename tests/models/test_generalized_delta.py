"""Issue 35 item 1: RWKV-7's generalised delta rule and Kimi Delta Attention
(``models.kernels.generalized_delta``): the chunked forms against their step-by-step
``*_ref`` in float64 (outputs, final state and gradients, with an initial state, at odd
lengths, both forms of the decay products), the C forms (``generalized_delta_cpu``, backend
``cpu``) likewise, streaming in pieces, the identities with the existing operators, and our
transcriptions of fla's naive references."""
from __future__ import annotations

import pytest
import torch

from models.kernels import generalized_delta as gd
from models.kernels import generalized_delta_cpu as gdc
from models.kernels import linear_rnn as lr
from helpers import assert_mixer_streams, assert_results_close, op_outputs_and_grads, op_state

F64 = torch.float64


_state, _run, _close = op_state, op_outputs_and_grads, assert_results_close

needs_c = pytest.mark.skipif(not gdc.available(),
                             reason=f"no C kernels: {gdc.unavailable_reason()}")


def _forms(name):
    """Every form of ``name`` that runs here: chunked, ref and (when it builds) C."""
    return [*gd.OPS[name], *([gdc.OPS[name]] if gdc.available() else [])]


@pytest.mark.parametrize("name", list(gd.OPS))
@pytest.mark.parametrize("time, chunk_size", [(37, 8), (13, None), (1, 16)])
@pytest.mark.parametrize("factorised", [True, False])
def test_chunked_equals_ref(name, time, chunk_size, factorised, monkeypatch):
    monkeypatch.setattr(gd, "FACTORISED", factorised)
    args = gd.make_inputs(name, time=time, gate_range=(-2.0, 0.0))
    fast, ref = gd.OPS[name]
    _close(_run(fast, args, _state(args), chunk_size=chunk_size),
           _run(ref, args, _state(args)))


@pytest.mark.parametrize("name, kw", [("rwkv7", {"a_lr_range": (1.0, 2.0)}),
                                      ("kda", {"beta_range": (0.0, 2.0), "value_heads": 4}),
                                      ("kda", {"gate_range": (-12.0, -6.0)})])
def test_chunked_equals_ref_at_the_extremes(name, kw):
    # in-context learning rate / beta up to 2 (negative eigenvalues), grouped value heads,
    # strong decays (float64: still the factorised form at chunk 16)
    args = gd.make_inputs(name, time=29, **kw)
    fast, ref = gd.OPS[name]
    _close(_run(fast, args, _state(args), chunk_size=16), _run(ref, args, _state(args)))


def test_strong_float32_decays_take_the_masked_form_and_stay_finite():
    args = gd.make_inputs("kda", time=64, dtype=torch.float32, gate_range=(-20.0, -10.0),
                          requires_grad=False)
    o, s = gd.kda(*args, output_final_state=True, chunk_size=32)
    o_ref, s_ref = gd.kda_ref(*args, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(gd.OPS))
def test_l2norm_in_kernel_and_segments_equal_ref(name):
    args = gd.make_inputs(name, time=21)
    fast, ref = gd.OPS[name]
    kw = {"use_qk_l2norm_in_kernel": True} if name == "kda" else {}
    if name == "kda":
        args[1] = (args[1].detach() * 3).requires_grad_()      # un-normalised keys
    _close(_run(fast, args, _state(args), chunk_size=8, segment_len=10, **kw),
           _run(ref, args, _state(args), **kw))


@pytest.mark.parametrize("name", list(gd.OPS))
def test_streaming_in_pieces_equals_one_pass(name):
    args = gd.make_inputs(name, time=31, requires_grad=False)
    fast, ref = gd.OPS[name]
    S = _state(args).detach()
    o_full, s_full = fast(*args, initial_state=S, output_final_state=True)
    outs = []
    for a, b in ((0, 1), (1, 12), (12, 13), (13, 31)):       # one step, a chunk, odd pieces
        o, S = fast(*(x[:, a:b] for x in args), initial_state=S, output_final_state=True)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), o_full, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(S, s_full, atol=1e-12, rtol=1e-10)


def test_kda_with_one_decay_per_head_is_the_gated_delta_rule():
    q, k, v, g, beta = gd.make_inputs("kda", time=23, value_heads=4, requires_grad=False)
    g1 = g[..., 0]                                              # one log-gate per head
    S0 = _state([q, k, v]).detach()
    want = lr.gated_delta_rule_ref(q, k, v, g1, beta, initial_state=S0, output_final_state=True)
    for fn in gd.OPS["kda"]:
        got = fn(q, k, v, g1[..., None].expand_as(g).contiguous(), beta, initial_state=S0,
                 output_final_state=True)
        _close(got, want)


def test_rwkv7_with_k_equal_minus_a_is_kda():
    # a = -k_hat... with b = -beta k, a = k exp(g), k -> beta k the dplr rule is kda
    q, k, v, g, beta = gd.make_inputs("kda", time=19, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    kb = k * beta[..., None]
    got = gd.rwkv7(q, kb, v, k * g.exp(), -kb, g, scale=None, initial_state=S0,
                   output_final_state=True)
    _close(got, gd.kda_ref(q, k, v, g, beta, initial_state=S0, output_final_state=True))


def test_bad_shapes_are_refused():
    q, k, v, a, b, gk = gd.make_inputs("rwkv7", time=5, requires_grad=False)
    with pytest.raises(ValueError, match="gk must be"):
        gd.rwkv7(q, k, v, a, b, gk[..., :3])
    with pytest.raises(ValueError, match="v must have q's heads"):
        gd.rwkv7(q, k, torch.cat([v, v], 2), a, b, gk)
    q, k, v, g, beta = gd.make_inputs("kda", time=5, requires_grad=False)
    with pytest.raises(ValueError, match="g must be"):
        gd.kda(q, k, v, g[..., 0], beta)


# ---------------------------------------------------------------------------------------
# the C forms (generalized_delta_cpu): the recurrence with a hand-written backward
# ---------------------------------------------------------------------------------------

@needs_c
@pytest.mark.parametrize("name", list(gd.OPS))
@pytest.mark.parametrize("time, value_dim, chunk_len", [
    (37, 8, 8),        # odd length, a last chunk of 5 steps, value rows padded to a tile
    (13, 20, None),    # one chunk, 20 columns: a whole tile and a padded one
    (1, 8, 4),         # one step
    (33, 70, 16),      # 70 columns: two column groups (4 tiles, then 1), 3 chunks
    (32, 16, 16),      # whole tiles, in place; two full chunks
])
def test_c_equals_ref(name, time, value_dim, chunk_len):
    args = gd.make_inputs(name, time=time, value_dim=value_dim, key_dim=5 if time == 33 else 8,
                          gate_range=(-2.0, 0.0))
    _close(_run(gdc.OPS[name], args, _state(args), chunk_len=chunk_len),
           _run(gd.OPS[name][1], args, _state(args)))


@needs_c
@pytest.mark.parametrize("name, kw", [("rwkv7", {"a_lr_range": (1.0, 2.0)}),
                                      ("kda", {"beta_range": (0.0, 2.0), "value_heads": 4}),
                                      ("kda", {"gate_range": (-12.0, -6.0)}),
                                      ("rwkv7", {"gate_range": (-30.0, -10.0)})])
def test_c_equals_ref_at_the_extremes(name, kw):
    args = gd.make_inputs(name, time=29, **kw)
    _close(_run(gdc.OPS[name], args, _state(args), chunk_len=8),
           _run(gd.OPS[name][1], args, _state(args)))


@needs_c
@pytest.mark.parametrize("name", list(gd.OPS))
def test_c_without_initial_or_final_state_and_with_l2norm(name):
    # no h0 (no dh0 asked), no final state out (its gradient None), kda's in-kernel l2norm
    args = gd.make_inputs(name, time=19)
    kw = {"use_qk_l2norm_in_kernel": True} if name == "kda" else {}
    if name == "kda":
        args[1] = (args[1].detach() * 3).requires_grad_()
    w = torch.randn(2, 19, args[2].shape[2], 8, generator=torch.Generator().manual_seed(3),
                    dtype=F64)
    got, want = (fn(*args, **kw) for fn in (gdc.OPS[name], gd.OPS[name][1]))
    assert got[1] is None and want[1] is None
    torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=1e-10)
    for g, r in zip(torch.autograd.grad((got[0] * w).sum(), args),
                    torch.autograd.grad((want[0] * w).sum(), args)):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-8)


@needs_c
@pytest.mark.parametrize("name", list(gd.OPS))
def test_c_float32_is_close_to_float64_ref(name):
    # float32 runs in float32 (exp inlined in C): close to the float64 oracle, gradients too
    args = gd.make_inputs(name, time=50)
    S0 = _state(args)
    gen = torch.Generator().manual_seed(5)
    w_o = torch.randn(*args[2].shape, generator=gen, dtype=F64)
    w_s = torch.randn(*S0.shape, generator=gen, dtype=F64)

    def run(fn, xs, h0):
        o, s = fn(*xs, initial_state=h0, output_final_state=True)
        loss = (o * w_o.to(o.dtype)).sum() + (s * w_s.to(s.dtype)).sum()
        return [o, s, *torch.autograd.grad(loss, [*xs, h0])]
    args32 = [x.detach().float().requires_grad_() for x in [*args, S0]]
    got = run(gdc.OPS[name], args32[:-1], args32[-1])
    want = run(gd.OPS[name][1], args, S0)
    assert all(x.dtype == torch.float32 for x in got)
    _close(got, [x.float() for x in want], atol=1e-4, rtol=1e-4)


@needs_c
@pytest.mark.parametrize("name", list(gd.OPS))
def test_c_streams_in_pieces_and_reads_strided_views(name):
    args = gd.make_inputs(name, time=31, requires_grad=False)
    S = _state(args).detach()
    o_full, s_full = gd.OPS[name][1](*args, initial_state=S, output_final_state=True)
    outs = []
    for a, b in ((0, 1), (1, 12), (12, 13), (13, 31)):
        o, S = gdc.OPS[name](*(x[:, a:b] for x in args), initial_state=S,
                             output_final_state=True)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), o_full, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(S, s_full, atol=1e-12, rtol=1e-10)
    # q as a (batch, head, time, dim) tensor seen through a transpose: read by its strides
    q = args[0].transpose(1, 2).contiguous().transpose(1, 2)
    o, _ = gdc.OPS[name](q, *args[1:], output_final_state=True)
    torch.testing.assert_close(o, gd.OPS[name][1](*args)[0], atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------------------------------
# fla's naive references, transcribed (fla-org/flash-linear-attention:
# fla/ops/rwkv7/recurrent_naive.py ``naive_recurrent_rwkv7``: state in (value, key) layout,
# decay exp(-exp(w)); fla/ops/kda/naive.py ``naive_recurrent_kda``)
# ---------------------------------------------------------------------------------------

def _fla_naive_rwkv7(q, k, v, w, a, b, scale, h0):
    """(B, H, T, D) inputs, w the raw decay (log-decay -exp(w)), state (B, H, V, K)."""
    state = h0.clone()
    o = torch.zeros_like(v)
    for t in range(q.shape[2]):
        sab = torch.einsum("bhik,bhk,bhj->bhij", state, a[:, :, t], b[:, :, t])
        state = (state * torch.exp(-torch.exp(w[:, :, t, None, :])) + sab
                 + torch.einsum("bhj,bhi->bhij", k[:, :, t], v[:, :, t]))
        o[:, :, t] = torch.einsum("bhj,bhij->bhi", q[:, :, t] * scale, state)
    return o, state


def _fla_naive_kda(q, k, v, g, beta, scale, h0):
    S = h0.clone()
    o = torch.zeros_like(v)
    for i in range(q.shape[1]):
        S = S * g[:, i][..., None].exp()
        upd = v[:, i] - (k[:, i][..., None] * S).sum(-2)
        S = S + torch.einsum("bhk,bhv->bhkv", beta[:, i][..., None] * k[:, i], upd)
        o[:, i] = torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, S)
    return o, S


LARGEST = {}


def test_rwkv7_matches_fla_naive():
    q, k, v, a, b, gk = gd.make_inputs("rwkv7", time=33, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    w = torch.log(-gk)                                          # gk = -exp(w)
    o_n, s_n = _fla_naive_rwkv7(*(x.transpose(1, 2) for x in (q, k, v, w, a, b)), 1.0,
                                S0.transpose(-1, -2))
    for fn in _forms("rwkv7"):
        o, s = fn(q, k, v, a, b, gk, initial_state=S0, output_final_state=True)
        torch.testing.assert_close(o, o_n.transpose(1, 2), atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(s, s_n.transpose(-1, -2), atol=1e-12, rtol=1e-10)
        LARGEST[("rwkv7", fn.__module__, fn.__name__)] = max(
            (o - o_n.transpose(1, 2)).abs().max().item(),
            (s - s_n.transpose(-1, -2)).abs().max().item())


def test_kda_matches_fla_naive():
    q, k, v, g, beta = gd.make_inputs("kda", time=33, requires_grad=False)
    S0 = _state([q, k, v]).detach()
    o_n, s_n = _fla_naive_kda(q, k, v, g, beta, q.shape[-1] ** -0.5, S0)
    for fn in _forms("kda"):
        o, s = fn(q, k, v, g, beta, initial_state=S0, output_final_state=True)
        torch.testing.assert_close(o, o_n, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(s, s_n, atol=1e-12, rtol=1e-10)
        LARGEST[("kda", fn.__module__, fn.__name__)] = max((o - o_n).abs().max().item(),
                                                           (s - s_n).abs().max().item())


# ---------------------------------------------------------------------------------------
# backends and bench --ops
# ---------------------------------------------------------------------------------------

def test_backends_pick_the_c_form_on_a_cpu_when_it_builds():
    from models.kernels import linear_rnn_backends as lb

    for name, (fast, ref) in gd.OPS.items():
        want = (gdc.OPS[name], "cpu") if gdc.available() else (fast, "torch")
        assert lb.get_op(name, "auto", "cpu") == want
        assert lb.get_op(name, "torch", "cpu") == (fast, "torch")
        assert lb.get_op(name, "ref", "cpu") == (ref, "ref")
        if gdc.available():
            assert lb.get_op(name, "cpu", "cpu") == (gdc.OPS[name], "cpu")
        with pytest.raises(lb.BackendError, match="CUDA tensors only"):
            lb.get_op(name, "fla", "cpu")
        with pytest.raises(lb.BackendError, match="CPU tensors only"):
            lb.get_op(name, "cpu", "cuda")


def test_without_a_compiler_auto_takes_the_chunked_form_and_cpu_is_refused(monkeypatch):
    from models.kernels import linear_rnn_backends as lb

    monkeypatch.setattr(lb, "cpu_status", lambda: (False, "no C compiler found ($CC or cc)"))
    for name, (fast, _ref) in gd.OPS.items():
        assert lb.get_op(name, "auto", "cpu") == (fast, "torch")
        with pytest.raises(lb.BackendError, match="no C compiler"):
            lb.get_op(name, "cpu", "cpu")


def test_fla_rwkv7_wrapper_passes_fla_dplr_its_keywords(monkeypatch):
    from models.kernels import linear_rnn_backends as lb

    seen = {}

    def fake(**kw):
        seen.update(kw)
        return "o", "S"
    args = gd.make_inputs("rwkv7", time=3, requires_grad=False)
    assert lb._fla_dplr(fake)(*args, output_final_state=True) == ("o", "S")
    assert [seen[n] is x for n, x in zip("q k v a b gk".split(), args)] == [True] * 6
    assert seen["scale"] == 1.0 and seen["output_final_state"] is True


def test_bench_ops_measures_rwkv7_and_kda_against_their_refs(capsys, bench_in_process):
    import json

    from workbench.cli import bench

    backends = ["ref", "torch", *(["cpu"] if gdc.available() else [])]
    rc = bench.main(["--ops", "rwkv7,kda", "--seq-lens", "9", "--batch", "1",
                     "--heads", "1", "--head-dim", "4", "--repeats", "1", "--warmup", "0",
                     "--op-backends", ",".join(backends), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["ops"]
    assert rc == 0
    assert [(r["op"], r["backend"]) for r in rows] == [
        (op, b) for op in ("rwkv7", "kda") for b in backends]
    assert all("error" not in r and r["x_ref"] > 0 for r in rows)


# ---------------------------------------------------------------------------------------
# the layers and their registry entries
# ---------------------------------------------------------------------------------------

def _layers():
    from models.linear_rnn.dplr_mixers import KimiDeltaAttention, RWKV7Attention

    return {"kda": lambda **kw: KimiDeltaAttention(16, n_heads=2, **kw),
            "kda_gva_neg": lambda **kw: KimiDeltaAttention(16, n_heads=2, num_v_heads=4,
                                                           allow_neg_eigval=True, **kw),
            "rwkv7": lambda **kw: RWKV7Attention(16, n_heads=2, decay_low_rank_dim=4,
                                                 a_low_rank_dim=4, gate_low_rank_dim=4, **kw)}


@pytest.mark.parametrize("name", ["kda", "kda_gva_neg", "rwkv7"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_layer_steps_and_chunks_equal_the_full_forward(name, backend):
    torch.manual_seed(0)
    m = _layers()[name](backend=backend).to(F64)
    with torch.no_grad():                        # off the zero init: r_k's bonus term counts
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert_mixer_streams(m, torch.randn(2, 11, 16, dtype=F64))
    assert m.backend == ("cpu" if backend == "auto" and gdc.available() else "torch")


def test_kda_and_rwkv7_entries_count_and_size():
    import models

    d, H, HV = 32, 2, 4
    m = models.build("kda", d_model=d, n_layers=1, n_heads=H, num_v_heads=HV)
    mix = m.layers[0].mixer
    dk, dv, conv = d // H, d // HV, 3 * d
    want = (3 * d * d + d * HV + conv * 4                   # q, k, v, b, short conv
            + d * dv + dv * HV * dk + HV + HV * dk          # f_proj (low rank), A_log, dt_bias
            + d * dv + dv * d + d                           # g_proj (low rank, bias)
            + dv + d * d)                                   # gated norm, o_proj
    assert sum(p.numel() for p in mix.parameters()) == want
    assert models.state_size(m) == HV * dk * dv + conv * 3
    assert mix.backend == ("cpu" if gdc.available() else "torch")
    assert "Kimi" in models.describe("kda")
    m = models.build("rwkv7", d_model=d, n_layers=1, n_heads=H)
    mix = m.layers[0].mixer
    want = (6 * d + 4 * d * d                               # mu, r, k, v, o
            + 2 * d * 16 + d + 2 * d * 16 + d + 2 * d * 32  # w, a (bias), g LoRAs
            + 2 * d + d + 2 * d)                            # k_k, k_a, r_k, group norm
    assert sum(p.numel() for p in mix.parameters()) == want
    assert models.state_size(m) == H * (d // H) ** 2 + d
    assert "Goose" in models.describe("rwkv7")
    with pytest.raises(ValueError, match="decay_low_rank_dim"):
        models.build("rwkv7", d_model=d, n_layers=1, decay_low_rank_dim=0)
