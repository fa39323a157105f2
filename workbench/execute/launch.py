"""Starting and stopping runs, whichever executor runs them: :func:`submit` queues a
profile's sweep and hands its runs to the profile's executor (the local scheduler,
:mod:`workbench.execute.scheduler`, or Slurm); :func:`kill` cancels a run through its own.

:func:`submit` is idempotent: replaying a profile skips its finished runs and requeues the
unfinished ones (resumed from their checkpoints, workbench/execute/resume.py) instead of
adding them again. Resumed runs are ordinary pending runs for the executor; the worker does
the resuming.

The ``run`` command, the TUI's sweep form (its ``scheduler``: this module by default) and
``kill`` call these. Above :mod:`workbench.execute.dispatch` and
:mod:`workbench.execute.resume`, which this module imports and which import it back never.
"""
from __future__ import annotations

from workbench.execute import resume
from workbench.execute.dispatch import executor_for, executor_named
from workbench.execute.scheduler import resolve_runs_per_gpu
from workbench.store import Store


class Submission(list):
    """The run ids of a submitted sweep, in sweep order (what ``run`` watches), and what
    submitting did with each: ``queued`` new runs, ``resumed`` from a checkpoint,
    ``restarted`` from scratch (unfinished, no checkpoint), ``skipped`` (already finished),
    ``attached`` (already pending or running), ``refused`` ((id, reason): could not be
    requeued, e.g. its worker is still exiting, or it holds its final results although it
    did not finish: those are never deleted)."""

    def __init__(self):
        super().__init__()
        self.queued: list[int] = []
        self.resumed: list[int] = []
        self.restarted: list[int] = []
        self.skipped: list[int] = []
        self.attached: list[int] = []
        self.refused: list[tuple[int, str]] = []
        # finished lm runs whose corpus changed since they trained: (old id, why), trained
        # again as new runs; ``data_note`` says so in one line (None when none)
        self.data_changed: list[tuple[int, str]] = []
        self.data_note: str | None = None


def submit(store: Store, profile, jobs: int | None = None, runs_per_gpu: int | None = None,
           fresh: bool = False) -> Submission:
    """Queue the runs of ``profile``'s sweep and make sure a scheduler serves them.

    Replaying is idempotent: a run of the sweep that the store already holds (same profile
    name, same spec: :func:`checkpoint.spec_key`) is not added again. Finished ones are
    skipped, pending or running ones watched, and the others requeued: resumed from their
    checkpoint, or restarted when they have none. A crashed run that holds its final
    results counts as finished (:meth:`Store.recognise_finished`); any other unfinished
    one holding them is refused: no replay deletes results. ``fresh`` adds every run anew.

    ``runs_per_gpu``: the command-line value; None falls back to the profile's, then 1.
    (A scheduler already serving this store keeps its own setting for these runs.)"""
    from workbench.spec.expand import expand
    from workbench.spec.run_spec import spec_key

    specs = [spec.to_dict() for spec in expand(profile)]
    out = Submission()
    if fresh:
        out.queued = store.add_runs(specs)
        out.extend(out.queued)
    else:
        store.reap()  # a dead 'running' run counts as unfinished, not as going
        for r in store.runs(profile=profile.name, states=["crashed"]):
            # measured everything, then its end was lost (a verdict while it was paused):
            # finished, so skipped below and never trained again over its results
            store.recognise_finished(r.id)
        have: dict[str, list] = {}
        for r in store.runs(profile=profile.name):
            if (r.info or {}).get("superseded_by"):  # trained on a corpus since changed
                continue
            have.setdefault(spec_key(r.spec), []).append(r)
        data_now, replaced = _DataCheck(), []
        order: list[int | None] = []  # an existing run's id, or None for a new one
        new = []
        for s in specs:
            r = _best_match(have.get(spec_key(s), []))
            why = data_now(r) if r is not None and r.state == "finished" else None
            if why:  # its results are the old corpus's: the spec is trained again, as a new run
                have[spec_key(s)].remove(r)
                out.data_changed.append((r.id, why))
                replaced.append(len(order))  # where the new run's id will stand in ``out``
                r = None
            if r is None:
                new.append(s)
                order.append(None)
                continue
            have[spec_key(s)].remove(r)  # one existing run answers one spec
            order.append(r.id)
            if r.state == "finished":
                out.skipped.append(r.id)
            elif r.state in ("pending", "running"):
                out.attached.append(r.id)
            else:
                try:
                    how = resume.requeue(store, r.id, require_checkpoint=False)
                except resume.ResumeError as e:
                    out.refused.append((r.id, str(e)))
                    continue
                (out.resumed if how == "resumed" else out.restarted).append(r.id)
        out.queued = store.add_runs(new)
        fresh_ids = iter(out.queued)
        out.extend(i if i is not None else next(fresh_ids) for i in order)
        if out.data_changed:
            _supersede(store, profile.name, out, [out[i] for i in replaced])
    executor = executor_named(getattr(profile, "executor", None))
    executor.adopt(store, out.queued + out.resumed + out.restarted, profile)
    executor.submit(store, out.queued + out.resumed + out.restarted + out.attached, jobs,
                    resolve_runs_per_gpu(runs_per_gpu, profile))
    return out


