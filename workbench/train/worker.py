"""The worker: one process per run, ``python -u -m workbench.train.worker --store DIR --run-id N``.

Started by the scheduler in its own session (so a closed terminal does not stop it), or
by a Slurm job with ``--run-file SHARED`` (rows go to a run file on the shared folder). It
is the only writer of its run's rows. This module is the entry: it parses the arguments,
opens the writer, installs the signal handlers, reads the run's typed spec
(``RunSpec.from_dict``), starts the system sampler (``sysmon.Sampler``: system rows at 1 Hz
and the heartbeat every ``HEARTBEAT_S``), hands the run to the :class:`Trainer`
(workbench/train/trainer.py), records the final results (workbench/train/summary.py) and the
terminal state (finished, or failed with one readable line: a RunFailed's message, or for
any other exception :func:`error_line`'s type, message and place, while the traceback goes
to the run's log), and asks Slurm to requeue a job near its time limit.

Checkpoints (workbench/train/checkpoint.py) are saved every ``train.checkpoint_every`` steps and
``train.checkpoint_minutes`` minutes, and on SIGTERM or SIGUSR1: inside the training loop the
signal only sets a flag, the current step finishes, the checkpoint is written and the run
ends ``preempted`` (or stays ``killed`` when ``kill`` sent the signal and marked it first).
A run whose info carries a ``resume`` marker loads its checkpoint and continues from it.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from workbench.spec.run_spec import RunSpec, run_devices, run_sharding, spec_key
from workbench.store import HEARTBEAT_S, Store, StoreError, full_disk_detail, is_disk_full
from workbench.store.runfile import RunFile
from workbench.train import checkpoint, distributed, sysmon, threads
from workbench.train.stop import RunFailed, StopFlag, Stopped
from workbench.train.summary import record_final, run_info
from workbench.train.trainer import Trainer


class SystemRows:
    """The system sampler's sink: a system row per sample and a heartbeat every
    ``HEARTBEAT_S``, on a store connection of the sampler thread's own (opened there at
    the first sample; a run file is shared, it locks its writes). A full disk is said
    once: the main thread meets it at its next write and records the run's end."""

    def __init__(self, store, run_id: int):
        self.main, self.run_id = store, run_id
        self.store = None
        self.last_beat = 0.0
        self.disk_full = False

    def __call__(self, s: dict) -> None:
        if self.store is None:
            self.store = Store(self.main.root) if isinstance(self.main, Store) else self.main
        self.store.add_system(self.run_id, s)
        if time.time() - self.last_beat >= HEARTBEAT_S:
            self.store.heartbeat(self.run_id)
            self.last_beat = time.time()

    def error(self, e: Exception) -> None:
        if is_disk_full(e):
            # until the main thread records it, say it once (the log may be on the full disk too)
            if not self.disk_full:
                _say(f"[worker] background sampling: disk full: {e}", err=True)
            self.disk_full = True
            return
        _say(f"[worker] background sampling error: {e}", err=True)


def start_sampler(store, run_id: int, interval: float = 1.0) -> sysmon.Sampler:
    rows = SystemRows(store, run_id)
    sampler = sysmon.Sampler(rows, interval, on_error=rows.error, at_start=True)
    sampler.start()
    return sampler


def _command(store) -> str:
    """The workbench's command in the hints a run's messages hold, as the user types it
    (``progress.command``: ``./run.sh`` when run.sh started the sweep, ``--store DIR`` for a
    store found elsewhere); a Slurm run's RunFile is in the shared folder, not the store,
    so it names no store."""
    from workbench.store.progress import command

    return command(store.root if isinstance(store, Store) else None)


