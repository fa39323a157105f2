"""The sweep form's size preset and recipe (workbench/spec/recipes.py), and the keys they fill.

A size (``model.size``) sets d_model, n_layers and the learning rate; a recipe (the
profile's ``recipe``) sets training keys (betas, weight decay, clip, schedule, ...); each
only where the profile does not write the key itself. A form that wrote every field would
override them all, so:

- picking a size or recipe empties the fields it fills that still hold the form's own
  starting values (a value the user typed stays, and wins, as in a hand-written profile);
  their placeholders say where the value comes from;
- loading a profile that uses presets shows the keys it does not write as such empty
  fields, and remembers what every other control showed for a key the profile does not
  write: saving leaves out those still unchanged (:meth:`FormPresets.drop_unwritten`), so
  load -> save writes the keys the file wrote, and the runs resolve the same.

The early-stopping metric follows the task as the form's own choice (:func:`task_es_metric`:
eval loss for a language model, eval accuracy otherwise) until the user picks one; a
language model's eval loss is left out of the saved profile while early stopping is off
(it changes nothing then, and the runs keep the identity they had before this default:
:func:`workbench.spec.expand.task_early_stopping` gives lm runs eval loss once it is on).

A mixin of :class:`~workbench.tui.sweep_form.SweepForm` (with FormProfile).
"""
from __future__ import annotations

from typing import Any

from textual.widgets import Input, Select

from workbench.spec import profile as profiles
from workbench.spec.recipes import RECIPE_NAMES, RECIPES, SIZES
from workbench.spec.schema import TrainSection
from workbench.tui.form_fields import TRAIN_INPUTS
from workbench.tui.form_fields import put

NONE = "none"  # the Selects' "no preset" value
RECIPE_OPTIONS = [(NONE, NONE)] + [(n, n) for n in RECIPE_NAMES]
SIZE_OPTIONS = [(NONE, NONE)] + [(f"{n} ({s.n_layers} x {s.d_model})", n) for n, s in SIZES.items()]
# the form's inputs a size fills (section, key) and those any recipe may fill
SIZE_FIELDS = {"d_model": "model", "n_layers": "model", "lr": "train"}
# controls other than TRAIN_INPUTS and their profile key paths
CONTROL_KEYS: dict[str, tuple[str, ...]] = {
    "schedule": ("train", "schedule"), "amp": ("train", "amp"), "device": ("train", "device"),
    "es_metric": ("train", "early_stopping", "metric"), "patience": ("train", "early_stopping", "patience"),
    **{fid: (section, fid) for fid, _, section, _ in TRAIN_INPUTS},
}
DEFAULTS = {fid: default for fid, _, _, default in TRAIN_INPUTS}


def task_es_metric(tasks: list[str] | str) -> str:
    """The early-stopping metric the form starts a sweep of ``tasks`` with: eval loss when
    every task is a language model (``lm``), else eval accuracy."""
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    return "loss" if names and all(t == "lm" for t in names) else "accuracy"


def _off(es: dict[str, Any]) -> bool:
    """Early stopping off in the form's data: no patience (or 0) and no target."""
    return str(es.get("patience", "0")).strip() in ("", "0") and es.get("target") is None


def preset_fields(recipe: str | None, size: str | None) -> set[str]:
    """The form's inputs that ``recipe`` and ``size`` fill (when the profile leaves them out)."""
    out: set[str] = set()
    if recipe:
        out |= {k for k in RECIPES[recipe].train if k in DEFAULTS}
    if size:
        out |= set(SIZE_FIELDS)
    return out & set(DEFAULTS)


def placeholder(fid: str, recipe: str | None, size: str | None) -> str:
    """Where an empty preset field's value comes from, short enough for its input (28
    columns): '128 (size tiny-1m)', '0.9, 0.95 (recipe)', '0.003 (size x recipe 5)'."""
    if size and fid in SIZE_FIELDS:
        s = SIZES[size]
        if fid == "lr":
            scale = RECIPES[recipe].lr_scale if recipe else 1.0
            return f"{s.lr * scale:.6g} (size" + (f" x recipe {scale:g})" if scale != 1 else f" {size})")
        return f"{getattr(s, fid)} (size {size}" + (", 2x: 1 mixer)" if fid == "n_layers" else ")")
    if recipe and fid in RECIPES[recipe].train:
        v = RECIPES[recipe].train[fid]
        shown = ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        return f"{shown} (recipe)"
    return ""


