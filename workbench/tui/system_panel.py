"""The system panel of a run: GPU memory/utilisation from NVML where the worker had a
driver, otherwise CPU % and process memory on one line, from the ``system`` rows the
worker writes.

A run that is not running writes no samples: its panel then says how old the last one is
and that it is not live (:func:`age_note`); so does a running run's panel when its samples
stopped coming (more than ``STALE_S`` old)."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from workbench.tui.formatting import duration, set_text

STALE_S = 30.0  # a running run's worker samples every few seconds: older is worth saying


def age_note(last_t: float | None, state: str | None, now: float | None = None) -> str | None:
    """'last sample 3m05s ago: the run is killed, nothing is measured now' for a run that
    is not running, 'last sample 45s ago' for a running run whose samples stopped coming,
    else None (a live sample)."""
    if last_t is None:
        return None
    age = (time.time() if now is None else now) - last_t
    if state is not None and state != "running":
        return f"last sample {duration(age)} ago: the run is {state}, nothing is measured now"
    if age > STALE_S:
        return f"last sample {duration(age)} ago: no new samples"
    return None


def _get(row: Any, key: str) -> Any:
    """row[key], or None where the row has no such column (a store without it)."""
    try:
        return row[key]
    except (IndexError, KeyError):
        return None


def _has_gpu(row: Any) -> bool:
    return row["gpu_mem_total_mb"] is not None or row["gpu_name"] is not None


class SystemPanel(Vertical):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nvml_note = ""  # why there are no GPU figures, from sysmon.nvml_status()

    def compose(self) -> ComposeResult:
        yield Static("System", classes="panel-title")
        yield Static("no samples yet", id="sys-text")
        yield Sparkline([], id="sys-spark", summary_function=max)

    def show(self, rows: Sequence[Any], run: Any = None) -> None:
        """rows: the run's latest ``system`` rows, oldest first; ``run``: the run (its
        state says whether the samples are live)."""
        text = self.query_one("#sys-text", Static)
        spark = self.query_one("#sys-spark", Sparkline)
        if not rows:
            set_text(text, Text("no system samples yet" + (f"\n{self.nvml_note}" if self.nvml_note else ""),
                             style="dim"))
            if spark.data:
                spark.data = []
            spark.display = False  # an empty sparkline draws a misleading flat line
            return
        spark.display = True
        last = rows[-1]
        out = Text()
        note = age_note(_get(last, "t"), getattr(run, "state", None))
        if note:
            out.append(note + "\n", style="bold yellow")
        if _has_gpu(last):
            used, total = last["gpu_mem_used_mb"], last["gpu_mem_total_mb"]
            own = _get(last, "gpu_proc_mem_mb")  # this run's worker alone, when NVML lists it
            out.append(f"{last['gpu_name'] or 'GPU'}\n", style="bold")
            if own is not None and used is not None and total:
                out.append(f"this run: {own:,.0f} MiB · GPU: {used:,.0f} / {total:,.0f} MiB "
                           f"({100 * used / total:.0f}%)\n")
            elif used is not None and total:
                out.append(f"GPU memory {used:,.0f} / {total:,.0f} MiB ({100 * used / total:.0f}%)\n")
            if last["gpu_util"] is not None:
                out.append(f"GPU utilisation {last['gpu_util']:.0f}%\n")
            out.append("utilisation, last samples:", style="dim")
            data = [r["gpu_util"] or 0.0 for r in rows]
        else:
            # one line (issue 42 item 4: five lines of it pushed a run's results down at
            # 80x24); why NVML found no GPU is `ssm-workbench doctor`'s to say in full
            parts = []
            if last["cpu_percent"] is not None:
                parts.append(f"CPU {last['cpu_percent']:.0f}%")
            if last["rss_mb"] is not None:
                parts.append(f"process memory {last['rss_mb']:,.0f} MiB")
            out.append(" · ".join(parts) + (" · " if parts else ""))
            out.append("No NVIDIA GPU (CPU % below)", style="yellow")
            data = [r["cpu_percent"] or 0.0 for r in rows]
        set_text(text, out)
        if list(spark.data or []) != data:  # a new sample arrived
            spark.data = data
