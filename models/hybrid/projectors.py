"""Splitters and combiners between one stream and two parallel branches (same width d).

The family of sadmankiba/hybrid-model (``hybrid/projector.py``), where a GPT-Neo branch and
a Mamba branch run side by side. P_b, Q_b are Linear(d, d) (one per branch, splitter and
combiner each have their own); x: (batch, length, d) the stream, y_b the branch outputs.

=============  ==========================================  ==============================================
kind           split: input of branch b                    combine
=============  ==========================================  ==============================================
``null``       x                                           (y_1 + y_2) / 2
``res``        P_b x + x                                   ((Q_1 y_1 + y_1) + (Q_2 y_2 + y_2)) / 2
``gres``       (1 - a_b) P_b x + a_b x                     sum_b w_b ((1 - c_b) Q_b y_b + c_b y_b),
               a_b scalar, starts at 1                     w = softmax(c_1, c_2); c_b scalar, starts at 1
``gres-soft``  (1 - s_b) P_b x + s_b x,                    sum_b t_b ((1 - t_b) Q_b y_b + t_b y_b),
               (s_1, s_2) = softmax(a, 1 - a), a ~ N(0,1)  (t_1, t_2) = softmax(c, 1 - c), c ~ N(0,1)
=============  ==========================================  ==============================================

The gates are unconstrained scalars, as in the reference: at the start ``gres`` is a pure
residual split and an equal-weight residual merge, so P_b and Q_b get no gradient until
the first update has moved the gates off 1 (as in the reference). The Linear layers keep PyTorch's default
initialisation (the reference builds them outside Hugging Face's models), so their
parameters are marked ``_no_reinit`` for ``models.init_schemes``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

PROJECTORS = ("null", "res", "gres", "gres-soft")


def _check(kind: str) -> str:
    if kind not in PROJECTORS:
        raise ValueError(f"unknown projector {kind!r}; expected one of {', '.join(PROJECTORS)}")
    return kind


def _linears(kind: str, d: int) -> nn.ModuleList | None:
    if kind == "null":
        return None
    layers = nn.ModuleList(nn.Linear(d, d) for _ in range(2))
    for layer in layers:
        for p in layer.parameters():
            p._no_reinit = True
    return layers


def _gate(kind: str) -> nn.Parameter | None:
    """The learned gate: two scalars at 1 (gres), one scalar ~ N(0, 1) (gres-soft), or none."""
    if kind == "gres":
        return nn.Parameter(torch.ones(2))
    if kind == "gres-soft":
        return nn.Parameter(torch.randn(1))
    return None


def _soft_pair(a: torch.Tensor) -> torch.Tensor:
    """(s_1, s_2) = softmax(a, 1 - a) for a scalar parameter a of shape (1,)."""
    return torch.softmax(torch.cat([a, 1 - a]), dim=0)


class Splitter(nn.Module):
    """x: (batch, length, d) -> [input of branch 1, input of branch 2]."""

    def __init__(self, kind: str, d: int):
        super().__init__()
        self.kind = _check(kind)
        self.proj = _linears(kind, d)
        self.alpha = _gate(kind)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.kind == "null":
            return [x, x]
        if self.kind == "res":
            return [p(x) + x for p in self.proj]
        gate = self.alpha if self.kind == "gres" else _soft_pair(self.alpha)
        return [(1 - gate[b]) * p(x) + gate[b] * x for b, p in enumerate(self.proj)]


class Combiner(nn.Module):
    """[y_1, y_2], each (batch, length, d) -> (batch, length, d)."""

    def __init__(self, kind: str, d: int):
        super().__init__()
        self.kind = _check(kind)
        self.proj = _linears(kind, d)
        self.gamma = _gate(kind)

    def forward(self, ys: list[torch.Tensor]) -> torch.Tensor:
        if self.kind == "null":
            return (ys[0] + ys[1]) / 2
        if self.kind == "res":
            return sum(q(y) + y for q, y in zip(self.proj, ys)) / 2
        if self.kind == "gres":
            gate, weight = self.gamma, torch.softmax(self.gamma, dim=0)
        else:
            gate = weight = _soft_pair(self.gamma)
        return sum(weight[b] * ((1 - gate[b]) * q(y) + gate[b] * y)
                   for b, (q, y) in enumerate(zip(self.proj, ys)))
