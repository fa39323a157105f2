"""Run profiles: schema-versioned TOML sweeps, strictly validated.

A profile names a task (schema 2: several, ``[[tasks]]``, each with optional one-at-a-time
``variants``), a list of models, sequence lengths and seeds, the training settings and
(schema 2) a ``[sweep.grid]`` of dotted keys over any of them; :func:`expand` turns it
into one :class:`RunSpec` per (task setting, model, seq_len, grid point, seed).
Schema 1 profiles (one ``[task]``, no grid) load as before and expand to the same specs.
Unknown keys anywhere are errors that name the key, its line and the file (zoology
silently drops them; we don't). Validation matches what runs: every number is finite and
in a range that trains (a value that is certainly a mistake is refused, not run), integers
are integers (``epochs = true`` is refused, not read as 1), booleans are booleans, seeds fit
the store's 64-bit integers and are distinct, and the budget trains at least one step.
Errors name the key and its line in the file (:func:`_key_lines`), or the ``--set`` that
gave the value. Saving from the TUI writes the same format via :func:`dumps`.
"""

# The profile API in one place: this module loads and saves; the schema, the checks and
# the expansion into runs are their own modules, re-exported here so that callers write
# `from workbench.spec import profile as P; P.load(...); P.expand(...)`.
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

__all__ = ["SCHEMA_VERSION", "SCHEMA_VERSIONS", "DataAbsent", "EvalProfile", "ModelChoice", "ModelSection", "Need", "Profile",
           "ProfileError",
           "PublishedValue", "RunSpec", "SweepSection", "TaskSection", "TaskSetting", "TrainSection",
           "apply_overrides", "dumps", "expand", "grid_points", "load", "loads", "save", "summary",
           "task_settings", "to_dict"]

from workbench.spec.check import DataAbsent, _check_grid, _check_registries, _problems_text, absent_needs  # noqa: F401
from workbench.spec.expand import TaskSetting, _set_path, expand, grid_points, summary, task_settings  # noqa: F401
from workbench.spec.run_spec import RunSpec  # noqa: F401
from workbench.spec.schema import (BUDGET_KEYS, FROM_FILE, SCHEMA_VERSION, SCHEMA_VERSIONS, ModelChoice,  # noqa: F401
                                   ModelSection, Need, Profile, ProfileError, PublishedValue, SweepSection,
                                   TaskSection, TrainSection)
from workbench.spec.eval_profile import EvalProfile, is_eval_data  # noqa: F401
from workbench.spec.eval_profile import validate as validate_eval
from workbench.spec.where import _validation_message, _Where

def loads(text: str, path: str = "<string>", check_registries: bool = True,
          overrides: list[str] | None = None, check_data: bool = False) -> Profile | EvalProfile:
    """Validate profile ``text``; ``overrides`` and ``check_data`` as for :func:`load`
    (applied to the parsed data, so line numbers in messages stay those of ``text``). A text
    with an ``[eval]`` table is an evaluation profile (:class:`EvalProfile`), any other a
    training one."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: malformed TOML: {e}") from None
    origins = apply_overrides(data, overrides or [], path)
    if "name" not in data and path not in ("<string>",):
        data["name"] = Path(path).stem
        origins[("name",)] = "from the file name"
    where = _Where(text, origins)
    if is_eval_data(data):  # an [eval] table: lm-eval tasks on models (workbench.spec.eval_profile)
        return validate_eval(data, path, where, check_registries)
    try:
        prof = Profile.model_validate(data, context=FROM_FILE)  # typed values: "12" is no number
    except ValidationError as e:
        raise ProfileError(_validation_message(e, path, where)) from None
    problems = _check_grid(prof, where)
    if problems:
        raise ProfileError(_problems_text(path, problems))
    if check_registries:
        _check_registries(prof, path, where, data=check_data)
    return prof


def _decode(raw: bytes, path: str) -> str:
    """The text of a profile file, or a one-line ProfileError: profiles are UTF-8 TOML."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ProfileError(f"{path}: not UTF-8 text (it starts with a UTF-16 byte-order mark); "
                           f"save the profile as UTF-8")
    if b"\x00" in raw:
        raise ProfileError(f"{path}: not a TOML profile: it contains NUL bytes (a binary file, or "
                           f"UTF-16 text); profiles are UTF-8 text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ProfileError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); "
                           f"save the profile as UTF-8") from None
    return text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is still UTF-8


