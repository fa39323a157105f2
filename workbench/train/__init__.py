"""The training layer: one run in one process. worker.py (the entry point, ``python -m
workbench.train.worker``: arguments, writer, signals, typed spec, sampler, the run's end),
trainer.py (the Trainer: training/eval loop and checkpoint state), loss_window.py (the
train loss kept on the device), rank_state.py (what a run on several ranks keeps beyond
one process's state), optim.py (optimiser and LR schedule), measure.py (step timing and
memory, shared with ``bench``), stop.py (how a run ends early), summary.py (run info and
final results), checkpoint.py (a run's checkpoint file), compose.py (task encoder +
registry backbone + task head), sysmon.py (GPU/CPU samples, the background Sampler, peak
memory). Imports spec, store and results, never execute, cli or tui.
"""
