"""The run's specification layer.

It will hold the profile schema and the run's typed spec (today in ``workbench.profile``);
for now it holds :mod:`workbench.spec.estimate`, the resource estimate a profile's runs
get before anything is queued.
"""
