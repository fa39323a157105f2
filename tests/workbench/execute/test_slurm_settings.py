"""The Slurm executor's settings and batch script (no Slurm needed): what a user writes in
``[slurm]`` becomes the #SBATCH lines they would have written, and bad settings are errors
that name the key."""
from __future__ import annotations

import pytest
import tomli_w

from workbench.spec import profile as profiles
from workbench.execute.slurm import SlurmSettings, job_script


def test_settings_become_sbatch_lines(tmp_path):
    s = SlurmSettings(partition="gpu", account="lab", qos="high", time="04:00:00", gpus_per_run=2,
                      cpus_per_run=8, mem="32G", extra=["--constraint=a100"], setup=["module load cuda"])
    text = job_script(7, s, tmp_path / "slurm" / "run-7", tmp_path, "ssmwb-p-7")
    lines = text.splitlines()
    sb = [l.removeprefix("#SBATCH ") for l in lines if l.startswith("#SBATCH ")]
    for flag in ("--partition=gpu", "--account=lab", "--qos=high", "--time=04:00:00", "--gpus=2",
                 "--cpus-per-task=8", "--mem=32G", "--constraint=a100", "--requeue",
                 "--signal=B:USR1@120", "--open-mode=append", "--job-name=ssmwb-p-7"):
        assert flag in sb, flag
    assert any(f.startswith("--output=") and f.endswith("run-7/slurm-%j.out") for f in sb)
    assert "module load cuda" in lines
    assert lines[-1].startswith("exec ") and f"-m workbench.train.worker --run-file {tmp_path} --run-id 7" in lines[-1]
    # no GPUs, no time limit: no --gpus and no signal (there is no limit to warn about)
    bare = job_script(1, SlurmSettings(gpus_per_run=0, requeue=False), tmp_path, tmp_path, "x")
    assert "--gpus" not in bare and "--signal" not in bare and "--no-requeue" in bare


@pytest.mark.parametrize("value, ok", [("30", True), (30, True), ("1:30:00", True), ("2-12:00:00", True),
                                       ("soon", False), ("1h", False)])
def test_time_limit_forms(value, ok):
    if ok:
        assert SlurmSettings(time=value).time == str(value)
    else:
        with pytest.raises(ValueError, match="MM, HH:MM:SS"):
            SlurmSettings(time=value)


def test_profile_executor_and_unknown_keys():
    base = {"schema_version": 1, "name": "p", "task": {"name": "mad_selective_copying"},
            "sweep": {"models": ["lstm"], "seq_lens": [64]}, "train": {"steps": 2}}
    p = profiles.loads(tomli_w.dumps(base))
    assert p.executor == "local"
    text = tomli_w.dumps({**base, "executor": "slurm"}) + '\n[slurm]\npartition = "gpu"\ntime = 04:00:00\n'
    p = profiles.loads(text)  # an unquoted TOML time is read as the string Slurm wants
    assert p.executor == "slurm" and p.slurm.partition == "gpu" and p.slurm.time == "04:00:00"
    with pytest.raises(profiles.ProfileError, match="partiton"):
        profiles.loads(tomli_w.dumps({**base, "slurm": {"partiton": "gpu"}}))
    with pytest.raises(profiles.ProfileError, match="executor"):
        profiles.loads(tomli_w.dumps({**base, "executor": "pbs"}))
    # a profile saved and loaded again keeps its executor and settings
    again = profiles.loads(profiles.dumps(p))
    assert again.executor == "slurm" and again.slurm == p.slurm
