"""Decoding through a captured CUDA graph (workbench.train.decode.graphed_step) gives the
tokens and logits of the eager loop, for every registry family with a fixed-size state
(issue 43's GPU check; skipped where torch sees no CUDA device, as on the CPU CI: the CPU
side, that the wrapper leaves the CPU path alone and that no step reads a tensor on the
host, is tests/workbench/train/test_decode_sync_free.py). A family whose step cannot be captured is
reported by its reason, not failed: it decodes eagerly. The Transformer decodes from its
static key/value cache (Transformer.static_state), as bench --generate does on CUDA."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import models
from workbench.train.decode import GraphedStep, graphed_step, greedy_steps, next_token

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")

FAMILIES = ("transformer", "mamba", "mamba2", "gated_deltanet", "rwkv7", "gla", "retnet", "deltanet", "kda", "mamba3",
            "sliding_window_attention", "lstm", "s6")


@pytest.mark.parametrize("name", FAMILIES)
@torch.no_grad()
def test_graphed_decoding_equals_eager(name):
    if name not in models.names():
        pytest.skip(f"{name} is not registered")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bb = models.build(name, d_model=64, n_layers=2).to(dev).eval()
    emb, head = nn.Embedding(50, 64).to(dev), nn.Linear(64, 50).to(dev)

    def step(tok, st):
        y, st = bb.step(emb(tok), st)
        return head(y), st

    def prompt_state():
        ids = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(1)).to(dev)
        y, st = bb.forward_with_state(emb(ids), bb.init_state(3))
        return next_token(head(y[:, -1])), st

    tok, st = prompt_state()
    eager = torch.empty(3, 12, dtype=torch.long, device=dev)
    _, eager_logits, _ = greedy_steps(step, tok, st, 12, out=eager)
    tok, st = prompt_state()
    if hasattr(bb, "static_state"):   # the Transformer: its KV cache copied into fixed-size buffers
        st = bb.static_state(st, 20 + 12 + 1)
    run, why = graphed_step(step, tok, st)
    if not isinstance(run, GraphedStep):
        pytest.skip(f"{name} decodes eagerly: {why}")
    graphed = torch.empty_like(eager)
    _, graphed_logits, _ = greedy_steps(run, tok, st, 12, out=graphed)
    torch.cuda.synchronize()
    assert torch.equal(graphed, eager)
    torch.testing.assert_close(graphed_logits, eager_logits, rtol=1e-4, atol=1e-4)
