"""The run view: loss and accuracy curves streaming from the store, the run's config,
final results, error text and a system panel.

Language-model runs (task ``lm``, or runs that log perplexity or tokens trained) are shown
through what language modelling measures, not accuracy (a next-token accuracy says little,
whole-sequence accuracy is always 0): the second plot is eval bits per byte (the figure
that compares tokenizers) instead of eval accuracy, both plots against the training
tokens (step x the run's tokens a step) where the run records them, and the title gives
train loss, eval loss, eval perplexity and bits per byte, each labelled, and the tokens
(and training FLOPs) seen so far: the run's step x its recorded tokens a step (and FLOPs
per token), so the count moves with every heartbeat, not only at evaluations. The title's
fields wrap whole onto a second line where the terminal is too narrow (:func:`wrap_fields`),
never cut inside one.

The screen polls at ~2 Hz in a thread worker. Metrics are fetched incrementally (rows after
the last rowid seen) and the plots are redrawn only when rows arrived, so an idle or
finished run costs nothing to display, even over a slow SSH link. An empty plot says why
(:func:`empty_text`: waiting to start, waiting for metrics, or the run ended without any),
and the system panel says when its last sample is old (the run stopped).
"""
from __future__ import annotations

import json
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Static

from workbench.results import catalogue
from workbench.store import Run, Store
from workbench.tui.background import PollsStore
from workbench.tui.formatting import accuracy, count, duration, number, percent, set_text, state_text
from workbench.tui.help_screen import KeysFooter
from workbench.tui.messages import KillRequested
from workbench.tui.plots import MetricPlot
from workbench.tui.system_panel import SystemPanel

POLL_S = 0.5  # 2 Hz: the plots redraw at most this often
SYSTEM_SAMPLES = 60

LOSS_SERIES = {("train", "loss"): "train loss", ("eval", "loss"): "eval loss"}
ACC_SERIES = {("train", "accuracy"): "train acc", ("eval", "accuracy"): "eval acc",
              ("eval", "sequence_accuracy"): "eval seq acc"}
# a language model's latest figures, shown in the title (tasks/lm logs them at evaluations)
LM_FIGURES = {("eval", "perplexity"): "ppl", ("eval", "bits_per_byte"): "bpb",
              ("train", "tokens_trained"): "tokens"}
# a language model's second plot (in place of ACC_SERIES): bits per byte compares tokenizers
LM_SERIES = {("eval", "bits_per_byte"): "eval bpb"}
LM_RESULTS = ("loss", "perplexity", "bits_per_byte")  # a language model's results, listed first
FIELD_GAP = "  "  # between the title's fields


@dataclass
class Snapshot:
    """What one poll read from the store (built in a thread, applied on the UI thread)."""

    run: Run | None
    metrics: list[Any] = field(default_factory=list)
    system: list[Any] = field(default_factory=list)
    results: dict[str, dict[str, float | None]] = field(default_factory=dict)
    nvml_note: str | None = None


def empty_text(state: str, what: str, kind: str | None = None) -> str:
    """What an empty plot of ``what`` (loss, accuracy) says for a run in ``state`` (an
    evaluation run, ``kind`` "eval", has no curves: its numbers are per task)."""
    if kind == "eval" and state not in ("pending",):
        return f"evaluation run: no {what} curve; results at right"
    if state == "pending":
        return "waiting for the run to start..."
    if state == "running":
        return "waiting for metrics..."
    if state == "finished":
        return f"no {what} was logged"
    return f"run {state} before logging any {what}"


def nvml_note() -> str:
    """Why NVML gives no GPU figures on this machine (empty when sysmon is unavailable)."""
    try:
        from workbench.train import sysmon
    except ImportError:
        return ""
    try:
        return "" if sysmon.gpu_available() else sysmon.nvml_status()
    except Exception as e:  # NVML failures are a note here, never a crash of the UI
        return f"NVML: {e}"


