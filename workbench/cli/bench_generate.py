"""``ssm-workbench bench --generate``: autoregressive decoding of registry backbones, the
measurement of the Mamba paper's §4.5 / Figure 8 (a recurrent model generates from a
fixed-size state; a Transformer's key/value cache grows with the prompt).

    ssm-workbench bench --generate --models transformer,mamba --prompt-lens 256,1024,4096 --batch 1,8,32
    ssm-workbench bench --generate --d-model 128 --n-layers 2 --figure figures/

For each (model, prompt length, batch) a fresh process (``--one``, as the other tables)
builds a random language model around the backbone: an embedding and a linear head over
``--vocab`` ids (random weights: this measures speed, not text), on CUDA where torch sees
one (``--device``). It reads a random prompt (batch, prompt_len) once and then generates
greedily, one token per step for every sequence of the batch, with the same start/step
as ``ssm-workbench sample`` (workbench.train.eval_models.load_run: the backbone's
``forward_with_state`` over the prompt, then ``step`` per token, carrying the recurrent
state or the Transformer's KV cache; the next token is decode.next_token's argmax, kept on
the device, so the loop never waits for the host). Per row:

- prefill_ms:   reading the prompt and the first logits (one call after a short warm-up).
- decode_ms:    per-token decode time, the median over ``--gen-tokens`` steps after
                ``--warmup`` untimed ones, each step synchronised on CUDA.
- tok_s:        batch / decode time: tokens generated per second over the batch.
- state_bytes:  the state (recurrent state or filled KV cache) after the prompt, bytes per
                sequence: a recurrent family's is constant in the prompt length, the
                Transformer's grows with it.
- peak_mib:     the process's peak (RSS on CPU, the allocator's peak on CUDA); extra_mib:
                what prefill and decoding added above the built model.

A Transformer is built with ``max_len`` = prompt + tokens (its cache and position table); an
``--opt max_len`` below that is refused in one line. ``--figure DIR`` writes
``generate.png`` / ``.svg``: throughput against batch size (longest prompt) and per-token
latency against prompt length (batch 1 or the smallest), one line per model.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from workbench.cli.bench_args import Run

DEFAULT_MODELS = ("transformer", "mamba", "mamba2", "gated_deltanet")
DEFAULT_PROMPT_LENS = (256, 1024, 4096)
DEFAULT_BATCHES = (1, 8, 32)
MAX_PROMPT_LEN = 16384
GENERATE_COLUMNS = ["model", "prompt_len", "batch", "params", "prefill_ms", "decode_ms", "tok_s",
                    "state_bytes", "peak_mib", "extra_mib", "backend", "device"]


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a decoding state: nested lists / tuples / dicts / dataclasses
    (FoX's) of tensors; an object with ``nbytes()`` (a KVCache: its filled positions) counts
    what that says."""
    import dataclasses

    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if hasattr(state, "nbytes") and callable(state.nbytes):
        return int(state.nbytes())
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_bytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def measure_generate(spec: dict[str, Any]) -> dict[str, Any]:
    """One (model, prompt_len, batch) config measured in this process; see the module doc."""
    import torch
    import torch.nn as nn

    import models
    from workbench.train.decode import next_token
    from workbench.train.measure import ExtraPeak, peak_memory_mb, pick_device, sync

    device = pick_device(spec["device"], "--device")
    torch.manual_seed(spec.get("seed", 0))
    d, vocab, batch, P = spec["d_model"], spec["vocab"], spec["batch"], spec["prompt_len"]
    bb = models.build(spec["model"], d_model=d, n_layers=spec["n_layers"], **spec["options"])
    if not all(hasattr(bb, m) for m in ("init_state", "forward_with_state", "step")):
        raise SystemExit(f"{spec['model']} cannot decode token by token (no init_state / forward_with_state / step)")
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    for m in (bb, emb, head):
        m.to(device).eval()
    gen = torch.Generator(device=device).manual_seed(1)
    prompt = torch.randint(0, vocab, (batch, P), generator=gen, device=device)

    # the start / step of workbench.train.eval_models.load_run, over a batch
    def start(ids):
        y, st = bb.forward_with_state(emb(ids), bb.init_state(ids.shape[0]))
        return head(y[:, -1]), st

    def step(tok, st):
        y, st = bb.step(emb(tok), st)
        return head(y), st

    with torch.inference_mode():
        logits, st = start(prompt[:, :8])        # warm-up: lazy inits, kernels loaded
        for _ in range(2):
            logits, st = step(next_token(logits), st)
        del logits, st
        extra = ExtraPeak(device)
        sync(device)
        t0 = time.perf_counter()
        logits, st = start(prompt)
        sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        per_seq = state_bytes(st) / batch
        tok = next_token(logits)
        for _ in range(spec["warmup"]):
            logits, st = step(tok, st)
            tok = next_token(logits)
        sync(device)
        times = []
        for _ in range(spec["tokens"]):
            t0 = time.perf_counter()
            logits, st = step(tok, st)
            tok = next_token(logits)
            sync(device)
            times.append(time.perf_counter() - t0)
        finite = bool(torch.isfinite(logits).all())
    decode_s = statistics.median(times)
    return {
        "model": spec["label"],
        "prompt_len": P,
        "batch": batch,
        "params": models.param_count(bb),
        "prefill_ms": round(prefill_ms, 2),
        "decode_ms": round(decode_s * 1e3, 3),
        "tok_s": round(batch / decode_s),
        "state_bytes": int(per_seq),
        "peak_mib": round(peak_memory_mb(device), 1),
        "extra_mib": round(extra.mib(), 1),
        "backend": models.backend(bb),
        "device": str(device),
        "finite": finite,
        "d_model": d,
        "n_layers": spec["n_layers"],
        "vocab": vocab,
        "tokens": spec["tokens"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One spec per (model, prompt_len, batch); SystemExit (one line) on a bad choice."""
    import models

    if not args.generate:
        return []
    names = args.models or [m for m in DEFAULT_MODELS if m in models.names()]
    prompt_lens = args.prompt_lens or list(DEFAULT_PROMPT_LENS)
    batches = args.batches or list(DEFAULT_BATCHES)
    too_long = [p for p in prompt_lens if p > MAX_PROMPT_LEN]
    if too_long:
        raise SystemExit(f"--prompt-lens: {too_long[0]:,} is past {MAX_PROMPT_LEN:,} tokens")
    tokens = args.gen_tokens
    specs = []
    for name in names:
        takes = models.entry(name).options()   # unknown model: error listing the known ones
        options = {k: v for k, v in args.opt if k in takes}
        if args.backend and "backend" in takes:
            options["backend"] = args.backend[0]
        for P in prompt_lens:
            opts = dict(options)
            need = P + args.warmup + tokens
            if "max_len" in takes:
                if "max_len" in options and options["max_len"] < need:
                    raise SystemExit(f"{name}: a {P:,}-token prompt + {args.warmup + tokens:,} generated tokens need "
                                     f"{need:,} cache positions, past --opt max_len={options['max_len']:,}")
                opts.setdefault("max_len", need)
            for B in batches:
                specs.append(dict(kind="generate", model=name, label=name, options=opts, prompt_len=P, batch=B,
                                  tokens=tokens, warmup=args.warmup, vocab=args.vocab, d_model=args.d_model,
                                  n_layers=args.n_layers, device=args.device, threads=args.threads))
    return specs


def generate_rows(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """--generate: every spec of :func:`plan` measured by ``run(spec, timeout)``; the
    figure written when ``--figure`` names a folder."""
    rows = []
    for spec in plan(args):
        res = run(spec, args.timeout)
        if "error" in res:
            res = {"model": spec["label"], "prompt_len": spec["prompt_len"], "batch": spec["batch"], **res}
        rows.append(res)
        print(f"  generated {spec['label']} prompt={spec['prompt_len']} batch={spec['batch']}",
              file=sys.stderr, flush=True)
    if rows and getattr(args, "figure", None):
        paths = figure(rows, args.figure)
        print(f"  figure: {', '.join(str(p) for p in paths)}", file=sys.stderr, flush=True)
    return rows


def figure(rows: list[dict[str, Any]], out_dir) -> list:
    """Figure 8 of the Mamba paper, from the rows: (left) tokens/s against batch size at the
    longest prompt measured, (right) per-token decode ms against prompt length at the
    smallest batch; one colour per model. Writes ``generate.png`` and ``.svg``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from workbench.results import figure_base as fb

    ok = [r for r in rows if "error" not in r]
    if not ok:
        return []
    labels = list(dict.fromkeys(r["model"] for r in ok))
    colors = fb.model_colors(labels)
    longest = max(r["prompt_len"] for r in ok)
    smallest = min(r["batch"] for r in ok)
    with fb._style():
        fig = Figure(figsize=(2 * fb.FIGSIZE[0], fb.FIGSIZE[1]), layout="constrained")
        FigureCanvasAgg(fig)
        left, right = fig.subplots(1, 2)
        for i, m in enumerate(labels):
            style = dict(color=colors[m], marker=fb.MARKERS[i % len(fb.MARKERS)], label=m)
            pts = sorted((r["batch"], r["tok_s"]) for r in ok if r["model"] == m and r["prompt_len"] == longest)
            if pts:
                left.plot(*zip(*pts), **style)
            pts = sorted((r["prompt_len"], r["decode_ms"]) for r in ok if r["model"] == m and r["batch"] == smallest)
            if pts:
                right.plot(*zip(*pts), **style)
        device = ok[0].get("device", "")
        left.set(xscale="log", yscale="log", xlabel="batch size", ylabel="generation throughput (tokens/s)",
                 title=f"throughput, prompt {longest:,} ({device})")
        right.set(xscale="log", yscale="log", xlabel="prompt length (tokens)", ylabel="per-token decode time (ms)",
                  title=f"latency per token, batch {smallest} ({device})")
        for ax in (left, right):
            ax.set_xscale("log", base=2)
        left.legend()
    return fb.save(fig, out_dir, "generate")
