"""Runs as TensorBoard event files, written with tensorboardX (no TensorFlow).

One folder per run, ``<root>/<profile>/<run folder>``, the folder named by the run's grid
point (:func:`run_folder_name`: label, task, length, seed, task setting and grid keys, then
the run id, which keeps two runs of one point apart), so ``tensorboard --logdir ROOT``,
``wandb sync --sync-tensorboard ROOT/<profile>/<folder>`` and aim's TensorBoard importer
show one run each. What a folder holds (the same whether exported or written live):

- every metric row of the store as a scalar: tag ``<split>/<name>`` (``train/loss``,
  ``train/lr``, ``eval/accuracy``, ``train/tokens_trained``, ...), the row's step as the
  global step and its time as the wall time;
- every final result as a scalar at the run's last step: ``results/<name>`` for the test
  set (eval set ''), ``results/<eval set>/<name>`` for the others (``valid``, ``len=1024``);
- the run's settings as TensorBoard hparams (the HParams tab, and what wandb reads as the
  config): model, task, seq_len, seed, d_model, n_layers and every grid key, with the
  test-set results as the session's metrics.

System samples (GPU/CPU utilisation) have no step and are not written.

``export`` (:func:`export_runs`) writes a run's folder whole: into a temporary folder beside
it, then renamed over the old one, so a folder exported again holds one copy of each point.
``train.tensorboard = true`` writes the same live through :class:`LiveEvents`, a wrapper of
the worker's writer: each metric row and result goes to the store and to the event file; a
resumed attempt starts its file with TensorBoard's purge step (the checkpoint's step + 1),
so the interrupted attempt's later points, dropped from the store, are dropped there too.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from workbench.store import Run

TB_EXTRA = "pip install 'ssm-workbench[tensorboard]'"
FOLDER = "tensorboard"          # <store>/tensorboard: live events and export's default root
LIVE_FLUSH_S = 5                # seconds between flushes of a live event file
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")
EVENT_PREFIX = "events.out.tfevents."


class TensorBoardMissing(ImportError):
    """tensorboardX is not installed; the message is one line with the install command."""


def summary_writer():
    """tensorboardX's SummaryWriter class, or :class:`TensorBoardMissing`."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise TensorBoardMissing(f"TensorBoard event files need tensorboardX: {TB_EXTRA}") from None
    return SummaryWriter


def default_root(store_root: str | Path) -> Path:
    """Where live events go and ``export --format tensorboard`` writes by default."""
    return Path(store_root) / FOLDER


def _safe(text: Any) -> str:
    return _UNSAFE.sub("_", str(text)).strip("_") or "_"


def run_folder_name(run_id: int, spec: dict) -> str:
    """The folder of one run, named by its grid point: ``mamba_mqar_L256_seed0_lr=0.001_run12``
    (label, task, ``L<seq_len>``, ``seed<seed>``, the task setting when not the baseline,
    each grid key by its last part, ``run<id>``); characters other than letters, digits and
    ``._=+-`` become ``_``."""
    parts = [spec.get("label") or spec.get("model"), spec.get("task")]
    if spec.get("seq_len") is not None:
        parts.append(f"L{spec['seq_len']}")
    parts.append(f"seed{spec.get('seed')}")
    setting = spec.get("task_setting")
    if setting and setting != "baseline":
        parts.append(setting)
    grid = spec.get("grid") or {}
    short = [k.rsplit(".", 1)[-1] for k in grid]
    for key, value in grid.items():
        # the key's last part unless two grid keys share it (train.lr and opt.lr)
        name = key.rsplit(".", 1)[-1] if short.count(key.rsplit(".", 1)[-1]) == 1 else key
        parts.append(f"{name}={value}")
    parts.append(f"run{run_id}")
    return "_".join(_safe(p) for p in parts)


def run_dir(root: str | Path, run_id: int, spec: dict) -> Path:
    """``root/<profile>/<run folder>``."""
    return Path(root) / _safe(spec.get("profile") or "profile") / run_folder_name(run_id, spec)


def metric_tag(split: str, name: str) -> str:
    return f"{split}/{name}"


def result_tag(eval_set: str, name: str) -> str:
    return f"results/{name}" if not eval_set else f"results/{eval_set}/{name}"


def hparams_of(spec: dict) -> dict[str, Any]:
    """The run's settings as TensorBoard hparams (numbers, strings and booleans only)."""
    fields = dict(spec.get("fields") or {})
    for k in ("model", "task", "seq_len", "seed", "d_model", "n_layers"):
        if k not in fields and spec.get(k) is not None:
            fields[k] = spec[k]
    fields["model"] = spec.get("label") or fields.get("model")
    fields.update(spec.get("grid") or {})
    return {k: v for k, v in fields.items() if isinstance(v, (bool, int, float, str))}


def _write_hparams(w, spec: dict, results: dict[str, float | None]) -> None:
    """The hparams summaries into ``w``'s own file (add_hparams would open a second folder)."""
    from tensorboardX.summary import hparams

    metrics = {result_tag("", k): v for k, v in results.items() if v is not None}
    for s in hparams(hparams_of(spec), metrics):
        w.file_writer.add_summary(s)


def _scalar(w, tag: str, value: float | None, step: int, walltime: float | None) -> None:
    if value is None:  # the store keeps a non-finite value as NULL; TensorBoard has no gap value
        return
    w.add_scalar(tag, float(value), global_step=int(step), walltime=walltime)


def _last_step(run: Run, metric_rows: list) -> int:
    steps = [int(r["step"]) for r in metric_rows]
    return max([run.step or 0, *steps])


