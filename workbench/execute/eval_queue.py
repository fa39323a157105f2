"""Evaluation runs into the store and onto an executor: what ``ssm-workbench eval`` and the
TUI's evaluation form (workbench/tui/eval_form.py) both do once the specs are built
(workbench/spec/eval_profile.py, eval_spec.py). ``submit`` finds or adds the runs, ``sources``
reads the ``run:N`` models a Slurm job needs, ``start`` hands pending runs to the executor;
``queue`` is the three in order."""
from __future__ import annotations

import time


def submit(store, specs: list[dict], fresh: bool) -> tuple[list[int], list[str]]:
    """Runs for ``specs``: the store's own where it has them (finished: shown again;
    unfinished: requeued to go on at the next task), else new ones."""
    from workbench.spec.run_spec import spec_key
    from workbench.store.run import UNFINISHED

    ids, notes = [], []
    for s in specs:
        have = [] if fresh else [r for r in store.runs(profile=s["profile"])
                                 if r.spec.get("kind") == "eval" and spec_key(r.spec) == spec_key(s)]
        done = next((r for r in have if r.state == "finished"), None)
        going = next((r for r in have if r.state in ("pending", "running")), None)
        again = next((r for r in have if r.state in UNFINISHED), None)
        if done is not None:
            ids.append(done.id)
            notes.append(f"run {done.id}: {s['label']} was evaluated on these tasks already (--fresh to "
                         f"evaluate again)")
        elif going is not None:
            ids.append(going.id)
            notes.append(f"run {going.id}: {s['label']} is {going.state}; watching it")
        elif again is not None and store.requeue(again.id, {"eval": "next task", "requested": time.time()}):
            store.set_info(again.id, {"devices": s["eval"]["devices"]})  # this request's ranks (run_devices)
            ids.append(again.id)
            notes.append(f"run {again.id}: {s['label']} was {again.state}; it goes on at its next task")
        else:
            (rid,) = store.add_runs([s])
            ids.append(rid)
            notes.append(f"run {rid}: {s['label']} on {', '.join(s['eval']['tasks'])}")
    return ids, notes


def sources(store, specs: list[dict]) -> dict[str, dict]:
    """For a Slurm evaluation, each ``run:N`` model as read from the store now (its spec
    and checkpoint folder: workbench.train.eval_models.run_source): the job opens no store.
    A ModelRefError (no such run, not an lm run) before anything is queued."""
    from workbench.train.eval_models import run_id_of, run_source

    return {s["model"]: run_source(store.root, run_id_of(s["model"]))
            for s in specs if s["model"].startswith("run:")}


def start(store, ids: list[int], executor: str, slurm, sources: dict[str, dict]) -> None:
    """Hand the pending runs of ``ids`` to ``executor`` and start them, as
    workbench.execute.scheduler.submit does for a training profile (a Slurm run of
    ``run:N`` gets ``sources``' entry in its info as ``eval_source``)."""
    from types import SimpleNamespace

    from workbench.execute.executor import executor_named

    pending = [r for r in store.runs(ids=ids) if r.state == "pending"]
    if not pending:
        return
    for r in pending:
        if r.spec["model"] in sources:
            store.set_info(r.id, {"eval_source": sources[r.spec["model"]]})
    ex = executor_named(executor)
    ex.adopt(store, [r.id for r in pending], SimpleNamespace(slurm=slurm))
    ex.submit(store, [r.id for r in pending])


def queue(store, specs: list[dict], executor: str, slurm, fresh: bool = False) -> tuple[list[int], list[str]]:
    """``sources`` (Slurm only), ``submit`` and ``start`` in order: the run ids and a line per
    run. A ModelRefError (a ``run:N`` that is no lm run) comes before anything is queued."""
    found = sources(store, specs) if executor == "slurm" else {}
    ids, notes = submit(store, specs, fresh)
    start(store, ids, executor, slurm, found)
    return ids, notes