def run(store_dir: str | None, run_id: int, run_file: str | None = None) -> int:
    """Run ``run_id`` of the store in ``store_dir``, or, with ``run_file`` (a Slurm job on
    another node), of the run file in that shared folder (workbench/store/runfile.py).
    A process started as rank >= 1 of a run on several devices trains without writing
    (:func:`run_peer`); rank 0, or a plain worker, goes on here."""
    ranks = distributed.from_env()
    if ranks is not None and not ranks.leader:
        return run_peer(store_dir, run_id, run_file, ranks)
    try:
        store = RunFile(run_file, run_id) if run_file else Store(store_dir)
    except (StoreError, OSError) as e:  # nothing can be recorded: the scheduler's check says crashed
        _say(f"[worker] run {run_id}: cannot open its store: {e}", err=True)
        return 2
    if getattr(store, "readonly", False):
        _say(f"[worker] run {run_id}: {store._refusal()}", err=True)
        return 2
    t_start = time.time()
    stop = StopFlag()
    previous = {sig: signal.signal(sig, stop.handler) for sig in StopFlag.SIGNALS}
    torch_threads = torch.get_num_threads()  # _set_cpu_threads may change it
    argv = ["--run-file", run_file] if run_file else ["--store", str(store_dir)]
    try:
        return _run(store, run_id, t_start, stop, argv + ["--run-id", str(run_id)])
    except Stopped as e:  # before the run started: nothing to save
        store.finish(run_id, "preempted", f"preempted ({signal.Signals(e.signum).name}) before it started")
        return 128 + e.signum
    except Exception as e:  # a full disk, met anywhere, even while recording another end
        if not is_disk_full(e):
            raise
        return _disk_full(store, run_id, e)
    finally:  # in-process callers (tests) get their handlers and thread count back
        for sig, h in previous.items():
            signal.signal(sig, h)
        torch.set_num_threads(torch_threads)


def _start_ranks(store, run_id: int, r, argv: list[str]) -> tuple[distributed.Ranks | None,
                                                                  distributed.Launcher | None]:
    """This process's rank (None: one process), and the launcher when it starts the others
    itself (workbench/train/distributed.py). Under torchrun or srun the ranks are given."""
    world = run_devices(r.spec, r.info)
    ranks = distributed.from_env()
    if ranks is not None:
        if ranks.world != world:
            key = "eval.devices" if r.spec.get("kind") == "eval" else "train.devices"
            raise RunFailed(f"started as {ranks.world} ranks ({ranks.launcher}), but the run asks for "
                            f"{world} ({key})")
        return ranks, None
    if world == 1:
        return None, None
    root = store.root

    def on_stuck(line: str) -> None:  # the watcher thread: rank 0 is stuck waiting for a dead rank
        try:
            writer = Store(root) if isinstance(store, Store) else store
            writer.finish(run_id, "failed", line)
            _say(f"[worker] run {run_id} failed: {line}")
        finally:
            for p in launcher.children.values():
                if p.poll() is None:
                    p.kill()
            os._exit(1)

    resume = "1" if (r.info or {}).get("resume") else "0"
    launcher = distributed.Launcher(world, argv, {**os.environ, "SSMWB_RESUME": resume}, on_stuck=on_stuck)
    print(f"[worker] run {run_id}: {world} ranks on this machine (rank 0 here, pid {os.getpid()}; "
          f"ranks 1-{world - 1}: pids {', '.join(str(p.pid) for p in launcher.children.values())})", flush=True)
    return launcher.rank0(), launcher


def _rank_failure(group, launcher, e: BaseException) -> str | None:
    """A peer rank's failure behind rank 0's error ``e`` (``group``: the run's
    distributed.Group, or None), as the run's one line, if any."""
    line = launcher.wait_failure() if launcher is not None else None
    said = group.failure() if group is not None else None
    if said and line:
        return f"{line}: {said.split(': ', 1)[-1]}"
    if line or said:
        return line or said
    lost = type(e).__name__ == "DistBackendError" or any(
        k in str(e) for k in ("by peer", "Connection reset", "Broken pipe"))
    if group is not None and lost:
        # a rank this process did not start (torchrun, srun) died without a word (a signal):
        # its launcher's own log names it
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return (f"another rank of {group.world} ({group.ranks.launcher}) stopped without "
                f"an error of its own (killed?); see {group.ranks.launcher}'s output: {first}")
    return None