class RunScreen(PollsStore, Screen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back to runs"),
        Binding("k", "kill", "Kill run"),
        Binding("g", "sample", "Sample text"),
    ]

    def __init__(self, store: Store, run_id: int, lock: threading.Lock | None = None) -> None:
        super().__init__()
        self.store, self.run_id = store, run_id
        self.lock = lock or nullcontext()
        self.last_rowid = 0
        self.run: Run | None = None
        self._nvml_checked = False
        self._shown: tuple | None = None  # what the side panels last showed
        self.lm: dict[str, float] = {}  # LM_FIGURES' latest values, by their short name
        self.lm_view = False  # plots set up for a language model (set_lm_plots)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"run {self.run_id}", id="run-title")
        with Horizontal(id="run-body"):
            with Vertical(id="plots"):
                yield MetricPlot("loss", "loss", id="loss-plot")
                yield MetricPlot("accuracy", "accuracy", ylim=(0.0, 1.0), id="acc-plot")
                # an evaluation run has no curves: its numbers per task take the plots' place
                table = VerticalScroll(Static("", id="eval-table"), id="eval-results")
                table.styles.height, table.display = "1fr", False
                yield table
            with VerticalScroll(id="run-side"):
                yield SystemPanel(id="system")
                yield Static("", id="run-error")
                yield Static("Results", classes="panel-title")
                yield Static("none yet", id="run-results")
                yield Static("Config", classes="panel-title")
                yield Static("", id="run-config")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = f"run {self.run_id}"
        self.poll()
        self.set_interval(POLL_S, self.poll)

    # ------------------------------------------------------------------ polling
    def read(self) -> Snapshot:
        with self.lock:
            snap = Snapshot(
                run=self.store.get(self.run_id),
                metrics=self.store.metrics(self.run_id, after_rowid=self.last_rowid),
                system=self.store.system(self.run_id, last=SYSTEM_SAMPLES),
                results=self.store.results([self.run_id]).get(self.run_id, {}),
            )
        if not self._nvml_checked:
            snap.nvml_note = nvml_note()
        return snap

    def apply(self, snap: Snapshot) -> None:
        if snap.nvml_note is not None:
            self._nvml_checked = True
            self.query_one(SystemPanel).nvml_note = snap.nvml_note
        had, self.run = self.run, snap.run
        if (had is None) != (snap.run is None) or (had and snap.run and had.task != snap.run.task):
            self.refresh_bindings()  # g offered for lm runs only (check_action)
        if snap.run is None:
            self.query_one("#run-title", Static).update(Text(f"run {self.run_id}: not in the store", "red"))
            return
        total = snap.run.total_steps
        for plot in self.query(MetricPlot):
            if total and plot.xmax != total:  # known once the worker planned its steps
                plot.xmax = total
                if plot.series:
                    plot.redraw()
        for plot in self.query(MetricPlot):  # an empty plot says why it is empty
            text = empty_text(snap.run.state, plot.ylabel, snap.run.spec.get("kind"))
            if text != plot.empty_text:
                plot.empty_text = text
                if not plot.series:
                    plot.redraw()
        if snap.run.task == "lm" or self.lm_view:
            self.set_lm_plots(snap.run)
        self._apply_metrics(snap.metrics)
        evaluation = snap.run.spec.get("kind") == "eval"
        for plot in self.query(MetricPlot):
            plot.display = not evaluation
        self.query_one("#eval-results").display = evaluation
        title = self.query_one("#run-title", Static)
        width = (title.content_size.width or self.size.width - 2) or None  # (none before the first layout)
        set_text(title, self._title(snap.run, self.lm, width))
        self.query_one(SystemPanel).show(snap.system, snap.run)
        shown = (snap.run.state, snap.run.error, json.dumps(snap.results, sort_keys=True),
                 json.dumps(snap.run.info, sort_keys=True, default=str))
        if shown != self._shown:  # these change rarely: rewrite only when they did
            self._shown = shown
            self._show_side(snap.run, snap.results)

    def _apply_metrics(self, rows: list[Any]) -> None:
        if not rows:
            return
        self.last_rowid = rows[-1]["rowid"]
        loss, acc = self.query_one("#loss-plot", MetricPlot), self.query_one("#acc-plot", MetricPlot)
        touched = set()
        for r in rows:
            key = (r["split"], r["name"])
            if key in LOSS_SERIES:
                loss.append(LOSS_SERIES[key], r["step"], r["value"])
                touched.add(loss)
                if key == ("eval", "loss") and r["value"] is not None:
                    self.lm["eval loss"] = r["value"]
            elif self.lm_view and key in LM_SERIES:
                acc.append(LM_SERIES[key], r["step"], r["value"])
                touched.add(acc)
                if r["value"] is not None:
                    self.lm[LM_FIGURES[key]] = r["value"]
            elif self.lm_view and key in ACC_SERIES:
                continue  # a language model's accuracy: not plotted (bits per byte is)
            elif key in ACC_SERIES:
                acc.append(ACC_SERIES[key], r["step"], r["value"])
                touched.add(acc)
            elif key in LM_FIGURES and r["value"] is not None:
                self.lm[LM_FIGURES[key]] = r["value"]
        for plot in touched:
            plot.redraw()

    def set_lm_plots(self, run: Run) -> None:
        """A language model's plots: eval bits per byte in the accuracy plot's place, and
        both plots against training tokens once the run records its tokens a step."""
        acc = self.query_one("#acc-plot", MetricPlot)
        if not self.lm_view:
            self.lm_view = True
            acc.title, acc.ylabel, acc.ylim = "eval bits per byte", "bits/byte", None
            acc.series = {}
            acc.redraw()
        per_step = (run.info or {}).get("tokens_per_step")
        for plot in self.query(MetricPlot):
            if per_step and plot.xscale != per_step:
                plot.xscale, plot.xlabel = float(per_step), "training tokens"
                plot.redraw()

    # ------------------------------------------------------------------ rendering
    @staticmethod
    def _title(run: Run, lm: dict[str, float] | None = None, width: int | None = None) -> Text:
        """The title line: the run, its state and progress, then its figures, each
        labelled train or eval (a language model's: train loss, eval loss, perplexity, bits
        per byte, tokens seen); wrapped between whole fields to ``width``."""
        lm = lm or {}
        fields = [
            Text.assemble((f"run {run.id}", "bold")), Text(run.label, "bold cyan"), Text(run.task),
            *([Text(f"L={run.seq_len}")] if run.seq_len is not None else []), Text(f"seed {run.seed}"),
            state_text(run.state),
            Text(f"{percent(run.progress)}  step {run.step}" + (f"/{run.total_steps}" if run.total_steps else "")),
            Text(duration(run.elapsed)),
            *([Text(f"{run.device}" + (f" ({run.backend})" if run.backend else ""))] if run.device else []),
        ]
        is_lm = run.task == "lm" or any(k in lm for k in ("ppl", "bpb", "tokens"))
        if run.last_loss is not None:  # the heartbeat's: the mean training loss of the last steps
            fields.append(Text(f"train loss {number(run.last_loss)}"))
        if is_lm:
            for key, name in (("eval loss", "eval loss"), ("ppl", "eval ppl"), ("bpb", "eval bpb")):
                if key in lm:
                    fields.append(Text(f"{name} {number(lm[key])}"))
        elif run.last_accuracy is not None:
            fields.append(Text(f"eval acc {accuracy(run.last_accuracy)}"))
        if is_lm:  # tokens seen: live from the step where the run counts them
            per_step, fpt = (run.info or {}).get("tokens_per_step"), (run.info or {}).get("flops_per_token")
            tokens = run.step * per_step if per_step else lm.get("tokens")
            if tokens is not None:
                fields.append(Text(f"{count(tokens)} tokens" + (f" ({tokens * fpt:.3g} FLOPs)" if fpt else "")))
        return wrap_fields(fields, width)

    def _show_side(self, run: Run, results: dict[str, dict[str, float | None]]) -> None:
        err = self.query_one("#run-error", Static)
        if run.state in ("failed", "crashed") or run.error:
            err.update(Text.assemble((f"{run.state}: ", "bold red"), run.error or "(no error text)"))
            err.display = True
        elif run.stall_note():  # silent but its process exists: not called crashed (Store.reap)
            err.update(Text.assemble(("stalled: ", "bold yellow"), run.stall_note(),
                                     f"; {run.worker}, not declared crashed while it exists"))
            err.display = True
        else:
            err.display = False
        res = self.query_one("#run-results", Static)
        if run.spec.get("kind") == "eval":  # per task in the plots' place; the run's own figures here
            self.query_one("#eval-table", Static).update(eval_table(run, results))
            results = {k: v for k, v in results.items() if not k}
        if results:
            out = Text()
            for eval_set, values in sorted(results.items()):
                default = "the whole run" if run.spec.get("kind") == "eval" else "default eval set"
                out.append(f"{eval_set or default}\n", style="bold")
                # values with '± SE' (and an evaluation's run-level figures): wider, in a narrower name column
                narrow = any(k.endswith("_stderr") for k in values) or run.spec.get("kind") == "eval"
                for name, value in sorted(values.items(), key=lambda kv: _lm_first(run, kv[0])):
                    # not measured here (e.g. GPU figures on a CPU run); a standard error
                    # (lm-eval's <metric>_stderr) goes beside its metric
                    if value is None or (name.endswith("_stderr") and name.removesuffix("_stderr") in values):
                        continue
                    se = values.get(f"{name}_stderr")
                    # (with '± SE' the value is wider: the name's column narrower, to fit the panel)
                    out.append(f"  {name:<14}{_figure(name, value, se):>16}\n" if narrow else
                               f"  {name:<24} {_figure(name, value):>10}\n")
            set_text(res, out)
        else:
            set_text(res, Text("none yet" if not run.finished else "none recorded", style="dim"))
        set_text(self.query_one("#run-config", Static), config_text(run))

    # ------------------------------------------------------------------ actions
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """g (Sample text) is in the footer of an lm run's view only: an evaluation run or a
        synthetic task's offers no text (pressed all the same, it says why)."""
        if action == "sample":
            return self.run is not None and self.run.task == "lm" and self.run.spec.get("kind") != "eval"
        return True

    def action_kill(self) -> None:
        self.post_message(KillRequested(self.run_id))

    def action_sample(self) -> None:
        """Text from a finished lm run, in a window (workbench/tui/sample_screen.py)."""
        from workbench.tui.sample_screen import SampleScreen, refusal

        why = refusal(self.run)
        if why:
            self.notify(why, severity="warning", markup=False)
            return
        self.app.push_screen(SampleScreen(self.store, self.run_id, self.lock))


