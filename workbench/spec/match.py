"""Models matched by size: ``[sweep.match] params = N`` (non-embedding parameters) or
``state_size = N`` (floats of recurrent state per sequence, ``models.state_size``) solves,
for every model of a sweep, one integer knob so that the model meets the target within
:data:`TOLERANCE` (MAD's "iso-param, iso-state" comparisons, done for the user).

Which knob is solved, per registry family (:data:`KNOBS`):

==========  ================  =========================================================
family      params            state_size
==========  ================  =========================================================
ssm         d_model (width)   d_state (state dimension N; width kept) - d_model where the
                              model has no d_state option (Hyena long convolutions: no
                              fixed state, refused)
linear-rnn  d_model           d_model (state = heads x d_k x d_v, quadratic in width)
rnn         d_model           d_model (LSTM: h and c)
attention   d_model           d_model (sliding window: the window's KV cache); full
                              attention has no fixed-size state (KV cache grows with
                              length): refused
hybrid      d_model           d_model; refused where a full-attention layer has no
                              fixed-size state
mlp         d_model           refused: no state
pretrained  refused           refused: the width is the checkpoint's
==========  ================  =========================================================

Where the width's valid values (multiples of the heads or head width) are too far apart
for the tolerance, a second knob (:data:`FINE`: ssm and hybrid d_state, linear-rnn
expand_v, attention mlp_mult) is solved at the width just below the target.

The search is over integers and respects each model's divisibility constraints (heads,
head width, expand_k x d_model, ...) by building the model: a value its factory refuses is
skipped. Counting builds with models.registry.build_shapes: on the CPU while the model is
small (milliseconds), on the meta device (no memory) past that, and on the CPU again for the
few factories that compute on real tensors (S4's DPLR init). Both
counts grow with the knob, so a bracketing then bisection search finds the smallest value
at or above the target; of it and the largest valid value below, the nearer is taken.
A target no value meets within the tolerance is a :class:`MatchError` saying why.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

TOLERANCE = 0.02
KNOB_MAX = {"d_model": 1 << 15, "d_state": 1 << 12}
_SKIP = 64  # how far past a value the factory refuses the next valid one is looked for

# family -> (knob for params, knob for state_size); None: cannot be matched (the reason)
KNOBS: dict[str, tuple[str | None, str | None]] = {
    "ssm": ("d_model", "d_state"),
    "linear-rnn": ("d_model", "d_model"),
    "rnn": ("d_model", "d_model"),
    "attention": ("d_model", "d_model"),
    "hybrid": ("d_model", "d_model"),
    "conv": ("d_model", "d_model"),
    "mlp": ("d_model", None),
    "pretrained": (None, None),
}
# family -> a second, finer knob solved at the width just below the target where the
# width's valid values (multiples of the heads or head width) are too far apart
FINE = {"ssm": "d_state", "hybrid": "d_state", "linear-rnn": "expand_v", "attention": "mlp_mult"}
_NO_KNOB = {
    ("mlp", "state_size"): "it carries no state",
    ("pretrained", "params"): "a pretrained model's width is its checkpoint's",
    ("pretrained", "state_size"): "a pretrained model's width is its checkpoint's",
}


def _show(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}" for k, v in values.items())


class MatchError(ValueError):
    """A target a model cannot meet, with the reason. ``nearest``: the counts the model
    does reach nearest the target (offered instead), empty where it has no such knob."""

    def __init__(self, message: str, nearest: tuple[int, ...] = ()):
        super().__init__(message)
        self.nearest = tuple(nearest)


# family -> why a model of it has no fixed-size state (models.state_size is None); each
# family its own reason (a Hyena convolution is not attention)
_NO_STATE = {
    "attention": "attention's KV cache grows with the length",
    "hybrid": "its attention layers' KV cache grows with the length",
    "conv": "its long convolution reads the whole sequence, so what it keeps grows with the length",
    "ssm": "its long convolution reads the whole sequence, so what it keeps grows with the length",
}


@dataclass(frozen=True)
class Solved:
    target: str     # "params" or "state_size"
    value: int      # the target
    solved: dict[str, Any]  # knob -> value: {"d_model": 272} or {"d_model": 240, "expand_v": 1.6}
    got: int                # the model's count there

    @property
    def error(self) -> float:
        return self.got / self.value - 1

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "value": self.value, "solved": dict(self.solved),
                "got": self.got, "error": round(self.error, 6)}

    def text(self) -> str:
        what = "non-embedding params" if self.target == "params" else "state floats"
        return (f"{_show(self.solved)} ({self.got:,} {what}, {self.error:+.2%} of "
                f"{self.value:,})")


def knob_for(model: str, target: str, options: dict[str, Any] | None = None) -> str:
    """The knob solved for ``model`` under ``target`` ("params" / "state_size"), or a
    MatchError with the reason it cannot be matched."""
    import models

    e = models.registry.entry(model)
    if e.family not in KNOBS:
        raise MatchError(f"model {model!r} (family {e.family!r}) has no size knob in workbench.spec.match")
    knob = KNOBS[e.family][0 if target == "params" else 1]
    if knob is None:
        raise MatchError(f"model {model!r} cannot be matched by {target}: {_NO_KNOB[(e.family, target)]}")
    if knob == "d_state" and "d_state" not in e.options():
        knob = "d_model"
    return knob


@lru_cache(maxsize=4096)
def _measure(model: str, target: str, knob: str, value: int, d_model: int, n_layers: int,
             options_json: str) -> int | None:
    """The model's count at ``knob = value``; None where the factory refuses the value.
    A model without a fixed-size state raises MatchError."""
    import models
    from models.compute import param_counts

    opts = json.loads(options_json)
    if knob == "d_model":
        d_model = value
    else:
        opts[knob] = value

    try:
        m = models.registry.build_shapes(model, d_model=d_model, n_layers=n_layers, **opts)
    except (ValueError, AssertionError, RuntimeError, ZeroDivisionError):
        return None  # this value breaks a divisibility constraint (heads, head width, ...)
    if target == "params":
        return param_counts(m).non_embedding
    s = models.state_size(m)
    if s is None:
        why = _NO_STATE.get(models.registry.entry(model).family, "models.state_size gives none for it")
        raise MatchError(f"model {model!r} cannot be matched by state_size: it has no fixed-size state ({why})")
    return int(s)


def _search(f, seq, value: int) -> list[tuple[Any, int]]:
    """The valid entries of the increasing sequence ``seq`` (a range or list; ``f(x)``: the
    count there, None where invalid, nondecreasing in x) nearest ``value``: the largest
    below it and the smallest at or above it (one of them where the other does not exist).
    Bracketing by doubling the index, then bisection; invalid entries are skipped."""
    n = len(seq)

    def valid_from(i: int, stop: int) -> int | None:  # first valid index in [i, stop)
        for j in range(i, min(stop, i + _SKIP, n)):
            if f(seq[j]) is not None:
                return j
        return None

    lo = valid_from(0, n)
    if lo is None:
        return []
    if f(seq[lo]) >= value:
        return [(seq[lo], f(seq[lo]))]
    hi, i = None, max(1, lo * 2)
    while i < n:
        j = valid_from(i, n)
        if j is None:
            break
        if f(seq[j]) >= value:
            hi = j
            break
        lo, i = j, j * 2
    if hi is None:
        return [(seq[lo], f(seq[lo]))]
    while hi - lo > 1:  # invariant: lo, hi valid, count(lo) < value <= count(hi)
        mid = (lo + hi) // 2
        j = next((k for d in range(hi - lo) for k in (mid + d, mid - d)
                  if lo < k < hi and f(seq[k]) is not None), None)
        if j is None:
            break  # lo and hi are neighbouring valid entries
        if f(seq[j]) >= value:
            hi = j
        else:
            lo = j
    return [(seq[lo], f(seq[lo])), (seq[hi], f(seq[hi]))]


def _fine_values(model: str, fine: str, d_model: int, options: dict[str, Any]) -> list:
    """The fine knob's candidate values, increasing: d_state 1..256; expand_v such that
    expand_v x d_model is a whole multiple of the heads (mlp_mult: a whole number of
    channels), from 1/4 to 4 x its default."""
    import models

    if fine == "d_state":
        return list(range(1, 257))
    default = options.get(fine, models.registry.entry(model).options()[fine])
    # mlp_mult: the SwiGLU hidden width round(mlp_mult x d_model) in whole channels (a model
    # whose mlp_mult is an int refuses these, and keeps its width's solution)
    heads = 1 if fine == "mlp_mult" else options.get("num_v_heads") or options.get("n_heads") or 1
    lo, hi = max(1, int(default * d_model / 4) // heads), int(default * d_model * 4) // heads
    return [k * heads / d_model for k in range(lo, hi + 1)]


def solve(model: str, target: str, value: int, *, d_model: int, n_layers: int,
          options: dict[str, Any] | None = None, written: set[str] | frozenset = frozenset()) -> Solved:
    """The knob value that brings ``model`` (at ``n_layers``, with ``options``) nearest to
    ``value`` of ``target``; MatchError when it is not within :data:`TOLERANCE`.
    ``written``: knobs the profile sets itself (a match must not override them)."""
    import models

    if target not in ("params", "state_size"):
        raise MatchError(f"unknown match target {target!r}: params or state_size")
    options = {k: v for k, v in (options or {}).items()
               if k not in ("init_scheme", "init_std", "tie_embeddings")}
    knob = knob_for(model, target, options)
    if knob in written or knob in options:
        raise MatchError(f"model {model!r}: sweep.match solves {knob} for {target}; do not also write {knob}")
    key = json.dumps(options, sort_keys=True)

    def f(v: int) -> int | None:
        return _measure(model, target, knob, v, d_model, n_layers, key)

    cands = [({knob: k}, c) for k, c in _search(f, range(1, KNOB_MAX[knob] + 1), value)]
    if not cands:
        raise MatchError(f"model {model!r}: no {knob} in 1..{_SKIP} builds with these options")
    fine = FINE.get(models.registry.entry(model).family) if knob == "d_model" else None
    if fine is not None and fine not in models.registry.entry(model).options():
        fine = None
    if fine is not None and fine not in options and fine not in written and \
            min(abs(c / value - 1) for _, c in cands) > TOLERANCE:
        # the width's valid values are too far apart here (heads, head width): keep the
        # width just below the target and solve the fine knob there
        d = cands[0][0][knob]
        key2 = lambda x: json.dumps({**options, fine: x}, sort_keys=True)  # noqa: E731
        g = lambda x: _measure(model, target, "d_model", d, d, n_layers, key2(x))  # noqa: E731
        for x, c in _search(g, _fine_values(model, fine, d, options), value):
            cands.append(({knob: d, fine: x}, c))
    best = min(cands, key=lambda t: abs(t[1] / value - 1))
    s = Solved(target, value, best[0], best[1])
    if abs(s.error) > TOLERANCE + 1e-9:
        raise _unmet(model, target, value, knob, cands)
    return s


def _unmet(model: str, target: str, value: int, knob: str, cands: list[tuple[dict, int]]) -> MatchError:
    """The MatchError of a target no value meets within the tolerance: what the nearest
    values give, and the nearest count the model reaches, offered as the target to set."""
    nearest = sorted({c for _, c in cands}, key=lambda c: (abs(c / value - 1), c))
    offer = f"; the nearest it reaches: {target} = {nearest[0]:,}"
    if len(cands) == 1:
        (k, c), = cands
        # (the count named is the nearest it reaches)
        why = (f"even the smallest {_show(k)} that builds gives {c:,}" if c > value
               else f"out of reach: {knob} up to {KNOB_MAX[knob]} gives at most {c:,}")
        return MatchError(f"model {model!r} cannot meet {target} {value:,}: {why}", tuple(nearest))
    by_count = {}
    for k, c in sorted(cands, key=lambda t: t[1]):
        by_count.setdefault(c, k)
    near = " and ".join(f"{_show(k)} gives {c:,} ({c / value - 1:+.1%})" for c, k in by_count.items())
    return MatchError(f"model {model!r} cannot meet {target} {value:,} within {TOLERANCE:.0%}: {near}{offer}",
                      tuple(nearest))
