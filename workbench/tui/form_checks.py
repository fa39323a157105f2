"""The sweep form's checks and messages: pydantic's errors as plain sentences that name
the form's field (:func:`plain_message`), the run count and the resource estimate shown
beside the sweep (:func:`run_count_text`, :func:`estimate_text`), and the profile loader's
checks beyond the schema with the key path each problem is about (:func:`registry_problems`).
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from workbench.spec import profile as profiles
from workbench.spec.check import registry_problems  # noqa: F401  (the form's checks beyond the schema)
from workbench.spec.profile import Profile, ProfileError
from workbench.tui.formatting import count


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def run_count_text(sweep: dict[str, Any], task: str) -> tuple[str, bool]:
    """'will launch N runs = M models x K lengths x S seeds' for the form's sweep section,
    or what keeps it from being counted; and whether it could be counted.

    The count is ``len(expand(...))`` of a profile with the form's sweep and placeholders
    elsewhere: the runs are the sweep's product, whatever the other fields say, so the count
    shows while they are still being edited (about a millisecond for hundreds of runs)."""
    try:
        prof = Profile.model_validate({"schema_version": profiles.SCHEMA_VERSION, "name": "count",
                                       "task": {"name": task}, "sweep": sweep, "train": {"steps": 1}})
    except ValidationError as e:
        axis = {"models": "models", "seq_lens": "sequence lengths", "seeds": "seeds"}
        problems = []
        for err in e.errors():
            where = next((axis[p] for p in err["loc"] if p in axis), "sweep")
            if err["type"] == "too_short":
                problem = "pick at least one model" if where == "models" else f"give at least one of the {where}"
            else:
                bad = f" ({err['input']!r})" if not isinstance(err.get("input"), (dict, list)) else ""
                problem = f"{where}{bad}: {err['msg']}"
            if problem not in problems:
                problems.append(problem)
        return "cannot count the runs yet: " + "; ".join(problems), False
    try:
        n = len(profiles.expand(prof))
    except ProfileError as e:  # a grid value its section refuses (shown in full on launch/save)
        first = str(e).splitlines()[0].removeprefix("count: ")
        return f"cannot count the runs yet: {first}", False
    lens = prof.sweep.seq_lens
    length_part = _plural(len(lens), "length") if lens else "1 length (the task's default)"
    grid = f" x {_plural(len(profiles.grid_points(prof)), 'grid point')}" if prof.sweep.grid else ""
    return (f"will launch {_plural(n, 'run')} = "
            f"{_plural(len(prof.sweep.models), 'model')} x {length_part} x "
            f"{_plural(len(prof.sweep.seeds), 'seed')}{grid}"), True


def budget_steps_text(specs: list) -> tuple[str, bool, list[int] | None]:
    """('= N steps a run of B x L tokens (...)', ok, each run's steps) for the runs of a
    profile with a budget in tokens, FLOPs or tokens per parameter (RunSpec.budget, from
    workbench/spec/budget.py); per model when the models' steps differ (FLOPs and tokens per
    parameter depend on the model)."""
    budgets = [(s.label, s.budget) for s in specs if s.budget]
    if not budgets:
        return "", True, None
    if any(b.get("steps") is None for _, b in budgets):  # train.bytes: steps known once tokenised
        per_step = sorted({b["tokens_per_step"] for _, b in budgets})
        return (f"= steps from bytes of text, resolved at launch from the tokenizer's bytes per token "
                f"({_span(per_step, lambda v: f'{v:,}')} tokens a step)"), True, None
    steps = [b["steps"] for _, b in budgets]
    per_step = sorted({b["tokens_per_step"] for _, b in budgets})
    tokens = [b["tokens"] for _, b in budgets]
    flops = [b["flops"] for _, b in budgets if b.get("flops")]
    head = (f"= {_span(steps, lambda v: f'{v:,}')} step{'' if max(steps) == 1 else 's'} a run "
            f"({_span(per_step, lambda v: f'{v:,}')} tokens a step): {_span(tokens, count)} tokens"
            + (f", {_span(flops, _e)} FLOPs" if flops else ""))
    by_model: dict[str, list[int]] = {}
    for label, b in budgets:
        by_model.setdefault(label, []).append(b["steps"])
    if len(by_model) > 1 and min(steps) != max(steps):  # FLOPs and parameters differ by model
        head += "; steps: " + ", ".join(f"{label} {_span(st, lambda v: f'{v:,}')}"
                                        for label, st in by_model.items())
    return head, True, steps


def _span(values: list, fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}..{fmt(hi)}"


def _e(v: float) -> str:
    return f"{v:.3g}".replace("e+", "e")


def estimate_text(prof: Profile) -> tuple[str, str | None]:
    """('largest est. peak ...' for beside the run count, the refusal or None).

    The resource estimate (workbench/spec/estimate.py) of the validated profile: the
    largest run's estimated peak memory and the device's limit; the refusal names every
    run that cannot fit with its numbers, or says there is no GPU for train.device = cuda."""
    from workbench.spec import estimate

    try:
        ests = estimate.estimate_profile(prof, estimate.share_of(prof))
    except estimate.EstimateError as e:
        return "no estimate", f"cannot launch: {e}"
    known = [e for e in ests if e.peak is not None]
    if not known:
        return "peak memory not estimated", None
    top = max(known, key=lambda e: e.peak)
    limit = f" of {estimate.fmt_bytes(top.limit)}" if top.limit is not None else ""
    peak = (f"largest est. peak {estimate.fmt_bytes(top.peak)}{limit} on {top.device} "
            f"({top.model}, L={top.seq_len})")
    bad = estimate.too_big(ests)
    if not bad:
        return peak, None
    return peak, (f"cannot launch: {_plural(len(bad), 'run')} cannot fit: {bad[0].refusal()}"
                  + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                  + "; lower the batch size, lengths, d_model or n_layers")


def launch_extras(prof: Profile) -> str:
    """What a launch summary adds about each run beyond the count: the devices it trains on
    (train.devices) and the size its models are matched to ([sweep.match]); '' for neither."""
    parts = []
    if (prof.train.devices or 1) > 1:
        parts.append(f"each run on {prof.train.devices} devices ({(prof.train.sharding or 'ddp').upper()})")
    if prof.sweep.match is not None:
        target, value = prof.sweep.match.target()
        parts.append(f"models matched to {value:,} {'parameters' if target == 'params' else 'state floats'}")
    return "; ".join(parts)


def _shown_value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _bound(ctx: dict[str, Any]) -> str | None:
    for key, words in (("gt", "greater than"), ("ge", "at least"), ("lt", "less than"), ("le", "at most")):
        if key in ctx:
            v = ctx[key]
            return f"{words} {int(v) if isinstance(v, float) and v.is_integer() else v}"
    return None


def plain_message(err: dict[str, Any], label: str, example: str | None = None) -> str:
    """One pydantic error as a sentence that names the form's field, e.g. ``learning rate:
    'abc' is not a number`` for "Input should be a valid number, unable to parse string as
    a number". ``example``: a valid value to quote when values are missing."""
    kind, ctx = err["type"], err.get("ctx") or {}
    got = err.get("input")
    item = any(isinstance(p, int) for p in err["loc"])  # one value of a list field
    value = _shown_value(got) if isinstance(got, (str, int, float)) and not isinstance(got, bool) else None
    eg = f" (e.g. {example})" if example else ""
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        if label == "models":
            return f"models: pick at least {n} model (space in the list picks the one under the cursor)"
        return f"{label}: give at least {n} value{'' if n == 1 else 's'}{eg}"
    if kind == "too_long":
        return f"{label}: give at most {ctx.get('max_length')} values{eg}"
    if kind == "missing":
        idx = next((p for p in err["loc"] if isinstance(p, int)), None)
        if idx is not None:
            return f"{label}: value {idx + 1} is missing{eg}"
        return f"{label}: required"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"{label}: {value} is not a whole number" if value else f"{label}: give a whole number"
    if kind in ("float_parsing", "float_type"):
        return f"{label}: {value} is not a number" if value else f"{label}: give a number"
    if kind in ("bool_parsing", "bool_type"):
        return f"{label}: {value} is not true or false"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        rule = f"{label} must {'each ' if item else ''}be {_bound(ctx)}"
        return f"{rule}; {got} is not" if value else rule
    if kind == "string_too_short":
        return f"{label}: must not be empty"
    if kind == "literal_error":
        return f"{label}: must be one of {ctx.get('expected')}"
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    return f"{label}: {msg[:1].lower()}{msg[1:]}"


