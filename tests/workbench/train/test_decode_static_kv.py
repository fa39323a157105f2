"""The Transformer's static key/value cache (``Transformer.static_state``, attention's
``StaticKV``): the state ``bench --generate`` decodes a Transformer from on CUDA so that it
too replays one CUDA graph per token. Checked on the CPU: its steps equal the growing
cache's and the full forward for every position scheme; it is a fixed set of tensors
whose shapes a step keeps (what decode.graphed_step needs); a step reads no tensor on the
host; it refuses a size it cannot be, and a step past its size fails instead of writing
somewhere. The graphed replay itself is tests/workbench/train/test_decode_cuda_graphs.py
(CUDA only)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import models
from models.attention.attention import CacheFull, StaticKV
from workbench.train.decode import (
    _copy,
    greedy_steps,
    next_token,
    same_layout,
    state_leaves,
)

POSITIONS = ("absolute", "learned", "rope", "xpos", "none")


def _transformer(pos: str, max_len: int = 64):
    torch.manual_seed(0)
    return models.build("transformer", d_model=32, n_layers=2, pos=pos, max_len=max_len).double().eval()


@pytest.mark.parametrize("pos", POSITIONS)
@torch.no_grad()
def test_static_steps_equal_the_growing_cache_and_the_full_forward(pos):
    bb = _transformer(pos)
    prompt, new = torch.randn(3, 10, 32, dtype=torch.float64), torch.randn(3, 6, 32, dtype=torch.float64)
    full = bb(torch.cat([prompt, new], 1))                                   # (3, 16, 32)
    _, growing = bb.forward_with_state(prompt, bb.init_state(3))
    _, st = bb.forward_with_state(prompt, bb.init_state(3))
    static = bb.static_state(st, 16)
    assert all(isinstance(s, StaticKV) for s in static[0::2]), "every attention layer's cache is static"
    for t in range(6):
        want, growing = bb.step(new[:, t], growing)
        got, static = bb.step(new[:, t], static)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=f"{pos}: step {t} vs the growing cache")
        torch.testing.assert_close(got, full[:, 10 + t], rtol=0, atol=1e-12, msg=f"{pos}: step {t} vs forward")
    assert int(static[0].length) == 16


@torch.no_grad()
def test_the_static_state_is_a_fixed_set_of_tensors_a_step_keeps():
    bb = _transformer("rope")
    _, st = bb.forward_with_state(torch.randn(2, 5, 32, dtype=torch.float64), bb.init_state(2))
    assert state_leaves(st) is None, "the growing cache is not graphable (a KVCache object)"
    static = bb.static_state(st, 12)
    leaves = state_leaves(static)
    assert leaves is not None
    _, after = bb.step(torch.randn(2, 32, dtype=torch.float64), _copy(static))
    assert same_layout(leaves, state_leaves(after))


HOST = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy")


@pytest.mark.parametrize("pos", ["absolute", "learned", "xpos"])
@torch.no_grad()
def test_a_static_step_reads_no_tensor_on_the_host(pos, monkeypatch):
    bb = _transformer(pos).float()
    emb, head = nn.Embedding(11, 32), nn.Linear(32, 11)

    def step(tok, st):
        y, st = bb.step(emb(tok), st)
        return head(y), st

    y, st = bb.forward_with_state(emb(torch.randint(0, 11, (3, 6))), bb.init_state(3))
    static = bb.static_state(st, 12)

    def refuse(*_a, **_k):
        raise AssertionError("a tensor's value was read on the host")

    for attr in HOST:
        monkeypatch.setattr(torch.Tensor, attr, refuse)
    out = torch.empty(3, 5, dtype=torch.long)
    greedy_steps(step, next_token(head(y[:, -1])), static, 5, out=out)
    monkeypatch.undo()
    assert ((out >= 0) & (out < 11)).all()


@torch.no_grad()
def test_sizes_it_cannot_be_are_refused_and_a_full_one_does_not_write_past_its_end():
    bb = _transformer("absolute", max_len=20)
    _, st = bb.forward_with_state(torch.randn(1, 8, 32, dtype=torch.float64), bb.init_state(1))
    with pytest.raises(CacheFull, match="max_len=20"):
        bb.static_state(st, 21)
    with pytest.raises(CacheFull, match="cannot hold the 8 cached"):
        bb.static_state(st, 7)
    static = bb.static_state(st, 9)
    _, static = bb.step(torch.randn(1, 32, dtype=torch.float64), static)   # slot 8: the last
    with pytest.raises(IndexError):
        bb.step(torch.randn(1, 32, dtype=torch.float64), static)
