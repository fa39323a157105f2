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
from models.attention.attention import CACHE_CHUNK, CacheFull, KVCache

# the families the issue names and the hybrids; every other registry entry with a step path is tested too
NAMED = ("transformer", "mamba", "mamba2", "gated_deltanet", "rwkv7", "sliding_window_attention", "lstm",
         "forgetting_transformer", "hybrid", "hybrid_parallel", "mambaformer", "interleaved", "based")
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


# options that make decoding take its other paths: windows shorter than the sequence (the
# cache slides), hybrids' splits, combiners, projectors and recurrent kinds, patterns mixing
# attention, sliding windows and recurrent layers
VARIANTS = [
    ("sliding_window_attention", dict(window=4)),
    ("sliding_window_attention", dict(window=1, pos="none")),
    ("based", dict(window=3, n_layers=3)),
    ("interleaved", dict(pattern="AW2N", window=4, n_layers=4)),
    ("interleaved", dict(pattern="MA", n_layers=2, pos="xpos")),
    ("hybrid", dict(split="linear", combiner="res")),
    ("hybrid", dict(combiner="null", recurrent="gated_deltanet", t_layers=2)),
    ("hybrid", dict(channel_mixer="swiglu", pos="xpos")),
    ("hybrid_parallel", dict(projector="gres", max_len=64)),
    ("hybrid_parallel", dict(projector="gres-soft", max_len=64, m_layers=2)),
    ("hybrid_parallel", dict(projector="null", max_len=64)),
    ("mambaformer", dict(n_layers=1)),
    ("forgetting_transformer", dict(channel_mixer="none")),
]


@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in VARIANTS])
@torch.no_grad()
def test_decode_equals_forward_with_a_chunk_after_steps(name, options):
    """A prompt, steps, a second chunk after the cached positions (its causal mask offset by
    them), steps again: the logits of one forward pass over the whole sequence."""
    options = dict(options)
    torch.manual_seed(0)
    lm = LM(models.build(name, d_model=D, **{"n_layers": 2, **options})).double().eval()
    ids = torch.randint(0, VOCAB, (2, TOTAL), generator=torch.Generator().manual_seed(2))
    bb = lm.backbone
    y, state = bb.forward_with_state(lm.emb(ids[:, :7]), bb.init_state(2))
    out = [lm.head(y)]
    for t in range(7, 12):
        y_t, state = bb.step(lm.emb(ids[:, t]), state)
        out.append(lm.head(y_t)[:, None])
    y, state = bb.forward_with_state(lm.emb(ids[:, 12:17]), state)
    out.append(lm.head(y))
    for t in range(17, TOTAL):
        y_t, state = bb.step(lm.emb(ids[:, t]), state)
        out.append(lm.head(y_t)[:, None])
    dec, full = torch.cat(out, 1), lm(ids)
    assert torch.allclose(dec, full, atol=1e-8, rtol=0), (dec - full).abs().amax()


@pytest.mark.parametrize("name", ["transformer", "hybrid", "hybrid_parallel", "mambaformer", "interleaved"])
@torch.no_grad()
def test_a_stack_step_updates_its_state_list_in_place(name):
    """One pass over the layers per token: the state list a step returns is the one it was
    given (no container rebuilt per token), its key/value caches the same objects."""
    torch.manual_seed(0)
    options = {"pattern": "MA"} if name == "interleaved" else {}
    bb = models.build(name, d_model=D, n_layers=2, **options).eval()
    state = bb.init_state(2)
    _, after = bb.forward_with_state(torch.randn(2, 5, D), state)
    assert after is state
    before = [id(s) for s in state]
    _, after = bb.step(torch.randn(2, D), state)
    assert after is state and len(state) == len(before)
    caches = [s for s in state if isinstance(s, KVCache)] or [c for s in state for c in s if isinstance(c, KVCache)]
    assert caches and all(c.length == 6 for c in caches)


@torch.no_grad()
def test_the_fox_cache_grows_in_chunks_and_is_refused_past_its_limit():
    from models.attention.forgetting_attention import ForgettingAttention

    torch.manual_seed(0)
    layer = ForgettingAttention(D, n_heads=2).eval()
    cache = layer.init_state(1)
    _, cache = layer.forward_with_state(torch.randn(1, 3, D), cache)
    assert cache.k.shape[2] == CACHE_CHUNK and cache.length == 3
    buffers = {cache.k.data_ptr()}
    for _ in range(CACHE_CHUNK):            # 3 + 256 positions: one growth, not a copy per token
        _, cache = layer.step(torch.randn(1, D), cache)
        buffers.add(cache.k.data_ptr())
    assert len(buffers) == 2 and cache.k.shape[2] == 2 * CACHE_CHUNK and cache.length == 3 + CACHE_CHUNK
    assert cache.nbytes() == (3 + CACHE_CHUNK) * (2 * D * 4 + 2 * 8)   # k, v float32; c float64 per head
    full = layer.init_state(1, capacity=64, limit=4)
    assert full.k.shape[2] == 4
    _, full = layer.forward_with_state(torch.randn(1, 4, D), full)
    with pytest.raises(CacheFull) as e:
        layer.step(torch.randn(1, D), full)
    assert "\n" not in str(e.value) and "at most 4 positions" in str(e.value) and "4 cached + 1 new" in str(e.value)


@torch.no_grad()
def test_hybrid_parallel_refuses_a_position_past_its_table():
    bb = models.build("hybrid_parallel", d_model=D, n_layers=1, max_len=6).eval()
    _, state = bb.forward_with_state(torch.randn(1, 6, D), bb.init_state(1))
    with pytest.raises(CacheFull, match="position 6 is past hybrid_parallel's max_len=6"):
        bb.step(torch.randn(1, D), state)


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