def _run(store: Store, run_id: int, t_start: float, stop: StopFlag, argv: list[str] | None = None) -> int:
    # The scheduler records our pid right after starting us; wait for it so the first
    # heartbeat cannot race with the pending -> running transition.
    for _ in range(100):
        r = store.get(run_id)
        if r is None:
            print(f"run {run_id} does not exist", file=sys.stderr)
            return 2
        if r.state != "pending":
            break
        time.sleep(0.1)
    if r.state != "running":
        print(f"run {run_id} is {r.state}; nothing to do", file=sys.stderr)
        return 0
    if r.spec.get("kind") == "eval":  # an lm-eval run (workbench/train/eval_run.py)
        return _run_eval(store, run_id, r, stop, argv or [])
    bg = start_sampler(store, run_id)
    trainer = events = launcher = None
    try:
        try:
            spec = RunSpec.from_dict(r.spec)
            if r.info.get("sharding"):  # resume --sharding wins over the spec's
                spec.train.sharding = run_sharding(r.spec, r.info)
        except ValueError as e:
            raise RunFailed(f"cannot read the run's spec: {e}") from None
        ranks, launcher = _start_ranks(store, run_id, r, argv or [])  # several devices: rank 0's side
        # with train.tensorboard the rows also go to TensorBoard event files, live
        events = _live_events(store, run_id, r.spec) if spec.train.tensorboard else None
        writer = events or store  # what training and the final results write through
        trainer = Trainer(writer, run_id, spec, stop, key=spec_key(r.spec), ranks=ranks)
        if trainer.device.type == "cpu":
            _set_cpu_threads(spec, ranks.world if ranks else 1)
        trainer.attempt_start = t_start
        trainer.background = bg
        resumed = None
        if ranks is not None:
            store.set_info(run_id, {"ranks": {"world": ranks.world, "launcher": ranks.launcher,
                                              "backend": trainer.group.backend,
                                              "sharding": "fsdp" if trainer.fsdp else "ddp"}})
        if r.info.get("resume"):
            try:  # verified again here (resume did once): the file may have changed since
                ck = checkpoint.load_for_run(store.root, run_id, r.spec)
            except checkpoint.CheckpointError as e:
                raise RunFailed(f"cannot resume: {e}; `{_command(store)} resume --restart {run_id}` "
                                f"trains the run from step 0") from None
            check = ck.pop("_file", {}).get("check")
            trainer.restore(ck)
            dropped = writer.trim_after(run_id, ck["step"])  # the interrupted attempt's later rows
            resumed = {"step": ck["step"], "from_device": ck["device"], "metrics_dropped": dropped,
                       "time": time.time(), "check": check, "from_ranks": ck.get("ranks", 1),
                       "ranks": ranks.world if ranks else 1, "from_sharding": ck.get("sharding", "ddp"),
                       "sharding": "fsdp" if trainer.fsdp else "ddp"}
            print(f"[worker] run {run_id}: resuming from the checkpoint at step {ck['step']} "
                  f"({check}; {dropped} later metric rows dropped)", flush=True)
        dev = trainer.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        info = run_info(trainer)
        if resumed:
            info["resumed"] = r.info.get("resumed", []) + [resumed]
        if spec.task == "lm":  # the data it trains on, by content (shown by `show`, checked by replay)
            info["data"] = _data_identity(trainer.task, r.info.get("data"), resumed is not None)
        store.set_info(run_id, info)
        store.heartbeat(run_id, backend=trainer.model.backend, device=str(dev))
        print(f"[worker] run {run_id}: {r.label} on {r.task} L={r.seq_len} seed={r.seed} "
              f"device={dev} backend={trainer.model.backend} params={info['params_backbone']} "
              f"init={trainer.model.init_choice['init_scheme']}"
              f"{' tied' if trainer.model.init_choice['tie_embeddings'] else ''}", flush=True)

        out = trainer.train()
        summary = record_final(writer, run_id, trainer, out, trainer.gpu_util + bg.gpu_util,
                               trainer.gpu_mem + bg.gpu_mem, t_start)
        stop.defer = True  # all measured: a signal from here on changes nothing
        if not store.finish(run_id, "finished"):
            # killed at the last moment, or requeued to another worker while this one was
            # paused: the checkpoint may be what the run goes on from, so it stays
            now = store.get(run_id)
            print(f"[worker] run {run_id}: every result is recorded, but the run is "
                  f"{now.state if now else 'gone'} and was not marked finished; its checkpoint "
                  f"is kept: {summary}", flush=True)
            return 0
        if trainer.saved:  # a finished run needs no checkpoint (weights + optimizer: often GBs)
            checkpoint.remove(store.root, run_id)
            store.set_info(run_id, {"checkpoint": None})
        if spec.task == "lm":
            # a language model is worth evaluating later (`ssm-workbench eval run:N`): keep its
            # weights (a Slurm job's in its shared folder, where eval_models.run_source looks)
            try:
                size = checkpoint.save_weights(store.root, run_id, trainer.key, out["steps"],
                                               trainer.model.state_dict())
                store.set_info(run_id, {"weights": {"path": str(checkpoint.weights_path(store.root, run_id)),
                                                    "bytes": size}})
                checkpoint.save_tokenizer(checkpoint.tokenizer_folder(store.root, run_id), trainer.task)
            except Exception as e:  # the run is finished and recorded; only its later evaluation is lost
                _say(f"[worker] run {run_id}: its weights could not be kept: {e}", err=True)
        print(f"[worker] run {run_id} finished: {summary}", flush=True)
        return 0
    except Stopped as e:
        return _stopped(store, run_id, trainer, stop, e.signum)
    except RunFailed as e:
        store.finish(run_id, "failed", str(e))
        print(f"[worker] run {run_id} failed: {e}", flush=True)
        return 1
    except Exception as e:
        if is_disk_full(e):
            raise  # run() records it, with the space it frees first
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        group = trainer.group if trainer is not None else None
        peer = _rank_failure(group, launcher, e) if (launcher or group) else None
        if peer:  # a collective broke because another rank died: that rank's failure is the run's
            store.finish(run_id, "failed", peer)
            print(f"[worker] run {run_id} failed: {peer}", flush=True)
            return 1
        store.finish(run_id, "failed", error_line(e))  # the traceback: printed above, into the run's log
        return 1
    finally:
        bg.stop()
        # the group first: ranks still waiting in a collective (rank 0 failed alone) then
        # fail at once instead of at the launcher's deadline
        if trainer is not None and trainer.group is not None:
            trainer.group.close()
        if launcher is not None:
            launcher.stop(grace_s=10.0)
        if events is not None:  # closed with the hparams once the run's results are all in
            events.close(with_hparams=trainer is not None and trainer.out is not None)


