"""Reproduction reports: published numbers beside ours, generated from the store.

``ssm-workbench report PROFILE.toml ...`` writes, per profile, Markdown tables of

1. **published vs ours**: each ``[[published]]`` entry of the profile (the paper's number,
   where it comes from) beside our value at the same point (the eval metric at the same
   epoch or step of the training history, else the final result on the named eval set):
   mean ± std over the seeds that finished, the per-seed values, and the parameter count;
2. **learning curve**: eval accuracy after each evaluation, mean ± std over seeds, for
   profiles trained in epochs (as the published tables count them);
3. **eval sets**: with several eval sets (induction heads' test lengths and distances),
   the final accuracy per eval set, one row per run (per seed), plus the mean row.

Each row averages one (model, seq_len)'s runs over seeds; when the profile's name in the
store also holds another sweep's runs (another task, ``task.tokenizer``, ...), the report
is refused naming the key that differs, rather than averaging different things.

Everything is read from the store; nothing is typed. ``--into FILE`` replaces the part of
FILE between ``<!-- report:begin -->`` and ``<!-- report:end -->`` (appending the markers
if absent), so the hand-written parts of a file such as docs/results/reproductions.md stay
as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.spec import profile as prof
from workbench.spec.eval_profile import PUBLISHED_METRICS, EvalProfile
from workbench.results.export import fmt_cell, write_atomic
from workbench.results.aggregate import SPLIT_EVAL_SET, PoolingError, refuse_pooling, summarize
from workbench.store import Store

BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
VALID = SPLIT_EVAL_SET["validation"]  # the validation set's eval set name


def _runs_by_label(store: Store, p: prof.Profile) -> dict[tuple[str, Any], list]:
    """(label, seq_len) -> finished runs of this profile, by seed."""
    out: dict[tuple[str, Any], list] = {}
    for r in store.runs(profile=p.name, states=["finished"]):
        out.setdefault((r.label, r.seq_len), []).append(r)
    for runs in out.values():
        runs.sort(key=lambda r: r.seed)
    return out


def _like_with_like(p: prof.Profile, runs: dict[tuple[str, Any], list]) -> None:
    """Every row of a training profile's report averages one (label, seq_len)'s runs as
    seeds, so they may differ in the seed only. When the profile's name in the store also
    holds another sweep's runs (another task, another ``task.tokenizer``), the report is
    refused with a ProfileError naming the key
    (:func:`workbench.results.aggregate.refuse_pooling`) rather than averaging them."""
    fields = [{**r.fields, "model": label, "seq_len": L} for (label, L), rs in runs.items() for r in rs]
    try:
        refuse_pooling(fields, ["model", "seq_len"], f"report of {p.name!r}")
    except PoolingError as e:
        raise prof.ProfileError(str(e)) from None


def _history_value(store: Store, run_id: int, metric: str, epoch: float | None,
                   step: int | None) -> float | None:
    for row in store.metrics(run_id, split="eval", name=metric):
        if epoch is not None and row["epoch"] is not None and abs(row["epoch"] - epoch) < 1e-9:
            return row["value"]
        if step is not None and row["step"] == step:
            return row["value"]
    return None


def _value(store: Store, results: dict, run, pub: prof.PublishedValue) -> float | None:
    if pub.epoch is not None or pub.step is not None:
        return _history_value(store, run.id, pub.metric, pub.epoch, pub.step)
    return results.get(run.id, {}).get(pub.eval_set, {}).get(pub.metric)


def _params(run) -> str:
    n = (run.info or {}).get("params_total")
    return f"{n:,}" if isinstance(n, (int, float)) else "–"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _point(pub: prof.PublishedValue) -> str:
    where = (f"epoch {pub.epoch:g}" if pub.epoch is not None else
             f"step {pub.step}" if pub.step is not None else "final")
    return f"{pub.metric}{' ' + pub.eval_set if pub.eval_set else ''}, {where}"


def published_table(store: Store, p: prof.Profile, runs, results, digits: int) -> list[str]:
    rows = []
    for pub in p.published:
        matched = [r for (label, L), rs in runs.items() for r in rs
                   if label == pub.model and (pub.seq_len is None or L == pub.seq_len)]
        vals = [_value(store, results, r, pub) for r in matched]
        per_seed = ", ".join(f"{r.seed}: " + ("–" if v is None else f"{v:.{digits}f}")
                             for r, v in zip(matched, vals))
        rows.append([pub.model, _point(pub), f"{pub.value:.{digits}f}",
                     fmt_cell(summarize(vals), digits) + f" (n={summarize(vals)['n']})",
                     per_seed or "no finished run", _params(matched[0]) if matched else "–",
                     pub.source or "–"])
    return _table(["model", "metric, point", "published", "ours: mean ± std", "ours per seed",
                   "params", "source"], rows)


def curve_table(store: Store, runs, digits: int, metric: str = "accuracy") -> list[str]:
    """Eval ``metric`` after each evaluation (by epoch), mean ± std over seeds."""
    series: dict[str, dict[float, list[float]]] = {}
    for (label, L), rs in runs.items():
        key = label if L is None else f"{label} (L={L})"
        for r in rs:
            for row in store.metrics(r.id, split="eval", name=metric):
                if row["epoch"] is not None:
                    series.setdefault(key, {}).setdefault(round(row["epoch"], 6), []).append(row["value"])
    epochs = sorted({e for s in series.values() for e in s})
    if not epochs or len(epochs) > 25:
        return []
    rows = [[key] + [fmt_cell(summarize(s.get(e, [])), digits) for e in epochs]
            for key, s in series.items()]
    return _table(["model"] + [f"ep {e:g}" for e in epochs], rows)


def eval_set_table(runs, results, digits: int, metric: str = "accuracy") -> list[str]:
    """Final ``metric`` per eval set: one row per run, then the mean over seeds per model.
    The validation set (eval set "valid", for selection) is not one of them."""
    sets = sorted({es for rs in runs.values() for r in rs for es in results.get(r.id, {})
                   if es and es != VALID},
                  key=_eval_set_key)
    if len(sets) < 2:
        return []
    rows = []
    for (label, L), rs in runs.items():
        per_set: dict[str, list] = {es: [] for es in sets}
        for r in rs:
            vals = [results.get(r.id, {}).get(es, {}).get(metric) for es in sets]
            for es, v in zip(sets, vals):
                per_set[es].append(v)
            rows.append([label, str(r.seed)] + ["–" if v is None else f"{v:.{digits}f}" for v in vals])
        if len(rs) > 1:
            rows.append([f"**{label}**", "mean ± std"] + [fmt_cell(summarize(per_set[es]), digits)
                                                       for es in sets])
    sizes = [next((results[r.id][es].get("eval_sequences") for rs in runs.values() for r in rs
                   if results.get(r.id, {}).get(es, {}).get("eval_sequences") is not None), None)
             for es in sets]
    if any(n is not None for n in sizes):
        rows.append(["sequences per set", ""] + ["–" if n is None else f"{n:.0f}" for n in sizes])
    return _table(["model", "seed"] + sets, rows)


def _eval_set_key(name: str) -> tuple:
    kind, _, num = name.partition("=")
    try:
        return (kind, int(num))
    except ValueError:
        return (kind, 0)


def eval_table(runs, results, tasks: list[str], digits: int) -> list[str]:
    """An evaluation profile's numbers: one row per model, one column per lm-eval task and
    metric it stored (acc, acc_norm, perplexity), ± lm-eval's standard error."""
    cols = [(t, m) for t in tasks for m in PUBLISHED_METRICS
            if any(results.get(r.id, {}).get(t, {}).get(m) is not None for rs in runs.values() for r in rs)]
    rows = []
    for (label, _), rs in runs.items():
        r = rs[-1]  # one finished run per model (the latest, if evaluated again)
        cells = []
        for t, m in cols:
            vals = results.get(r.id, {}).get(t, {})
            v, se = vals.get(m), vals.get(m + "_stderr")
            cells.append("–" if v is None else f"{v:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else ""))
        rows.append([label] + cells)
    return _table(["model"] + [f"{t} {m}" for t, m in cols], rows) if cols else []


def eval_section(store: Store, path: str | Path, p, digits: int = 3) -> str:
    """The report of an evaluation profile: published vs measured per model, task and
    metric, then every number measured."""
    runs = _runs_by_label(store, p)
    labels = [m.label for m in p.eval.models]
    runs = {k: v for k, v in sorted(runs.items(), key=lambda kv: labels.index(kv[0][0]) if kv[0][0] in labels
                                    else len(labels)) if k[0] in labels}
    results = store.results([r.id for rs in runs.values() for r in rs])
    lines = [f"### {p.name}", "", p.description, "",
             f"Command: `ssm-workbench run {path}` · {len(runs)} of {len(labels)} model(s) evaluated "
             f"(finished) on {', '.join(p.eval.tasks)}"
             f"{f'; limit {p.eval.limit:g} documents per task (not the full sets)' if p.eval.limit else ''}.", ""]
    if p.published:
        rows = []
        for pub in p.published:
            rs = runs.get((pub.model, None), [])
            vals = results.get(rs[-1].id, {}).get(pub.eval_set, {}) if rs else {}
            v, se = vals.get(pub.metric), vals.get(pub.metric + "_stderr")
            ours = ("no finished run" if not rs else "–" if v is None else
                    f"{v:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else ""))
            diff = "–" if v is None else f"{v - pub.value:+.{digits}f}"
            rows.append([pub.model, pub.eval_set, pub.metric, f"{pub.value:.{digits}f}", ours, diff,
                         pub.source or "–"])
        lines += ["Published vs ours:", ""] + _table(["model", "task", "metric", "published", "ours ± stderr",
                                                      "ours − published", "source"], rows) + [""]
    table = eval_table(runs, results, list(p.eval.tasks), digits)
    if table:
        lines += ["Measured (lm-eval, ± standard error):", ""] + table + [""]
    if not runs:
        lines += ["No finished runs in this store yet.", ""]
    return "\n".join(lines)


def profile_section(store: Store, path: str | Path, digits: int = 3) -> str:
    p = prof.load(path, check_registries=False)
    if isinstance(p, EvalProfile):
        return eval_section(store, path, p, digits)
    runs = _runs_by_label(store, p)
    _like_with_like(p, runs)
    all_runs = store.runs(profile=p.name)
    results = store.results([r.id for rs in runs.values() for r in rs])
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    lines = [f"### {p.name}", "", p.description, "",
             f"Command: `ssm-workbench run {path}` · {sum(map(len, runs.values()))} finished of "
             f"{len(prof.expand(p))} runs in the profile ({len(all_runs)} in the store), "
             f"seeds {', '.join(map(str, seeds)) or '–'}.", ""]
    if p.published:
        lines += ["Published vs ours:", ""] + published_table(store, p, runs, results, digits) + [""]
    curve = curve_table(store, runs, digits)
    if curve:
        lines += ["Eval accuracy after each epoch (mean ± std over seeds):", ""] + curve + [""]
    sets = eval_set_table(runs, results, digits)
    if sets:
        lines += ["Final accuracy per eval set:", ""] + sets + [""]
    if not runs:
        lines += ["No finished runs in this store yet.", ""]
    return "\n".join(lines)


def render(store: Store, paths: list[str], digits: int = 3) -> str:
    body = "\n".join(profile_section(store, path, digits) for path in paths)
    return (f"{BEGIN}\n<!-- generated by `ssm-workbench --store {store.root} report "
            f"{' '.join(paths)}`; edits here are overwritten -->\n\n{body}{END}\n")


def write_into(path: str | Path, block: str) -> None:
    """Replace the report block of ``path`` (or append one); atomic."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + block + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    write_atomic(path, text)  # whole or not at all (CannotWrite): a full disk keeps the old file
