"""Fixtures of the end-to-end tests: the real one-node Slurm cluster (tests/slurm_cluster.py),
started once a session and shared by the tests that ask for it."""
import os

import pytest

from slurm_cluster import SlurmCluster, unavailable_reason as slurm_unavailable_reason


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node Slurm cluster (munged, slurmctld, slurmd; tests/slurm_cluster.py),
    started once and shared by the session's tests; pass ``slurm_cluster.env`` to sbatch,
    squeue, scontrol and scancel. Skips when Slurm/munge are not installed or not root;
    fails, with the daemons' logs, when they are but the node does not come up."""
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch):
    """Slurm's clients (called by workbench.execute.slurm) and the jobs find the test cluster;
    its jobs are cancelled after the test."""
    for k, v in slurm_cluster.env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    yield slurm_cluster
    slurm_cluster.cancel_all()
