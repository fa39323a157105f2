"""`ssm-workbench bench --match params=N | state_size=N`: the benchmark's models sized by
the solver of a profile's [sweep.match] (workbench.spec.match), the solved widths in the
table, the models it cannot size named with its own reason and the others measured."""
from __future__ import annotations

import json

import pytest

import models
from models.compute import param_counts
from workbench.cli import bench
from workbench.spec import match

SMALL = ["--seq-lens", "16", "--batch", "1", "--n-layers", "1", "--repeats", "1", "--warmup", "0"]
TARGET = 20_000


def _parse_md(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_each_model_is_measured_at_the_size_the_profile_solver_gives(capsys, bench_in_process):
    """The rows' widths are the solver's, and the built backbones meet the target within 2%."""
    rc = bench.main(["--models", "mamba,gated_deltanet,lstm", "--match", f"params={TARGET}",
                     "--d-model", "8", *SMALL, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = {r["model"]: r for r in doc["runs"]}
    assert set(rows) == {"mamba", "gated_deltanet", "lstm"}
    for name, row in rows.items():
        s = match.solve(name, "params", TARGET, d_model=8, n_layers=1, options={})
        solved = dict(s.solved)
        assert row["d_model"] == solved.pop("d_model") and row["d_model"] != 8
        assert all(row[k] == v for k, v in solved.items())  # the finer knob, where one was solved
        assert row["matched"] == s.got and row["match_err_%"] == round(100 * s.error, 2)
        built = models.build(name, d_model=row["d_model"], n_layers=1, **solved)
        assert abs(param_counts(built).non_embedding / TARGET - 1) <= match.TOLERANCE
        assert row["params"] == models.param_count(built)  # what was measured is that model
    assert doc["match"] == {"target": "params", "value": TARGET, "unmatched": []}


def test_unmatched_models_are_named_with_the_solvers_reason_and_the_others_measured(capsys, bench_in_process):
    rc = bench.main(["--models", "transformer,mamba,gated_mlp", "--match", "state_size=512",
                     "--d-model", "16", *SMALL])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = _parse_md(out)
    assert [r["model"] for r in rows] == ["mamba"]
    # the solved widths are columns: state_size keeps mamba's width and solves d_state
    assert {"d_model", "n_layers", "d_state", "matched", "match_err_%"} <= set(rows[0])
    s = match.solve("mamba", "state_size", 512, d_model=16, n_layers=1, options={})
    assert rows[0]["d_state"] == str(s.solved["d_state"]) and rows[0]["d_model"] == "16"
    notes = [ln for ln in out.splitlines() if ln.startswith("not matched: ")]
    reasons = {}
    for name in ("transformer", "gated_mlp"):
        with pytest.raises(match.MatchError) as e:
            match.solve(name, "state_size", 512, d_model=16, n_layers=1, options={})
        reasons[name] = str(e.value)
    assert notes == [f"not matched: {n}: {r}" for n, r in reasons.items()]  # one line each
    assert "matched: state_size = 512 (state floats per sequence)" in out


def test_nothing_left_to_measure_fails_and_csv_keeps_the_notes_apart(capsys, bench_in_process):
    rc = bench.main(["--models", "transformer", "--match", "state_size=512", *SMALL])
    out, err = capsys.readouterr()
    assert rc == 1 and "not matched: transformer: " in out
    rc = bench.main(["--models", "mamba,transformer", "--match", "state_size=512", "--d-model", "16",
                     *SMALL, "--format", "csv"])
    out, err = capsys.readouterr()
    assert rc == 0
    header, *lines = out.strip().splitlines()
    assert header.split(",")[:6] == ["model", "seq_len", "backend", "d_model", "n_layers", "d_state"]
    assert len(lines) == 1 and lines[0].startswith("mamba,")  # the CSV holds the table alone
    assert "not matched: transformer: " in err


@pytest.mark.parametrize("text,want", [("params=3200000", ("params", 3_200_000)),
                                       ("params=3.2M", ("params", 3_200_000)),
                                       ("state_size=64k", ("state_size", 64_000))])
def test_match_values(text, want):
    assert bench.build_parser().parse_args(["--match", text]).match == want


@pytest.mark.parametrize("argv,msg", [
    (["--match", "width=3"], "expected params=N or state_size=N"),
    (["--match", "params=lots"], "expected a whole number"),
    (["--match", "params=2.5"], "whole number"),
    (["--match", "params=1000", "--stream-tokens", "8"], "--stream-tokens does not take it"),
    (["--match", "params=1000", "--estimate"], "--estimate does not take it"),
])
def test_bad_match_arguments_are_one_line_errors(capsys, argv, msg):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(argv)
    assert msg in capsys.readouterr().err
