"""``ssm-workbench bench --triton-compile ARCH``: the Triton kernels compiled for a GPU
without one, and what each costs an SM (models.kernels.triton_aot)."""
from __future__ import annotations

import argparse
import sys
from typing import Any


def compile_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--triton-compile ARCH: the kernels' resources at N = 16, float32 and bfloat16."""
    if args.triton_compile is None:
        return []
    from models.kernels import triton_aot

    if args.triton_compile not in triton_aot.ARCH_LIMITS:
        raise SystemExit(f"--triton-compile {args.triton_compile}: known compute capabilities "
                         f"{', '.join(map(str, triton_aot.ARCH_LIMITS))}")
    why = triton_aot.unavailable_reason()
    if why:
        raise SystemExit(f"--triton-compile: {why}")
    pr = triton_aot.PROBLEM
    print(f"  compiling the Triton kernels for {triton_aot.ARCH_LIMITS[args.triton_compile]['name']} "
          f"(programs, sm_fill: batch {pr['batch']}, {pr['dim']} channels, L = {pr['L']})",
          file=sys.stderr, flush=True)
    return triton_aot.compile_all(args.triton_compile, (16,), ("fp32", "bf16"))