def _get(d: dict, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


class FormPresets:
    """The recipe and size Selects and what they fill (see the module docstring)."""

    def _preset_init(self) -> None:
        # control id -> the value it showed for a key the loaded profile does not write
        self._unwritten: dict[str, Any] = {}
        self._es_task: str = ""  # the task the early-stopping metric last followed
        self._es_written = False  # the loaded profile wrote train.early_stopping.metric

    def _control_value(self, fid: str) -> Any:
        w = self.query_one(f"#{fid}")
        return w.value.strip() if isinstance(w, Input) else w.value

    def presets(self) -> tuple[str | None, str | None]:
        """(recipe, size) as chosen in the form (None: none)."""
        recipe, size = (self.query_one(f"#{f}", Select).value for f in ("recipe", "size"))
        return (None if recipe == NONE else str(recipe),
                None if size == NONE else str(size))

    def fill_presets(self, prof: profiles.Profile, d: dict[str, Any]) -> None:
        """After the form showed ``prof``: its recipe and size in their Selects; with
        presets, the preset keys it does not write emptied, and what every control showed
        for a key it does not write remembered (``d``: :func:`profiles.to_dict`)."""
        self._unwritten = {}
        names = [t.name for _, t in prof.task_entries()]
        self._es_written = "metric" in prof.train.early_stopping.model_fields_set
        self._es_task = names[0] if len(set(names)) == 1 else ""
        if not self._es_written:  # what the runs resolve to (an lm sweep: eval loss)
            self.query_one("#es_metric", Select).value = task_es_metric(names)
        with self.query_one("#recipe", Select).prevent(Select.Changed), \
                self.query_one("#size", Select).prevent(Select.Changed):
            self.query_one("#recipe", Select).value = prof.recipe or NONE
            self.query_one("#size", Select).value = prof.model.size or NONE
        if not profiles.uses_presets(prof):
            self._show_placeholders()
            return
        # the presets of the profile and of its sweep entries (each entry resolves its own)
        recipes = {prof.recipe} | {c.recipe for c in prof.sweep.model_choices()}
        sizes = {prof.model.size} | {c.size for c in prof.sweep.model_choices()} | \
            set(prof.sweep.grid.get("model.size", []))
        filled = set().union(*(preset_fields(r, s) for r in recipes for s in sizes))
        for fid, path in CONTROL_KEYS.items():
            if _get(d, path) is not None:
                continue  # written: shown as it is, saved as it is
            if fid in filled:
                self.query_one(f"#{fid}", Input).value = ""
            self._unwritten[fid] = self._control_value(fid)
        self._show_placeholders()

    def presets_data(self, data: dict[str, Any]) -> None:
        """The form's recipe and size into its profile data, and out of it the keys they
        fill that were only copied from a loaded profile without presets (its defaults,
        e.g. min_lr_ratio 0.0, would win over the recipe's) and the keys a loaded profile
        with presets did not write (:meth:`drop_unwritten`)."""
        recipe, size = self.presets()
        data.pop("recipe", None)
        data["model"].pop("size", None)
        if recipe:
            data["recipe"] = recipe
        if size:
            data["model"]["size"] = size
        if recipe and not self._unwritten:
            train = data["train"]
            for k in RECIPES[recipe].train:
                field = TrainSection.model_fields.get(k)
                default = field.default if field is not None else None
                default = list(default) if isinstance(default, tuple) else default
                if k in train and k not in DEFAULTS and train[k] == default:
                    del train[k]
        self.drop_unwritten(data)

    def drop_unwritten(self, data: dict[str, Any]) -> None:
        """Leave out of the form's profile data the keys a loaded profile did not write
        whose control still shows what it showed then."""
        for fid, shown in self._unwritten.items():
            if self._control_value(fid) != shown:
                continue
            *parents, key = CONTROL_KEYS[fid]
            d = data
            for p in parents:
                d = d.get(p, {})
            d.pop(key, None)
        es = data.get("train", {}).get("early_stopping")
        task = (data.get("task") or {}).get("name")
        if es and not self._es_written and es.get("metric") == "loss" == task_es_metric(task or "") and _off(es):
            del es["metric"]  # lm's default, off: the spec as before (see the module docstring)
        if es == {}:
            del data["train"]["early_stopping"]

    def es_metric_follows(self, task: str) -> None:
        """The task changed: the early-stopping metric becomes the new task's default where
        it still shows the previous task's (a metric the user picked stays)."""
        sel = self.query_one("#es_metric", Select)
        if sel.value == task_es_metric(getattr(self, "_es_task", "")):
            sel.value = task_es_metric(task)
        self._es_task = task

    def preset_changed(self, since: float) -> None:
        """A recipe or size picked (or a match target set, FormMatch): the fields it fills that hold the form's own starting
        values are emptied (it fills them); fields no preset fills any more get those
        values back where they are empty. Only fields not edited since ``since`` (when
        the preset changed: form_fields.put), so keys typed meanwhile are kept."""
        recipe, size = self.presets()
        filled = preset_fields(recipe, size) | self.match_fills()  # (FormMatch: the width a match solves)
        auto = getattr(self, "_auto", {})
        for fid, default in DEFAULTS.items():
            field = self.query_one(f"#{fid}", Input)
            text = field.value.strip()
            if fid in filled and text in (default, auto.get(fid)):
                put(field, "", since)
            elif fid not in filled and not text and fid != "eval_every":
                put(field, auto.get(fid, default), since)
        self._show_placeholders()

    def _show_placeholders(self) -> None:
        recipe, size = self.presets()
        matched = self.match_fills()
        for fid in DEFAULTS:
            self.query_one(f"#{fid}", Input).placeholder = (
                "solved per model (match)" if fid in matched else placeholder(fid, recipe, size))