class _DataCheck:
    """Whether a finished ``lm`` run's corpus still holds what it trained on (its info's
    ``data`` fingerprint, tasks/lm/fingerprint.py), one line when not; each distinct task
    setting's source is fingerprinted once per replay (a stat per file while unchanged)."""

    def __init__(self):
        self.now: dict[str, str | None] = {}

    def __call__(self, r) -> str | None:
        recorded = (r.info or {}).get("data")
        if r.task != "lm" or not isinstance(recorded, dict) or not recorded.get("fingerprint"):
            return None  # not an lm run, or one trained before fingerprints were kept
        import json

        from tasks.lm import fingerprint

        params = r.spec.get("task_params") or {}
        key = json.dumps(params, sort_keys=True, default=str) + recorded["fingerprint"]
        if key not in self.now:
            self.now[key] = fingerprint.changed(params, recorded)
        return self.now[key]


def _supersede(store: Store, profile: str, out: Submission, new_ids: list[int]) -> None:
    """Mark each finished run whose corpus changed with the new run that trains its spec
    again (info ``superseded_by``: later replays match the new run, not the old one), and
    say so in ``out.data_note``, one line for the profile."""
    for (old_id, why), new_id in zip(out.data_changed, new_ids):
        store.set_info(old_id, {"superseded_by": {"run": new_id, "why": why}})
    whys = list(dict.fromkeys(why for _, why in out.data_changed))
    more = f" (and {len(whys) - 1} other source(s))" if len(whys) > 1 else ""
    out.data_note = (f"profile {profile}: {whys[0]}{more}; finished run(s) "
                     f"{', '.join(str(i) for i, _ in out.data_changed)} trained again as new "
                     f"run(s) {', '.join(map(str, new_ids))}")


def _best_match(runs: list):
    """The existing run that stands for a spec: a finished one, else one pending or running,
    else the latest that ended unfinished."""
    for states in (("finished",), ("pending", "running")):
        found = [r for r in runs if r.state in states]
        if found:
            return found[-1]
    return runs[-1] if runs else None


def kill(store: Store, run_id: int, grace_s: float = 5.0) -> bool:
    """Kill a pending or running run through its executor. Returns False if it had already
    ended. A local run is marked ``killed`` first; its worker then finishes the step it is
    in and saves a checkpoint (so ``resume`` can continue it) unless that takes over
    ``grace_s``. A Slurm run's job is scancelled."""
    r = store.get(run_id)
    if r is None:
        raise KeyError(f"no run {run_id}")
    return executor_for(r).cancel(store, run_id, grace_s)
