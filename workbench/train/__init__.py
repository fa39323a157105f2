"""The training layer: one run in one process. worker.py (the entry point, ``python -m
workbench.train.worker``, and the Trainer), checkpoint.py (a run's checkpoint file),
compose.py (task encoder + registry backbone + task head), sysmon.py (GPU/CPU samples,
peak memory). Imports spec, store and results, never execute, cli or tui.
"""
