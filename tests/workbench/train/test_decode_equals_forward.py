"""Decoding equals the full forward pass, position by position, for every registry backbone
that can decode (issue 43): a prompt read once (``forward_with_state``) and then one token at
a time (``step``), carrying the recurrent state or the Transformer's key/value cache, gives
the logits a forward pass over the whole sequence gives. Random init, float64.

Also the Transformer's cache itself: preallocated and grown in chunks (not a copy per
token), positions continued at the cache's length for every position encoding, and a
cache past ``max_len`` refused in one line."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import models
from models.attention.attention import CACHE_CHUNK, CacheFull

# the families the issue names; every other registry entry with a step path is tested too
NAMED = ("transformer", "mamba", "mamba2", "gated_deltanet", "rwkv7", "sliding_window_attention", "lstm")
VOCAB, D, PROMPT, TOTAL = 37, 16, 9, 24


def decoders() -> list[str]:
    """Registry entries whose backbone has init_state / forward_with_state / step."""
    out = []
    for name in models.names():
        try:
            bb = models.build(name, d_model=D, n_layers=2)
        except TypeError:   # pretrained_* entries need a checkpoint path
            continue
        if all(hasattr(bb, m) for m in ("init_state", "forward_with_state", "step")):
            out.append(name)
    return out


DECODERS = decoders()


def test_the_named_families_all_decode():
    assert set(NAMED) <= set(DECODERS), sorted(set(NAMED) - set(DECODERS))


class LM(nn.Module):
    """Embedding -> backbone -> linear head: logits of a random language model."""

    def __init__(self, backbone):
        super().__init__()
        self.emb, self.backbone, self.head = nn.Embedding(VOCAB, D), backbone, nn.Linear(D, VOCAB)

    def forward(self, ids):
        return self.head(self.backbone(self.emb(ids)))

    def decode(self, ids, prompt: int):
        """Logits at every position: the first ``prompt`` tokens in one chunk, then a step each."""
        bb = self.backbone
        y, state = bb.forward_with_state(self.emb(ids[:, :prompt]), bb.init_state(ids.shape[0]))
        out = [self.head(y)]
        for t in range(prompt, ids.shape[1]):
            y_t, state = bb.step(self.emb(ids[:, t]), state)
            out.append(self.head(y_t)[:, None])
        return torch.cat(out, 1)


def lm_of(name: str, **options) -> LM:
    torch.manual_seed(0)
    return LM(models.build(name, d_model=D, n_layers=2, **options)).double().eval()


@pytest.mark.parametrize("name", DECODERS)
@torch.no_grad()
def test_decode_logits_equal_the_forward_pass(name):
    lm = lm_of(name)
    ids = torch.randint(0, VOCAB, (2, TOTAL), generator=torch.Generator().manual_seed(1))
    full = lm(ids)
    dec = lm.decode(ids, PROMPT)
    assert dec.shape == full.shape == (2, TOTAL, VOCAB)
    assert torch.allclose(dec, full, atol=1e-6, rtol=0), (dec - full).abs().amax(-1)


@pytest.mark.parametrize("pos", ["absolute", "learned", "rope", "xpos", "none"])
@torch.no_grad()
def test_transformer_decode_equals_forward_for_every_position_encoding(pos):
    """Positions continue at the cache's length: a prompt, steps, then a second chunk after
    the cached positions (its causal mask offset by them)."""
    torch.manual_seed(0)
    bb = models.build("transformer", d_model=D, n_layers=2, pos=pos, max_len=64).double().eval()
    x = torch.randn(2, 40, D, dtype=torch.float64)
    state = bb.init_state(2)
    y, state = bb.forward_with_state(x[:, :7], state)
    ys = [y]
    for t in range(7, 20):
        y_t, state = bb.step(x[:, t], state)
        ys.append(y_t[:, None])
    y, state = bb.forward_with_state(x[:, 20:], state)
    ys.append(y)
    assert torch.allclose(torch.cat(ys, 1), bb(x), atol=1e-10, rtol=0)
    assert state[0].length == 40 and state[1] == ()   # attention caches, the MLPs hold nothing


@torch.no_grad()
def test_the_cache_grows_in_chunks_not_per_token():
    torch.manual_seed(0)
    bb = models.build("transformer", d_model=D, n_layers=1, max_len=1000).eval()
    state = bb.init_state(1)
    _, state = bb.forward_with_state(torch.randn(1, 3, D), state)
    cache = state[0]
    assert cache.k.shape[2] == CACHE_CHUNK and cache.length == 3
    buffers = {cache.k.data_ptr()}
    for _ in range(CACHE_CHUNK):            # 3 + 256 positions: one growth
        _, state = bb.step(torch.randn(1, D), state)
        buffers.add(cache.k.data_ptr())
    assert len(buffers) == 2 and cache.k.shape[2] == 2 * CACHE_CHUNK and cache.length == 3 + CACHE_CHUNK
    assert cache.nbytes() == 2 * (3 + CACHE_CHUNK) * D * 4   # keys + values of the filled positions


@torch.no_grad()
def test_a_cache_past_max_len_is_refused_in_one_line():
    bb = models.build("transformer", d_model=D, n_layers=1, max_len=10).eval()
    state = bb.init_state(1, capacity=64)
    assert state[0].k.shape[2] == 10                     # never more room than max_len
    _, state = bb.forward_with_state(torch.randn(1, 10, D), state)
    with pytest.raises(CacheFull) as e:
        bb.step(torch.randn(1, D), state)
    msg = str(e.value)
    assert "\n" not in msg and "max_len=10" in msg and "10 cached + 1 new" in msg


def test_a_workbench_transformer_run_generates_within_its_window():
    """sample / the run view: a run whose backbone keeps a key/value cache (load_run's
    info["carries"]) keeps prompt + tokens within its window, as a transformers model does;
    a recurrent state has no such end."""
    from types import SimpleNamespace

    from workbench.train.decode import new_tokens

    def lm(carries):
        return SimpleNamespace(name="run:2", start=object(), step=object(), max_length=64,
                               info={"kind": "workbench-run", "carries": carries})

    assert new_tokens(lm("key/value cache"), 10, 100) == (
        54, "100 tokens after a 10-token prompt pass run:2's window of 64 tokens: generating 54")
    assert new_tokens(lm("recurrent state"), 10, 100) == (100, None)
