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
``rwkv7`` / ``kda`` (``models.kernels.generalized_delta``; no ``cpu`` backend) take a, b and
a per-key-channel log-decay (rwkv7) or a per-key-channel g and beta (kda).
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
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

COLUMNS = ["model", "seq_len", "backend", "params", "fwd_bwd_ms", "infer_ms", "train_tok_s", "peak_mib"]
SCAN_COLUMNS = ["kernel", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_first"]
OP_COLUMNS = ["op", "seq_len", "backend", "fwd_bwd_ms", "fwd_ms", "peak_mib", "x_ref"]
ESTIMATE_COLUMNS = ["family", "model", "seq_len", "batch", "est_mib", "measured_mib", "ratio"]
# --estimate's default: one model per family of the registry (pretrained needs a checkpoint
# folder, so it is left out)
ESTIMATE_MODELS = {"transformer": "attention", "mamba": "ssm", "lstm": "rnn", "gated_mlp": "mlp",
                   "hyena": "conv", "hybrid": "hybrid"}
STREAM_COLUMNS = ["model", "tokens", "mode", "chunk_len", "backend", "seconds", "tok_s", "peak_rss_mib", "extra_mib"]
_REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------
# measurements (run inside the --one subprocess; workbench.train.measure does the measuring)
# ---------------------------------------------------------------------------------------

def measure_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one (model, options, seq_len) config in this process; see module docstring."""
    import torch
    import models
    from workbench.train.measure import pick_device, timed_with_peak

    device = pick_device(spec["device"], "--device")
    torch.manual_seed(spec.get("seed", 0))
    model = models.build(spec["model"], d_model=spec["d_model"], n_layers=spec["n_layers"],
                         **spec["options"]).to(device)
    batch, L, d = spec["batch"], spec["seq_len"], spec["d_model"]
    x = torch.randn(batch, L, d, device=device)

    def train_step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    def infer():
        with torch.no_grad():
            model(x)

    def infer_after_training():
        model.zero_grad(set_to_none=True)  # the gradients are not part of inference
        infer()

    # memory baseline: everything built, nothing run yet
    train_ms, peak, infer_ms = timed_with_peak(train_step, infer_after_training, spec["repeats"],
                                               spec["warmup"], device)
    return {
        "model": spec["label"],
        "seq_len": L,
        "backend": models.backend(model),
        "params": models.param_count(model),
        "fwd_bwd_ms": round(train_ms, 2),
        "infer_ms": round(infer_ms, 2),
        "train_tok_s": round(batch * L / (train_ms / 1e3)),
        "peak_mib": round(peak, 1),
        "device": str(device),
        "batch": batch,
        "d_model": d,
        "n_layers": spec["n_layers"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def measure_scan(spec: dict[str, Any]) -> dict[str, Any]:
    """The selective scan alone, one backend and length, on random inputs (see module doc)."""
    import torch
    from models.kernels import selective_scan as ss
    from workbench.train.measure import pick_device, timed_with_peak

    device = pick_device(spec["device"], "--device")
    g = torch.Generator(device=device).manual_seed(spec.get("seed", 0))
    batch, dim, N, L = spec["batch"], 2 * spec["d_model"], 16, spec["seq_len"]

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).requires_grad_()

    inputs = dict(u=r(batch, dim, L), delta=r(batch, dim, L, scale=0.5),
                  A=(-torch.arange(1, N + 1, device=device).float().repeat(dim, 1)).requires_grad_(),
                  B=r(batch, N, L), C=r(batch, N, L), D=r(dim), z=r(batch, dim, L),
                  delta_bias=r(dim, scale=0.1))
    weight = torch.randn(batch, dim, L, generator=g, device=device)
    backend = ss.choose_backend(spec["backend"], device)

    def train_step():
        out = ss.selective_scan_fn(**inputs, delta_softplus=True, backend=backend)
        torch.autograd.grad((out * weight).sum(), list(inputs.values()))

    def forward():
        with torch.no_grad():
            ss.selective_scan_fn(**inputs, delta_softplus=True, backend=backend)

    train_ms, peak, fwd_ms = timed_with_peak(train_step, forward, spec["repeats"], spec["warmup"], device)
    return {"kernel": "selective_scan", "seq_len": L, "backend": backend,
            "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
            "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "dim": dim,
            "state": N, "threads": torch.get_num_threads()}


def measure_op(spec: dict[str, Any]) -> dict[str, Any]:
    """One linear-RNN operator, one backend and length, on random inputs (see module doc)."""
    import torch
    from models.kernels import linear_rnn, linear_rnn_backends, mamba3_scan
    from workbench.train.measure import pick_device, timed_with_peak

    device = pick_device(spec["device"], "--device")
    batch, L, H, D = spec["batch"], spec["seq_len"], spec["heads"], spec["head_dim"]
    if spec["op"] in mamba3_scan.OPS:   # Mamba-3: its own inputs and state (theta, S, k, v)
        fn, backend = mamba3_scan.get_op(spec["op"], spec["backend"], device.type)
        args, S0 = mamba3_scan.make_inputs(spec["op"], batch, L, H, D, seed=spec.get("seed", 0),
                                           device=device)

        def m3_train():
            o, S = fn(*args, initial_state=S0, output_final_state=True)
            torch.autograd.grad(o.square().sum() + S[1].square().sum(), [*args, *S0],
                                allow_unused=True)

        def m3_forward():
            with torch.no_grad():
                fn(*args, initial_state=S0, output_final_state=True)

        train_ms, peak, fwd_ms = timed_with_peak(m3_train, m3_forward, spec["repeats"],
                                                 spec["warmup"], device)
        return {"op": spec["op"], "seq_len": L, "backend": backend,
                "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
                "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "heads": H,
                "head_dim": D, "threads": torch.get_num_threads()}
    from models.kernels import generalized_delta

    fn, backend = linear_rnn_backends.get_op(spec["op"], spec["backend"], device.type)
    n = spec.get("householder", 2)
    if spec["op"] in generalized_delta.OPS:   # rwkv7, kda: their own argument lists
        args = generalized_delta.make_inputs(spec["op"], batch, L, H, D, D, torch.float32,
                                             gate_range=(-0.5, 0.0), seed=spec.get("seed", 0),
                                             device=device)
    else:
        args = linear_rnn.make_inputs(spec["op"], batch, L, H, D, D, torch.float32,
                                      gate_range=(-0.5, 0.0), seed=spec.get("seed", 0),
                                      device=device, num_householder=n)
    S0 = torch.randn(batch, H, D, D, device=device, requires_grad=True)
    leaves = [*args, S0]

    def train_step():
        o, S = fn(*args, initial_state=S0, output_final_state=True)
        torch.autograd.grad(o.square().sum() + S.square().sum(), leaves)

    def forward():
        with torch.no_grad():
            fn(*args, initial_state=S0, output_final_state=True)

    train_ms, peak, fwd_ms = timed_with_peak(train_step, forward, spec["repeats"], spec["warmup"], device)
    return {"op": spec["op"], "seq_len": L, "backend": backend,
            "fwd_bwd_ms": round(train_ms, 2), "fwd_ms": round(fwd_ms, 2),
            "peak_mib": round(peak, 1), "device": str(device), "batch": batch, "heads": H,
            "head_dim": D, "threads": torch.get_num_threads(),
            **({"householder": n} if spec["op"] in linear_rnn.PRODUCT_OPS else {})}


def measure_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a recurrent backbone over spec['tokens'] tokens at batch 1, state carried between chunks."""
    import torch
    import models
    from models.ssm.mamba import stream
    from workbench.train import sysmon
    from workbench.train.measure import ExtraPeak, pick_device, sync

    device = pick_device(spec["device"], "--device")
    torch.manual_seed(spec.get("seed", 0))
    model = models.build(spec["model"], d_model=spec["d_model"], n_layers=spec["n_layers"],
                         **spec["options"]).to(device).eval()
    tokens, chunk, d = spec["tokens"], spec["chunk_len"], spec["d_model"]
    gen = torch.Generator(device=device).manual_seed(1)

    def chunks():  # inputs made on the fly: a (1, 2^20, d) input alone would be 256 MiB
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            yield torch.randn(1, n, d, generator=gen, device=device)
            done += n

    checksum = 0.0
    rss = ExtraPeak(torch.device("cpu"))  # RSS (peak reset to it): state and chunks live in this process
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        if spec["mode"] == "chunked":
            for y in stream(model, chunks()):
                checksum += float(y[0, -1].sum())
        else:
            state = model.init_state(1)
            for c in chunks():
                for x_t in c.unbind(1):
                    y_t, state = model.step(x_t, state)
                checksum += float(y_t.sum())
    sync(device)
    seconds = time.perf_counter() - t0
    peak = sysmon.peak_rss_mib()
    return {
        "model": spec["model"],
        "tokens": tokens,
        "mode": spec["mode"],
        "chunk_len": chunk if spec["mode"] == "chunked" else 1,
        "backend": models.backend(model),
        "seconds": float(f"{seconds:.3g}"),  # 3 significant digits: a short stream is not 0.0 s
        "tok_s": round(tokens / seconds),
        "peak_rss_mib": round(peak, 1),
        "extra_mib": round(peak - rss.rss_before, 1),
        "finite": bool(checksum == checksum and abs(checksum) != float("inf")),
        "device": str(device),
    }


# ---------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------

def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in _csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("values must be >= 1")
    return values


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def _option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string such as rope
    return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssm-workbench bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_csv_list, default=None,
                   help="comma-separated registry names (default: mamba,transformer where registered)")
    p.add_argument("--seq-lens", type=_int_list, default=[256, 1024])
    p.add_argument("--batch", type=_positive, default=8)
    p.add_argument("--d-model", type=_positive, default=64)
    p.add_argument("--n-layers", type=_positive, default=2)
    p.add_argument("--backend", type=_csv_list, default=None,
                   help="scan backend(s) for models that take `backend` (e.g. ref,torch)")
    p.add_argument("--opt", type=_option, action="append", default=[], metavar="KEY=VALUE",
                   help="model option (JSON value) for every model that takes it; repeatable")
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=_positive, default=None,
                   help="torch intra-op threads in each measuring process (default: torch's)")
    p.add_argument("--format", default="md", choices=["md", "csv", "json"])
    p.add_argument("--timeout", type=float, default=1800, help="seconds per config before giving up")
    p.add_argument("--scan-backends", type=_csv_list, default=None,
                   help="measure the selective scan alone with these backends (e.g. ref,torch,cpu)")
    p.add_argument("--ops", type=_csv_list, default=None,
                   help="measure linear-RNN operators alone: comma list of "
                        "linear_attention,simple_gla,gla,delta_rule,gated_delta_rule,"
                        "gated_delta_product, or all")
    p.add_argument("--op-backends", type=_csv_list, default=["ref", "torch"],
                   help="operator backends for --ops (ref, torch, cpu, fla, auto); x_ref "
                        "compares with ref")
    p.add_argument("--heads", type=_positive, default=4, help="--ops: heads")
    p.add_argument("--head-dim", type=_positive, default=32, help="--ops: key and value dim per head")
    p.add_argument("--householder", type=_positive, default=2,
                   help="--ops gated_delta_product: delta-rule steps per token")
    p.add_argument("--ref-max-len", type=_positive, default=None,
                   help="--ops: skip the step-by-step ref backend above this length")
    p.add_argument("--triton-compile", type=int, default=None, metavar="ARCH",
                   help="compile the Triton kernels for compute capability ARCH (e.g. 90) "
                        "without a GPU and report registers, spills and occupancy")
    p.add_argument("--estimate", action="store_true",
                   help="the resource estimate beside the measured peak memory, per model and "
                        "length, and their ratio (--models: which models; default one per "
                        "family; the speed table is not measured then)")
    p.add_argument("--estimate-tries", type=_positive, default=2,
                   help="--estimate: fresh processes measured per config; the smallest peak counts")
    p.add_argument("--stream-tokens", type=_positive, default=None,
                   help="also run the streamed-inference measurement over this many tokens")
    p.add_argument("--stream-chunk", type=_positive, default=4096)
    p.add_argument("--stream-mode", default="chunked", choices=["chunked", "step"])
    p.add_argument("--stream-model", type=_csv_list, default=["mamba"],
                   help="recurrent model(s) to stream, comma-separated")
    p.add_argument("--one", metavar="SPEC_JSON", help=argparse.SUPPRESS)  # internal: one config
    return p


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One config measured in this process (what ``--one SPEC`` runs and prints)."""
    fn = {"stream": measure_stream, "scan": measure_scan, "op": measure_op}.get(spec["kind"], measure_one)
    return fn(spec)


def _run_subprocess(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
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


def _default_models() -> list[str]:
    import models
    return [m for m in ("mamba", "transformer") if m in models.names()]


def _options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The --opt options ``name`` takes, and a position table long enough for --seq-lens."""
    import models

    takes = models.entry(name).options()
    base = {k: v for k, v in args.opt if k in takes}
    if "max_len" in takes and "max_len" not in base:
        # absolute/learned position tables must cover the longest benchmarked length
        base["max_len"] = max(takes["max_len"] or 0, max(args.seq_lens))
    return base


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Expand the arguments into one spec per (model, backend, seq_len)."""
    import models

    # with --stream-tokens or --scan-backends alone, only those measurements run; with
    # --estimate, --models names the estimate's models and this table is not measured
    names = [] if args.estimate else args.models or (
        [] if (args.stream_tokens or args.scan_backends or args.ops or args.triton_compile)
        else _default_models())
    for name in names:
        models.entry(name)  # unknown model: error listing the known ones
    takes = {name: models.entry(name).options() for name in names}
    if args.backend and names and not any("backend" in takes[n] for n in names):
        raise SystemExit(f"--backend given but none of {', '.join(names)} takes a backend option")
    for key, _ in args.opt:
        if not any(key in takes[n] for n in names):
            raise SystemExit(f"--opt {key}: none of {', '.join(names)} takes option {key!r}")
    specs = []
    for name in names:
        base = _options(name, args)
        backends = args.backend if (args.backend and "backend" in takes[name]) else [None]
        for backend in backends:
            options = dict(base, **({"backend": backend} if backend else {}))
            label = f"{name}[{backend}]" if backend and len(backends) > 1 else name
            for L in args.seq_lens:
                specs.append(dict(kind="train", model=name, label=label, options=options, seq_len=L,
                                  batch=args.batch, d_model=args.d_model, n_layers=args.n_layers,
                                  repeats=args.repeats, warmup=args.warmup, device=args.device,
                                  threads=args.threads))
    return specs


def format_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "md") -> str:
    """Markdown or CSV table of ``rows`` (dicts) over ``columns`` (plus errors, if any)."""
    cols = list(columns) + (["error"] if any("error" in r for r in rows) else [])
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _measure_ops(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--ops: every (op, length, backend) in a fresh process; x_ref against ref's time."""
    if not args.ops:
        return []
    from models.kernels.linear_rnn import ALL_OPS
    from models.kernels.linear_rnn_backends import BACKENDS
    from models.kernels.mamba3_scan import OPS as MAMBA3_OPS

    from models.kernels.generalized_delta import OPS as GD_OPS

    OPS = [*ALL_OPS, *GD_OPS, *MAMBA3_OPS]

    ops = list(OPS) if args.ops == ["all"] else args.ops
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise SystemExit(f"--ops: unknown operator(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    bad = [b for b in args.op_backends if b not in BACKENDS]
    if bad:
        raise SystemExit(f"--op-backends: unknown {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    rows = []
    for op in ops:
        ref_ms: dict[int, float] = {}
        for L in args.seq_lens:
            for backend in args.op_backends:
                if backend == "ref" and args.ref_max_len and L > args.ref_max_len:
                    continue
                spec = dict(kind="op", op=op, backend=backend, seq_len=L, batch=args.batch,
                            heads=args.heads, head_dim=args.head_dim,
                            householder=args.householder,
                            repeats=min(args.repeats, 2) if backend == "ref" else args.repeats,
                            warmup=min(args.warmup, 1) if backend == "ref" else args.warmup,
                            device=args.device, threads=args.threads)
                res = _run_subprocess(spec, args.timeout)
                if "error" in res:
                    res = {"op": op, "seq_len": L, "backend": backend, **res}
                elif backend == "ref":
                    ref_ms[L] = res["fwd_bwd_ms"]
                if res.get("fwd_bwd_ms") and ref_ms.get(L):
                    res["x_ref"] = round(ref_ms[L] / res["fwd_bwd_ms"], 1)
                rows.append(res)
                print(f"  measured {op}[{backend}] L={L}", file=sys.stderr, flush=True)
    return rows


def _estimate_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--estimate: bench_estimate beside the smallest of --estimate-tries measurements."""
    if not args.estimate:
        return []
    import models
    from workbench.spec import estimate

    names = args.models or [m for m in ESTIMATE_MODELS if m in models.names()]
    rows = []
    for name in names:
        options = _options(name, args)  # unknown model: error listing the known ones
        family = ESTIMATE_MODELS.get(name, "")
        for L in args.seq_lens:
            spec = dict(kind="train", model=name, label=name, options=options, seq_len=L,
                        batch=args.batch, d_model=args.d_model, n_layers=args.n_layers,
                        repeats=1, warmup=0, device="cpu", threads=args.threads or 1)
            row: dict[str, Any] = {"family": family, "model": name, "seq_len": L, "batch": args.batch}
            try:
                est = estimate.bench_estimate(name, options, args.d_model, args.n_layers,
                                              args.batch, L) / estimate.MiB
            except Exception as e:  # noqa: BLE001 - the table says why this row has no estimate
                rows.append({**row, "error": f"no estimate: {type(e).__name__}: {e}"})
                continue
            # CPU, one thread, a fresh process each: the estimate is of the CPU probe, and RSS
            # noise (allocator, transparent huge pages) only ever adds, so the smallest counts
            tries = [_run_subprocess(spec, args.timeout) for _ in range(args.estimate_tries)]
            good = [t for t in tries if "error" not in t]
            if not good:
                rows.append({**row, "est_mib": round(est, 1), "error": tries[-1]["error"]})
                continue
            measured = min(t["peak_mib"] for t in good)
            rows.append({**row, "est_mib": round(est, 1), "measured_mib": measured,
                         "ratio": round(est / measured, 2) if measured > 0 else None})
            print(f"  estimated and measured {name} L={L}", file=sys.stderr, flush=True)
    return rows


def _compile_triton(args: argparse.Namespace) -> list[dict[str, Any]]:
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

    rows = []
    for spec in plan(args):
        res = _run_subprocess(spec, args.timeout)
        if "error" in res:
            res = {"model": spec["label"], "seq_len": spec["seq_len"],
                   "backend": spec["options"].get("backend", ""), **res}
        rows.append(res)
        print(f"  measured {spec['label']} L={spec['seq_len']}", file=sys.stderr, flush=True)

    scan_rows = []
    for backend in args.scan_backends or []:
        for L in args.seq_lens:
            spec = dict(kind="scan", backend=backend, seq_len=L, batch=args.batch,
                        d_model=args.d_model, repeats=args.repeats, warmup=args.warmup,
                        device=args.device, threads=args.threads)
            res = _run_subprocess(spec, args.timeout)
            scan_rows.append(res if "error" not in res else
                             {"kernel": "selective_scan", "seq_len": L, "backend": backend, **res})
            print(f"  measured scan[{backend}] L={L}", file=sys.stderr, flush=True)
    first = {r["seq_len"]: r.get("fwd_bwd_ms") for r in scan_rows if r["backend"] == scan_rows[0]["backend"]} if scan_rows else {}
    for r in scan_rows:
        if r.get("fwd_bwd_ms") and first.get(r["seq_len"]):
            r["x_first"] = round(first[r["seq_len"]] / r["fwd_bwd_ms"], 1)

    op_rows = _measure_ops(args)
    est_rows = _estimate_rows(args)
    aot_rows = _compile_triton(args)

    stream_rows = []
    for stream_model in (args.stream_model if args.stream_tokens else []):
        # --backend (its first entry) picks the stream's scan backend too; default auto
        stream_options = {"backend": args.backend[0]} if args.backend else {}
        spec = dict(kind="stream", model=stream_model, options=stream_options, tokens=args.stream_tokens,
                    chunk_len=args.stream_chunk, mode=args.stream_mode, d_model=args.d_model,
                    n_layers=args.n_layers, device=args.device, threads=args.threads)
        res = _run_subprocess(spec, args.timeout)
        stream_rows.append(res if "error" not in res else {"model": stream_model, **res})
        print(f"  streamed {stream_model}", file=sys.stderr, flush=True)

    if args.format == "json":
        print(json.dumps({"runs": rows, "scan": scan_rows, "ops": op_rows, "stream": stream_rows,
                          "estimate": est_rows, "triton_compile": aot_rows}, indent=1))
    else:
        tables = [format_table(rows, COLUMNS, args.format)] if rows else []
        if scan_rows:
            tables.append(format_table(scan_rows, SCAN_COLUMNS, args.format))
        if op_rows:
            tables.append(format_table(op_rows, OP_COLUMNS, args.format))
        if stream_rows:
            tables.append(format_table(stream_rows, STREAM_COLUMNS, args.format))
        if est_rows:
            tables.append(format_table(est_rows, ESTIMATE_COLUMNS, args.format))
        if aot_rows:
            from models.kernels.triton_aot import COLUMNS as AOT_COLUMNS
            tables.append(format_table(aot_rows, AOT_COLUMNS, args.format))
        print("\n\n".join(tables))
    all_rows = rows + scan_rows + op_rows + stream_rows + est_rows + aot_rows
    return 1 if any("error" in r for r in all_rows) else 0

if __name__ == "__main__":
    sys.exit(main())
