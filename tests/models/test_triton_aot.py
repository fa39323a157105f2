"""The Triton kernels compiled for an H100 (sm_90) without a GPU (models/kernels/triton_aot.py):
they build for the real backend, not only under the interpreter the other tests use, and at
the launcher's tile sizes no kernel spills registers to local memory."""
from __future__ import annotations

import pytest

from models.kernels import triton_aot as ta
from models.kernels import triton_kernels as tk

WHY = ta.unavailable_reason()
needs_compiler = pytest.mark.skipif(bool(WHY), reason=WHY or "")
# Triton's compiler and ptxas for sm_90, many kernels and sizes: tens of seconds of CPU;
# in the slow group (./test.sh --slow, CI) with the other builds
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def launch_rows():
    """Every kernel at the launcher's parameters, N = 16 and 64, float32 and bfloat16."""
    return ta.compile_all(90, (16, 64), ("fp32", "bf16"))


@needs_compiler
@slow
def test_every_kernel_builds_for_sm90_without_spills(launch_rows):
    assert len(launch_rows) == 2 * (2 * 2 + 3)
    assert {r["kernel"] for r in launch_rows} == {
        "selective_scan_fwd", "selective_scan_bwd", "causal_conv_fwd", "causal_conv_bwd_pre",
        "causal_conv_bwd_input"}
    for row in launch_rows:
        assert "error" not in row, row
        assert 0 < row["regs"] <= 255, row
        assert row["spill_B"] == 0, f"spills: {row}"
        assert row["blocks_sm"] >= 1, row


@needs_compiler
@slow
def test_the_report_sees_spills_and_build_errors():
    """The conv backward's old launch (64 x 32 at 4 warps) spilled on sm_90: the report must
    say so, or the no-spill test above proves nothing; a kernel that cannot build (a channel
    tile of 3: tl.arange needs a power of two) is reported, not raised."""
    rows = ta.compile_all(90, (16,), ("fp32",), {
        "causal_conv_bwd_pre_kernel": {"BLT": 64, "num_warps": 4},
        "selective_scan_fwd_kernel": {"BD": 3}})
    by = {r["kernel"]: r for r in rows}
    assert by["causal_conv_bwd_pre"]["regs"] == 255 and by["causal_conv_bwd_pre"]["spill_B"] > 0
    assert by["causal_conv_bwd_pre"]["tile"] == "64x32"
    assert "error" in by["selective_scan_fwd"] and "error" not in by["selective_scan_bwd"]


@needs_compiler
@slow
def test_the_gpu_test_suites_float64_cases_build():
    """On a GPU, tests/models/test_triton_kernels.py runs these kernels compiled in float64, with
    state sizes 3 (padded to 4) and 40 (64) and a width-1 conv: they must build (spills
    allowed: float64 is the tests' oracle precision, not a training dtype)."""
    conv_k1 = {k: {"K": 1} for k in ("causal_conv_fwd_kernel", "causal_conv_bwd_pre_kernel",
                                      "causal_conv_bwd_input_kernel")}
    rows = ta.compile_all(90, (3, 40), ("fp64",), conv_k1)
    assert len(rows) == 2 * 2 + 3
    for row in rows:
        assert "error" not in row, row


def test_overrides_are_checked():
    assert ta._parse_set(["selective_scan_bwd:BD=4,num_warps=4"]) == {
        "selective_scan_bwd_kernel": {"BD": 4, "num_warps": 4}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        ta._parse_set(["selective_scan_bwd:BD"])
    v = ta.variants((16,), ("fp32",))[0]
    with pytest.raises(ValueError, match="no constexpr BX"):
        ta._apply(v, {v.kernel: {"BX": 4}})


def test_occupancy_from_registers_and_shared_memory():
    # 128 registers x 128 threads = 16 Ki registers a block: 4 blocks in 64 Ki
    assert ta.occupancy(128, 1024, 4, 90) == (4, 0.25)
    # 255 registers round up to 256 a thread (8 Ki a warp): 8 warps a SM, one 8-warp block
    assert ta.occupancy(255, 0, 8, 90) == (1, 0.125)
    # shared memory binds: 100 KiB a block (+1 KiB reserved) leaves room for 2 on sm_90
    assert ta.occupancy(32, 100 * 1024, 4, 90)[0] == 2


def test_scan_tiles_shrink_with_state_size_and_narrow_to_fill_the_gpu(monkeypatch):
    monkeypatch.setattr(tk, "_TILE_PINNED", False)
    bt, bd = tk.SCAN_BT, tk.SCAN_BD
    assert tk.scan_tiles(16) == (bt, bd, 16)
    assert tk.scan_tiles(5) == (bt, bd, 8)
    assert tk.scan_tiles(64) == (bt, bd // 4, 64)
    assert tk.scan_tiles(64, backward=True) == (bt, bd // 8, 64)
    # b8 x 128 channels on 132 SMs: forward until 2 programs a SM, backward until 1, with
    # no more than 16 channel tiles (128 / 16 = 8 channels at least)
    assert tk.scan_tiles(16, 8, 128, 132) == (bt, 2, 16)
    assert tk.scan_tiles(16, 8, 128, 132, backward=True) == (bt, 8, 16)
    # a grid that already fills the GPU keeps the wide tile
    assert tk.scan_tiles(16, 64, 256, 132) == (bt, bd, 16)
    assert tk.scan_tiles(16, 64, 256, 132, backward=True) == (bt, bd, 16)
    # no GPU (the interpreter): no narrowing
    assert tk.scan_tiles(16, 8, 128, 0) == (bt, bd, 16)
    monkeypatch.setattr(tk, "_TILE_PINNED", True)
    assert tk.scan_tiles(16, 8, 128, 132) == (bt, bd, 16)
