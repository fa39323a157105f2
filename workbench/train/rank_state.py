"""What the Trainer keeps for a run on several ranks (workbench/train/distributed.py) beyond
one process's state, and the steps of its loop that only such a run takes.

- The rank's device and the group, joined when the Trainer is built, before anything else,
  so a rank that cannot start fails every rank's start (:class:`RankState`).
- This rank's shard of each global batch (:meth:`RankState.batch_shard`), and the train-loss
  window summed over the ranks at each read (:class:`RankLossTracker`).
- At a checkpoint, what rank 0 writes beyond its own state (:meth:`RankState.gather_for_checkpoint`):
  every rank's RNGs and, under FSDP, the whole model and optimizer state dicts gathered onto
  its CPU, so a checkpoint reads the same whatever ran it; on resume, each rank's RNGs
  (:func:`set_rngs`).
- Under FSDP (``train.sharding = "fsdp"``, workbench/train/sharded.py): the model sharded
  when training starts, and rank 0's plain replica of it, which rank 0 evaluates on (the
  ranks gather the weights into it before each evaluation) and, after the last step, goes
  on with as a one-process run (:meth:`RankState.unshard`).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from tasks import metrics as task_metrics
from workbench.train import checkpoint, distributed, sharded
from workbench.train.loss_window import LossTracker


class RankLossTracker(LossTracker):
    """The loss tracker of a run on several ranks. Each rank adds its shard's share of the
    step's loss (its targets' summed loss over the global batch's targets), so the step's
    loss is the sum over ranks; every read first combines the ranks (:meth:`merge`, a
    collective: all ranks read at the same steps), leaving the window's sum on rank 0."""

    def __init__(self, device: torch.device, group: distributed.Group):
        super().__init__(device)
        self.group = group

    def merge(self) -> None:
        """Rank 0's sum := the ranks' sum (others 0); the first non-finite step of any rank
        (and its value) on every rank, so every rank fails at the same read."""
        rows = torch.stack(self.group.gather(torch.stack([self.sum, self.bad_step, self.bad_value]))).tolist()
        bad = min(((s, v) for _, s, v in rows if s), default=(0.0, 0.0))
        self.sum.fill_(sum(r[0] for r in rows) if self.group.rank == 0 else 0.0)
        self.bad_step.fill_(bad[0])
        self.bad_value.fill_(bad[1])

    def check(self) -> None:
        self.merge()
        super().check()

    def flush(self) -> float:
        self.merge()
        return super().flush()

    def load(self, st: dict[str, float | int]) -> None:
        # a checkpoint holds the merged window (rank 0's); the others start theirs at 0
        super().load(st if self.group.rank == 0 else {**st, "sum": 0.0})


