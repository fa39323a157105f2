"""The execution layer: getting runs run. scheduler.py (the detached local scheduler,
``python -m workbench.execute.scheduler``, submit and kill), slurm.py (the Slurm executor),
resume.py (unfinished runs back to pending). Imports spec, store, train and results, never
cli or tui.
"""
