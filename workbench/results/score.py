"""The MAD score of a profile's runs, computed as mad-lab computes it.

Source: athms/mad-lab, ``mad/configs.py::make_benchmark_mad_configs`` (every task setting,
the baseline and each one-at-a-time change, is trained at every lr x weight decay) and
``mad/analysis.py`` (``subset_model_results_to_best_sweep_runs``: per setting, the run of
the lr x weight-decay sweep with the highest ``test_acc``; ``compute_model_mad_scores``:
per task, the mean of those bests over its settings); ``benchmark.py`` prints the MAD
score as the mean over tasks. mad-lab trains one seed per configuration and evaluates the
final model.

Here, per model:

1. a *setting* is (task, task_setting, seq_len); schema 1 runs, which have no
   task_setting, are the setting "baseline";
2. per setting, :func:`workbench.results.aggregate.best_over` keeps the grid point of the
   ``over`` keys (default ``train.lr``, ``train.weight_decay``, those the runs have) with
   the best mean accuracy over seeds on the selection split, and the setting's value is
   that point's mean *test* accuracy over seeds (with one seed: mad-lab's number);
3. a task's score is the mean of its settings' values, the MAD score the mean of the task
   scores (each mean taken by :func:`workbench.results.aggregate.summarize`).

Selection: ``select_on="test"`` is mad-lab's rule (it picks the best ``test_acc``); the
default ``"validation"`` picks on eval set "valid" and reports test numbers. Every output
says which, and "selected on test" where so.

Like with like: within one grid point of one setting the runs may differ in the seed only.
That is checked on the fields the profile expands to and on the store's runs themselves
(a profile name may also hold another sweep's runs: another tokenizer, another task
parameter); either refuses naming the key (:func:`workbench.results.aggregate.refuse_pooling`).

Missing settings: a setting is *scored* only when every run it should have (each grid
point x seed) has finished; a model whose settings are not all scored is listed in
``missing``. The CLI then refuses to print a score unless ``--allow-partial``, where a task
shows "k/N" settings and the MAD score is marked partial (mean over what was scored).
The expected runs come from the profile file's expansion when one is given, else from the
runs of the profile in the store in any state.
"""
from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterable

from workbench.results import aggregate as agg

MAD_OVER = ("train.lr", "train.weight_decay")
METRIC = "accuracy"
SETTING = ["model", "task", "task_setting", "seq_len"]
FORMATS = ("md", "csv", "latex", "json")
SOURCE = "athms/mad-lab mad/analysis.py (best per setting over lr x wd, mean over settings, mean over tasks)"


class ScoreError(ValueError):
    """The score cannot be computed from these runs (one line, for the CLI). ``code``: 2 for
    bad input (a key, a selection), 1 for runs not there yet; then ``ran`` says how many of
    the profile's runs the store holds (0: nothing ran, the CLI says how to run it)."""

    def __init__(self, message: str, code: int = 2, ran: int | None = None):
        super().__init__(message)
        self.code = code
        self.ran = ran


def size_text(expected: list[dict]) -> str:
    """'48 run(s) (6 setting(s) x 2 model(s))': what the profile expands to, counted as
    ``profile check`` counts (a setting is a task setting at one length, for every model)."""
    settings = {setting_of(f)[1:] for f in expected}
    models = {f.get("model") for f in expected}
    return f"{len(expected)} run(s) ({len(settings)} setting(s) x {len(models)} model(s))"


def setting_of(fields: dict) -> tuple:
    """(model, task, task_setting, seq_len) of a run's fields; no task_setting: baseline."""
    return (fields.get("model"), fields.get("task"), fields.get("task_setting") or "baseline",
            fields.get("seq_len"))


def _ident(fields: dict) -> str:
    return json.dumps(fields, sort_keys=True, default=str)


def _setting_label(task_setting: str, seq_len: Any) -> str:
    return f"{task_setting}, seq_len={seq_len}" if seq_len is not None else task_setting


