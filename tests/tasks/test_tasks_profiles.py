"""The task profiles shipped in profiles/ validate and every run's task builds."""
from __future__ import annotations

from pathlib import Path

import pytest

import tasks

profile = pytest.importorskip("workbench.spec.profile")

ROOT = Path(__file__).resolve().parents[2] / "profiles"
MINE = ["selective-copying-paper", "mamba-table1-grid", "induction-heads",
        "induction-heads-attention", "mad-in-context-recall", "char-lm-shakespeare",
        "digits-image", "state-tracking-reduced"]


@pytest.mark.parametrize("name", MINE)
def test_profile_validates_and_tasks_build(name, tmp_path, monkeypatch):
    path = ROOT / f"{name}.toml"
    # profile.load builds the task; char-LM's data file is the user's (relative path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tinyshakespeare.txt").write_text("To be, or not to be. " * 400)
    monkeypatch.chdir(tmp_path)
    text = path.read_text()
    assert "REDUCED" in text or "Runs on CPU as is" in text      # says how it was reduced
    assert "Published" in text or "published" in text            # and what was published
    p = profile.load(path)
    specs = profile.expand(p)
    assert specs
    seen = []
    for s in specs:
        if (s.task, s.task_params) in seen:
            continue
        seen.append((s.task, s.task_params))
        task_name, params = s.task, dict(s.task_params)
        if task_name == "char_lm":   # the data file is the user's; use a stand-in
            f = tmp_path / "t.txt"
            f.write_text("To be, or not to be, that is the question. " * 200)
            params["path"] = str(f)
        t = tasks.build(task_name, **params)
        assert t.seq_len >= 1
