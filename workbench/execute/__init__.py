"""The execution layer: getting runs run. executor.py (the Executor interface), dispatch.py
(executor_for and the read-side sync), launch.py (submit a sweep, kill a run), scheduler.py
(LocalExecutor: the detached local scheduler, ``python -m workbench.execute.scheduler``),
slurm.py (SlurmExecutor), resume.py (unfinished runs back to pending), eval_queue.py
(evaluation runs queued and started). Imports spec, store, train and results, never cli or tui.
"""