def write_run(store, run: Run, folder: Path) -> None:
    """Every metric row, result and the hparams of ``run`` into a new event file in ``folder``."""
    SummaryWriter = summary_writer()
    rows = store.metrics(run.id)
    results = store.results([run.id]).get(run.id, {})
    last = _last_step(run, rows)
    w = SummaryWriter(logdir=str(folder), flush_secs=3600)
    try:
        for r in rows:
            _scalar(w, metric_tag(r["split"], r["name"]), r["value"], r["step"], r["t"])
        t_end = run.ended or run.heartbeat
        for eval_set in sorted(results):
            for name, value in sorted(results[eval_set].items()):
                _scalar(w, result_tag(eval_set, name), value, last, t_end)
        w.add_text("run", _run_text(run), global_step=last, walltime=t_end)
        _write_hparams(w, run.spec, results.get("", {}))
    finally:
        w.close()


def _run_text(run: Run) -> str:
    spec = json.dumps(run.spec, indent=1, sort_keys=True, default=str)
    return (f"run {run.id} of profile {run.profile}: {run.label} on {run.task}, state {run.state}"
            + (f", error: {run.error.splitlines()[0]}" if run.error else "")
            + "\n\n```\n" + spec + "\n```")


def export_runs(store, runs: Iterable[Run], root: str | Path) -> list[Path]:
    """One folder per run under ``root`` (see the module's docstring), each written whole:
    into a temporary folder beside it, then renamed over the previous one. Returns the
    folders. Raises :class:`TensorBoardMissing` without tensorboardX, OSError when a
    folder cannot be written (the previous folder, if any, is left as it was)."""
    summary_writer()
    out = []
    for run in runs:
        final = run_dir(root, run.id, run.spec)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            write_run(store, run, tmp)
            old = final.with_name(f".{final.name}.{os.getpid()}.old")
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        out.append(final)
    return out


class LiveEvents:
    """A run writer (:class:`workbench.store.writer.RunWriter`) that also writes the run's
    metric rows and results as TensorBoard events under ``root`` while it trains (the
    profile's ``train.tensorboard``); every other call goes to the wrapped writer unchanged.

    The event file is opened at the first row. A fresh attempt first removes the event
    files a previous attempt of the run left in its folder (a restart from step 0 drops
    that attempt's rows from the store too); a resumed one (the worker calls
    :meth:`trim_after` with the checkpoint's step) opens its file with purge step = that
    step + 1. Writing events never fails the run: an error is said once in the run's log and
    the events stop (the store keeps everything)."""

    def __init__(self, writer, run_id: int, spec: dict, root: str | Path | None = None):
        self._inner = writer
        self._run_id = run_id
        self._spec = spec
        self.events_dir = run_dir(root or default_root(writer.root), run_id, spec)
        self._w = None
        self._purge: int | None = None
        self._last = 0
        self._results: dict[str, float | None] = {}
        self._broken = False
        summary_writer()  # without tensorboardX the run fails at its start, in one line

    def __getattr__(self, name: str):  # everything else is the wrapped writer's
        return getattr(self._inner, name)

    def _events(self):
        if self._broken:
            return None
        if self._w is None:
            try:
                if self._purge is None and self.events_dir.is_dir():
                    for f in self.events_dir.glob(EVENT_PREFIX + "*"):
                        f.unlink()
                # tensorboardX names a file by the second and the host: an attempt that
                # starts within the second of the last one's must not write over its file
                self._w = summary_writer()(logdir=str(self.events_dir), purge_step=self._purge,
                                           flush_secs=LIVE_FLUSH_S,
                                           filename_suffix=f".{os.getpid()}.{time.time_ns()}")
            except Exception as e:
                self._fail(e)
        return self._w

    def _fail(self, e: Exception) -> None:
        self._broken = True
        try:
            from workbench.store.progress import command

            print(f"[worker] TensorBoard events stopped ({self.events_dir}): {type(e).__name__}: {e}; "
                  f"the store keeps every measurement (`{command()} export --format tensorboard` "
                  "writes them later)", file=sys.stderr, flush=True)
        except OSError:
            pass
        try:
            if self._w is not None:
                self._w.close()
        except Exception:
            pass

    def trim_after(self, run_id: int, step: int) -> int:
        n = self._inner.trim_after(run_id, step)
        self._purge, self._last = step + 1, step
        return n

    def add_metrics(self, run_id: int, rows, *args, **kwargs) -> None:
        rows = list(rows)
        self._inner.add_metrics(run_id, rows, *args, **kwargs)
        w = self._events()
        if w is None:
            return
        try:
            for step, _epoch, split, name, value in rows:
                _scalar(w, metric_tag(split, name), value, step, None)
                self._last = max(self._last, int(step))
        except Exception as e:
            self._fail(e)

    def set_results(self, run_id: int, values: dict[str, float | None], eval_set: str = "") -> None:
        self._inner.set_results(run_id, values, eval_set)
        if eval_set == "":
            self._results.update(values)
        w = self._events()
        if w is None:
            return
        try:
            for name, value in values.items():
                _scalar(w, result_tag(eval_set, name), value, self._last, None)
        except Exception as e:
            self._fail(e)

    def finish(self, run_id: int, state: str, error: str | None = None, **kwargs) -> bool:
        done = self._inner.finish(run_id, state, error, **kwargs)
        self.close(with_hparams=state == "finished")
        return done

    def close(self, with_hparams: bool = False) -> None:
        """Write the hparams (a finished run) and close the event file."""
        w = self._w if not self._broken else None
        if w is None:
            return
        try:
            if with_hparams:
                _write_hparams(w, self._spec, self._results)
            w.close()
        except Exception as e:
            self._fail(e)
        self._w = None
