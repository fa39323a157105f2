"""The sweep form's fields and how their text maps to a profile: the tables of fields
(ids, labels, profile sections, defaults, units), the parsers of what is typed (lists, task
parameters, model options, grid axes, Slurm settings) and the formatters that show a loaded
profile's values, and :func:`field_for`, the field a profile key path is about (where a
validation problem is shown). No widgets here but :class:`FormInput`, the text input every
field is (it keeps every keystroke: see "The form's own writes" below);
:mod:`workbench.tui.sweep_form` builds them.
"""
from __future__ import annotations

import inspect
import json
import math
import tomllib
from typing import Any

import tasks
from textual import _time, events
from textual.binding import Binding
from textual.widgets import Input

EVALS_PER_RUN = 20  # the default "evaluate every" gives about this many evaluations a run
DEFAULT_BUDGET = "200"  # steps, for tasks not in TASK_TRAIN_DEFAULTS
DEFAULT_LENGTHS = "64"  # the sweep's sequence lengths, for tasks that take one

# Training fields edited as plain inputs: (field id, label, profile section, default text;
# eval_every's default follows the budget: default_eval_every).
TRAIN_INPUTS = [
    ("batch_size", "batch size", "train", "32"),
    ("d_model", "d_model", "model", "64"),
    ("n_layers", "layers", "model", "2"),
    ("lr", "learning rate", "train", "0.001"),
    ("betas", "AdamW betas", "train", "0.9, 0.999"),
    ("weight_decay", "weight decay", "train", "0.0"),
    ("warmup_steps", "warm-up", "train", "0"),
    ("grad_clip", "grad clip", "train", "1.0"),
    ("eval_every", "evaluate every", "train", "10"),
]
# what a number in these fields counts (eval_every's says steps or epochs, as the budget)
UNITS = {"batch_size": "sequences a step", "lr": "peak (after warm-up)", "eval_every": "steps",
         "warmup_steps": "steps", "betas": "2 numbers in [0, 1)", "grad_clip": "max norm; 0 = off"}


