"""Data parallelism for one run: its ranks, their process group, the local launcher, and
how a rank's failure becomes the run's one-line error.

A run with ``train.devices = N > 1`` trains as N ranks, each a worker process with its own
device (a GPU, or a CPU slot), all holding the same model (DDP; with ``train.sharding =
"fsdp"`` each holds 1/N of it instead: workbench/train/sharded.py). Every rank builds the same
*global* batch of ``train.batch_size`` examples (same data order as one process: the task's
batch for this step, or the seeded epoch permutation) and trains on its shard of it (rank
r: the r-th of N contiguous slices). Gradients are *summed* across ranks (a DDP comm hook)
of a loss that each rank divides by the global batch's number of targets, so the update is
that of one process on the whole batch, to float round-off, whatever N is.

Who starts the ranks (:func:`from_env` reads which):

- ``self``: the local scheduler starts the worker as usual (one pid, the run's); that
  process is rank 0 and starts ranks 1..N-1 as its children (:class:`Launcher`) with
  torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``), in its own process group, so ``kill``'s signal reaches all of them.
- ``torchrun``: ``torchrun --nproc-per-node N -m workbench.train.worker ...`` sets that
  environment itself; the worker only reads it.
- ``srun``: a Slurm job's ``srun`` starts N tasks (workbench/execute/slurm.py); their
  ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` are the rank, world and local
  rank, and the job script exports ``MASTER_ADDR`` / ``MASTER_PORT``.

Only rank 0 writes: the store (or run file) rows, the checkpoints, the final results
(the worker gives ranks >= 1 a :class:`NullWriter`). Rank 0 evaluates; the others wait
for it at the step's agreement (:meth:`Group.agree`), a small all-reduce after every step
that makes every rank stop, checkpoint or finish at the same step.

A failing rank ends the run with one line naming it: a rank >= 1 that raises records its
error in the group's key-value store before exiting; the launcher sees a child's exit
code or signal; rank 0 meets a peer's death as a failed collective and reports whichever
of these it finds (:meth:`Group.failure`).
"""
from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from workbench.train.stop import RunFailed

FAILED_KEY = "ssmwb/failed/"  # + rank: a rank's one-line error, in the group's store
# a collective waits this long for a peer (rank 0 evaluates while the others wait at the
# step's agreement, so it must outlast the longest evaluation)
TIMEOUT = dt.timedelta(hours=2)
JOIN_TIMEOUT = dt.timedelta(minutes=10)  # for every rank to reach the rendezvous
NOTICE_S = 15.0  # a dead child not noticed by rank 0's main thread in this time: the launcher ends the run


@dataclass(frozen=True)
class Ranks:
    """Which rank this process is, of how many, and who started it."""

    rank: int
    world: int
    local_rank: int
    launcher: str  # "self", "torchrun" or "srun"
    addr: str = "127.0.0.1"  # rank 0's host and the port its rendezvous listens on
    port: int = 29500

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def pin(self, device: torch.device, key: str) -> torch.device:
        """This rank's device: on CUDA its own GPU (local rank, made current), refused in one
        line naming ``key`` (the setting that asked for the ranks) when the node shows fewer
        GPUs; any other device unchanged."""
        if device.type != "cuda":
            return device
        if self.local_rank >= torch.cuda.device_count():
            raise RunFailed(f"rank {self.rank} needs GPU {self.local_rank}, but this node shows "
                            f"{torch.cuda.device_count()} ({key} = {self.world})")
        torch.cuda.set_device(self.local_rank)
        return torch.device("cuda", self.local_rank)


def from_env(env: Mapping[str, str] = os.environ) -> Ranks | None:
    """This process's rank when it was started as one (torchrun's variables, or srun's with
    more than one task), else None (a plain worker)."""
    where = (env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")))
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        if world > 1:
            rank = int(env["RANK"])
            return Ranks(rank, world, int(env.get("LOCAL_RANK", rank)),
                         env.get("SSMWB_LAUNCHER", "torchrun"), *where)
    if int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in env and "MASTER_ADDR" in env:
        rank = int(env["SLURM_PROCID"])
        return Ranks(rank, int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)), "srun", *where)
    return None


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous shard of n examples: sizes differ by at most one,
    the larger first (the global batch is divisible by the ranks except an epoch's last)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- the group
class Group:
    """The run's process group, once every rank has joined (:meth:`join`)."""

    def __init__(self, ranks: Ranks, device: torch.device):
        import torch.distributed as dist

        self.ranks, self.device, self.dist = ranks, device, dist
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        # the rendezvous has its own, shorter limit: a rank whose peers never come (rank 0
        # found nothing to do, a rank died before joining under srun) fails in minutes
        rendezvous = dist.TCPStore(ranks.addr, ranks.port, ranks.world, is_master=ranks.rank == 0,
                                   timeout=JOIN_TIMEOUT)
        dist.init_process_group(self.backend, store=rendezvous, rank=ranks.rank, world_size=ranks.world,
                                timeout=TIMEOUT)
        # flags and Python objects go through gloo on the CPU (no device sync on a GPU run)
        self.control = dist.new_group(backend="gloo", timeout=TIMEOUT) if self.backend != "gloo" else None
        self.kv = rendezvous  # where a failing rank leaves its line (FAILED_KEY)

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world(self) -> int:
        return self.ranks.world

    def agree(self, *flags: bool) -> list[bool]:
        """Each flag true on any rank (one all-reduce of a few numbers on the CPU)."""
        t = torch.tensor([float(f) for f in flags], dtype=torch.float64)
        self.dist.all_reduce(t, group=self.control)
        return [bool(v > 0) for v in t.tolist()]

    def gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's copy of ``t`` (a device tensor), in rank order."""
        out = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t.contiguous())
        return out

    def gather_objects(self, obj) -> list:
        out: list = [None] * self.world
        self.dist.all_gather_object(out, obj, group=self.control)
        return out

    def say_failed(self, line: str) -> None:
        """Record this rank's error where rank 0 finds it (best effort: the group may be gone)."""
        try:
            self.kv.set(f"{FAILED_KEY}{self.rank}", line)
        except Exception:
            pass

    def failure(self) -> str | None:
        """The first recorded error of a rank other than this one, if any."""
        for r in range(self.world):
            if r == self.rank:
                continue
            key = f"{FAILED_KEY}{r}"
            try:
                if self.kv.check([key]):
                    return self.kv.get(key).decode(errors="replace")
            except Exception:
                return None
        return None

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass


