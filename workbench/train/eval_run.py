"""An evaluation run: lm-evaluation-harness tasks on one model, as a run of the store.

``ssm-workbench eval`` adds a run whose spec has ``kind = "eval"`` (:func:`eval_spec`); the
local scheduler starts the usual worker for it, which hands it to :func:`run_eval`, so an
evaluation is queued, shown, killed and resumed like a training run. The run

- loads the model (workbench/train/eval_models.py) and wraps it in the adapter
  (workbench/train/lm_eval_adapter.py);
- runs the tasks one at a time through ``lm_eval.simple_evaluate``, with a
  ``TaskManager`` that also knows the task folders given (lm-eval YAML + local data files,
  its ``include_path``);
- after each task, stores that task's numbers as results under eval set = the task's name
  (a group stores one eval set per member task): lm-eval's metric names (``acc``,
  ``acc_norm``, ``perplexity``, ``word_perplexity``, ``bits_per_byte``, ...) with their
  standard errors as ``<metric>_stderr``, and ``samples`` (documents scored); a filter other
  than ``none`` is appended as ``<metric>/<filter>``;
- records each finished task and the eval sets it wrote in its info (``eval_done``,
  ``eval_sets``) and its progress as step = tasks done of total_steps = tasks: a run stopped
  (killed, preempted) and resumed goes on at the first task whose results it does not hold;
- at the end stores run-level ``wall_s`` and ``params`` under eval set ``""`` and finishes;
- with ``eval.output_path`` writes lm-eval's own files per task through lm-eval's
  EvaluationTracker (:func:`write_outputs`: ``results_<date>.json``, and with
  ``eval.log_samples`` the per-document ``samples_<task>_<date>.jsonl``), as lm-eval's CLI does;
- lm-eval's ``git describe`` (the ``git_hash`` of its results) is asked with git's stderr
  discarded (:func:`quiet_git_hash`): no ``fatal: not a git repository`` in the log per task.

So ``export --metric acc``, ``report`` (a profile's ``[[published]]`` with ``eval_set`` =
the task) and the Results tab read these numbers like any others.

With ``eval.devices = N > 1`` the worker starts N ranks as for training
(workbench/train/distributed.py: rank 0 the scheduler's worker, ranks 1..N-1 its children;
or torchrun / srun), each joins the group first (:func:`join`: its device, gloo on the CPU,
nccl on a GPU, the group's timeouts) and loads the model; lm-eval gives each rank every N-th
document and gathers the per-document metrics to rank 0 (workbench/train/lm_eval_adapter.py),
which alone writes the run's rows. Rank 0 decides which tasks are done and tells the others,
so every rank runs the same tasks; the numbers equal one rank's (tests/workbench/cli/test_lm_eval_ranks.py).
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Any

from workbench.train.stop import RunFailed

from workbench.spec.eval_spec import DEFAULTS, KIND, TASK, eval_spec  # noqa: F401 (re-exported)


def metrics_of(values: dict[str, Any]) -> dict[str, float | None]:
    """lm-eval's ``{"acc,none": v, "acc_stderr,none": se, "alias": ...}`` -> ``{"acc": v,
    "acc_stderr": se}`` (a filter other than ``none`` kept as ``acc/<filter>``); "N/A" -> None."""
    out: dict[str, float | None] = {}
    for key, v in values.items():
        if "," not in key:
            continue  # alias, sample counts
        metric, _, filt = key.partition(",")
        name = metric if filt == "none" else f"{metric}/{filt}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v) if math.isfinite(v) else None
        elif v is None or v == "N/A":  # a standard error lm-eval could not compute
            out[name] = None
    return out


@contextmanager
def quiet_git_hash():
    """lm-eval records ``git describe`` of the current folder in its results (``git_hash``,
    lm_eval/loggers/utils.py ``get_git_commit_hash``, called by ``simple_evaluate`` through
    the name lm_eval.evaluator imported): outside a git repository git prints ``fatal: not a
    git repository`` on the inherited stderr, once per task in an evaluation run's log. Within
    this block that name asks git the same question with its stderr discarded (the hash
    recorded is the same; lm-eval's files are untouched), and is restored after."""
    import subprocess

    import lm_eval.evaluator as evaluator

    real = evaluator.get_git_commit_hash

    def quiet() -> str | None:
        try:
            out = subprocess.run(["git", "describe", "--always"], capture_output=True, check=False)  # noqa: S607
        except OSError:  # no git on this machine
            return None
        return out.stdout.decode().strip() if out.returncode == 0 else None

    evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = real


def output_tracker(cfg: dict):
    """lm-eval's EvaluationTracker writing into ``cfg["output_path"]`` (None when the
    evaluation asked for no output folder): the files ``lm_eval --output_path DIR
    [--log_samples]`` writes, made by lm-eval's own code (:func:`write_outputs`)."""
    if not cfg.get("output_path"):
        return None
    from lm_eval.loggers import EvaluationTracker

    return EvaluationTracker(output_path=str(cfg["output_path"]))


def write_outputs(tracker, res: dict, model: str) -> list[str]:
    """One task's ``results_<date>.json`` (and with log_samples its
    ``samples_<task>_<date>.jsonl``) under ``<output_path>/<model, sanitized>/``, as lm-eval's
    CLI writes them (lm_eval/_cli/run.py: ``save_results_aggregated`` then
    ``save_results_samples`` per task of ``configs``). The model's folder is named from its
    reference (``run:3`` -> ``run__3``, a folder's path as lm-eval's ``pretrained=`` path):
    simple_evaluate names a model object ``CUSTOM`` with a random name. The paths written."""
    from pathlib import Path

    from lm_eval.utils import sanitize_model_name

    general = tracker.general_config_tracker
    general.model_name = model
    general.model_name_sanitized = sanitize_model_name(model)
    res = dict(res)
    samples = res.pop("samples", None)
    tracker.save_results_aggregated(results=res, samples=samples)
    folder = Path(tracker.output_path) / general.model_name_sanitized
    written = [folder / f"results_{tracker.date_id}.json"]
    for name in res.get("configs", {}) if samples else ():
        tracker.save_results_samples(task_name=name, samples=samples[name])
        written.append(folder / f"samples_{name}_{tracker.date_id}.jsonl")
    missing = [str(p) for p in written if not p.is_file()]
    if missing:  # lm-eval logs a failure to write as a warning and goes on: a run says so
        raise RunFailed(f"lm-eval could not write {', '.join(missing)} (eval.output_path {tracker.output_path})")
    return [str(p) for p in written]


def task_manager(tasks: list[str], include: list[str]):
    """lm-eval's TaskManager for ``tasks``: the given folders' alone when they hold every
    task (indexing lm-eval's own ~15,000 task files takes 10-50 s), else with lm-eval's."""
    from lm_eval.tasks import TaskManager

    if include:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return TaskManager(include_path=include or None)


def _stop_in_this_process_only(stop) -> dict:
    """SIGTERM/SIGUSR1 handlers that stop this process and leave forked helpers alone:
    lm-eval bootstraps standard errors in a ``multiprocessing`` pool whose workers inherit
    the handlers, and the pool ends them with SIGTERM; a Stopped raised there hung the pool.
    Returns the previous handlers."""
    import os
    import signal

    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked helper: die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stop.handler(signum, frame)

    return {sig: signal.signal(sig, handler) for sig in stop.SIGNALS}


def bootstrap_pools_from_a_clean_process() -> None:
    """lm-eval bootstraps standard errors (perplexity, F1, ...) in a ``multiprocessing.Pool``.
    Under the default start method on Linux (fork), each pool worker is a fork of this
    process, which runs threads (the heartbeat, the system sampler, tqdm's monitor, OpenMP
    and allocator threads): a worker forked while one of them held a lock waits on it
    forever, and the pool's own ``terminate`` then waits on that worker (seen: an eval run
    hung at "bootstrapping for stddev: perplexity"). Pools now start from a forkserver, a
    fresh single-threaded process with lm-eval's metrics imported once; the resamples and
    their seeds are lm-eval's, so the numbers are the same."""
    import multiprocessing as mp

    if mp.get_start_method(allow_none=True) != "forkserver":
        mp.set_start_method("forkserver", force=True)
    mp.set_forkserver_preload(["lm_eval.api.metrics"])


def join(spec: dict, ranks):
    """(this rank's device, the group or None for one process). On several ranks the group
    is joined before anything else, so a rank that cannot start fails every rank's start
    (the rendezvous' limit, distributed.JOIN_TIMEOUT); each rank takes GPU ``local_rank``,
    or on the CPU its share of the cores."""
    import os

    import torch

    from workbench.train import distributed
    from workbench.train.measure import pick_device

    cfg = {**DEFAULTS, **(spec.get("eval") or {})}
    try:
        device = pick_device(cfg["device"], "eval.device")
    except ValueError as e:
        raise RunFailed(str(e)) from None
    if ranks is None:
        return device, None
    device = ranks.pin(device, "eval.devices")
    if device.type != "cuda" and "OMP_NUM_THREADS" not in os.environ:  # the scheduler's worker_env sets it; inline runs do not
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks.world))
    return device, distributed.Group(ranks, device)


