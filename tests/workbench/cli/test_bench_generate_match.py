"""``ssm-workbench bench --generate --match params=N | state_size=N`` (issue 43): the decoding
models sized by the training bench's solver and code path (workbench.cli.bench_models.match_size
over workbench.spec.match), the solved width reaching the model each config builds, the
generation table's match columns (Markdown, JSON, CSV, --from-table, the figure's legend), a
model the solver refuses named with the training bench's own message while the others run,
and bad input refused in one line. Tiny sizes; no time is asserted."""
from __future__ import annotations

import json

import pytest

import models
from models.compute import param_counts
from workbench.cli import bench
from workbench.cli.bench_generate import GENERATE_MATCH_COLUMNS, plan
from workbench.spec import match

TINY = ["--generate", "--d-model", "16", "--n-layers", "1", "--gen-tokens", "3", "--warmup", "1",
        "--vocab", "16", "--device", "cpu"]
TARGET = 20_000


def parse_md(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


@pytest.fixture
def built(monkeypatch):
    """Every backbone a --generate config builds (models.build spied on): (name, d_model, module)."""
    seen = []
    real = models.build

    def spy(name, **kw):
        m = real(name, **kw)
        seen.append((name, kw["d_model"], m))
        return m

    monkeypatch.setattr(models, "build", spy)
    return seen


def test_the_solved_width_reaches_each_built_decode_model(capsys, bench_in_process, built):
    rc = bench.main([*TINY, "--models", "transformer,mamba,gated_deltanet", "--match", f"params={TARGET}",
                     "--prompt-lens", "16", "--batch", "1,2", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = doc["generate"]
    assert [(r["model"], r["batch"]) for r in rows] == [(m, b) for m in ("transformer", "mamba", "gated_deltanet")
                                                        for b in (1, 2)]
    assert len(built) == len(rows)   # one decode model built per config
    for row, (name, d_model, module) in zip(rows, sorted(built, key=lambda t: [r["model"] for r in rows].index(t[0]))):
        assert row["model"] == name and row["d_model"] == d_model != 16
        # the model measured meets the target within the solver's tolerance, and is the solver's
        n = param_counts(module).non_embedding
        assert abs(n / TARGET - 1) <= match.TOLERANCE
        assert row["matched"] == n and row["match_err_%"] == round(100 * (n / TARGET - 1), 2)
        assert row["params"] == models.param_count(module)
        s = match.solve(name, "params", TARGET, d_model=16, n_layers=1, options={})
        assert row["d_model"] == s.solved["d_model"]
        assert all(row[k] == v for k, v in s.solved.items())   # the finer knob (gated_deltanet: expand_v)
    assert "expand_v" in rows[-1]
    assert doc["match"] == {"target": "params", "value": TARGET, "unmatched": []}


def test_the_grid_keeps_one_solved_width_per_model():
    """--grid axes: every config of a model at its one solved width (solved once, at the
    longest prompt's max_len), the models interleaved in time as without --match."""
    args = bench.build_parser().parse_args([*TINY, "--models", "transformer,mamba", "--grid", "axes",
                                            "--prompt-lens", "16,64", "--batch", "1,4", "--match", f"params={TARGET}"])
    specs = plan(args)
    assert [(s["model"], s["prompt_len"], s["batch"]) for s in specs] == [
        (m, p, b) for p, b in [(16, 1), (16, 4), (64, 1)] for m in ("transformer", "mamba")]
    for name in ("transformer", "mamba"):
        mine = [s for s in specs if s["model"] == name]
        s = match.solve(name, "params", TARGET, d_model=16, n_layers=1, options={})
        assert {x["d_model"] for x in mine} == {s.solved["d_model"]}
        assert all(x["match"] == {"matched": s.got, "match_err_%": round(100 * s.error, 2)} for x in mine)
    # the Transformer's cache still fits each config's own prompt
    assert [s["options"]["max_len"] for s in specs if s["model"] == "transformer"] == [20, 20, 68]


def test_the_generation_table_carries_the_match_columns(capsys, bench_in_process, tmp_path):
    argv = [*TINY, "--models", "mamba,gated_deltanet", "--match", f"params={TARGET}", "--prompt-lens", "16",
            "--batch", "1"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = parse_md(out)
    at = GENERATE_MATCH_COLUMNS.index("n_layers") + 1
    want = GENERATE_MATCH_COLUMNS[:at] + ["expand_v"] + GENERATE_MATCH_COLUMNS[at:]
    assert list(rows[0]) == want
    assert [r["model"] for r in rows] == ["mamba", "gated_deltanet"]
    assert f"matched: params = {TARGET:,} (non-embedding parameters), within 2%, by workbench.spec.match" in out
    # CSV: the same columns; --from-table reads them back (numbers as numbers) and redraws the
    # figure, each model's solved width in its legend entry
    assert bench.main([*argv, "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    assert csv_text.splitlines()[0] == ",".join(want)
    table = tmp_path / "gen.csv"
    table.write_text(csv_text)
    fig = tmp_path / "g.svg"
    assert bench.main(["--generate", "--from-table", str(table), "--figure", str(fig)]) == 0
    again = parse_md(capsys.readouterr().out)
    assert list(again[0]) == want and [r["d_model"] for r in again] == [r["d_model"] for r in rows]
    svg = fig.read_text()
    assert f"mamba (d_model {rows[0]['d_model']})" in svg and "sizes matched (within 2%)" in svg


def test_a_matched_json_table_redraws_with_its_target(tmp_path, capsys, monkeypatch):
    from workbench.cli import bench_tables

    monkeypatch.setattr(bench, "_run_subprocess", lambda spec, timeout: pytest.fail("--from-table measured"))
    rows = [{"model": m, "prompt_len": 16, "batch": b, "d_model": d, "n_layers": 1, "params": 1, "matched": 19900,
             "match_err_%": -0.5, "prefill_ms": 1.0, "decode_ms": 1.0, "tok_s": 10 * b, "state_bytes": 64,
             "peak_mib": 1.0, "extra_mib": 0.1, "backend": "torch", "device": "cpu"}
            for m, d in (("mamba", 48), ("lstm", 40)) for b in (1, 2)]
    unmatched = [{"model": "gated_mlp", "reason": "it carries no state"}]
    table = tmp_path / "gen.json"
    table.write_text(bench_tables.render({"generate": rows}, "json", ("state_size", 512), unmatched))
    assert bench.main(["--generate", "--from-table", str(table), "--figure", str(tmp_path / "g.svg")]) == 0
    out = capsys.readouterr().out
    assert "not matched: gated_mlp: it carries no state" in out
    svg = (tmp_path / "g.svg").read_text()
    assert "state_size matched to 512 (within 2%)" in svg and "lstm (d_model 40)" in svg


def test_an_unmatched_model_gets_the_training_benchs_refusal_and_the_others_run(capsys, bench_in_process):
    rc = bench.main([*TINY, "--models", "transformer,mamba", "--match", "state_size=512", "--prompt-lens", "16",
                     "--batch", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert [r["model"] for r in parse_md(out)] == ["mamba"]
    with pytest.raises(match.MatchError) as e:
        match.solve("transformer", "state_size", 512, d_model=16, n_layers=1, options={})
    gen_notes = [ln for ln in out.splitlines() if ln.startswith("not matched: ")]
    assert gen_notes == [f"not matched: transformer: {e.value}"]
    assert f"  not matched transformer: {e.value}" in err
    # the training bench's words, the same
    rc = bench.main(["--models", "transformer,mamba", "--match", "state_size=512", "--d-model", "16", "--n-layers",
                     "1", "--seq-lens", "16", "--batch", "1", "--repeats", "1", "--warmup", "0"])
    train_out = capsys.readouterr().out
    assert rc == 0 and [ln for ln in train_out.splitlines() if ln.startswith("not matched: ")] == gen_notes
    # nothing left to decode: a failure, the reason named
    rc = bench.main([*TINY, "--models", "transformer", "--match", "state_size=512", "--prompt-lens", "16",
                     "--batch", "1", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["generate"] == []
    assert doc["match"]["unmatched"] == [{"model": "transformer", "reason": str(e.value)}]


@pytest.mark.parametrize("argv,msg", [
    (["--match", "width=3"], "expected params=N or state_size=N"),
    (["--match", "params=lots"], "expected a whole number"),
    (["--match", "params=0"], "whole number >= 1"),
    (["--match", "params=1000", "--from-table", "t.json"], "--from-table measures none"),
])
def test_bad_match_arguments_with_generate_are_one_line_errors(capsys, argv, msg):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--generate", *argv])
    assert msg in capsys.readouterr().err
