"""The sweep form's values as a profile and back: :class:`FormProfile` reads the fields
into the profile's plain data (values as typed: pydantic checks their types) with the
errors found before pydantic, and fills the fields from a loaded profile, keeping what the
form has no field for. A mixin of :class:`~workbench.tui.sweep_form.SweepForm`.
"""
from __future__ import annotations

from typing import Any, Callable

from textual.widgets import Input, Select, Switch

import tasks
from workbench.spec import profile as profiles
from workbench.spec.profile import Profile, ProfileError
from workbench.spec.schema import BUDGET_KEYS
from workbench.tui.form_fields import (GRID_INPUTS, LABELS, STEP_KINDS, TRAIN_INPUTS, _default_value, _fmt,
                                       _model_name, default_eval_every, format_budget, format_grid_values,
                                       format_model_options, format_settings, parse_budget, parse_grid_axes,
                                       parse_grid_values, parse_model_options, parse_param, parse_settings,
                                       required_params, split_list)
from workbench.tui.model_picker import ModelPicker


class FormProfile:
    """Reading the form into a profile's data and filling it from a profile (see the module
    docstring); uses the form's ``_base`` and ``_loaded_models``."""

    # ------------------------------------------------------------------ reading the form
    def _text(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def _select(self, fid: str) -> Any:
        return self.query_one(f"#{fid}", Select).value

    def _parsed(self, parse: Callable[[str], dict], fid: str, errors: dict[str, str]) -> dict:
        """``parse`` of field ``fid``'s text, or {} with its message put in ``errors``."""
        try:
            return parse(self._text(fid))
        except ValueError as e:
            errors[fid] = f"{LABELS[fid]}: {e}"
            return {}

    def _task_params(self, task_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The task parameters the profile should hold (what differs from the task's
        defaults, or what a loaded profile had) and their parse errors by field id."""
        errors: dict[str, str] = {}
        params: dict[str, Any] = {}
        base = self._base
        required = required_params(task_name)
        for p, default in tasks.parameters(task_name).items():
            if p == "seq_len":
                continue
            text = self._text(f"param-{p}")
            if not text:
                if p in required:
                    errors[f"param-{p}"] = f"task parameter {p}: required"
                continue
            try:
                value = parse_param(text, default)
            except ValueError as e:
                errors[f"param-{p}"] = f"task parameter {p}: {e}"
                continue
            # write what differs from the task's default, or what the loaded profile had:
            # a profile then keeps following the registry's defaults where it never chose
            if value != _default_value(default) or p in base.get("task", {}):
                params[p] = value
        return params, errors

    def form_data(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The profile as a plain dict (values as typed) and errors found before pydantic."""
        base = self._base
        task_name = str(self._select("task"))
        params, errors = self._task_params(task_name)
        sweep = self._sweep_data()
        errors.update(self._grid_data()[1])
        chosen = sweep["models"]
        model = {k: v for k, v in base.get("model", {}).items() if k not in ("d_model", "n_layers", "options")}
        opts = self._parsed(parse_model_options, "model_options", errors)
        if opts:
            model["options"] = opts
        # the form's budget replaces a loaded one of any kind (one budget key in a profile)
        train = {k: v for k, v in base.get("train", {}).items() if k not in BUDGET_KEYS}
        es = dict(train.get("early_stopping", {}))
        for fid, _, section, _ in TRAIN_INPUTS:
            text = self._text(fid)
            target = model if section == "model" else train
            if not text:
                target.pop(fid, None)  # empty = the schema's default
            elif fid == "betas":
                target[fid] = split_list(text)
            else:
                target[fid] = text
        budget = self._text("budget")
        if budget:
            kind = str(self._select("budget_kind"))
            try:
                train[kind] = parse_budget(budget, kind)
            except ValueError as e:
                errors["budget"] = f"{LABELS['budget']}: {e}"
        train["schedule"] = self._select("schedule")
        train["amp"] = self.query_one("#amp", Switch).value
        train["device"] = self._select("device")
        train.pop("devices", None)  # empty: one process (a loaded profile's value is in the field)
        if self._text("devices"):
            train["devices"] = self._text("devices")
        if self._select("sharding") == "fsdp" or "sharding" in train:  # ddp, the default: written if it was
            train["sharding"] = self._select("sharding")
        es["metric"] = self._select("es_metric")
        if self._text("patience"):
            es["patience"] = self._text("patience")
        train["early_stopping"] = es
        data = {
            # a loaded schema 1 profile stays schema 1: its runs keep their identity
            # (checkpoint.spec_key), so launching it from here replays, not duplicates
            # (a grid needs schema 2)
            "schema_version": 2 if sweep.get("grid") else base.get("schema_version", profiles.SCHEMA_VERSION),
            "name": self._text("name"),
            "description": self.query_one("#description", Input).value,
            "task": {"name": task_name, **params},
            "sweep": sweep,
            "model": model,
            "train": train,
        }
        data["executor"] = self._select("executor")
        slurm_settings = self._parsed(parse_settings, "slurm", errors)
        if slurm_settings:
            data["slurm"] = slurm_settings
        # no field in the form: keep a loaded profile's (a need counts only while a task
        # parameter or model option reads its path, so one the edits left unread is harmless)
        for key in ("runs_per_gpu", "needs"):
            if base.get(key):
                data[key] = base[key]
        # a loaded profile's published numbers, for the models still picked
        labels = {m if isinstance(m, str) else m.get("label") or m.get("name") for m in chosen}
        published = [e for e in base.get("published", []) if e.get("model") in labels]
        if published:
            data["published"] = published
        self.presets_data(data)  # the recipe and size, and the keys a loaded profile left to them
        self.match_data(data, errors)  # [sweep.match] (FormMatch)
        return data, errors

    def _sweep_data(self) -> dict[str, Any]:
        """The sweep section as typed: models, sequence lengths, seeds."""
        picked = self.query_one("#models", ModelPicker).picked
        # a loaded profile's entries (labels, options) for the models still picked, in its
        # order (the order its runs go in); models picked since follow in registry order
        chosen: list[Any] = [m for m in self._loaded_models if _model_name(m) in picked]
        kept = {_model_name(m) for m in chosen}
        chosen += [n for n in picked if n not in kept]
        sweep = {"models": chosen, "seq_lens": split_list(self._text("seq_lens")),
                 "seeds": split_list(self._text("seeds"))}
        grid, _ = self._grid_data()
        if grid:
            sweep["grid"] = grid
        return sweep

    def _grid_data(self) -> tuple[dict[str, list[Any]], dict[str, str]]:
        """``[sweep.grid]`` from the lr, weight decay and other-axes inputs (a loaded
        profile's keys keep their order, the order its runs go in), and the inputs' parse
        errors by field id."""
        grid: dict[str, list[Any]] = {}
        errors: dict[str, str] = {}
        for fid, key in GRID_INPUTS.items():
            values = parse_grid_values(self._text(fid))
            if values:
                grid[key] = values
        axes = self._parsed(parse_grid_axes, "grid_axes", errors)
        for key, values in axes.items():
            fid = next((f for f, k in GRID_INPUTS.items() if k == key), None)
            if key in grid:
                errors["grid_axes"] = f"grid axes: {key} has its own input ({fid.replace('_', ' ')})"
            else:
                grid[key] = values
        order = list(self._base.get("sweep", {}).get("grid", {}))
        grid = dict(sorted(grid.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
        return grid, errors

    # ------------------------------------------------------------------ filling the form
    async def fill(self, prof: Profile) -> None:
        """Show a loaded profile in the form (settings the form has no field for are kept).

        All in one screen update (``App.batch_update``): the task's parameter inputs are
        rebuilt with awaits in between, and a repaint there showed a mixed form (the old
        task beside the new task's description, no parameters, the old lengths) for
        seconds on a loaded machine."""
        if prof.task is None:
            from workbench.store.progress import command

            raise ProfileError(f"profile {prof.name!r} has {len(prof.tasks)} tasks ([[tasks]]): the form edits "
                               f"profiles with one [task]; run it with `{command(self.state_dir)} run`")
        with self.app.batch_update():
            await self._fill(prof)

    async def _fill(self, prof: Profile) -> None:
        d = profiles.to_dict(prof)
        self._base = d
        self._auto_name = None  # the profile's own name: a launch into another sweep asks (SweepForm._launch_named)
        self._auto = {}  # the profile's budget and learning rate stay when the task changes
        self._loaded_models = list(d["sweep"]["models"])
        await self._show_task(prof.task.name, prof.task.params())
        self.query_one("#task", Select).value = prof.task.name
        self.query_one("#name", Input).value = prof.name
        self.query_one("#description", Input).value = prof.description
        self.query_one("#models", ModelPicker).set_picked(_model_name(m) for m in self._loaded_models)
        self.query_one("#model_options", Input).value = format_model_options(prof.model.options)
        # a length given as task.seq_len (no sweep lengths) shows as the one length: the form
        # has no seq_len parameter input, and an empty field would mean the task's default
        own = prof.task.params().get("seq_len")
        lens = prof.sweep.seq_lens or ([own] if own is not None else [])
        self.query_one("#seq_lens", Input).value = _fmt(lens)
        self.query_one("#seeds", Input).value = _fmt(prof.sweep.seeds)
        grid = dict(prof.sweep.grid)
        for fid, key in GRID_INPUTS.items():
            self.query_one(f"#{fid}", Input).value = format_grid_values(grid.pop(key, []))
        self.query_one("#grid_axes", Input).value = "; ".join(
            f"{k} = {format_grid_values(v)}" for k, v in grid.items())
        t = prof.train
        # the profile's budget in its own unit (a token, FLOP or tokens-per-parameter
        # budget too: reading t.steps showed "None" for those)
        kind = next((k for k in BUDGET_KEYS if getattr(t, k) is not None), "steps")
        value = getattr(t, kind)
        budget = str(value) if kind in STEP_KINDS else format_budget(value, kind)
        self.query_one("#budget_kind", Select).value = kind
        self.query_one("#budget", Input).value = budget
        # the profile's own eval_every stays: only a value equal to the budget's default
        # follows later budget edits
        self._eval_auto = default_eval_every(kind, budget) or self._eval_auto
        for fid, _, section, _ in TRAIN_INPUTS:
            src = prof.model if section == "model" else t
            self.query_one(f"#{fid}", Input).value = _fmt(getattr(src, fid))
        self.query_one("#schedule", Select).value = t.schedule
        self.query_one("#amp", Switch).value = t.amp
        self.query_one("#es_metric", Select).value = t.early_stopping.metric
        self.query_one("#patience", Input).value = str(t.early_stopping.patience)
        self.query_one("#device", Select).value = t.device
        self.query_one("#devices", Input).value = _fmt(t.devices)
        self.query_one("#sharding", Select).value = t.sharding or "ddp"
        self.query_one("#executor", Select).value = prof.executor
        self.query_one("#slurm", Input).value = format_settings(prof.slurm.model_dump(exclude_defaults=True))
        self.fill_presets(prof, d)  # its recipe and size; what they fill shown empty
        self.fill_match(prof, d)  # its [sweep.match]; a width it solves shown empty
        self._show_errors({}, [], focus=False)
        # what the fields' Changed handlers would show once the batch is over, shown with it
        self._show_run_count()
        self._show_eval_unit()
