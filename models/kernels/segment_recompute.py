"""Training a long sequence through a state-carrying operator in segments recomputed in the
backward (the linear-RNN operators of ``models.kernels.linear_rnn`` use it above their
``SEGMENT_LEN``).

The forward runs core(q, k, v, g, beta, S) -> (o, S_end) one segment of time at a time
without recording, keeping only the inputs and each segment's start state (B, H, K, V);
the backward recomputes one segment at a time, last first, with the gradient of its end
state from the segment after it. Exact because the operator carries its state exactly
(streaming in pieces equals one pass). What autograd would otherwise keep for the chunked
form, every chunk's (C, C) matrices and chunked copies of q, k, v, is then held for one
segment at a time only.
"""
from __future__ import annotations

import torch


class SegmentRecompute(torch.autograd.Function):
    """o, S_T = core(q, k, v, g, beta, S_0) run segment by segment (exact: the state is
    carried), storing only the inputs and each segment's start state for the backward.

    core(q, k, v, g, beta, S) -> (o, S_end) is a chunked form on one segment (time slices
    of q, k, v (B, t, H, K|V), g (B, t, H[, K]) or None, beta (B, t, H) or None)."""

    @staticmethod
    def forward(ctx, core, seg, q, k, v, g, beta, S0):
        T = q.shape[1]
        bounds = [(a, min(a + seg, T)) for a in range(0, T, seg)]
        outs, starts, S = [], [], S0
        with torch.no_grad():
            for a, b in bounds:
                starts.append(S)
                o, S = core(*(_time_slice(x, a, b) for x in (q, k, v, g, beta)), S)
                outs.append(o)
        ctx.core, ctx.bounds = core, bounds
        ctx.save_for_backward(q, k, v, g, beta, *starts)
        return torch.cat(outs, 1), S

    @staticmethod
    def backward(ctx, dO, dS):
        from models.common import vjp_loss

        q, k, v, g, beta, *starts = ctx.saved_tensors
        inputs = (q, k, v, g, beta)
        grads = [[] if x is not None and x.requires_grad else None for x in inputs]
        dS = torch.zeros_like(starts[-1]) if dS is None else dS
        for (a, b), S_a in zip(reversed(ctx.bounds), reversed(starts)):
            with torch.enable_grad():
                xs = [None if x is None else
                      _time_slice(x, a, b).detach().requires_grad_(x.requires_grad)
                      for x in inputs]
                S_in = S_a.detach().requires_grad_(True)
                o, S_out = ctx.core(*xs, S_in)
                leaves = [x for x in xs if x is not None and x.requires_grad] + [S_in]
                found = torch.autograd.grad(vjp_loss((o, S_out), (dO[:, a:b], dS)), leaves,
                                            allow_unused=True)
            it = iter(found)
            for slot, x in zip(grads, xs):
                if slot is not None:
                    gx = next(it)
                    slot.append(torch.zeros_like(x) if gx is None else gx)
            dS = next(it)
            dS = torch.zeros_like(S_a) if dS is None else dS
        out = [None if slot is None else torch.cat(slot[::-1], 1) for slot in grads]
        return (None, None, *out, dS)


def _time_slice(x, a, b):
    return None if x is None else x[:, a:b]