def sum_gradients(group, bucket):
    """DDP comm hook: sum the ranks' gradients (DDP's default averages them). Each rank's
    loss is already divided by the global batch's targets, so the sum is the gradient of
    the global batch's mean loss, as in one process."""
    import torch.distributed as dist

    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def shard_loss(logits: torch.Tensor, targets: torch.Tensor, n_all: torch.Tensor, weight: float) -> torch.Tensor:
    """This rank's share of the global batch's mean cross-entropy: its targets' summed loss
    over ``n_all``, the global batch's number of targets. logits (b, L, C) or (b, C);
    targets (b, L) or (b,), -100 where no loss is taken (as tasks.metrics.loss)."""
    import torch.nn.functional as F

    from tasks.metrics import IGNORE

    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                            ignore_index=IGNORE, reduction="sum")
    return total * weight / n_all


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` under DistributedDataParallel with summed gradients. DDP broadcasts rank
    0's parameters and buffers at construction, so every rank starts from the same ones."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    # buffers are the same on every rank (same init, no batch statistics in the registry's
    # models): no broadcast before each forward
    try:
        ddp = DDP(model, device_ids=ids, forward_sync_buffers=False)
    except TypeError:  # torch before forward_sync_buffers
        ddp = DDP(model, device_ids=ids, broadcast_buffers=False)
    ddp.register_comm_hook(None, sum_gradients)
    return ddp


class NullWriter:
    """The writer of ranks >= 1: every write is dropped (rank 0 alone writes the run's rows)."""

    def __init__(self, root):
        self.root = root

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


# --------------------------------------------------------------------------- the local launcher
def _die_with_parent() -> None:
    """In a child rank, before exec: die when rank 0 does (Linux; elsewhere a dead rank 0
    still ends the others through their next failed collective)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Launcher:
    """Rank 0's side of a run that starts its own ranks (``self``): ranks 1..N-1 are this
    process's children, running the same worker command with torchrun's environment.

    A watcher thread notices a child that ends with a non-zero code: :attr:`failure` says
    which rank and how, in one line. Rank 0's main thread normally meets the same death as
    a failed collective at once and reports it; if it does not within ``NOTICE_S`` (it
    may be waiting for ranks to join), ``on_stuck(line)`` ends the run from the thread."""

    def __init__(self, world: int, argv: list[str], env: Mapping[str, str] | None = None,
                 device_type: str = "cpu", on_stuck: Callable[[str], None] | None = None):
        self.world, self.on_stuck = world, on_stuck
        self.port = free_port()
        self.failure: str | None = None
        self.ending = False  # rank 0 is stopping or done: children's exits are expected
        self.children: dict[int, subprocess.Popen] = {}
        base = dict(os.environ if env is None else env)
        base.update({"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port),
                     "SSMWB_LAUNCHER": "self", "PYTHONUNBUFFERED": "1"})
        for r in range(1, world):
            child_env = {**base, "RANK": str(r), "LOCAL_RANK": str(r)}
            self.children[r] = subprocess.Popen(
                [sys.executable, "-u", "-m", "workbench.train.worker", *argv], env=child_env,
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self._watch = threading.Thread(target=self._watcher, name="rank-watcher", daemon=True)
        self._watch.start()

    def rank0(self) -> Ranks:
        """This process's place in the group: rank 0 (its environment is left as it is)."""
        return Ranks(0, self.world, 0, "self", "127.0.0.1", self.port)

    def _check(self) -> str | None:
        for r, p in self.children.items():
            code = p.poll()
            if code is not None and code != 0 and not self.ending:
                return f"rank {r} of {self.world} (pid {p.pid}) {describe_exit(code)}"
        return None

    def _watcher(self) -> None:
        seen = None
        while not self.ending:
            line = self._check()
            if line and self.failure is None:
                self.failure, seen = line, time.monotonic()
            if seen is not None and time.monotonic() - seen > NOTICE_S and not self.ending:
                if self.on_stuck:
                    self.on_stuck(self.failure)
                return
            time.sleep(0.2)

    def wait_failure(self, within_s: float = 3.0) -> str | None:
        """A child's failure, waiting up to ``within_s`` for it to show (rank 0 met a
        failed collective: the peer that broke it is usually exiting right then)."""
        deadline = time.monotonic() + within_s
        while self.failure is None and time.monotonic() < deadline:
            line = self._check()
            if line:
                self.failure = line
                break
            time.sleep(0.05)
        return self.failure

    def stop(self, grace_s: float = 10.0) -> None:
        """Let the children end (they finish with rank 0), then terminate any left."""
        self.ending = True
        deadline = time.monotonic() + grace_s
        for p in self.children.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self.children.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