def _lm_first(run: Run, name: str) -> int:
    """Where a result goes in the side panel: a language model's eval loss, perplexity and
    bits per byte first (:data:`LM_RESULTS`), the rest as stored (a stable sort's key)."""
    if run.task == "lm" and name in LM_RESULTS:
        return LM_RESULTS.index(name)
    return len(LM_RESULTS)


def wrap_fields(fields: list[Text], width: int | None) -> Text:
    """``fields`` joined by :data:`FIELD_GAP`, a line break before any field that would cross
    ``width`` (None: one line), so a field is never cut in two (``eval bpb`` at a line's end,
    its value on the next)."""
    out, used = Text(), 0
    for f in fields:
        n = len(f.plain)
        if used and width and used + len(FIELD_GAP) + n > width:
            out.append("\n")
            used = 0
        elif used:
            out.append(FIELD_GAP)
            used += len(FIELD_GAP)
        out.append_text(f)
        used += n
    return out


def eval_table(run: Run, results: dict[str, dict[str, float | None]]):
    """An evaluation run's numbers as a table, one line per task and metric: the value with
    lm-eval's standard error beside it where it has one (``0.600 ± 0.245``), and the
    documents scored; what the run view shows instead of (empty) curves."""
    from rich.table import Table

    tasks = [t for t in (run.spec.get("eval") or {}).get("tasks", []) if t]
    sets = sorted((k for k in results if k), key=lambda k: (k not in tasks, tasks.index(k) if k in tasks else 0, k))
    if not sets:
        waiting = {"pending": "waiting for the run to start...", "running": "no task finished yet..."}
        return Text(waiting.get(run.state, f"run {run.state} before any task finished"), style="dim")
    # one line per task (its documents), its metrics indented under it, short headers and
    # title (a title wraps at the table's width) and names folded rather than cut: at 80x24
    # the plots' place is 44 columns, and four columns side by side were cut to 'tiny_…',
    # 'word_perplexi…', 'value ± std…' and 'sampl…' (issue 42 items 4, 7)
    t = Table(title="lm-eval results", title_justify="left", expand=False,
              box=None, pad_edge=False, header_style="bold")
    t.add_column("task / metric", overflow="fold")
    t.add_column("value ± s.e.", justify="right", no_wrap=True)
    t.add_column("docs", justify="right", no_wrap=True)
    for eval_set in sets:
        values = results[eval_set]
        names = [k for k, v in values.items() if v is not None and k != "samples"
                 and not (k.endswith("_stderr") and k.removesuffix("_stderr") in values)]
        samples = values.get("samples")
        t.add_row(Text(eval_set, style="bold"), "", _figure("samples", samples) if samples is not None else "")
        for name in names:
            t.add_row(Text("  " + name), _figure(name, values[name], values.get(f"{name}_stderr")), "")
    return t