def compute(store, profile: str, expected: Iterable[dict] | None = None,
            over: list[str] | None = None, select_on: str = "validation") -> dict:
    """The MAD score of ``profile``'s finished runs in ``store``.

    ``expected``: the fields of every run the profile should have (its expansion), by
    default those of its runs in the store in any state. ``over``: the grid keys selected
    over (default: those of ``train.lr``, ``train.weight_decay`` the runs have).

    Returns {'models', 'tasks', 'scores': {model: {'tasks': {task: {'score', 'n', 'total',
    'settings': [...]}}, 'mad_score', 'complete'}}, 'missing': [...], 'over', 'select_on',
    'seeds'}. Raises ScoreError when nothing can be scored, a run field other than the
    setting, the seed and ``over`` varies within a setting, or the selection fails."""
    runs = store.runs(profile=profile)
    expected = [r.fields for r in runs] if expected is None else list(expected)
    if not expected:
        raise ScoreError(f"no runs of profile {profile!r} in {store.root}", 1, ran=0)
    if not runs:
        raise ScoreError(f"nothing of profile {profile!r} has run in {store.root}: none of its "
                         f"{size_text(expected)}", 1, ran=0)
    keys = {k for f in expected for k in f}
    if over is None:
        over = [k for k in MAD_OVER if k in keys]
    for k in over:
        if k not in keys:
            raise ScoreError(f"--best-over: no run of {profile!r} has field {k!r}")
    exp: dict[tuple, set] = {}
    of_setting: dict[tuple, list[dict]] = {}
    for f in expected:
        key = setting_of(f)
        exp.setdefault(key, set()).add(_ident(f))
        # one grid point of one setting: its runs may differ in the seed only (fields that
        # follow a selected key, such as d_model with model.d_model, vary between points)
        point = key + tuple(json.dumps(f.get(k), default=str) for k in over)
        of_setting.setdefault(point, []).append(f)
    for point, fs in of_setting.items():
        key = point[:len(SETTING)]
        for k in dict.fromkeys(k for f in fs for k in f):
            if k in SETTING or k == "seed" or k in over:
                continue
            vs = {json.dumps(f[k], default=str) if k in f else "(absent)" for f in fs}
            if len(vs) > 1:
                raise ScoreError(
                    f"runs of {key[0]} on {key[1]} ({_setting_label(key[2], key[3])}) differ in "
                    f"{k!r} ({', '.join(sorted(vs))}): a setting's runs may differ only in the seed "
                    f"and the --best-over keys ({', '.join(over) or 'none'})")
    done: dict[tuple, set] = {}
    for r in runs:
        if r.state == "finished":
            done.setdefault(setting_of(r.fields), set()).add(_ident(r.fields))
    complete = {k for k, ids in exp.items() if ids <= done.get(k, set())}
    missing = [{"model": k[0], "task": k[1], "task_setting": k[2], "seq_len": k[3],
                "finished": len(ids & done.get(k, set())), "runs": len(ids)}
               for k, ids in exp.items() if k not in complete]

    recs = agg.records(store, profile)
    for r in recs:
        r["task_setting"] = r.get("task_setting") or "baseline"
    recs = [r for r in recs if setting_of(r) in complete]
    # like with like on the runs themselves, not only on the expected fields: a profile file
    # names one sweep, but its name in the store may hold another's runs (two tokenizers,
    # another task's parameters) with the same setting; within one grid point they may
    # differ in the seed only (the best-over keys are chosen among, so they may differ)
    try:
        agg.refuse_pooling(recs, SETTING + list(over), f"no MAD score of {profile!r}")
    except agg.PoolingError as e:
        raise ScoreError(str(e)) from None
    choices: list[dict] = []
    if over and recs:
        try:
            recs, choices = agg.best_over(recs, over, METRIC, SETTING, select_on)
        except agg.SelectionError as e:
            raise ScoreError(str(e)) from None
    chosen = {tuple(c[k] for k in SETTING): c for c in choices}
    cells = agg.table(recs, METRIC, ["model"], SETTING[1:])["cells"] if recs else {}

    models = list(dict.fromkeys(k[0] for k in exp))
    tasks = list(dict.fromkeys(k[1] for k in exp))
    scores: dict[str, dict] = {}
    for m in models:
        per_task: dict[str, dict] = {}
        for t in tasks:
            settings = [k for k in exp if k[0] == m and k[1] == t]
            rows = []
            for k in settings:
                cell = cells.get(((m,), k[1:]))
                c = chosen.get(k)
                rows.append({"task_setting": k[2], "seq_len": k[3], "scored": k in complete,
                             METRIC: cell, "chosen": c["chosen"] if c else {},
                             "selection_mean": c["mean"] if c else None})
            s = agg.summarize(r[METRIC]["mean"] for r in rows if r["scored"] and r[METRIC])
            per_task[t] = {"score": s["mean"], "n": s["n"], "total": len(settings), "settings": rows}
        task_means = [per_task[t]["score"] for t in tasks if per_task[t]["total"]]
        overall = agg.summarize(task_means)
        complete_m = all(v["n"] == v["total"] for v in per_task.values())
        scores[m] = {"tasks": per_task, "mad_score": overall["mean"], "complete": complete_m}
    seeds = sorted({c["n"] for c in cells.values() if c and c["n"]})
    if not any(v["tasks"][t]["n"] for v in scores.values() for t in tasks):
        # counted in runs and as `profile check` counts settings (not per model, which
        # read as twice the settings the profile has)
        finished = sum(m["finished"] for m in missing)
        raise ScoreError(f"no setting of profile {profile!r} has all its runs finished yet: "
                         f"{finished} of its {size_text(expected)} finished", 1, ran=len(runs))
    return {"models": models, "tasks": tasks, "scores": scores, "missing": missing,
            "over": list(over), "select_on": select_on, "seeds": seeds}


