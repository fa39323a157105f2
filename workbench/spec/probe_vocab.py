"""The vocabulary apart: what a real vocabulary adds to a probe of a small stand-in.

A token model with a per-position head over a large vocabulary (a language model) spends
most of its probe on the vocabulary: the embedding and head weights (zeroed, then run)
and the (B, L, V) logits (five ~125M models with GPT-NeoX's 50,280 ids were 29 s of a
cold `profile check profiles/*.toml`, four fifths of it). Nothing of the backbone depends
on the vocabulary, and what the vocabulary adds is known from its shapes: the embedding
(V x d) and an untied head (C x d, and C biases) in weights; in activations, the float32
log-softmax of the logits (B, L, C) that cross-entropy saves for backward (the logits
themselves are not saved: Linear keeps its input, log-softmax its output, nll_loss the
same output and the targets). So the body is probed with a vocabulary of SPLIT_VOCAB
tokens (and classes), and each probe length's row gets the difference added: weights from
the encoder's and head's shapes (built on the meta device where large), L (C - C_small)
float32 per sequence, and the largest saved tensor max(the body's, L C float32). The
split is exact to the byte against a whole probe (tests/workbench/spec/test_cost_probe_vocab_split.py
compares the two over models, vocabularies, tied and untied heads and depths). Tokens
in, one class per position out, and not a pretrained model (its checkpoint brings its
own embedding); every other shape is probed whole.

Used by :mod:`workbench.spec.cost_probe`: :func:`split_vocab` gives the stand-in task and
what to add; :meth:`VocabSplit.add` adds it to each probe length's row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SPLIT_VOCAB = 16


@dataclass
class ShapeTask:
    """A stand-in for a task with only what its composed model and the probe's batch read
    (:func:`workbench.spec.cost_probe.model_shape`, its name for messages and its length)."""

    name: str
    seq_len: int
    readout: str
    vocab_size: int | None
    num_classes: int
    input_dim: int | None = None
    pooled: bool = False


@dataclass
class VocabSplit:
    """What a real vocabulary adds to a probe of its small stand-in, per probe length."""

    params: int
    trainable: int
    weight_bytes: int
    trainable_bytes: int
    logit_bytes_per_position: int   # float32 log-softmax of the real classes, per position
    small_logit_bytes: int          # the same of the stand-in's classes

    def add(self, rows: list[tuple], lens: tuple[int, ...]) -> list[tuple]:
        """``rows`` (one per probe length in ``lens``) with the real vocabulary's part added."""
        out = []
        for L, (p, t, wb, tb, shared, per_sample, largest) in zip(lens, rows):
            out.append((p + self.params, t + self.trainable, wb + self.weight_bytes, tb + self.trainable_bytes,
                        shared, per_sample + L * (self.logit_bytes_per_position - self.small_logit_bytes),
                        max(largest, L * self.logit_bytes_per_position)))
        return out


def split_vocab(task, model: str, d_model: int, options: dict[str, Any]):
    """(the small stand-in task, the options to build it with, the :class:`VocabSplit`)
    for a model whose vocabulary can be added from shapes (see above), else None."""
    import models
    from tasks.heads import make_encoder, make_head
    from workbench.spec.compose_options import split_options
    from workbench.train.compose import resolve_init

    if (getattr(task, "input_dim", None) or task.readout != "per_position" or not task.vocab_size
            or task.pooled or models.entry(model).family == "pretrained"):
        return None
    V, C = int(task.vocab_size), int(task.num_classes)
    small = ShapeTask(task.name, task.seq_len, task.readout, min(V, SPLIT_VOCAB), min(C, SPLIT_VOCAB))
    if (small.vocab_size, small.num_classes) == (V, C):
        return None
    _, compose_opts = split_options(options)
    # the real task decides tying (equal vocabulary and classes); the stand-in is told
    tied = resolve_init(task, model, **compose_opts)["tie_embeddings"]
    try:
        parts = [[counts(models.registry.build_for_shapes(lambda t=t, f=f: f(t, d_model)))
                  for f in ((make_encoder,) if tied else (make_encoder, make_head))] for t in (task, small)]
    except Exception:  # noqa: BLE001 - a shape the registry cannot build: the whole probe will say why
        return None
    real, stand_in = ([sum(c) for c in zip(*p)] for p in parts)
    delta = [a - b for a, b in zip(real, stand_in)]
    return small, {**options, "tie_embeddings": tied}, VocabSplit(*delta, 4 * C, 4 * small.num_classes)


def counts(net) -> tuple[int, int, int, int]:
    """(parameters, trainable parameters, bytes of parameters and buffers, bytes of trainable
    parameters) of ``net`` (shared parameters once, as ``parameters()`` gives them)."""
    ps = list(net.parameters())
    tr = [p for p in ps if p.requires_grad]
    return (sum(p.numel() for p in ps), sum(p.numel() for p in tr),
            sum(p.numel() * p.element_size() for p in ps) + sum(b.numel() * b.element_size() for b in net.buffers()),
            sum(p.numel() * p.element_size() for p in tr))
