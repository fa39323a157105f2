import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    d = tmp_path / "store"
    monkeypatch.setenv("SSM_WORKBENCH_STORE", str(d))
    return d