def run_eval(store, run_id: int, spec: dict, stop, device=None, group=None, info: dict | None = None) -> str:
    """Evaluate the run's model on its tasks (module doc); returns a one-line summary.
    ``stop`` (a StopFlag) raises Stopped when a signal arrives; the tasks done stay done.
    On several ranks: ``device`` and ``group`` from :func:`join`; a rank >= 1 passes a
    NullWriter as ``store`` and the run's ``info`` as rank 0 read it."""
    import signal

    previous = _stop_in_this_process_only(stop)
    bootstrap_pools_from_a_clean_process()
    try:
        return _run_eval(store, run_id, spec, stop, device, group, info)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _run_eval(store, run_id: int, spec: dict, stop, device, group, info) -> str:
    import torch

    try:
        import lm_eval
    except ImportError:
        raise RunFailed("evaluation needs lm-evaluation-harness: pip install 'ssm-workbench[eval]'") from None
    from workbench.train import eval_models
    from workbench.train.lm_eval_adapter import WorkbenchLM

    t0 = time.time()
    cfg = {**DEFAULTS, **(spec.get("eval") or {})}
    if device is None:
        device, group = join(spec, None)
    leader = group is None or group.rank == 0
    for folder in cfg["include"]:
        from pathlib import Path
        if not Path(folder).is_dir():
            raise RunFailed(f"task folder {folder} does not exist")
    if info is None:
        info = (store.get(run_id).info or {}) if hasattr(store, "get") else {}
    try:
        # a Slurm job's run:N comes as read from the store at submission (info's eval_source)
        lm = eval_models.load(spec["model"], device, store_root=getattr(store, "root", None),
                              dtype=cfg["dtype"], max_length=cfg["max_length"], backend=cfg["backend"],
                              source=info.get("eval_source"))
    except eval_models.ModelRefError as e:
        raise RunFailed(str(e)) from None
    want = cfg.get("checkpoint_step")  # an unfinished run:N, asked for at this step (eval_spec.at_checkpoint)
    if want is not None and lm.info.get("step") != want:
        raise RunFailed(f"model {spec['model']}: its weights are at step {lm.info.get('step')} now, not the step "
                        f"{want} this evaluation was asked for (it trained on, or finished, since): evaluate it again")
    adapter = WorkbenchLM(lm, batch_size=int(cfg["batch_size"]), max_gen_toks=int(cfg["max_gen_toks"]),
                          group=group)
    manager = task_manager(cfg["tasks"], cfg["include"])
    unknown = [t for t in cfg["tasks"] if t not in manager.all_tasks]
    if unknown:  # `eval` and `run` check the names first (spec/lm_eval_tasks.py); a run queued by hand may not
        from workbench.spec import lm_eval_tasks

        raise RunFailed(lm_eval_tasks.describe({t: lm_eval_tasks.closest(t, manager.all_tasks) for t in unknown},
                                               cfg["include"]))
    # the tasks an earlier attempt finished count only when this attempt resumes it (info's
    # "resume", set by `resume`); a restart from scratch (resume None) has deleted their
    # results, and a first attempt has none: then every task runs. Read from the run's info,
    # not its results, so the worker uses only the RunWriter protocol (tests/workbench/store/test_writer.py)
    sets_of: dict[str, list[str]] = dict(info.get("eval_sets") or {}) if info.get("resume") else {}
    done = [t for t in (info.get("eval_done") or []) if t in cfg["tasks"] and sets_of.get(t)] \
        if info.get("resume") else []
    if group is not None:  # rank 0's list is the run's: every rank then runs the same tasks
        done = group.gather_objects(done)[0]
    store.set_info(run_id, {"eval_model": lm.info, "lm_eval_version": getattr(lm_eval, "__version__", "?"),
                            "max_length": lm.max_length})
    if group is not None:
        store.set_info(run_id, {"ranks": {"world": group.world, "launcher": group.ranks.launcher,
                                          "backend": group.backend}})
    tasks = cfg["tasks"]
    store.heartbeat(run_id, progress=len(done) / len(tasks), step=len(done), total_steps=len(tasks),
                    backend=lm.info.get("backend") or lm.info.get("kind"), device=str(device))
    if leader:
        ranks = f"; {group.world} ranks ({group.backend}), each scoring 1 document in {group.world}" if group else ""
        print(f"[eval] run {run_id}: {lm.name} ({lm.info.get('kind')}, {lm.info.get('params', 0):,} parameters, "
              f"max length {lm.max_length}) on {', '.join(tasks)}"
              f"{f'; {len(done)} done before' if done else ''}{ranks}", flush=True)
    beat = {"t": 0.0}

    def within(n: int, total: int) -> None:
        """The share of the current task's requests scored, as the run's progress (at most
        every 2 s: each heartbeat is a store write)."""
        if time.time() - beat["t"] >= 2.0 and total:
            beat["t"] = time.time()
            store.heartbeat(run_id, progress=(len(done) + n / total) / len(tasks))

    adapter.progress = within
    for task in tasks:
        if group is not None:
            # every rank at the same task and decision, or the run fails here: out of step,
            # lm-eval's collectives would pair unrelated calls or wait out the group's timeout
            plans = group.gather_objects(("task", task, task in done))
            if any(plan != plans[0] for plan in plans):
                raise RunFailed("ranks out of step: " + "; ".join(
                    f"rank {r} at {plan[1]} ({'done' if plan[2] else 'to run'})"
                    if isinstance(plan, tuple) and plan[:1] == ("task",) else f"rank {r} elsewhere ({plan!r:.60})"
                    for r, plan in enumerate(plans)))
        if task in done:
            continue
        stop.raise_if_set()
        t = time.time()
        tracker = output_tracker(cfg) if leader else None
        with torch.no_grad(), quiet_git_hash():
            res = lm_eval.simple_evaluate(
                model=adapter, tasks=[task], task_manager=manager, limit=cfg["limit"],
                num_fewshot=cfg["num_fewshot"], bootstrap_iters=int(cfg["bootstrap_iters"]),
                log_samples=bool(cfg.get("log_samples")), evaluation_tracker=tracker,
                random_seed=cfg["seed"], numpy_random_seed=1234 + cfg["seed"],
                torch_random_seed=1234 + cfg["seed"], fewshot_random_seed=1234 + cfg["seed"])
        if not leader:  # lm-eval aggregated this rank's share on rank 0, which stores it
            done.append(task)
            continue
        if res is None:
            raise RunFailed(f"lm-eval returned no results for {task}")
        if tracker is not None:
            for path in write_outputs(tracker, res, spec["model"]):
                print(f"[eval] run {run_id}: {task}: wrote {path}", flush=True)
        counts = res.get("n-samples", {})
        sets_of[task] = []
        for name, values in res["results"].items():
            m = metrics_of(values)
            if name in counts:
                m["samples"] = float(counts[name].get("effective", counts[name].get("original", 0)))
            if len(m) > ("samples" in m):
                store.set_results(run_id, m, eval_set=name)
                sets_of[task].append(name)
                shown = ", ".join(f"{k} {v:.4g}" for k, v in m.items() if v is not None and "stderr" not in k)
                print(f"[eval] run {run_id}: {name}: {shown}", flush=True)
        if not sets_of[task]:
            raise RunFailed(f"lm-eval gave no metrics for {task}")
        done.append(task)
        store.set_info(run_id, {"eval_done": done, "eval_sets": sets_of})
        store.heartbeat(run_id, progress=len(done) / len(tasks), step=len(done), total_steps=len(tasks))
        print(f"[eval] run {run_id}: {task} done in {time.time() - t:.1f} s", flush=True)
    generation = adapter.generation
    if group is not None:  # every rank generated for its own documents
        generation = {k: sum(g[k] for g in group.gather_objects(generation)) for k in generation}
    store.set_info(run_id, {"generation": generation})
    store.set_results(run_id, {"wall_s": time.time() - t0,
                               "params": float(lm.info.get("params", 0))}, eval_set="")
    return f"{lm.name}: {len(tasks)} task(s) in {time.time() - t0:.1f} s"
