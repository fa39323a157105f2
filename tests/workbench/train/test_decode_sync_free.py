"""The decoding loop is ready for CUDA, checked on the CPU (issue 43): a step of every
registry backbone that decodes never turns a tensor into a Python value (``.item()``,
``bool()``, ``int()``, ``.tolist()``, ``.cpu()``...), so on a GPU the host queues step after
step without waiting for the device; ``bench --generate``'s loop
(workbench.train.decode.greedy_steps) is the one ``sample`` would run; and the CUDA-graph
wrapper (decode.graphed_step) leaves the CPU path as it is and says why."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import models
from workbench.train.decode import _copy, graphed_step, greedy_steps, next_token, same_layout, state_leaves



def decoders() -> list[str]:
    """Registry entries whose backbone has init_state / forward_with_state / step."""
    out = []
    for name in models.names():
        try:
            bb = models.build(name, d_model=16, n_layers=2)
        except TypeError:   # pretrained_* entries need a checkpoint path
            continue
        if all(hasattr(bb, m) for m in ("init_state", "forward_with_state", "step")):
            out.append(name)
    return out


DECODERS = decoders()
HOST = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy")


class HostSync(RuntimeError):
    pass


def _refuse(*_a, **_k):
    raise HostSync("a tensor's value was read on the host")


def _lm(name: str, **options):
    torch.manual_seed(0)
    bb = models.build(name, d_model=16, n_layers=2, **options).eval()
    emb, head = nn.Embedding(11, 16), nn.Linear(16, 11)

    def step(tok, st):
        y, st = bb.step(emb(tok), st)
        return head(y), st

    with torch.no_grad():
        y, st = bb.forward_with_state(emb(torch.randint(0, 11, (3, 6))), bb.init_state(3))
    return step, head(y[:, -1]).detach(), st


@pytest.mark.parametrize("name,options", [(n, {}) for n in DECODERS] + [
    ("sliding_window_attention", {"window": 3}), ("interleaved", {"pattern": "AW"}),
    ("hybrid_parallel", {"max_len": 64})])
@torch.no_grad()
def test_decoding_steps_never_read_a_tensor_on_the_host(name, options, monkeypatch):
    step, logits, st = _lm(name, **options)
    for attr in HOST:
        monkeypatch.setattr(torch.Tensor, attr, _refuse)
    out = torch.empty(3, 5, dtype=torch.long)
    greedy_steps(step, next_token(logits), st, 5, out=out)   # raises HostSync on a sync
    monkeypatch.undo()
    assert ((out >= 0) & (out < 11)).all()


def test_the_probe_catches_a_host_read(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "__bool__", _refuse)
    with pytest.raises(HostSync):
        bool(torch.ones(1) > 0)


@torch.no_grad()
def test_greedy_steps_is_the_argmax_loop():
    step, logits, st = _lm("mamba")
    _, logits2, st2 = _lm("mamba")
    out = torch.empty(3, 4, dtype=torch.long)
    tok, last, _ = greedy_steps(step, logits.argmax(-1), st, 4, out=out)
    t, want = logits2.argmax(-1), []
    for _ in range(4):
        lg, st2 = step(t, st2)
        t = lg.argmax(-1)
        want.append(t)
    assert torch.equal(out, torch.stack(want, 1)) and torch.equal(tok, want[-1]) and torch.equal(last, lg)


@torch.no_grad()
def test_cuda_graphs_leave_the_cpu_path_alone_and_say_why():
    step, logits, st = _lm("mamba")
    same, why = graphed_step(step, next_token(logits), st)
    assert same is step and why == "tensors on cpu: CUDA graphs need CUDA"
    # what the wrapper would capture on CUDA: a recurrent state is a fixed set of tensors whose
    # shapes a step keeps; a Transformer's key/value cache is not
    leaves = state_leaves(st)
    assert leaves and all(isinstance(t, torch.Tensor) for t in leaves)
    _, st_next = step(next_token(logits), st)
    assert same_layout(leaves, state_leaves(st_next))
    copied = _copy([st, {"b": (leaves[0],), "a": leaves[1]}])       # the warm-up's copy: nesting kept
    assert isinstance(copied[1]["b"], tuple) and list(copied[1]) == ["b", "a"]
    new = state_leaves(copied)
    assert all(torch.equal(x, y) and x.data_ptr() != y.data_ptr()
               for x, y in zip(new, state_leaves([st, {"b": (leaves[0],), "a": leaves[1]}])))
    tstep, tlogits, tst = _lm("transformer")
    assert state_leaves(tst) is None
    assert not same_layout(leaves, leaves[:-1])