# --------------------------------------------------------------------------- formats
def missing_count(res: dict) -> str:
    """'3 setting(s), for 2 model(s)': the unscored settings counted as ``profile check``
    counts settings (one per task setting and length), not once per model."""
    settings = {(m["task"], m["task_setting"], m["seq_len"]) for m in res["missing"]}
    models = {m["model"] for m in res["missing"]}
    return f"{len(settings)} setting(s), for {len(models)} model(s),"


def missing_text(res: dict, limit: int = 20) -> str:
    """One line per unscored setting: model, task, setting and runs finished of expected."""
    lines = [f"  {m['model']}: {m['task']} {_setting_label(m['task_setting'], m['seq_len'])}: "
             f"{m['finished']}/{m['runs']} runs finished" for m in res["missing"][:limit]]
    if len(res["missing"]) > limit:
        lines.append(f"  ... and {len(res['missing']) - limit} more")
    return "\n".join(lines)


def _selection(res: dict) -> str:
    if not res["over"]:
        return "no grid to select over: one configuration per setting"
    on = ("selected on test (eval set ''), mad-lab's rule" if res["select_on"] == "test" else
          "selected on validation (eval set 'valid'); mad-lab selects on test (--select-on test)")
    return f"best over {' x '.join(res['over'])} per setting by mean accuracy, {on}"


def caption(res: dict) -> str:
    seeds = "/".join(map(str, res["seeds"])) or "0"
    text = (f"MAD score ({SOURCE}): test accuracy of each setting's best grid point, mean over "
            f"{seeds} seed(s); task = mean over its settings, MAD score = mean over tasks; "
            f"{_selection(res)}")
    if res["missing"]:
        text += (f"; PARTIAL: {missing_count(res)} not finished, k/N = settings "
                 f"scored of the task's total")
    return text


def _cell(task: dict, digits: int) -> str:
    if task["score"] is None:
        return f"– (0/{task['total']})"
    text = f"{task['score']:.{digits}f}"
    return text if task["n"] == task["total"] else f"{text} ({task['n']}/{task['total']})"


def _score_cell(s: dict, digits: int) -> str:
    if s["mad_score"] is None:
        return "–"
    text = f"{s['mad_score']:.{digits}f}"
    return text if s["complete"] else f"{text} (partial)"


def _grid(res: dict, digits: int) -> tuple[list[str], list[list[str]]]:
    label = "MAD score (selected on test)" if res["select_on"] == "test" and res["over"] else "MAD score"
    header = ["model"] + res["tasks"] + [label]
    body = [[m] + [_cell(res["scores"][m]["tasks"][t], digits) for t in res["tasks"]]
            + [_score_cell(res["scores"][m], digits)] for m in res["models"]]
    return header, body


def _tex(s: str) -> str:
    for ch in "_%&#$":
        s = s.replace(ch, "\\" + ch)
    return s


def to_json(res: dict) -> dict:
    """The whole result: rule, selection, per model the task scores with their settings."""
    return {"rule": SOURCE, "metric": METRIC, "select_on": res["select_on"], "best_over": res["over"],
            "seeds": res["seeds"], "tasks": res["tasks"],
            "models": [{"model": m, "mad_score": res["scores"][m]["mad_score"],
                        "complete": res["scores"][m]["complete"], "tasks": res["scores"][m]["tasks"]}
                       for m in res["models"]],
            "missing": res["missing"]}


def render(res: dict, fmt: str = "md", digits: int = 3) -> str:
    """The per-task table (rows model, columns tasks + MAD score) in md, csv, latex or json."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected md, csv, latex or json")
    if fmt == "json":
        return json.dumps(to_json(res), indent=2, default=str) + "\n"
    header, body = _grid(res, digits)
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + f"\n\n{caption(res)}\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(header + ["settings scored", "settings total"])
        for m in res["models"]:
            s = res["scores"][m]
            w.writerow([m] + ["" if s["tasks"][t]["score"] is None else f"{s['tasks'][t]['score']:.6g}"
                              for t in res["tasks"]]
                       + ["" if s["mad_score"] is None else f"{s['mad_score']:.6g}",
                          sum(v["n"] for v in s["tasks"].values()),
                          sum(v["total"] for v in s["tasks"].values())])
        return buf.getvalue()
    lines = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(header) - 1) + "}",
             "\\toprule", " & ".join(_tex(h) for h in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(_tex(c) for c in row) + " \\\\" for row in body]
    lines += ["\\bottomrule", "\\end{tabular}", "\\caption{" + _tex(caption(res)) + "}", "\\end{table}"]
    return "\n".join(lines) + "\n"