def _figure(name: str, value: float, stderr: float | None = None) -> str:
    """A result as the side panel shows it: counts (catalogue's: params, samples) as
    integers with thousands separators, accuracies (a fraction: 'accuracy', lm-eval's
    'acc', 'acc_norm') with three decimals (1.000 beside 0.997), other figures 5 digits;
    '± SE' after it where the run stored a standard error."""
    m = catalogue.get(name)
    if m is not None and m.count and float(value).is_integer():
        return f"{int(value):,}"
    frac = "accuracy" in name or (m is not None and m.unit == "fraction")
    shown = accuracy(value) if frac else number(value, 5)
    if stderr is not None:
        shown += f" ± {accuracy(stderr) if frac else number(stderr, 2)}"
    return shown


def config_text(run: Run) -> Text:
    """The run's spec as readable key: value lines (train settings indented)."""
    spec = dict(run.spec)
    out = Text()
    for k in ("profile", "model", "label", "model_options", "d_model", "n_layers", "task",
              "task_params", "seq_len", "seed"):
        if k in spec and not (k == "seq_len" and spec[k] is None):  # (an evaluation run has no length)
            out.append(f"{k}: ", style="bold")
            out.append(f"{_short(spec[k])}\n")
    train = spec.get("train") or {}
    if train:
        out.append("train:\n", style="bold")
        for k, v in train.items():
            if v is None:  # unset optional settings (e.g. epochs when steps are given)
                continue
            out.append(f"  {k}: {_short(v)}\n")
    ev = spec.get("eval") or {}  # an evaluation run's lm-eval settings (its tasks first)
    if ev:
        out.append("eval:\n", style="bold")
        for k, v in ev.items():
            if v not in (None, [], ""):
                out.append(f"  {k}: {_short(v)}\n")
    if run.info:
        out.append("info:\n", style="bold")
        for k, v in run.info.items():
            out.append(f"  {k}: {_short(v)}\n")
    if run.log_path:
        out.append("log: ", style="bold")
        out.append(run.log_path, style="dim")
    return out


def _short(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_short(x)}" for k, x in v.items()) or "{}"
    return str(v)
