"""Evaluation runs into the store and onto an executor: what ``ssm-workbench eval`` and the
TUI's evaluation form (workbench/tui/eval_form.py) both do once the specs are built
(workbench/spec/eval_profile.py, eval_spec.py). ``preflight`` checks the models before
anything is queued, ``submit`` finds or adds the runs, ``sources`` reads the ``run:N`` models
a Slurm job needs, ``start`` hands pending runs to the executor; ``queue`` is the four in order.

``preflight`` is where a bad model is refused in one line instead of failing in its run
seconds later: a ``run:N`` must exist, be an ``lm`` run and have finished (its kept weights
readable), unless ``allow_unfinished`` asks for its last checkpoint, which is then recorded
with its step (``eval_spec.at_checkpoint``: ``run:1@step660``, a run of its own, never the
run's result); a folder must be a whole checkpoint with a tokenizer that fits it
(models/checkpoint_check.py).

The checkpoint of a run still training is replaced every ``checkpoint_every`` steps, and an
evaluation may wait for a slot: ``submit`` keeps the step asked for as hard links to the
checkpoint folder's files (:func:`snapshot`; the checkpoint is replaced by a rename, so a
link keeps the old file's bytes; a copy where links are refused), and the evaluation loads
them (its info's ``eval_source``)."""
from __future__ import annotations

import time


