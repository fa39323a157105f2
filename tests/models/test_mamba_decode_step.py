"""The C decode step of Mamba and Mamba-2 (issue 43: csrc/mamba_step.c,
``models.kernels.mamba_step_cpu``).

Three layers of checks, as for the linear-RNN and delta-rule steps: the C functions
against their plain PyTorch twins (``mamba_step_ref``, ``mamba2_step_ref``) on random
inputs, strided and batched, float32 and float64, the parallel branch included; the twins
against the layers' torch step (``_torch_step``, the chain of ops the C replaces); each
layer's decode step (``step`` without autograd: in_proj, the C call, out_proj) against the
torch step and the full forward, token after token, with the torch step unreachable; then
the fallbacks (the library unavailable, autograd recording, another dtype or device, a
forced "torch" backend) taking the torch step, the inputs left unwritten, and a parameter
update followed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from decode_step_checks import close, perturbed

from models.kernels import mamba_step_cpu as ms
from models.ssm.mamba import Mamba
from models.ssm.mamba2 import Mamba2

pytestmark = pytest.mark.skipif(
    bool(ms._LIBRARY.load()[1]),
    reason=f"Mamba decode-step kernel unavailable: {ms._LIBRARY.load()[1]}")

D = 16
CASES = {
    "mamba": lambda: Mamba(D),
    "mamba_neg": lambda: Mamba(D, allow_neg_eigval=True),
    "mamba_noconvbias_state5": lambda: Mamba(D, d_state=5, conv_bias=False),
    "mamba_dtrank3_conv2_bias": lambda: Mamba(D, dt_rank=3, d_conv=2, bias=True),
    "mamba_conv1": lambda: Mamba(D, d_conv=1, d_state=3, expand=3),
    "mamba2": lambda: Mamba2(D, d_state=8, headdim=8),
    "mamba2_groups2": lambda: Mamba2(D, d_state=6, headdim=4, ngroups=2),
    "mamba2_groups4_noconvbias": lambda: Mamba2(D, d_state=5, headdim=8, ngroups=4,
                                                expand=4, conv_bias=False),
    "mamba2_conv2_bias": lambda: Mamba2(D, d_state=12, headdim=16, d_conv=2, bias=True),
}


def _layer(name, dtype=torch.float64):
    m = perturbed(CASES[name], dtype)
    if isinstance(m, Mamba):                   # A_log is 2-D: move it off its init too
        with torch.no_grad():
            m.A_log.add_(0.3 * torch.randn_like(m.A_log))
    return m


def _no_torch_step(mp, m):
    """The torch step unreachable: what steps is the C."""
    def no_torch_step(*a, **k):
        raise AssertionError("the torch step ran")
    mp.setattr(m, "_torch_step", no_torch_step)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_c_step_equals_torch_step_and_forward(name, dtype, monkeypatch):
    """After a 5-token prompt, each of 6 steps (the C step only) equals the torch step and
    the full forward at that position, the output and both state tensors."""
    m = _layer(name, dtype)
    B, P, T = 3, 5, 11
    x = torch.randn(B, T, D, dtype=dtype)
    with torch.no_grad():
        full = m(x)
        _, st_c = m.forward_with_state(x[:, :P], m.init_state(B))
    st_t = st_c
    for t in range(P, T):
        with monkeypatch.context() as mp, torch.no_grad():
            _no_torch_step(mp, m)
            y_c, st_c = m.step(x[:, t], st_c)
        with torch.no_grad():
            y_t, st_t = m._torch_step(x[:, t], st_t)
        close(y_c, y_t, dtype)
        close(y_c, full[:, t], torch.float32)
        for a, b in zip(st_c, st_t, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            close(a, b, dtype)


def _twin_step(m, x_t, st):
    """The layer's step through the C step's torch twin (its weights)."""
    if isinstance(m, Mamba):
        y, cache, h = ms.mamba_step_ref(
            m.in_proj(x_t), st[0], m.conv1d.weight, m.conv1d.bias, m.x_proj.weight,
            m.dt_proj.weight, m.dt_proj.bias, -torch.exp(m.A_log), m.D, st[1],
            allow_neg_eigval=m.allow_neg_eigval)
        return m.out_proj(y), (cache, h)
    o, cache, S = ms.mamba2_step_ref(
        m.in_proj(x_t), st[0], m.conv1d.weight, m.conv1d.bias, m.dt_bias, m.A_log, m.D,
        m.norm.weight, st[1], ngroups=m.ngroups, eps=m.norm.eps)
    return m.out_proj(o), (cache, S)


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_twin_is_the_torch_step(name):
    """The twin (the C step's oracle) against the layer's torch step (the chain of ops it
    replaces): a twin that drifts from the layer fails here, not only the C code."""
    m = _layer(name)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    with torch.no_grad():
        _, st = m.forward_with_state(x[:, :3], m.init_state(2))
        got, want = _twin_step(m, x[:, 3], st), m._torch_step(x[:, 3], st)
    close(got[0], want[0], torch.float64)
    for a, b in zip(got[1], want[1], strict=True):
        close(a, b, torch.float64)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _mamba_inputs(B, Din, N, R, W, dtype, seed, strided, bias=True):
    """Random arguments of mamba_step (the projections scaled as initialised, so that
    values stay O(1)); xz a view with a wider row stride when ``strided``."""
    g = _gen(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    xz = r(B, 3 * Din)[:, :2 * Din] if strided else r(B, 2 * Din)
    return (xz, r(B, Din, W - 1), r(Din, 1, W), r(Din) if bias else None,
            r(R + 2 * N, Din) * Din ** -0.5, r(Din, R) * R ** -0.5, r(Din), -torch.rand(Din, N, generator=g, dtype=dtype) * 3, r(Din),
            r(B, Din, N))


def _mamba2_inputs(B, H, P, N, G, W, dtype, seed, strided, bias=True):
    """Random arguments of mamba2_step; u a view with a wider row stride when ``strided``."""
    g = _gen(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    Cd = H * P + 2 * G * N
    width = H * P + Cd + H
    u = r(B, width + 5)[:, :width] if strided else r(B, width)
    return (u, r(B, Cd, W - 1), r(Cd, 1, W), r(Cd) if bias else None, r(H), r(H), r(H),
            r(H * P), r(B, H, N, P))


def _with_threads(n, fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        fn()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, Din, N, R, W, strided, bias", [
    (1, 4, 3, 1, 4, False, True), (3, 10, 5, 3, 3, True, True), (2, 7, 16, 2, 1, True, False),
    (2, 9, 4, 5, 2, False, False), (8, 512, 16, 16, 4, False, True)])
def test_mamba_c_step_equals_its_torch_twin(B, Din, N, R, W, strided, bias, dtype):
    """With and without negative eigenvalues, conv bias, a conv of width 1 (an empty cache);
    (8, 512, 16): enough work for the kernel's parallel branch (two threads here)."""
    args = _mamba_inputs(B, Din, N, R, W, dtype, 1, strided, bias)

    def check():
        for neg in (False, True):
            got = ms.mamba_step(*args, allow_neg_eigval=neg)
            want = ms.mamba_step_ref(*args, allow_neg_eigval=neg)
            for a, b in zip(got, want, strict=True):
                close(a, b, dtype)
    _with_threads(2, check)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, H, P, N, G, W, strided, bias", [
    (1, 1, 3, 2, 1, 4, False, True), (3, 4, 5, 6, 2, 3, True, True),
    (2, 6, 4, 3, 3, 1, True, False), (2, 4, 2, 7, 4, 2, False, False),
    (8, 8, 32, 32, 1, 4, False, True)])