# The form's starting values for a task, where the registry's defaults (a paper's sizes, for
# a GPU) or the form's generic budget would leave every model at chance on a 2-core CPU:
# with these, a Transformer at the form's size learns each task well above chance within
# the budget (tests/tui/test_first_hour_form.py trains every task from the form's defaults).
# Parameters go into the task's inputs (and so into the profile, where they differ from
# the registry); training values replace the budget and learning rate the form put there
# itself, until the user types their own (SweepForm._apply_task_training).
#
# Measured with a Transformer (d_model 64, 2 layers, batch 32, length 64) on a 2-core CPU
# under load, best eval accuracy (chance: always the test set's commonest target):
# - mqar: the registry's vocabulary 8192 and 16 pairs: 0.0005 after 300 steps (issue 32),
#   0.001 at step 120 here (chance); 128 and
#   4 pairs, 600 steps at lr 3e-3: 0.27 with 4 heads (a value from the context, not the
#   right one: 1/4), 0.69 with one head (zoology's attention has one);
# - induction_heads: 200 steps at lr 1e-3: 0.11 (chance 0.10); 600 at 3e-3: 1.000; tested at
#   64 and 256 only (the registry's 64..2048 cost more to evaluate than the training);
# - mad_in_context_recall, mad_noisy_in_context_recall: 0.31 after 200 steps at lr 1e-3,
#   0.32 after 400 at 3e-3 (the final evaluation) and after 800 at 1e-3 (chance 0.13);
# - at the generic 200 steps, lr 1e-3: copying 0.76, selective_copying 0.34,
#   mad_selective_copying 0.41, mad_copying 0.67, mad_memorization 0.81 (chance <= 0.08),
#   sequential_image 0.36 (chance 0.11).
# - state tracking (issue 35; d_model 64, trained at lengths 3 .. 40, 600 steps at 3e-3, a
#   target after every prefix): cycle_navigation 0.985 (chance 0.22; 0.42 at length 128);
#   parity 0.62 (chance 0.51) and modular arithmetic with + and - 0.36 (chance 0.21): a
#   Transformer does not track these states; an LSTM learns both (1.000 / 1.000 at d_model
#   32 in 400-600 steps), DeltaNet with allow_neg_eigval learns parity (1.000 after 400);
#   permutation_composition A5 at length 16: Transformer and LSTM 0.08 (chance 0.03).
TASK_PARAM_DEFAULTS: dict[str, dict[str, Any]] = {
    "parity": {"labels": "running", "eval_lens": [40, 128]},
    "cycle_navigation": {"labels": "running", "eval_lens": [40, 128]},
    "modular_arithmetic": {"labels": "running", "operators": "+-", "eval_lens": [40, 128]},
    "permutation_composition": {"group": "A5", "eval_lens": [16, 64]},
    "mqar": {"vocab_size": 128, "num_kv_pairs": 4},
    "induction_heads": {"eval_lens": [64, 256]},
}
TASK_TRAIN_DEFAULTS: dict[str, dict[str, str]] = {
    "parity": {"budget": "600", "lr": "0.003", "seq_lens": "40"},
    "cycle_navigation": {"budget": "600", "lr": "0.003", "seq_lens": "40"},
    "modular_arithmetic": {"budget": "600", "lr": "0.003", "seq_lens": "40"},
    "permutation_composition": {"budget": "600", "lr": "0.003", "seq_lens": "16"},
    "mqar": {"budget": "600", "lr": "0.003", "model_options": "transformer.n_heads=1"},
    "induction_heads": {"budget": "600", "lr": "0.003"},
    "mad_in_context_recall": {"budget": "400", "lr": "0.003"},
    "mad_noisy_in_context_recall": {"budget": "400", "lr": "0.003"},
}
# Tasks whose form defaults do not learn well above chance on a 2-core CPU within the
# budget (measured as above): the form says so under the task's description.
TASK_CPU_NOTES: dict[str, str] = {
    "parity": "On a 2-core CPU a Transformer stays near chance here (0.62 against 0.51 after 600 steps): "
              "pick lstm, or deltanet with allow_neg_eigval=true (both 1.000 in 400 steps).",
    "modular_arithmetic": "On a 2-core CPU a Transformer stays near chance here (0.36 against 0.21 after "
                          "600 steps); an LSTM learns it (1.000 in 600 steps).",
    "permutation_composition": "On a 2-core CPU A5 (60 classes) stays near chance in this budget (a "
                               "Transformer or an LSTM 0.08 against 0.03 after 600 steps); with group S3 "
                               "an LSTM reaches 1.000 (0.996 at length 64), a Transformer 0.36.",
    "mad_compression": "On a 2-core CPU this stays near chance at these settings (0.12-0.16 against 0.07 "
                       "after 200 steps; MAD's reduced protocol: 0.16 after 30 epochs): decoding a whole "
                       "sequence from one position needs far more training than a CPU budget.",
    "mad_fuzzy_in_context_recall": "On a 2-core CPU this stays near chance at these settings (0.21 against "
                                   "0.14 after 200 steps; MAD's reduced protocol: 0.24 after 30 epochs).",
    "lm": "On a 2-core CPU next-token accuracy stays modest at these settings (0.40 after 200 steps, "
          "against 0.30 for always the commonest byte): compare models by loss or bits per byte.",
}


# What a task parameter's input takes, beside it (task, parameter) -> unit, and the values
# offered as the user types (completed with the right arrow key).
PARAM_UNITS: dict[tuple[str, str], str] = {
    ("lm", "source"): "file/dir/glob/hf:ID",  # (20 columns at most: what 120 columns show)
    ("lm", "tokenizer"): "bytes char bpe or id",  # or a tokenizer.json folder / hub id
    ("lm", "vocab_size"): "bpe only (4096)",
    ("lm", "document"): "auto file line para…",  # auto: 1 file split by paragraph/position
    ("lm", "text_column"): "jsonl/parquet/hf",
    ("lm", "hf_config"): "hf: sources",
    ("lm", "hf_split"): "hf: sources",
    ("lm", "streaming"): "hf: sources",
    ("lm", "max_documents"): "0 = all",
}
PARAM_SUGGESTIONS: dict[tuple[str, str], list[str]] = {
    ("lm", "tokenizer"): ["bytes", "char", "bpe", "EleutherAI/gpt-neox-20b"],  # (Mamba's and Pythia's)
    ("lm", "document"): ["auto", "file", "line", "paragraph", "position"],
    ("lm", "source"): ["stdlib", "hf:"],
}