class Refused(ValueError):
    """Models that cannot be evaluated, found before anything was queued: ``lines``, one
    line each (the message is the lines, one a line)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(dict.fromkeys(lines))
        super().__init__("\n".join(self.lines))


def preflight(store, specs: list[dict]) -> list[dict]:
    """``specs`` as they are to be queued, every model checked first (module doc); a
    :class:`Refused` naming every bad one. ``store`` (may be None when there is none:
    then no ``run:N`` exists) is read, never written. An evaluation of an unfinished run
    comes back as the evaluation of its checkpoint's step; one of a finished run asked
    with ``allow_unfinished`` comes back without it (the same run as without the flag)."""
    from pathlib import Path

    from models.checkpoint_check import folder_problems
    from workbench.train.eval_models import ModelRefError

    out, problems = [], []
    for s in specs:
        ref = s["model"]
        if ref.startswith("run:"):
            try:
                out.append(_run_model(store, s))
            except ModelRefError as e:
                problems.append(str(e))
            continue
        if Path(ref).expanduser().is_dir():
            problems += folder_problems(ref)
        out.append(s)
    if problems:
        raise Refused(problems)
    return out


def _run_model(store, s: dict) -> dict:
    """The spec of an evaluation of ``run:N`` (preflight's rules), or a ModelRefError."""
    from workbench.spec.eval_spec import at_checkpoint, finished_form
    from workbench.train import checkpoint
    from workbench.train.eval_models import ModelRefError, run_id_of

    ref = s["model"]
    rid = run_id_of(ref)
    r = store.get(rid) if store is not None else None
    if r is None:
        raise ModelRefError(f"model {ref}: no such run in {store.root if store is not None else 'the store (none here)'}")
    if r.spec.get("kind") == "eval" or r.task != "lm":
        raise ModelRefError(f"model {ref}: a {r.spec.get('kind', r.task)!r} run; only runs of the lm task are "
                            "language models lm-eval can score")
    # a run trained by a Slurm job keeps its files in the job's shared folder (as eval_models.run_source)
    files = (r.info or {}).get("slurm_shared") or str(store.root)
    if r.state == "finished":
        weights = checkpoint.weights_path(files, rid)
        if not weights.is_file():
            raise ModelRefError(f"model {ref} has no weights in the store: a finished lm run keeps {weights}; "
                                f"runs finished before this version kept none")
        try:
            checkpoint.read_header(weights)
        except checkpoint.CheckpointError as e:
            raise ModelRefError(f"model {ref}: {e}") from None
        return finished_form(s)
    last, step, damaged = checkpoint.path_for(files, rid), None, None
    if last.is_file():
        try:
            step = checkpoint.read_header(last).step
        except checkpoint.CheckpointError as e:
            damaged = str(e)
        if step is None and damaged is None:  # a format-1 file: its step is in the run's info
            step = ((r.info or {}).get("checkpoint") or {}).get("step")
    total = f" of {r.total_steps:,}" if r.total_steps else ""
    if not s["eval"].get("allow_unfinished"):
        at = f"its last checkpoint is at step {step:,}{total}" if step is not None else "it has no checkpoint"
        raise ModelRefError(f"model {ref} is {r.state}, not finished ({at}): its numbers would not be the run's; "
                            f"evaluate it once it has finished, or give --allow-unfinished ([eval] "
                            f"allow_unfinished = true) to score that checkpoint as {ref}@step{step if step is not None else 'N'}")
    if damaged:
        raise ModelRefError(f"model {ref}: {damaged}")
    if step is None:
        raise ModelRefError(f"model {ref} is {r.state} and has no checkpoint to score (train.checkpoint_every or "
                            f"train.checkpoint_minutes write one while it trains)")
    return at_checkpoint(s, step)


def submit(store, specs: list[dict], fresh: bool) -> tuple[list[int], list[str]]:
    """Runs for ``specs``: the store's own where it has them (finished: shown again;
    unfinished: requeued to go on at the next task), else new ones."""
    from workbench.spec.eval_spec import at_checkpoint
    from workbench.spec.run_spec import spec_key
    from workbench.store.run import UNFINISHED

    ids, notes = [], []
    for s in specs:
        source = None
        if s["eval"].get("checkpoint_step") is not None:  # an unfinished run's checkpoint: kept as it is now
            source, step = snapshot(store, s)
            if step != s["eval"]["checkpoint_step"]:  # it was replaced since preflight read it
                s = at_checkpoint(s, step)
        have = [] if fresh else [r for r in store.runs(profile=s["profile"])
                                 if r.spec.get("kind") == "eval" and spec_key(r.spec) == spec_key(s)]
        mid = [r for r in have if _scored_mid_training(r, s)]
        for r in mid:  # before this version an unfinished run:N was scored under the finished one's spec
            notes.append(f"run {r.id} scored {s['model']} at its checkpoint of step {_eval_step(r)} before the run "
                         f"had finished: not counted as its evaluation")
        have = [r for r in have if r not in mid]
        done = next((r for r in have if r.state == "finished"), None)
        going = next((r for r in have if r.state in ("pending", "running")), None)
        again = next((r for r in have if r.state in UNFINISHED), None)
        if done is not None:
            ids.append(done.id)
            notes.append(f"run {done.id}: {s['label']} was evaluated on these tasks already (--fresh to "
                         f"evaluate again)" + _outputs_note(done, s))
        elif going is not None:
            ids.append(going.id)
            notes.append(f"run {going.id}: {s['label']} is {going.state}; watching it")
        elif again is not None and store.requeue(again.id, {"eval": "next task", "requested": time.time()}):
            store.set_info(again.id, {"devices": s["eval"]["devices"]})  # this request's ranks (run_devices)
            ids.append(again.id)
            notes.append(f"run {again.id}: {s['label']} was {again.state}; it goes on at its next task")
        else:
            (rid,) = store.add_runs([s])
            if source is not None:
                store.set_info(rid, {"eval_source": source})
            ids.append(rid)
            notes.append(f"run {rid}: {s['label']} on {', '.join(s['eval']['tasks'])}")
    return ids, notes


def _outputs_note(r, s: dict) -> str:
    """What a finished run found again does not do: write lm-eval's files into an output
    folder it was not run with (the folder is not part of its identity, run_spec.spec_key)."""
    want = (s["eval"].get("output_path"), bool(s["eval"].get("log_samples")))
    had = (r.spec["eval"].get("output_path"), bool(r.spec["eval"].get("log_samples")))
    if want[0] is None or want == had:
        return ""
    where = f"into {had[0]}" if had[0] else "into no output folder"
    return f"; it wrote lm-eval's files {where}: --fresh writes them into {want[0]}"


def sources(store, specs: list[dict]) -> dict[str, dict]:
    """For a Slurm evaluation, each ``run:N`` model as read from the store now (its spec
    and checkpoint folder: workbench.train.eval_models.run_source): the job opens no store.
    A ModelRefError (no such run, not an lm run) before anything is queued."""
    from workbench.train.eval_models import run_id_of, run_source

    return {s["model"]: run_source(store.root, run_id_of(s["model"]))
            for s in specs if s["model"].startswith("run:")}


def start(store, ids: list[int], executor: str, slurm, sources: dict[str, dict]) -> None:
    """Hand the pending runs of ``ids`` to ``executor`` and start them, as
    workbench.execute.launch.submit does for a training profile (a Slurm run of
    ``run:N`` gets ``sources``' entry in its info as ``eval_source``)."""
    from types import SimpleNamespace

    from workbench.execute.dispatch import executor_named

    pending = [r for r in store.runs(ids=ids) if r.state == "pending"]
    if not pending:
        return
    for r in pending:
        if r.spec["model"] in sources and not (r.info or {}).get("eval_source"):  # a snapshot's is kept
            store.set_info(r.id, {"eval_source": sources[r.spec["model"]]})
    ex = executor_named(executor)
    ex.adopt(store, [r.id for r in pending], SimpleNamespace(slurm=slurm))
    ex.submit(store, [r.id for r in pending])


def queue(store, specs: list[dict], executor: str, slurm, fresh: bool = False) -> tuple[list[int], list[str]]:
    """``preflight``, ``sources`` (Slurm only), ``submit`` and ``start`` in order: the run ids
    and a line per run. A :class:`Refused` (each bad model in a line) or ModelRefError comes
    before anything is queued."""
    specs = preflight(store, specs)
    found = sources(store, specs) if executor == "slurm" else {}
    ids, notes = submit(store, specs, fresh)
    start(store, ids, executor, slurm, found)
    return ids, notes


def _eval_step(r) -> int | None:
    return ((r.info or {}).get("eval_model") or {}).get("step")


def _scored_mid_training(r, s: dict) -> bool:
    """Whether stored evaluation run ``r``, found for ``s`` (an evaluation of a finished
    ``run:N``, no checkpoint step in its spec), scored that run's resumable checkpoint
    instead of its final weights (its info's ``eval_model.weights`` is not
    ``weights.pt``): such an answer is not the run's evaluation."""
    from workbench.train import checkpoint

    if not s["model"].startswith("run:") or s["eval"].get("checkpoint_step") is not None:
        return False
    weights = ((r.info or {}).get("eval_model") or {}).get("weights")
    return bool(weights) and not str(weights).endswith(checkpoint.WEIGHTS_FILE)


def snapshot(store, s: dict) -> tuple[dict, int]:
    """The checkpoint folder of unfinished run ``s["model"]`` as it is now, kept for its
    evaluation: its files hard-linked (else copied) into ``snapshots/runN-stepS/`` beside
    the run's files, laid out as a store's checkpoint folder. Returns (the ``eval_source``
    that makes the evaluation load it, as eval_models.run_source reads a run; the step kept)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from workbench.train import checkpoint
    from workbench.train.eval_models import ModelRefError, run_id_of, run_source

    rid = run_id_of(s["model"])
    src = run_source(store.root, rid)
    live = checkpoint.folder(src["files_root"], rid)
    base = Path(src["files_root"]) / "snapshots"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".run{rid}-", dir=base))
    try:
        dest = checkpoint.folder(tmp, rid)
        dest.mkdir(parents=True)
        # the checkpoint first: the files beside it (its tokenizer) do not change as it trains
        names = sorted((f.name for f in live.iterdir() if f.is_file() and not f.name.startswith(".")),
                       key=lambda n: n != checkpoint.path_for(tmp, rid).name)
        for name in names:
            try:
                os.link(live / name, dest / name)
            except FileNotFoundError:
                continue
            except OSError:
                shutil.copy2(live / name, dest / name)
        try:
            step = checkpoint.read_header(checkpoint.path_for(tmp, rid)).step
        except checkpoint.CheckpointError as e:
            raise ModelRefError(f"model {s['model']}: {e}") from None
        if step is None:
            step = s["eval"]["checkpoint_step"]
        final = base / f"run{rid}-step{step}"
        if not final.exists():
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**src, "files_root": str(final)}, int(step)
