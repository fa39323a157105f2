"""``ssm-workbench bench``: speed and memory of registry backbones, measured one config at a time.

    ssm-workbench bench --models mamba,transformer --seq-lens 784,4096 --batch 8 --d-model 64
    ssm-workbench bench --models mamba --backend ref,torch --seq-lens 1024 --repeats 1
    ssm-workbench bench --models mamba --stream-tokens 1048576
    ssm-workbench bench --estimate --seq-lens 1024 --batch 8 --d-model 64   # estimate vs measured

For each (model, backend, seq_len) a fresh Python process (``python -m workbench.cli.bench --one
SPEC``) builds the backbone with a fixed seed, then measures on random input
x: (batch, seq_len, d_model):

- fwd_bwd_ms:   forward + backward of mean(y^2) (no optimiser step), median over
                ``--repeats`` after ``--warmup`` untimed runs; synchronised on CUDA.
- infer_ms:     forward under ``torch.no_grad()``, median likewise.
- train_tok_s:  batch * seq_len / fwd_bwd time.
- peak_mib:     extra memory of the training step. CPU: the process's own peak RSS
                (``VmHWM``, reset to the current RSS just before the first forward)
                minus that RSS (workbench.train.sysmon.peak_rss_mib: ``ru_maxrss`` would
                carry the parent's RSS in); CUDA: ``torch.cuda.max_memory_allocated``
                minus the allocation before it. A fresh process per config all the same.

Timing and memory are measured by workbench.train.measure, as the worker measures a run.

``--scan-backends ref,torch,cpu`` measures the selective scan alone (S6's kernel, as Mamba
calls it: softplus, D skip and gate included) on u, delta, z: (batch, 2 * d_model, seq_len),
B, C: (batch, 16, seq_len), for each backend and length: forward + backward, forward, peak
memory, and the speed-up over the first backend listed (``x_first``).

``--ops linear_attention,gla,...`` (or ``all``) measures the linear-RNN operators of
``models.kernels.linear_rnn`` alone with each of ``--op-backends`` (default ``ref,torch``;
``cpu`` for the C kernels on a CPU, ``fla`` on a GPU with flash-linear-attention):
q, k: (batch, L, ``--heads``, ``--head-dim``), v likewise, log-gates uniform in (-0.5, 0), a random initial state in and the final state
out; forward + backward, forward, peak memory and the speed-up over ``ref`` (``x_ref``).
``mamba3`` / ``mamba3_mimo`` (``models.kernels.mamba3_scan``; MIMO at rank 4) take their own
inputs (dt, trapezoid weight, angle rates, the state with the previous rotated B and x).
``rwkv7`` / ``kda`` (``models.kernels.generalized_delta``; ``cpu``: ``generalized_delta_cpu``) take a, b and
a per-key-channel log-decay (rwkv7) or a per-key-channel g and beta (kda).
``forgetting_attn`` (FoX, ``models.attention.forgetting_attention``) takes q, k, v and log forget gates
uniform in (-0.5, 0), no state; its ``ref`` is the step-by-step (query by query) reference.
``gated_delta_product`` runs ``--householder`` (default 2) delta-rule steps per token: its
k, v and beta carry that many rows per token (fla's layout). ``--ref-max-len`` skips the (step-by-step, slow) ``ref`` above a length.

``--triton-compile 90`` compiles the Triton kernels for that compute capability (90: H100)
without a GPU, at the launcher's tile sizes, and reports what each costs an SM: registers,
spilled bytes, shared memory, resident programs and grid fill (``models.kernels.triton_aot``;
``python -m models.kernels.triton_aot --help`` takes other state sizes and trial parameters).

``--estimate`` sets the resource estimate beside the measurement: for each model (default: one
per family of the registry, ``ESTIMATE_MODELS``) and length, the peak memory that
``workbench.spec.estimate.bench_estimate`` predicts for this training step (``est_mib``, the
same probe and fit ``profile check`` uses), the smaller ``peak_mib`` of ``--estimate-tries``
fresh processes (``measured_mib``; RSS noise only adds) and ``ratio`` = est / measured.
A measured ratio depends on the machine and its load, so it is a benchmark, not a test:
docs/RESULTS.md keeps the table, and the tests check only the estimate's deterministic parts.

``--stream-tokens N`` runs the mamba backbone (``--n-layers``, ``--d-model``) over N tokens at
batch 1 in chunks of ``--stream-chunk`` (or token by token with ``--stream-mode step``),
carrying only the recurrent state, and reports wall time, tokens/s and peak RSS; ``--stream-model`` takes a comma list of
recurrent models (every model with ``forward_with_state``: mamba, mamba2, gla, retnet,
deltanet, ...), one streamed run each.

``--match params=N`` (non-embedding parameters) or ``--match state_size=N`` (state floats per
sequence) sizes every model as a profile's ``[sweep.match]`` does, with the same solver
(workbench.spec.match): its width (or d_state, expand_v, mlp_mult where the solver needs
a finer knob) is solved at ``--n-layers`` to within 2% of N, and the table gains the solved
``d_model``, ``n_layers``, any finer knob, the solver's count (``matched``) and its
distance from N (``match_err_%``). A model that cannot be matched (a Transformer has no
fixed-size state) is named under the table with the solver's reason, one line each; the
others are measured (bench_models.plan_matched). With ``--generate`` the decoding models
are sized so (one width per model, the same solver and code path: bench_models.match_size)
and the generation table gains the same columns.

``--generate`` measures autoregressive decoding instead of the training step (prefill,
per-token time, tokens/s, state bytes per sequence, against ``--prompt-lens`` and ``--batch``
1,8,32; ``--figure PATH``, ``--grid axes``, ``--from-table FILE``): workbench.cli.bench_generate.

The parts, one module each: bench_args (the options), bench_models (the training-step table),
bench_scan, bench_ops, bench_stream, bench_estimate, bench_triton, bench_generate (the other measurements),
bench_tables (columns and output); this module runs them and measures one ``--one`` config.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from workbench.cli import (bench_args, bench_estimate, bench_generate, bench_models, bench_ops, bench_scan,
                           bench_stream, bench_triton)
# the names tests and scripts read from here
from workbench.cli.bench_estimate import ESTIMATE_MODELS  # noqa: F401
from workbench.cli.bench_models import measure_one, plan  # noqa: F401
from workbench.cli.bench_ops import measure_op
from workbench.cli.bench_scan import measure_scan
from workbench.cli.bench_stream import measure_stream
from workbench.cli.bench_tables import (COLUMNS, ESTIMATE_COLUMNS, MATCH_COLUMNS,  # noqa: F401
                                        OP_COLUMNS, SCAN_COLUMNS, STREAM_COLUMNS, format_table,
                                        match_notes, render)

_REPO_ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    """The bench options (workbench.cli.bench_args), headed by this module's first line."""
    return bench_args.build_parser(__doc__.split("\n\n")[0])


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One config measured in this process (what ``--one SPEC`` runs and prints)."""
    fn = {"stream": measure_stream, "scan": measure_scan, "op": measure_op,
          "generate": bench_generate.measure_generate}.get(spec["kind"], measure_one)
    return fn(spec)


def _run_subprocess(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``spec`` measured in a fresh ``python -m workbench.cli.bench --one`` process: its row, or
    {"error": ...} (tests replace this with an in-process measure: conftest bench_in_process)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "workbench.cli.bench", "--one", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.one:
        spec = json.loads(args.one)
        if spec.get("threads"):
            import torch
            torch.set_num_threads(spec["threads"])
        print(json.dumps(measure(spec)), flush=True)
        return 0
    if args.warmup < 0:
        raise SystemExit("--warmup must be >= 0")

    # in this order: a bad --ops or --triton-compile stops the command after what comes before
    # --generate measures decoding only (workbench.cli.bench_generate)
    runs, refused = ([], []) if args.generate else bench_models.train_rows(args, _run_subprocess)
    scan = bench_scan.scan_rows(args, _run_subprocess)
    ops = bench_ops.op_rows(args, _run_subprocess)
    estimate = bench_estimate.estimate_rows(args, _run_subprocess)
    triton_compile = bench_triton.compile_rows(args)
    stream = bench_stream.stream_rows(args, _run_subprocess)
    generate, gen_match, gen_refused = bench_generate.generate_rows(args, _run_subprocess)
    # --generate --match (or a matched --from-table): the generation table's models were sized
    match, refused = (gen_match, gen_refused) if args.generate else (args.match, refused)
    sections = {"runs": runs, "scan": scan, "ops": ops, "stream": stream, "estimate": estimate,
                "triton_compile": triton_compile, "generate": generate}
    print(render(sections, args.format, match, refused))
    if args.format == "csv":  # a CSV file holds the table alone: the match's notes go to stderr
        for line in match_notes(match, refused):
            print(line, file=sys.stderr)
    failed = any("error" in r for rows in sections.values() for r in rows)
    # a model --match cannot size is named, not a failure, unless nothing was left to measure
    return 1 if failed or (refused and not any(sections.values())) else 0


if __name__ == "__main__":
    sys.exit(main())