def task_cpu_note(task: str) -> str:
    """What the form says about ``task`` at its defaults on a CPU ('' when they learn)."""
    return TASK_CPU_NOTES.get(task, "")


def task_param_defaults(task: str) -> dict[str, Any]:
    """The values the form's parameter inputs start with for ``task`` (others: the registry's)."""
    return dict(TASK_PARAM_DEFAULTS.get(task, {}))


def task_train_defaults(task: str) -> dict[str, str]:
    """The budget (steps), learning rate, model options and sequence lengths the form starts
    ``task`` with."""
    generic = {"budget": DEFAULT_BUDGET, "lr": next(d for f, _, _, d in TRAIN_INPUTS if f == "lr"),
               "model_options": "", "seq_lens": DEFAULT_LENGTHS}
    out = generic | TASK_TRAIN_DEFAULTS.get(task, {})
    if task in tasks.names() and "seq_len" not in tasks.parameters(task):
        out["seq_lens"] = ""  # its length is its own (sequential_image: 64 pixels); a length is refused
    return out


# The budget's unit: (label in the form, train key). A token, FLOP or tokens-per-parameter
# budget becomes steps per run when the profile expands (workbench/spec/budget.py); the
# form shows the steps it becomes (SweepForm._show_budget_steps).
BUDGET_KINDS = [("steps", "steps"), ("epochs", "epochs"), ("tokens", "tokens"), ("bytes of text", "bytes"),
                ("FLOPs", "flops"), ("tokens/param", "tokens_per_param")]
STEP_KINDS = ("steps", "epochs")  # budgets counted in optimizer steps or epochs themselves
_SUFFIXES = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}


def parse_budget(text: str, kind: str) -> int | float | str:
    """The budget as the profile holds it: tokens and bytes of text a whole number, FLOPs and
    tokens per parameter a number; '2M', '1.5e9', '3e18' and '1,000,000' are read for tokens,
    bytes and FLOPs (k, M, G or B, T, P, E: powers of 1000; bytes also as '50MB', '2GB').
    Steps and epochs stay as typed (pydantic checks them). ValueError with a one-line reason
    when it is not a number."""
    text = text.strip()
    if kind in STEP_KINDS:
        return text
    raw = text.replace(",", "").replace("_", "")
    scale = 1.0
    if kind == "bytes" and raw[-1:] in "bB" and raw[-2:-1].lower() in "kmgtpe" and raw[:-2]:
        raw = raw[:-1]  # train.bytes: '50MB' is 50M bytes of text
    if kind != "tokens_per_param" and raw[-1:].lower() in _SUFFIXES and raw[:-1]:
        scale, raw = _SUFFIXES[raw[-1].lower()], raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        unit = {"tokens": "tokens", "bytes": "bytes", "flops": "FLOPs"}.get(kind, "tokens per parameter")
        raise ValueError(f"{text!r} is not a number of {unit} (e.g. "
                         f"{ {'tokens': '2M', 'bytes': '50MB', 'flops': '1e15'}.get(kind, '20') })") from None
    if kind in ("tokens", "bytes"):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{text!r} is not a whole number of {kind}")
        return int(value)
    return value


def format_budget(value: int | float, kind: str) -> str:
    """A loaded profile's budget as the form shows it: FLOPs in e-notation (3e+15), others
    as numbers (tokens_per_param 20, not 20.0)."""
    if kind == "flops":
        return f"{value:.6g}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# train.sharding: how a run's ranks hold the model (label, value; "ddp" is also the default, None)
