"""The shell scripts under scripts/ parse (`bash -n`): the GPU session kit (gpu-session.sh,
gpu-bench.sh, gpu-wheels.sh) runs only on machines CI never sees, so a syntax error there
would otherwise surface in the one device call it was meant for."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_gpu_kit_is_there():
    names = {p.name for p in SCRIPTS}
    assert {"gpu-session.sh", "gpu-bench.sh", "gpu-wheels.sh", "setup-env.sh"} <= names