class RankState:
    """One rank of a run: its device, the group, and under FSDP rank 0's replica; between
    :meth:`gather_for_checkpoint` and :meth:`drop_gathered`, what the checkpoint needs
    from every rank (``rngs``; ``whole``, also kept on rank 0 after :meth:`unshard`)."""

    def __init__(self, ranks: distributed.Ranks, device: torch.device, sharding: str | None):
        self.device = device = ranks.pin(device, "train.devices")
        self.group = distributed.Group(ranks, device)
        self.lead = self.group.rank == 0
        # under FSDP the model is sharded per block when training starts; rank 0 evaluates
        # on a plain replica holding the whole weights
        self.fsdp = sharding == "fsdp"
        self.replica: nn.Module | None = None
        self.whole: tuple[dict, dict | None] | None = None  # gathered (model, optimizer) state dicts
        self.rngs: list | None = None  # every rank's RNGs, gathered at a checkpoint

    def batch_shard(self, x: torch.Tensor, y: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """This rank's shard of the global batch (x, y), the global batch's number of targets
        (the loss's divisor, so the ranks' losses sum to the global mean) and the shard's
        weight: 1, or 0 when an epoch's last batch has fewer examples than there are ranks
        (the rank then trains on one example with weight 0: DDP needs every rank's backward)."""
        n_all = (y != task_metrics.IGNORE).sum()
        a, b = distributed.shard_bounds(x.shape[0], self.group.world, self.group.rank)
        if a == b:
            return x[:1], y[:1], n_all, 0.0
        return x[a:b], y[a:b], n_all, 1.0

    # -- FSDP ------------------------------------------------------------------------
    def shard_model(self, model: nn.Module, store, run_id: int) -> None:
        """Shard ``model`` (on the CPU) per block across the ranks (every rank holds the
        same weights: the same seed, or the same checkpoint restored); rank 0 first keeps a
        plain replica on the CPU, for its evaluations and the final results, and records
        the sharding in the run's info."""
        whole = sharded.local_bytes(model)
        if self.lead:
            self.replica = copy.deepcopy(model)
        sharded.shard(model, self.device, self.group.world)
        if self.lead:
            held, n = sharded.local_bytes(model), len(sharded.units(model))
            store.set_info(run_id, {"fsdp": {"units": n, "param_bytes": whole, "param_bytes_rank0": held}})
            print(f"[worker] run {run_id}: fsdp over {self.group.world} ranks, {n} units: rank 0 holds "
                  f"{held / 2**20:.2f} of {whole / 2**20:.2f} MiB of parameters", flush=True)

    def gather_weights(self, model: nn.Module) -> None:
        """Every rank: gather the whole weights of the sharded ``model``; rank 0 loads them
        into its replica, on the device while it evaluates (:meth:`park_replica` puts it
        back on the CPU)."""
        weights, _ = sharded.full_state(model, None, self.lead)
        if self.lead:
            self.replica.load_state_dict(weights)
            self.replica.to(self.device)

    def park_replica(self) -> None:
        if self.fsdp and self.replica is not None and self.device.type != "cpu":
            self.replica.to("cpu")

    def unshard(self, model: nn.Module, opt: torch.optim.Optimizer) -> nn.Module:
        """After the last step, every rank: gather the whole model and optimizer state onto
        rank 0, which from here on is a one-process run (the final evaluations, the kept
        weights, a final checkpoint if a signal comes) on the replica, returned; the others
        are done (their ``model`` is returned as it is)."""
        self.whole = sharded.full_state(model, opt, self.lead)
        if not self.lead:
            self.whole = None
            return model
        self.replica.load_state_dict(self.whole[0])
        return self.replica.to(self.device)

    # -- checkpoints -----------------------------------------------------------------
    def gather_for_checkpoint(self, model: nn.Module, opt: torch.optim.Optimizer, losses: RankLossTracker) -> None:
        """Every rank, before rank 0 saves: the open loss window, whole, on rank 0; every
        rank's RNGs; under FSDP the whole state, gathered by every rank onto rank 0's CPU."""
        losses.merge()
        self.rngs = self.group.gather_objects(checkpoint.rng_state())
        if self.fsdp:
            self.whole = sharded.full_state(model, opt, self.lead)

    def drop_gathered(self) -> None:
        self.rngs = self.whole = None

    def checkpoint_fields(self) -> dict:
        """What a checkpoint holds beyond one process's: how many ranks, each one's RNGs
        (None after training: none is drawn then) and the sharding."""
        return {"ranks": self.group.world, "rng_ranks": self.rngs, "sharding": "fsdp" if self.fsdp else "ddp"}


def set_rngs(ck: dict, rank: int, seed: int, step: int) -> None:
    """A resumed run's RNGs: rank 0's as saved (one process's); rank r's own where the
    checkpoint has them (saved by as many ranks or more), else a stream of its own."""
    saved = ck.get("rng_ranks") or []
    if rank == 0:
        checkpoint.set_rng_state(ck["rng"])
    elif rank < len(saved):
        checkpoint.set_rng_state(saved[rank])
    else:
        checkpoint.set_rng_state(ck["rng"])
        torch.manual_seed(seed + 7919 * rank + 104729 * step)