SHARDING_KINDS = [("ddp: whole", "ddp"), ("fsdp: 1/N each", "fsdp")]
# [sweep.match] (workbench/spec/match.py): every model solved to this size. (label, key)
MATCH_KINDS = [("params", "params"), ("state size", "state_size")]


def parse_count(text: str, what: str) -> int:
    """A whole count as typed: '1M', '250k', '1e6', '1_000_000', '1,000,000' (k, M, G:
    powers of 1000). ValueError with a one-line reason otherwise."""
    raw = text.strip().replace(",", "").replace("_", "")
    scale = 1.0
    if raw[-1:].lower() in "kmg" and raw[:-1]:
        scale, raw = _SUFFIXES[raw[-1].lower()], raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number of {what} (e.g. 1M, 250k)") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"{text.strip()!r} is not a whole number of {what} of 1 or more")
    return int(value)


def default_eval_every(kind: str, budget: str) -> str | None:
    """The default "evaluate every" for a budget of ``budget`` steps or epochs (``kind``):
    about EVALS_PER_RUN evaluations a run, at least one step or epoch apart; None while
    the budget is not a positive whole number."""
    try:
        n = int(budget)
    except ValueError:
        return None
    if n <= 0 or kind not in ("steps", "epochs"):
        return None
    return str(max(1, round(n / EVALS_PER_RUN)))


def split_list(text: str) -> list[str]:
    """'64, 128,256' -> ['64', '128', '256'] (left as strings: pydantic checks the type)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_param(text: str, default: Any) -> Any:
    """Convert a task-parameter input to the type of its default (pydantic cannot: task
    parameters are free-form in the schema and checked against the task's signature)."""
    text = text.strip()
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "yes", "1", "on"):
            return True
        if low in ("false", "no", "0", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if isinstance(default, (list, tuple)):
        return [parse_param(x, default[0] if default else 0) for x in split_list(text)]
    if default is None:  # required or untyped: take the most specific literal
        for conv in (int, float):
            try:
                return conv(text)
            except ValueError:
                pass
    return text


def _split_top(text: str, seps: str = ";,") -> list[str]:
    """Split on ';' or ',' (``seps``) outside [...], {...} (an inline table) and quotes."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_model_options(text: str) -> dict[str, dict[str, Any]]:
    """'transformer.pos=rope, mamba.d_state=8' -> {'transformer': {'pos': 'rope'}, ...}.

    Values are TOML literals when they parse as one (numbers, true/false, [lists],
    "strings"), otherwise bare strings. Names and options are checked by the profile loader.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in (x.strip() for x in _split_top(text)):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        model, dot, opt = key.strip().partition(".")
        if not eq or not dot or not model or not opt.strip():
            raise ValueError(f"{item!r}: write model.option=value")
        out.setdefault(model.strip(), {})[opt.strip()] = _literal(raw)
    return out


def _literal(raw: str) -> Any:
    """A TOML literal (number, true/false, [list], "string") or else the bare string."""
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()


def parse_grid_values(text: str) -> list[Any]:
    """'1e-4, 5e-4, 1e-3' -> [0.0001, 0.0005, 0.001]: a grid axis's values, TOML literals
    where they parse as one (the profile schema checks them at each grid point)."""
    return [_literal(x) for x in _split_top(text, ",") if x.strip()]


def parse_grid_axes(text: str) -> dict[str, list[Any]]:
    """'model.d_model = 64, 128; task.num_kv_pairs = 4, 8' -> {'model.d_model': [64, 128],
    'task.num_kv_pairs': [4, 8]}: ``[sweep.grid]`` axes over dotted keys, ';' between them.
    The keys are checked by the profile loader (``[sweep.grid]`` in docs/reference/profile.md)."""
    out: dict[str, list[Any]] = {}
    for item in (x.strip() for x in _split_top(text, ";")):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        key = key.strip().strip('"')
        values = parse_grid_values(raw)
        if not eq or "." not in key or " " in key or not values:
            raise ValueError(f"{item!r}: write key = v1, v2 with a dotted key (e.g. model.d_model = 64, 128), "
                             f"axes separated by ';'")
        if key in out:
            raise ValueError(f"{key} is given twice")
        out[key] = values
    return out


def format_grid_values(values: list[Any]) -> str:
    def one(v: Any) -> str:  # a task.tokenizer table as a TOML inline table: {name = "bpe", vocab_size = 512}
        return "{" + ", ".join(f"{k} = {one(x)}" for k, x in v.items()) + "}" if isinstance(v, dict) else json.dumps(v)
    return ", ".join(one(v) for v in values)  # JSON scalars are TOML literals


# grid axes with their own input in the Training section; other keys go in "grid axes"
GRID_INPUTS = {"grid_lr": "train.lr", "grid_wd": "train.weight_decay"}


def parse_settings(text: str) -> dict[str, Any]:
    """'partition=gpu, time="04:00:00", extra=["--exclusive"]' -> a dict (values as in
    :func:`parse_model_options`; the schema checks names and types)."""
    return {opt: v for opts in parse_model_options(
        ", ".join(f"s.{item.strip()}" for item in _split_top(text) if item.strip())).values()
        for opt, v in opts.items()}


def format_settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())


