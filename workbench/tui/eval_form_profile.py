"""The evaluation form's profile <-> data (workbench/tui/eval_form.py keeps the widget):
an :class:`~workbench.spec.eval_profile.EvalProfile` written as the TOML the loader reads
back equal (:func:`profile_data`, :func:`save_profile`), the models field parsed and
written (:func:`parse_models`, :func:`format_models`), eval_profile.check's problems by
field (:func:`problem_lines`), whether a path can be lm-eval's output folder
(:func:`output_problem`), and the launch (:func:`queue_evals`, as ``eval --from FILE``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

from workbench.spec import eval_profile
from workbench.spec.eval_profile import EvalProfile
from workbench.spec.profile import ProfileError
from workbench.tui.form_fields import split_list


# ------------------------------------------------------------------ profile <-> data
def profile_data(p: EvalProfile) -> dict[str, Any]:
    """The profile as TOML data that :func:`workbench.spec.profile.loads` reads back equal:
    its fields without unset options, settings at their defaults (``bootstrap_iters =
    100000``, ``dtype = "float32"``, ...), empty tables or default Slurm settings; a whole
    number of documents as an integer (``limit = 10``, not the model's ``10.0``: only a
    fraction < 1 is a float)."""
    from workbench.spec.eval_profile import EvalSection
    from workbench.spec.slurm_settings import SlurmSettings

    d = p.model_dump(mode="json", exclude_none=True)
    for key, f in EvalSection.model_fields.items():
        if not f.is_required() and key in d["eval"] and d["eval"][key] == f.get_default(call_default_factory=True):
            d["eval"].pop(key)
    limit = d["eval"].get("limit")
    if isinstance(limit, float) and limit >= 1 and limit.is_integer():
        d["eval"]["limit"] = int(limit)
    if d.get("executor") == "local":  # the default
        d.pop("executor")
    for key in ("published", "needs"):
        if not d.get(key):
            d.pop(key, None)
    if not d.get("description"):
        d.pop("description", None)
    if not d["eval"].get("allow_unfinished"):  # the default: files written before it was a key stay as they were
        d["eval"].pop("allow_unfinished", None)
    if d.get("slurm") == SlurmSettings().model_dump(mode="json", exclude_none=True):
        d.pop("slurm")
    return d


def save_profile(p: EvalProfile, path: str | Path) -> Path:
    """Write ``p`` to ``path`` as TOML (atomically: a crash never leaves half a profile)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tomli_w.dumps(profile_data(p)), encoding="utf-8")
    tmp.replace(path)
    return path


def parse_models(text: str) -> list[dict[str, str]]:
    """'Mamba=state-spaces/mamba-130m-hf, run:12' -> [{label, model}, ...]; a model given
    without ``label=`` is labelled as written."""
    out = []
    for item in split_list(text):
        label, sep, model = item.partition("=")
        if not sep:
            label = model = item
        out.append({"label": label.strip(), "model": model.strip()})
    return out


def format_models(models) -> str:
    return ", ".join(m.model if m.label == m.model else f"{m.label}={m.model}" for m in models)


def queue_evals(store, prof: EvalProfile) -> tuple[list[int], list[str]]:
    """Queue (or find) the runs of ``prof`` and start them, as ``eval --from FILE --detach``
    does (workbench/execute/eval_queue.py, which the CLI calls too; no console output).
    Returns the run ids and a line per run."""
    from workbench.execute import eval_queue

    return eval_queue.queue(store, eval_profile.eval_specs(prof), prof.executor, prof.slurm)


def problem_lines(e: ProfileError) -> list[tuple[str | None, str]]:
    """eval_profile.check's problems ('  eval.models[0].model: ...') as (field id, message)."""
    out: list[tuple[str | None, str]] = []
    for line in str(e).splitlines()[1:]:
        line = line.strip()
        loc, _, msg = line.partition(": ")
        fid = "ev-models" if loc.startswith("eval.models") else "ev-include" if loc.startswith("eval.include") \
            else "ev-tasks" if loc.startswith("eval.tasks") else None
        out.append((fid, msg if fid else line))
    return out


def output_problem(text: str) -> str:
    """The form's line for an output folder that cannot be one ("" when it can)."""
    why = eval_profile.output_folder_problem(text)
    return f"output folder: {why}" if why else ""
