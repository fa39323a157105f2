"""Seams issue 23 closed around the TUI and the results layer: SQL only in the store
(workbench/store/queries.py), one table of run-state styles (workbench/store/states.py),
the sweep form's loader checks placed by key path (no TOML written and read again), the
app's poll through PollsStore."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_curves import sweep
from workbench.spec import profile as profiles
from workbench.spec.profile import Profile
from workbench.store import STATE_STYLES, STATES, Store, queries
from workbench.tui import form_checks
from workbench.tui.form_fields import field_for

ROOT = Path(__file__).resolve().parents[2]
SQL = re.compile(r"\bSELECT\b|\bINSERT\b|\bUPDATE\s+\w+\s+SET\b|\.execute(many)?\(")


def test_no_sql_outside_the_store():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in sorted((ROOT / "workbench").rglob("*.py")) if "store" not in p.relative_to(ROOT).parts[:2]
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if SQL.search(line)]
    assert hits == []


def test_queries_read_metric_rows_incrementally_and_say_what_was_logged(tmp_path):
    store = Store(tmp_path)
    a, b = sweep(store, models=("lstm",), seeds=(0, 1))
    store.add_metrics(a, [(1, None, "train", "loss", 2.0), (1, None, "train", "lr", 1e-3)])
    store.add_metrics(b, [(1, None, "eval", "loss", float("nan"))])  # stored as NULL
    rows = queries.metric_rows(store, [a, b], [("train", "loss"), ("eval", "loss")])
    assert [(r["run_id"], r["split"], r["name"]) for r in rows] == [(a, "train", "loss"), (b, "eval", "loss")]
    assert queries.metric_rows(store, [a, b], [("train", "loss")], after_rowid=rows[-1]["rowid"]) == []
    assert queries.metric_rows(store, [], [("train", "loss")]) == []
    assert queries.has_metric_values(store, [a], "train", "loss")
    assert not queries.has_metric_values(store, [b], "eval", "loss")  # only a NULL
    assert queries.logged_metrics(store, [a, b]) == ["eval.loss", "train.loss", "train.lr"]
    assert queries.newest_profile(store) == "cmp"
    assert queries.newest_profile(Store(tmp_path / "empty")) is None


def test_one_table_of_state_styles_for_every_state():
    from workbench.tui.formatting import state_text

    assert tuple(STATE_STYLES) == STATES
    assert len(set(STATE_STYLES.values())) == len(STATES)  # each state tells itself apart
    for s in STATES:
        assert str(state_text(s).style) == STATE_STYLES[s]
    from workbench.cli.common import STATE_STYLE    # the CLI's tables paint with the same

    assert STATE_STYLE == STATE_STYLES


def _form_profile(**model_options) -> Profile:
    """A profile as the form validates it (no registry checks yet)."""
    return Profile.model_validate({
        "schema_version": 2, "name": "form",
        "task": {"name": "mad_selective_copying", "vocab_size": 8, "num_tokens_to_copy": 2,
                 "num_train_examples": 64, "num_test_examples": 16},
        "sweep": {"models": ["transformer"], "seq_lens": [16], "seeds": [0]},
        "model": {"d_model": 8, "n_layers": 1, "options": model_options},
        "train": {"steps": 4, "batch_size": 4, "device": "cpu"}})


def test_registry_problems_name_the_key_path_without_writing_toml(monkeypatch):
    def no_toml(*a, **k):
        raise AssertionError("the form's checks must not go through a TOML text")

    monkeypatch.setattr(profiles, "dumps", no_toml)
    monkeypatch.setattr(profiles, "loads", no_toml)
    assert form_checks.registry_problems(_form_profile()) == []
    [(loc, msg)] = form_checks.registry_problems(_form_profile(transformer={"nope": 1}))
    assert loc[:3] == ("model", "options", "transformer") and "nope" in msg
    assert field_for(loc) == "model_options"
    assert "(line" not in msg


def test_registry_problems_place_a_grid_value_at_its_input():
    prof = _form_profile()
    prof.sweep.grid = {"train.weight_decay": [0.0, -1.0]}
    problems = form_checks.registry_problems(prof)
    assert problems and all(field_for(loc) == "grid_wd" for loc, _ in problems)
    assert "weight_decay" in problems[0][1]


@pytest.mark.parametrize("package", ["tui", "results"])
def test_modules_stay_under_600_lines(package):
    long = [p.name for p in (ROOT / "workbench" / package).glob("*.py")
            if len(p.read_text(encoding="utf-8").splitlines()) > 600]
    assert long == []