def _live_events(store, run_id: int, spec: dict):
    """The writer wrapped so that metric rows and results also become TensorBoard events
    (workbench/results/tensorboard.py); without tensorboardX the run fails in one line."""
    from workbench.results.tensorboard import LiveEvents, TensorBoardMissing

    try:
        live = LiveEvents(store, run_id, spec)
    except TensorBoardMissing as e:
        raise RunFailed(f"train.tensorboard = true: {e}") from None
    print(f"[worker] run {run_id}: TensorBoard events in {live.events_dir}", flush=True)
    return live


def _run_eval(store, run_id: int, r, stop: StopFlag, argv: list[str]) -> int:
    """An evaluation run: its tasks one by one, each one's results kept as it ends, so a
    stopped run resumes at the first task it has not finished. With eval.devices = N > 1
    this process is rank 0 and starts the others as for training (:func:`_start_ranks`)."""
    from workbench.train.eval_run import join, run_eval

    bg = start_sampler(store, run_id)
    group = launcher = None
    try:
        ranks, launcher = _start_ranks(store, run_id, r, argv)
        device, group = join(r.spec, ranks)
        summary = run_eval(store, run_id, r.spec, stop, device, group)
        stop.defer = True
        store.finish(run_id, "finished")
        print(f"[worker] run {run_id} finished: {summary}", flush=True)
        return 0
    except Stopped as e:
        name = signal.Signals(e.signum).name
        done = (store.get(run_id).info or {}).get("eval_done") or []
        store.finish(run_id, "preempted", f"preempted ({name}) after {len(done)} task(s); "
                                          f"`{_command(store)} resume {run_id}` goes on from the next")
        return 128 + e.signum
    except RunFailed as e:
        store.finish(run_id, "failed", str(e))
        print(f"[worker] run {run_id} failed: {e}", flush=True)
        return 1
    except Exception as e:
        if is_disk_full(e):
            raise
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        peer = _rank_failure(group, launcher, e) if (launcher or group) else None
        if peer:  # a collective broke because another rank died: that rank's failure is the run's
            store.finish(run_id, "failed", peer)
            print(f"[worker] run {run_id} failed: {peer}", flush=True)
            return 1
        store.finish(run_id, "failed", error_line(e))  # the traceback: printed above, into the run's log
        return 1
    finally:
        bg.stop()
        if group is not None:  # first, so ranks waiting in a collective fail at once
            group.close()
        if launcher is not None:
            launcher.stop(grace_s=10.0)