def test_mamba2_c_step_equals_its_torch_twin(B, H, P, N, G, W, strided, bias, dtype):
    """Groups of heads sharing B and C, with and without conv bias, a conv of width 1;
    (8, 8, 32, 32): enough work for the parallel branch (two threads here)."""
    args = _mamba2_inputs(B, H, P, N, G, W, dtype, 2, strided, bias)

    def check():
        got = ms.mamba2_step(*args, ngroups=G, eps=1e-5)
        want = ms.mamba2_step_ref(*args, ngroups=G, eps=1e-5)
        for a, b in zip(got, want, strict=True):
            close(a, b, dtype)
    _with_threads(2, check)


def test_c_steps_leave_their_inputs_unchanged():
    """The new state and conv cache are new tensors: those passed in are not written (the
    decode loops rely on it)."""
    for fn, args, kw in ((ms.mamba_step, _mamba_inputs(2, 6, 4, 2, 4, torch.float64, 3, False),
                          {"allow_neg_eigval": False}),
                         (ms.mamba2_step, _mamba2_inputs(2, 4, 3, 5, 2, 4, torch.float64, 4,
                                                         False), {"ngroups": 2, "eps": 1e-5})):
        before = [t.clone() for t in args]
        _, cache2, S2 = fn(*args, **kw)
        for a, b in zip(args, before, strict=True):
            assert torch.equal(a, b)
        assert cache2.data_ptr() != args[1].data_ptr() and S2.data_ptr() != args[-1].data_ptr()


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_decode_takes_the_c_step_without_autograd_only(name, monkeypatch):
    """Under no_grad the C step runs (the torch step unreachable); under autograd the torch
    step runs and the C functions are not called."""
    m = _layer(name)
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with monkeypatch.context() as mp, torch.no_grad():
        _no_torch_step(mp, m)
        assert m._fused_step(x, st) is not None
        m.step(x, st)
    calls = []
    monkeypatch.setattr(ms, "mamba_step", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(ms, "mamba2_step", lambda *a, **k: calls.append(2))
    y, _ = m.step(x, st)
    assert y.requires_grad and calls == []


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_the_torch_step_runs_where_the_c_step_cannot(name, monkeypatch):
    """The library unavailable, a state of another dtype, a float16 layer, a forced "torch"
    backend: _fused_step says None and step runs the torch step, whose answer it returns."""
    m = _layer(name)
    st = m.init_state(2)
    x = torch.randn(2, D, dtype=torch.float64)
    with torch.no_grad():
        want = m._torch_step(x, st)[0]
        monkeypatch.setattr(ms._LIBRARY, "loaded", (None, "no compiler (test)"))
        assert m._fused_step(x, st) is None
        torch.testing.assert_close(m.step(x, st)[0], want)
        monkeypatch.undo()
        assert m._fused_step(x, st) is not None
        assert m._fused_step(x, (st[0].float(), st[1])) is None
        assert m._fused_step(x, (st[0], st[1].float())) is None
        h = _layer(name, torch.float16)
        assert h._fused_step(x.half(), h.init_state(2)) is None
        forced = (Mamba(D, backend="torch") if name == "mamba"
                  else Mamba2(D, d_state=8, headdim=8, backend="torch")).double()
        assert forced._fused_step(x, forced.init_state(2)) is None


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_other_devices_decode_through_the_torch_step(name):
    """Not on a CPU (the meta device): the C step declines and step runs the torch step."""
    m = _layer(name, torch.float32).to("meta")
    st = m.init_state(2)
    with torch.no_grad():
        assert m._fused_step(torch.randn(2, D, device="meta"), st) is None
        y, st2 = m.step(torch.randn(2, D, device="meta"), st)
    assert y.device.type == "meta" and len(st2) == 2


@pytest.mark.parametrize("name", ["mamba", "mamba_neg"])
def test_c_step_follows_a_parameter_update(name):
    """A = -exp(A_log) is kept between steps: an in-place update of A_log (an optimiser
    step) is seen at the next step, as are the other parameters (read at each call)."""
    m = _layer(name)
    x = torch.randn(2, D, dtype=torch.float64)
    st = m.init_state(2)
    with torch.no_grad():
        st = m.step(x, st)[1]
        m.step(x, st)                                   # keeps -exp(A_log)
        m.A_log.add_(0.5)
        m.x_proj.weight.mul_(0.5)
        m.conv1d.weight.mul_(-1.0)
        got, want = m.step(x, st), m._torch_step(x, st)
    close(got[0], want[0], torch.float64)
    close(got[1][1], want[1][1], torch.float64)


def test_mamba_torch_step_is_the_ssm_step():
    """Mamba's torch step is the conv window, S6's _ssm_step and the gate (the path the C
    replaces, kept under autograd)."""
    m = _layer("mamba_neg")
    x = torch.randn(2, D, dtype=torch.float64)
    st = (torch.randn(2, m.d_inner, m.d_conv - 1, dtype=torch.float64),
          torch.randn(2, m.d_inner, m.d_state, dtype=torch.float64))
    with torch.no_grad():
        xi, z = m.in_proj(x).chunk(2, -1)
        win = torch.cat([st[0], xi[..., None]], -1)
        xc = F.silu((win * m.conv1d.weight[:, 0]).sum(-1) + m.conv1d.bias)
        y, h = m._ssm_step(xc, st[1])
        want = m.out_proj(y * F.silu(z))
        got = m.step(x, st)
    close(got[0], want, torch.float64)
    close(got[1][1], h, torch.float64)


# -- the stack: residual add + RMS norm between layers in one call (RecurrentStack.step) --

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("strided", [False, True])
def test_add_rmsnorm_equals_its_torch_twin(dtype, strided):
    g = _gen(5)
    x, w = torch.randn(3, 10, generator=g, dtype=dtype), torch.randn(10, generator=g, dtype=dtype)
    y = torch.randn(3, 20, generator=g, dtype=dtype)
    y = y[:, ::2] if strided else y[:, :10]
    for yy in (None, y):
        got, want = ms.add_rmsnorm(x, yy, w, 1e-5), ms.add_rmsnorm_ref(x, yy, w, 1e-5)
        for a, b in zip(got, want, strict=True):
            close(a, b, dtype)


def _stack(name, dtype, **stack):
    from models.ssm.mamba import RecurrentStack
    torch.manual_seed(0)
    if name == "gated_deltanet":
        from models.linear_rnn.delta_mixers import GatedDeltaNet
        def make(i):
            return GatedDeltaNet(D, n_heads=2)
    else:
        make = (lambda i: _layer("mamba_neg" if i else "mamba")) if name == "mamba" else \
            (lambda i: _layer("mamba2_groups2" if i else "mamba2"))
    bb = RecurrentStack(D, 3, make, **stack).to(dtype)
    with torch.no_grad():
        for n in [layer.norm for layer in bb.layers] + [bb.norm_f]:
            if hasattr(n, "weight"):
                n.weight.add_(0.3 * torch.randn_like(n.weight))
    return bb.eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["mamba", "mamba2", "gated_deltanet"])
