"""``ssm-workbench bench --generate`` (issue 43): autoregressive decoding measured per
(model, prompt length, batch). Tiny configs end to end (in process, as test_bench's), the
table's columns, the state bytes per sequence (a recurrent model's constant in the prompt
length, the Transformer's cache growing with it), the options refused in one line and the
figure. No timing is asserted: times are benchmarks."""
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
    with torch.no_grad():                                    # a dataclass state: k, v (2, 5, 2, 4), g (2, 5, 2)
        _, st = fox.forward_with_state(torch.randn(2, 5, 8), fox.init_state(2))
    assert state_bytes(st) == (2 * 2 * 5 * 8 + 2 * 5 * 2) * 4