def _data_identity(task, before: dict | None, resuming: bool) -> dict:
    """What the run trains on (tasks/lm/fingerprint.py: source, content fingerprint, token
    cache key, tokenizer, tokens per split). A resumed run whose corpus changed since it
    started is refused: its weights so far were trained on the other text."""
    from tasks.lm.fingerprint import data_identity

    now = data_identity(task)
    if resuming and before and before.get("fingerprint") not in (None, now["fingerprint"]):
        raise RunFailed(f"cannot resume: the corpus {now['source']!r} changed since the run started "
                        f"(fingerprint {before['fingerprint'][:12]} then, {now['fingerprint'][:12]} now); "
                        "`resume --restart` trains it from step 0 on the corpus as it is")
    return now


def _set_cpu_threads(spec: RunSpec, world: int = 1) -> None:
    """One thread for a small CPU run (workbench/train/threads.py says why); recorded in the
    run's info as ``torch_threads`` by run_info. On several ranks each judges its shard."""
    try:
        n, why = threads.cpu_threads(max(1, spec.train.batch_size // world), spec.seq_len, spec.d_model)
    except ValueError as e:
        raise RunFailed(str(e)) from None
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
        print(f"[worker] {n} CPU thread(s): {why}", flush=True)


def error_line(e: BaseException, limit: int = 600) -> str:
    """A run's stored error for an exception nobody turned into a message: its type, its
    message on one line, and where it was raised (the last frame, as ``folder/file.py:N``),
    e.g. ``SafetensorError: Error while deserializing header: ... (safetensors/torch.py:313)``.
    ``show`` and the TUI print this; the full traceback goes to the run's log (the worker
    prints it to stderr, which the scheduler and Slurm send there)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []
    where = ""
    if frames:
        parts = Path(frames[-1].filename).parts
        where = f" ({'/'.join(parts[-2:])}:{frames[-1].lineno}; traceback in the run's log)"
    return f"{type(e).__name__}: {text}{where}" if text else f"{type(e).__name__}{where}"


def _say(text: str, err: bool = False) -> None:
    """Print to the run's log, which may sit on a full disk: a line lost there must not
    stop the worker from recording how the run ended."""
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except OSError:
        pass


def _disk_full(store: Store, run_id: int, e: BaseException) -> int:
    """The disk under the store, the checkpoints or the log is full. The run ends
    ``failed`` with an error starting ``disk full`` (an unfinished state: ``resume`` goes on
    from its last checkpoint, which stays, once there is space). Recording that needs a
    little space itself: the background thread is stopped so it takes none, and the
    store's reserve file is deleted to make room; a shorter message is tried last."""
    for t in threading.enumerate():
        if isinstance(t, sysmon.Sampler) and t.stopped:
            t.join(timeout=10)
    try:
        ck = ((store.get(run_id).info or {}).get("checkpoint") or {})
    except Exception:
        ck = {}
    where = f"from its checkpoint at step {ck['step']}" if ck.get("step") is not None else "from the start"
    detail = full_disk_detail(e, store.root)
    msg = f"disk full: {detail}; free space there, then `{_command(store)} resume {run_id}` goes on {where}"
    store.release_reserve()
    for text in (msg, "disk full"):
        try:
            store.finish(run_id, "failed", text)
        except Exception as again:
            if not is_disk_full(again):
                raise
            continue
        _say(f"[worker] run {run_id} failed: {text}")
        return 1
    _say(f"[worker] run {run_id}: disk full, and its end could not be recorded: {detail}", err=True)
    return 1


def _stopped(store: Store, run_id: int, trainer: Trainer | None, stop: StopFlag, signum: int) -> int:
    """SIGTERM/SIGUSR1 ended the run. Training over but the run not finished (the signal
    came during the final evaluations): save the final state, so a resume only evaluates.
    Then mark the run ``preempted`` naming its checkpoint, unless ``kill`` marked it
    ``killed`` first (its checkpoint is resumable all the same)."""
    stop.defer = True  # a second signal must not cut the save short
    name = signal.Signals(signum).name
    if trainer is not None and trainer.out is not None and not (trainer.saved or {}).get("done"):
        try:
            trainer.save_checkpoint(trainer.out["steps"], trainer.out["stop_reason"], True)
        except Exception as e:  # the earlier checkpoint (if any) stays valid
            print(f"[worker] run {run_id}: final checkpoint failed: {e}", file=sys.stderr, flush=True)
    ck = (store.get(run_id).info or {}).get("checkpoint")
    if ck and Path(ck["path"]).is_file():
        msg = f"preempted ({name}): checkpoint at step {ck['step']}; `{_command(store)} resume {run_id}` continues"
    else:
        msg = f"preempted ({name}) before its first checkpoint"
    job = os.environ.get("SLURM_JOB_ID")
    if signum == signal.SIGUSR1 and job and ck and os.environ.get("SSMWB_REQUEUE_AT_TIME_LIMIT") == "1":
        # Slurm's warning before the time limit (--signal=B:USR1@N, workbench/execute/slurm.py): the
        # checkpoint is saved, so put this job back in the queue; its next attempt goes on
        # from the checkpoint instead of the run ending at the limit
        got = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        msg += ("; time limit near: Slurm job requeued" if got.returncode == 0 else
                f"; time limit near: scontrol requeue failed: {(got.stderr or got.stdout).strip()}")
    if not store.finish(run_id, "preempted", msg):
        msg = f"stopped ({name}) after it was marked {store.get(run_id).state}" + (
            f"; checkpoint at step {ck['step']}" if ck else "")
    print(f"[worker] run {run_id}: {msg}", flush=True)
    return 128 + signum


def _peer_view(store_dir: str | None, run_file: str | None, run_id: int):
    """(the run, the folder its checkpoint lies under, whether it resumes) as rank 0 sees
    them, read without writing anything: the store read-only, or a Slurm job's snapshot
    (a RunFile would log a start event). A Slurm job restarted by Slurm resumes when its
    checkpoint is there, as RunFile decides for rank 0; a self-started rank is told by its
    launcher (SSMWB_RESUME), which read the run before anything changed it."""
    import json

    from workbench.store import Run
    from workbench.store.runfile import SNAPSHOT, job_dir

    if run_file:
        r = Run(**json.loads((job_dir(run_file, run_id) / SNAPSHOT).read_text()))
        root = Path(run_file)
        resume = bool(r.info.get("resume")) or checkpoint.path_for(root, run_id).is_file()
    else:
        store = Store(store_dir, readonly=True)
        r = store.get(run_id)
        if r is None:
            raise RunFailed(f"run {run_id} does not exist")
        root, resume = store.root, bool(r.info.get("resume"))
    told = os.environ.get("SSMWB_RESUME")
    return r, root, (told == "1") if told is not None else resume


def run_peer(store_dir: str | None, run_id: int, run_file: str | None, ranks: distributed.Ranks) -> int:
    """Rank >= 1 of a run on several devices: read the run (never write it), train its shard
    in step with rank 0, and exit. Its errors go to the log and, in one line, to the group
    (rank 0 records the run's end). 0 when the run ended with rank 0 (finished, stopped)."""
    tag = f"rank {ranks.rank} of {ranks.world}"
    try:
        r, root, resume = _peer_view(store_dir, run_file, run_id)
        if r.spec.get("kind") == "eval":
            return _eval_peer(r, root, run_id, ranks, tag)
        spec = RunSpec.from_dict(r.spec)
        if r.info.get("sharding"):  # as rank 0 reads it
            spec.train.sharding = run_sharding(r.spec, r.info)
    except Exception as e:  # before the group: rank 0's launcher sees the exit code
        _say(f"[{tag}] run {run_id}: cannot read the run: {type(e).__name__}: {e}", err=True)
        return 1
    stop = StopFlag()
    for sig in StopFlag.SIGNALS:
        signal.signal(sig, stop.handler)
    trainer = None
    try:
        trainer = Trainer(distributed.NullWriter(root), run_id, spec, stop, key=spec_key(r.spec), ranks=ranks)
        if trainer.device.type == "cpu":
            _set_cpu_threads(spec, ranks.world)
        if resume:
            ck = checkpoint.load_for_run(root, run_id, r.spec)
            ck.pop("_file", None)
            trainer.restore(ck)
        trainer.train()
        return 0
    except Stopped:  # the ranks agreed to stop (rank 0 saved the checkpoint)
        return 0
    except BaseException as e:
        line = f"{tag}: {type(e).__name__}: {e}".splitlines()[0][:500]
        _say(f"[{tag}] run {run_id}: {traceback.format_exc()}", err=True)
        if trainer is not None and trainer.group is not None:
            trainer.group.say_failed(line)
        return 1
    finally:
        if trainer is not None and trainer.group is not None:
            trainer.group.close()


def _eval_peer(r, root, run_id: int, ranks: distributed.Ranks, tag: str) -> int:
    """Rank >= 1 of an evaluation run: score its share of each task's documents (rank 0
    gathers and stores the numbers), never writing the run."""
    from workbench.train.eval_run import join, run_eval

    stop = StopFlag()
    for sig in StopFlag.SIGNALS:
        signal.signal(sig, stop.handler)
    group = None
    try:
        device, group = join(r.spec, ranks)
        run_eval(distributed.NullWriter(root), run_id, r.spec, stop, device, group, info=r.info)
        return 0
    except Stopped:  # kill's signal reached every rank; rank 0 records it
        return 0
    except BaseException as e:
        line = f"{tag}: {type(e).__name__}: {e}".splitlines()[0][:500]
        _say(f"[{tag}] run {run_id}: {traceback.format_exc()}", err=True)
        if group is not None:
            group.say_failed(line)
        return 1
    finally:
        if group is not None:
            group.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.train.worker")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="the store's folder (a worker on this machine)")
    where.add_argument("--run-file", metavar="SHARED",
                       help="a shared folder holding slurm/run-ID/ (a Slurm job: rows go to a run file)")
    ap.add_argument("--run-id", type=int, required=True)
    a = ap.parse_args(argv)
    return run(a.store, a.run_id, a.run_file)


if __name__ == "__main__":
    sys.exit(main())