def format_model_options(options: dict[str, dict[str, Any]]) -> str:
    parts = []
    for model, opts in options.items():
        for k, v in opts.items():
            # JSON scalars and lists are valid TOML literals, on one line
            parts.append(f"{model}.{k}={json.dumps(v)}")
    return ", ".join(parts)


def required_params(task: str) -> set[str]:
    """Task parameters without a default (``tasks.parameters`` shows both these and
    optional ``None`` defaults as None; the constructor's signature tells them apart)."""
    sig = inspect.signature(tasks.task_class(task).__init__)
    return {p.name for p in sig.parameters.values() if p.default is inspect.Parameter.empty
            and p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _default_value(default: Any) -> Any:
    return list(default) if isinstance(default, tuple) else default


def _model_name(m: Any) -> str:
    """A sweep entry's registry name (entries are names or tables with a name)."""
    return m if isinstance(m, str) else m["name"]


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


# ---------------------------------------------------------------------------- fields
TRAIN_FIELD_IDS = {fid for fid, *_ in TRAIN_INPUTS}
# the form's names for its fields, used in messages
LABELS: dict[str, str] = {
    "name": "name", "description": "description", "models": "models", "model_options": "model options",
    "task": "task", "seq_lens": "sequence lengths", "seeds": "seeds", "budget": "train for",
    "grid_lr": "lr grid", "grid_wd": "weight decay grid", "grid_axes": "grid axes",
    "schedule": "lr schedule", "amp": "mixed precision", "es_metric": "early stop on",
    "patience": "patience", "device": "device", "executor": "executor", "slurm": "Slurm settings",
    "devices": "devices", "sharding": "sharding", "match_value": "match size",
    **{fid: label for fid, label, *_ in TRAIN_INPUTS},
}
EXAMPLES = {fid: default for fid, _, _, default in TRAIN_INPUTS} | {"seeds": "0, 1, 2", "devices": "2"}
# fields whose messages show under another's
ALIASES = {"budget_kind": "budget", "sharding": "devices", "match_kind": "match_value"}


def field_for(loc: tuple) -> str | None:
    """The form field a profile key path is about (a pydantic error's ``loc`` or a key of
    the TOML the form writes), or None when no field shows it."""
    keys = [p for p in loc if isinstance(p, str) and p not in ("str", "ModelChoice")]
    if not keys:
        return None
    head, sub = keys[0], keys[1] if len(keys) > 1 else ""
    if head in ("name", "description", "executor", "slurm"):
        return head
    if head == "sweep":
        if sub == "grid":
            key = keys[2] if len(keys) > 2 else ""
            return next((f for f, k in GRID_INPUTS.items() if k == key), "grid_axes")
        if sub == "match":
            return "match_value"
        return sub if sub in ("models", "seq_lens", "seeds") else None
    if head in ("task", "tasks"):
        return "task" if sub in ("", "name") else f"param-{sub}"
    if head == "model":
        return sub if sub in ("d_model", "n_layers") else "model_options" if sub == "options" else None
    if head == "train":
        if sub in ("", "epochs", "steps", "tokens", "bytes", "flops", "tokens_per_param"):
            return "budget"  # "give exactly one of epochs or steps" is a train-level error
        if sub == "early_stopping":
            return {"metric": "es_metric"}.get(keys[2] if len(keys) > 2 else "", "patience")
        if sub in TRAIN_FIELD_IDS or sub in ("schedule", "amp", "device", "devices", "sharding"):
            return sub
    return None

# --------------------------------------------------------------------------- the form's own writes
# The forms' text inputs, and the one way the form writes into them on its own.
#
# A form fills some fields itself: "evaluate every" follows the budget and the steps a token
# budget becomes (counted in a thread), a task switch puts the task's budget, learning rate
# and lengths into the fields still holding the form's values, a size preset or recipe
# empties the fields it fills. Each of those writes is decided from a change (a message) or
# a background result that was started earlier; under load the user has typed since, and a
# late write would overwrite what they typed (issue 42 item 3: ``50000`` typed into the
# budget after clearing it became ``10000``, the auto value written into the cleared field
# with the keys typed after it appended).
#
# Under load Textual also reorders a field's own editing keys against the letters typed
# after them (:data:`EDIT_KEYS`): a FormInput applies them in the order typed.
#
# So every :class:`FormInput` remembers when its value last changed by any other means than
# :func:`put` (a key, a paste, a profile loaded into the form), on the clock Textual stamps
# its messages with, and :func:`put` writes only into a field that has not changed since
# ``since``: the time of the change the write answers (``event.time``) or at which a
# background job read the form. A write whose moment has passed is dropped; the field
# keeps what was typed.

# Input's own editing keys (backspace, ctrl+u, delete, the cursor keys, ...) -> action.
# Textual runs a widget's (non-priority) bindings only once the key has bubbled up to the
# app, while a printable key is inserted by the Input itself as it arrives: under load
# 'ctrl+u b p e' then erased the 'bpe' typed after it (the keys in the Input's queue were
# inserted before the binding ran). A FormInput runs them itself, in the order typed.
EDIT_KEYS: dict[str, str] = {
    key.strip(): b.action
    for b in Input.BINDINGS if isinstance(b, Binding) and not b.priority
    for key in b.key.split(",")
}


def now() -> float:
    """The clock of Textual's message times (``Message.time``): ``since`` for a job
    started now."""
    return _time.get_time()


class FormInput(Input):
    """An Input that records when its value was last changed other than by :func:`put`."""

    changed_at: float = 0.0  # never changed since it was built (its starting value)
    _form_writing: bool = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.changed_at = 0.0  # the value it was built with is nobody's edit

    async def _on_key(self, event: events.Key) -> None:
        action = EDIT_KEYS.get(event.key)
        if action is not None:  # here, before the keys typed after it (see EDIT_KEYS)
            event.stop()
            event.prevent_default()  # (Input's own handler, and the binding, do not run)
            await self.run_action(action)

    def _watch_value(self, value: str) -> None:
        # runs as the value is set (synchronously): a key's edit is stamped before any
        # message about it, or about anything after it, is handled
        if not self._form_writing:
            self.changed_at = now()
        super()._watch_value(value)


def put(field: Input, value: str, since: float) -> bool:
    """Write ``value`` into ``field`` unless it changed after ``since`` (then keep what it
    holds: typed after the write was decided). True when written (or already holding it)."""
    if field.value == value:
        return True
    if getattr(field, "changed_at", 0.0) > since:
        return False
    field._form_writing = True
    try:
        field.value = value
    finally:
        field._form_writing = False
    return True