def test_stack_step_equals_layer_by_layer_and_forward(name, dtype, monkeypatch):
    """The stack's decode step with the fused add + norm (stack_with_state unreachable)
    equals the layer-by-layer step and the full forward, token after token, states too."""
    import models.ssm.mamba as mamba_mod
    bb = _stack(name, dtype)
    B, P, T = 2, 4, 9
    x = torch.randn(B, T, D, dtype=dtype)
    with torch.no_grad():
        full = bb(x)
        _, st_f = bb.forward_with_state(x[:, :P], bb.init_state(B))
    st_l = st_f
    for t in range(P, T):
        with monkeypatch.context() as mp, torch.no_grad():
            def no_stack(*a, **k):
                raise AssertionError("stack_with_state ran")
            mp.setattr(mamba_mod, "stack_with_state", no_stack)
            y_f, st_f = bb.step(x[:, t], st_f)
        with torch.no_grad():
            y_l, st_l = mamba_mod.stack_with_state(bb, x[:, t], st_l, "step")
        close(y_f, y_l, dtype)
        close(y_f, full[:, t], torch.float32)
        for a, b in zip(st_f, st_l, strict=True):
            for u, v in zip(a, b, strict=True):
                close(u, v, dtype)


@pytest.mark.parametrize("stack", [{"channel_mixer": "swiglu"}, {"norm": "layer"},
                                   {"dropout": 0.1}])
def test_stack_step_is_layer_by_layer_where_the_fusion_does_not_apply(stack, monkeypatch):
    """Channel mixers, LayerNorms, active dropout (train mode), autograd: the stack steps
    layer by layer (stack_with_state)."""
    import models.ssm.mamba as mamba_mod
    bb = _stack("mamba", torch.float64, **stack)
    if "dropout" in stack:
        bb.train()
    x = torch.randn(2, D, dtype=torch.float64)
    st = bb.init_state(2)
    with torch.no_grad():
        assert bb._fused_step(x, st) is None
    plain = _stack("mamba", torch.float64)
    with torch.no_grad():
        assert plain._fused_step(x, st) is not None
    calls = []
    real = mamba_mod.stack_with_state
    monkeypatch.setattr(mamba_mod, "stack_with_state",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    plain.step(x, st)                                   # autograd recording
    assert calls == [1]
