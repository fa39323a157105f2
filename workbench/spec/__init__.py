"""The run's specification layer: what a run is, before anything runs.

schema.py (the profile's pydantic models), profile.py (load/loads/save/dumps; the profile
API in one import), check.py (grid and registry checks), where.py (keys to lines),
expand.py (profile -> RunSpecs), run_spec.py (RunSpec, spec_key), compose_options.py,
estimate.py (resource estimate before launch), cost_probe.py (its measured model costs),
slurm_settings.py ([slurm] table).
Imports nothing of the workbench's other layers (cost_probe.py's use of the composed model
is the one exception; see tests/test_layering.py).
"""
