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


class StatefulSegments(torch.autograd.Function):
    """o = the outputs of core run segment by segment over time, carrying a state tuple:
    core(*timed slices (B, t, ...), *whole, *state) -> (o (B, t, ...), *next state).

    The same scheme as :class:`SegmentRecompute` for any core with any state tuple (Mamba-3's
    (theta, S, kr_prev, v_prev)): the forward runs without recording and keeps the inputs
    and each segment's start state; the backward recomputes one segment at a time, last
    first, so what autograd would keep for the whole sequence lives one segment at a time.
    ``whole`` (parameters, None allowed) get their gradients summed over the segments.
    Call as ``StatefulSegments.apply(core, seg, n_timed, n_whole, *timed, *whole, *state0)``;
    returns o (B, T, ...)."""

    @staticmethod
    def forward(ctx, core, seg, n_timed, n_whole, *args):
        timed, whole = args[:n_timed], args[n_timed:n_timed + n_whole]
        state = tuple(args[n_timed + n_whole:])
        T = timed[0].shape[1]
        bounds = [(a, min(a + seg, T)) for a in range(0, T, seg)]
        outs, starts = [], []
        with torch.no_grad():
            for a, b in bounds:
                starts.append(state)
                o, *nxt = core(*(t[:, a:b] for t in timed), *whole, *state)
                outs.append(o)
                # copies: a state that is a view (the last step of a segment's keys) would
                # keep the whole segment's tensor alive until the backward
                state = tuple(s.clone() for s in nxt)
        ctx.core, ctx.bounds, ctx.n = core, bounds, (n_timed, n_whole, len(state))
        ctx.save_for_backward(*timed, *whole, *(s for st in starts for s in st))
        return torch.cat(outs, 1)

    @staticmethod
    def backward(ctx, dO):
        n_timed, n_whole, n_state = ctx.n
        saved = ctx.saved_tensors
        timed, whole = saved[:n_timed], saved[n_timed:n_timed + n_whole]
        flat = saved[n_timed + n_whole:]
        starts = [flat[i:i + n_state] for i in range(0, len(flat), n_state)]
        needs = ctx.needs_input_grad[4:]
        need_t, need_w = needs[:n_timed], needs[n_timed:n_timed + n_whole]
        g_timed = [[] if n else None for n in need_t]
        g_whole = [None] * n_whole
        dS = None
        for (a, b), S_a in zip(reversed(ctx.bounds), reversed(starts)):
            with torch.enable_grad():
                xs = [t[:, a:b].detach().requires_grad_(n) for t, n in zip(timed, need_t)]
                ws = [None if w is None else w.detach().requires_grad_(n)
                      for w, n in zip(whole, need_w)]
                Ss = [s.detach().requires_grad_(True) for s in S_a]
                o, *S_out = ctx.core(*xs, *ws, *Ss)
                outs, grads = [o], [dO[:, a:b]]
                if dS is not None:
                    pairs = [(s, d) for s, d in zip(S_out, dS) if s.requires_grad]
                    outs += [s for s, _ in pairs]
                    grads += [d for _, d in pairs]
                leaves = ([x for x, n in zip(xs, need_t) if n]
                          + [w for w, n in zip(ws, need_w) if n and w is not None] + Ss)
                found = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
            it = iter(found)
            for i, n in enumerate(need_t):
                if n:
                    gx = next(it)
                    g_timed[i].append(torch.zeros_like(xs[i]) if gx is None else gx)
            for i, (w, n) in enumerate(zip(ws, need_w)):
                if n and w is not None:
                    gw = next(it)
                    if gw is not None:
                        g_whole[i] = gw if g_whole[i] is None else g_whole[i] + gw
            dS = [torch.zeros_like(s) if g is None else g for s, g in zip(Ss, it)]
        out_t = [None if g is None else torch.cat(g[::-1], 1) for g in g_timed]
        state_needs = needs[n_timed + n_whole:]
        out_s = [d if n else None for d, n in zip(dS, state_needs)]
        return (None, None, None, None, *out_t, *g_whole, *out_s)
