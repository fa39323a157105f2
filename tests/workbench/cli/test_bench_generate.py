"""``ssm-workbench bench --generate`` (issue 43): autoregressive decoding measured per
(model, prompt length, batch). Tiny configs end to end (in process, as test_bench's), the
table's columns, the state bytes per sequence (a recurrent model's constant in the prompt
length, the Transformer's cache growing with it), the options refused in one line, the
--grid axes plan (Figure 8's two axes, models interleaved in time) and the figure drawn from
a saved json / csv table (--from-table, nothing measured). No timing is asserted: times are
benchmarks."""
from __future__ import annotations

import json

import pytest

from workbench.cli import bench
from workbench.cli.bench_generate import GENERATE_COLUMNS, state_bytes

TINY = ["--generate", "--d-model", "16", "--n-layers", "1", "--gen-tokens", "3", "--warmup", "1",
        "--vocab", "16", "--device", "cpu"]


def parse_md(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_generate_table_and_state_bytes(capsys, bench_in_process, tmp_path):
    rc = bench.main([*TINY, "--models", "transformer,mamba", "--prompt-lens", "16,40", "--batch", "1,3",
                     "--figure", str(tmp_path / "fig")])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    rows = parse_md(out)
    assert list(rows[0]) == GENERATE_COLUMNS
    assert [(r["model"], r["prompt_len"], r["batch"]) for r in rows] == [
        (m, p, b) for m in ("transformer", "mamba") for p in ("16", "40") for b in ("1", "3")]
    for r in rows:
        assert float(r["prefill_ms"]) > 0 and float(r["decode_ms"]) > 0 and int(r["tok_s"]) > 0
        assert float(r["peak_mib"]) > 0 and int(r["params"]) > 0
    state = {(r["model"], int(r["prompt_len"]), int(r["batch"])): int(r["state_bytes"]) for r in rows}
    # mamba's state per sequence: the same at every prompt length and batch
    assert len({v for (m, _, _), v in state.items() if m == "mamba"}) == 1
    # the Transformer's cache: keys + values of every prompt position, 1 layer, d_model 16, float32
    for p in (16, 40):
        for b in (1, 3):
            assert state["transformer", p, b] == 2 * p * 16 * 4
    assert (tmp_path / "fig" / "generate.png").stat().st_size > 0
    assert (tmp_path / "fig" / "generate.svg").is_file()


def test_generate_json_and_every_family_that_decodes(capsys, bench_in_process):
    rc = bench.main([*TINY, "--models", "sliding_window_attention,lstm,gated_deltanet", "--prompt-lens", "20",
                     "--batch", "2", "--format", "json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = json.loads(out)["generate"]
    assert [r["model"] for r in rows] == ["sliding_window_attention", "lstm", "gated_deltanet"]
    assert all(r["finite"] and r["batch"] == 2 and r["prompt_len"] == 20 for r in rows)


def test_generate_in_a_fresh_process(capsys):
    # the --one path, as the command runs it: one config
    rc = bench.main([*TINY, "--models", "mamba", "--prompt-lens", "8", "--batch", "1", "--format", "csv"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.splitlines()[0] == ",".join(GENERATE_COLUMNS)


@pytest.mark.parametrize("argv,msg", [
    (["--models", "transformer", "--prompt-lens", "20000"], "--prompt-lens: 20,000 is past 16,384 tokens"),
    (["--models", "transformer", "--prompt-lens", "64", "--opt", "max_len=64"],
     "transformer: a 64-token prompt + 4 generated tokens need 68 cache positions, past --opt max_len=64"),
])
def test_refused_in_one_line(argv, msg, bench_in_process):
    with pytest.raises(SystemExit) as e:
        bench.main([*TINY, *argv])
    assert str(e.value) == msg


def test_a_batch_list_is_for_generate_only(capsys):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--batch", "1,8"])
    assert "--batch: one size (a comma list is for --generate)" in capsys.readouterr().err
    assert bench.build_parser().parse_args(["--batch", "4"]).batch == 4
    assert bench.build_parser().parse_args([]).batch == 8


def test_state_bytes_counts_nested_states_and_a_caches_filled_positions():
    import torch

    import models

    bb = models.build("transformer", d_model=8, n_layers=2).eval()
    with torch.no_grad():
        _, st = bb.forward_with_state(torch.randn(2, 5, 8), bb.init_state(2))
    assert state_bytes(st) == 2 * (2 * 2 * 5 * 8 * 4)      # 2 layers x (k + v) x batch 2, 5 positions
    assert state_bytes([(torch.zeros(3), {"a": torch.zeros(2, dtype=torch.float64)}), ()]) == 3 * 4 + 2 * 8
    fox = models.build("forgetting_transformer", d_model=8, n_layers=1, n_heads=2).eval()
    with torch.no_grad():                                    # its cache: k, v (2, 2, 5, 4) float32, c (2, 2, 5) float64
        _, st = fox.forward_with_state(torch.randn(2, 5, 8), fox.init_state(2))
    assert state_bytes(st) == 2 * 2 * 5 * 8 * 4 + 2 * 2 * 5 * 8


def _table_rows():
    """A table as bench --generate writes it (numbers made up: the figure only draws them)."""
    rows = []
    for m, grow in (("transformer", True), ("mamba", False)):
        for p, b in [(256, 1), (256, 4), (256, 16), (256, 64), (1024, 1), (4096, 1), (16384, 1)]:
            rows.append({"model": m, "prompt_len": p, "batch": b, "params": 100, "prefill_ms": 1.0,
                         "decode_ms": 1.0 + (p / 1024 if grow else 0), "tok_s": 100 * b,
                         "state_bytes": 512 * p if grow else 4096, "peak_mib": 10.0, "extra_mib": 1.0,
                         "backend": "torch", "device": "cpu", "d_model": 16, "n_layers": 1})
    return rows


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_the_figure_is_drawn_from_a_table(fmt, tmp_path, capsys, monkeypatch):
    """--from-table reads an earlier --format json / csv output and measures nothing;
    --figure NAME.png writes NAME.png and NAME.svg."""
    from workbench.cli import bench_tables

    def no_measuring(spec, timeout):
        raise AssertionError("--from-table measured a config")

    monkeypatch.setattr(bench, "_run_subprocess", no_measuring)
    rows = _table_rows()
    table = tmp_path / f"generation.{fmt}"
    table.write_text(bench_tables.render({"generate": rows}, fmt))
    out = tmp_path / "figs" / "generation.png"
    rc = bench.main(["--generate", "--from-table", str(table), "--figure", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert parse_md(printed)[0]["model"] == "transformer" and len(parse_md(printed)) == len(rows)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "figs" / "generation.svg").read_text()
    # the three panels: throughput at prompt 256 (the prompt with most batches), latency and
    # memory at batch 1 (the batch with most prompts)
    for text in ("throughput, prompt 256 tokens", "latency per token, batch 1", "memory per sequence"):
        assert text in svg


def test_the_figure_of_rows_without_numbers_is_not_written(tmp_path):
    from workbench.cli.bench_generate import figure

    assert figure([{"model": "mamba", "error": "timed out"}], tmp_path / "g.png") == []
    assert not (tmp_path / "g.png").exists()


def test_a_table_that_is_not_one_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"runs": []}')
    with pytest.raises(SystemExit) as e:
        bench.main(["--generate", "--from-table", str(bad)])
    assert str(e.value) == f"--from-table {bad}: not the JSON of bench --generate --format json (no 'generate' list)"
    with pytest.raises(SystemExit) as e:
        bench.main(["--generate", "--from-table", str(tmp_path / "none.csv")])
    assert str(e.value).startswith(f"--from-table {tmp_path / 'none.csv'}: cannot read it")


def test_the_axes_grid_is_figure_8s_two_axes():
    """--grid axes: every batch at the shortest prompt, every prompt at the smallest batch,
    the models interleaved in time (each config for every model before the next)."""
    from workbench.cli.bench_generate import plan

    args = bench.build_parser().parse_args([*TINY, "--models", "transformer,mamba", "--grid", "axes",
                                            "--prompt-lens", "1024,256,16384", "--batch", "1,4,64"])
    got = [(s["model"], s["prompt_len"], s["batch"]) for s in plan(args)]
    pairs = [(256, 1), (256, 4), (256, 64), (1024, 1), (16384, 1)]
    assert got == [(m, p, b) for p, b in pairs for m in ("transformer", "mamba")]
    # the Transformer's cache and position table fit the prompt and the generated tokens
    assert [s["options"]["max_len"] for s in plan(args) if s["model"] == "transformer"] == [p + 4 for p, _ in pairs]
    product = bench.build_parser().parse_args([*TINY, "--models", "mamba", "--prompt-lens", "8,16", "--batch", "1,2"])
    assert [(s["prompt_len"], s["batch"]) for s in plan(product)] == [(8, 1), (8, 2), (16, 1), (16, 2)]


def test_the_figure_can_draw_each_configs_fastest_step(tmp_path):
    """--figure-stat min draws decode_min_ms (a loaded machine's least disturbed step); a
    table without it (csv) is refused in one line."""
    from workbench.cli.bench_generate import figure

    rows = [{**r, "decode_min_ms": r["decode_ms"] / 2} for r in _table_rows()]
    paths = figure(rows, tmp_path / "g.svg", stat="min")
    assert [p.name for p in paths] == ["g.png", "g.svg"]
    assert "fastest step of each config" in paths[1].read_text()
    with pytest.raises(SystemExit, match="--figure-stat min: the rows have no decode_min_ms"):
        figure(_table_rows(), tmp_path / "h.png", stat="min")