def load(path: str | Path, check_registries: bool = True,
         overrides: list[str] | None = None, check_data: bool = False) -> Profile:
    """Read and validate a profile; ``overrides`` are ``dotted.key=TOML value`` settings
    (``run --set``) applied before validation, e.g. ``task.data_path="/data/aclImdb"``.
    ``check_data``: also whether each task's data can train it here (the ``lm`` corpus:
    not empty, not binary, every split at least a context: workbench/spec/check.py's
    ``preflight``), as ``profile check`` and ``run`` ask before anything is queued; a
    profile opened to be edited is valid without it. Every failure, unreadable or
    non-UTF-8 files included, is a :class:`ProfileError`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
    return loads(_decode(raw, str(path)), str(path), check_registries, overrides, check_data)


def apply_overrides(data: dict[str, Any], overrides: list[str], path: str = "<string>") -> dict[tuple, str]:
    """Set each ``a.b.c=value`` in the parsed profile ``data`` (value parsed as TOML; a bare
    word that is not valid TOML is taken as a string, so paths need no quotes). Returns
    ``{key path: "from --set a.b.c=value"}`` so messages can name the --set, not a line."""
    origins: dict[tuple, str] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = [k.strip() for k in key.split(".")]
        if not sep or not all(parts):
            raise ProfileError(f"--set {item!r}: expected dotted.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        try:
            _set_path(data, parts, value)
        except ValueError as e:
            raise ProfileError(f"--set {item!r}: {e} in {path}") from None
        if len(parts) == 2 and parts[0] == "train" and parts[1] in BUDGET_KEYS:
            # a budget given on the command line replaces the file's (train.steps ->
            # train.tokens), since a profile has exactly one
            for k in BUDGET_KEYS:
                if k != parts[1]:
                    data["train"].pop(k, None)
        origins[tuple(parts)] = f"from --set {item}"
    return origins


def _task_dict(t: TaskSection) -> dict[str, Any]:
    return {"name": t.name, **t.params(), **({"variants": t.variants} if t.variants else {})}


def to_dict(p: Profile) -> dict[str, Any]:
    """The profile as TOML data (what :func:`dumps` writes): sections it does not use
    (a schema 1 profile's grid and [[tasks]]) are left out, so it loads back the same."""
    d = p.model_dump(mode="json", exclude_none=True)
    if uses_presets(p):
        # a size or recipe fills the keys the profile does not write: write only the keys
        # written, or the defaults would come back as written keys and win over the presets
        for sec in ("train", "model"):
            d[sec] = getattr(p, sec).model_dump(mode="json", exclude_none=True, exclude_unset=True)
    if p.sweep.match is not None and "d_model" not in p.model.model_fields_set:
        d["model"].pop("d_model", None)  # [sweep.match] solves the width: written, the match would refuse it
    d.pop("task", None)
    d.pop("tasks", None)
    if p.task is not None:
        d["task"] = _task_dict(p.task)
    if p.tasks:
        d["tasks"] = [_task_dict(t) for t in p.tasks]
    d["sweep"]["models"] = [
        m if isinstance(m, str) else {k: v for k, v in {**m.model_dump(exclude_none=True), **m.options()}.items()}
        for m in p.sweep.models
    ]
    if not d["sweep"]["seq_lens"]:
        del d["sweep"]["seq_lens"]
    if not d["sweep"].get("grid"):
        d["sweep"].pop("grid", None)
    for key in ("published", "needs"):
        if not d.get(key):
            d.pop(key, None)
    return d


def uses_presets(p: Profile) -> bool:
    """Whether a size or a recipe (workbench.spec.recipes) applies anywhere in ``p``."""
    return bool(p.recipe or p.model.size or "model.size" in p.sweep.grid
                or any(c.recipe or c.size for c in p.sweep.model_choices()))


def dumps(p: Profile) -> str:
    return tomli_w.dumps(to_dict(p))


def save(p: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(p), encoding="utf-8")
    tmp.replace(path)  # atomic: a crash never leaves half a profile
    return path

