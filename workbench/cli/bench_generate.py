"""``ssm-workbench bench --generate``: autoregressive decoding of registry backbones, the
measurement of the Mamba paper's §4.5 / Figure 8 (a recurrent model generates from a
fixed-size state; a Transformer's key/value cache grows with the prompt).

    ssm-workbench bench --generate --models transformer,mamba --prompt-lens 256,1024,4096 --batch 1,8,32
    ssm-workbench bench --generate --grid axes --prompt-lens 256,1024,4096,16384 --batch 1,4,16,64 \\
        --d-model 256 --n-layers 4 --format json --figure docs/figures/generation.png > generation.json
    ssm-workbench bench --generate --from-table generation.json --figure docs/figures/generation.png

For each (model, prompt length, batch) a fresh process (``--one``, as the other tables)
builds a random language model around the backbone: an embedding and a linear head over
``--vocab`` ids (random weights: this measures speed, not text), on CUDA where torch sees
one (``--device``). It reads a random prompt (batch, prompt_len) in one parallel pass
(``forward_with_state``: the Transformer's causal SDPA, a recurrent family's chunked
scan) and then generates greedily, one token per step for every sequence of the batch,
with the same start/step as ``ssm-workbench sample`` (workbench.train.eval_models.load_run:
``step`` per token, carrying the recurrent state or the Transformer's KV cache). The loop
is workbench.train.decode.greedy_steps: the next token is the argmax kept on the device,
no host synchronisation per token (on CUDA each step is timed by events read after the
loop). On CUDA a fixed-size state decodes through one captured CUDA graph per step
(decode.graphed_step; ``--cuda-graphs off``: eager, to compare); so does the Transformer,
whose growing KV cache is first copied into a static one of prompt + tokens positions
(``Transformer.static_state``: each step then attends over all of them, empty ones masked,
as HF's StaticCache does), so that both sides of the comparison are graphed. Per row:

- prefill_ms:   reading the prompt and the first logits (one call after a short warm-up).
- decode_ms:    per-token decode time, the median over ``--gen-tokens`` steps after
                ``--warmup`` untimed ones.
- tok_s:        batch / decode time: tokens generated per second over the batch.
- state_bytes:  the state (recurrent state or filled KV cache) after the prompt, bytes per
                sequence: a recurrent family's is constant in the prompt length, the
                Transformer's grows with it.
- peak_mib:     the process's peak (RSS on CPU, the allocator's peak on CUDA); extra_mib:
                what prefill and decoding added above the built model.

``--grid product`` (default) measures every (prompt length, batch); ``--grid axes`` the two
axes of Figure 8 only: every batch at the shortest prompt and every prompt length at the
smallest batch (64 sequences of 16,384 tokens would hold a 4-layer d_model 256
Transformer's 8.6 GB of keys and values). A Transformer is built with ``max_len`` = prompt
+ tokens (its cache and position table); an ``--opt max_len`` below that is refused in one
line. ``--figure PATH`` draws the rows (:func:`figure`): a folder gets ``generate.png`` /
``.svg``, a file name ending in .png or .svg gets that name in both formats.
``--from-table FILE`` reads the rows of an earlier ``--format json`` or ``csv`` output
instead of measuring (to redraw the figure); ``--figure-stat min`` draws each config's
fastest step instead of its median (JSON rows keep ``decode_min_ms``): on a machine shared
with other work the median measures the neighbours.

``--match params=N`` / ``state_size=N`` compares models of one size (the Mamba paper's
Figure 8 compares matched sizes): each model's width (and finer knob, where the solver needs
one) is solved once, at ``--n-layers``, by the training table's solver and code path
(workbench.cli.bench_models.match_size over workbench.spec.match.solve), and every config of
that model is built at it. The table gains ``d_model``, ``n_layers``, any finer knob, the
solver's count (``matched``) and its distance from N (``match_err_%``), as the training table
does; a model the solver refuses is named under the table with the training table's words
and the others are measured. ``--grid`` plans as without it; ``--from-table`` reads a matched
table's columns back (and a JSON table's target and refusals); ``--figure`` puts each model's
solved width in its legend entry and the target in the title.

    ssm-workbench bench --generate --match params=3.2M --n-layers 4 --models transformer,mamba,mamba2
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from workbench.cli.bench_args import Run

DEFAULT_MODELS = ("transformer", "mamba", "mamba2", "gated_deltanet")
DEFAULT_PROMPT_LENS = (256, 1024, 4096)
DEFAULT_BATCHES = (1, 8, 32)
MAX_PROMPT_LEN = 16384
GRIDS = ("product", "axes")
GENERATE_COLUMNS = ["model", "prompt_len", "batch", "params", "prefill_ms", "decode_ms", "tok_s",
                    "state_bytes", "peak_mib", "extra_mib", "backend", "device"]
# --generate --match: the solved width (and any finer knob, after n_layers) and the solver's
# count and error beside the measurement, as the training-step table's MATCH_COLUMNS
GENERATE_MATCH_COLUMNS = ["model", "prompt_len", "batch", "d_model", "n_layers", "params", "matched",
                          "match_err_%", "prefill_ms", "decode_ms", "tok_s", "state_bytes", "peak_mib",
                          "extra_mib", "backend", "device"]
_INT_COLUMNS = {"prompt_len", "batch", "params", "tok_s", "state_bytes", "d_model", "n_layers", "matched",
                "d_state"}
_FLOAT_COLUMNS = {"prefill_ms", "decode_ms", "peak_mib", "extra_mib", "match_err_%", "expand_v", "mlp_mult"}


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a decoding state: nested lists / tuples / dicts / dataclasses
    of tensors; an object with ``nbytes()`` (a KVCache or FoX's cache: its filled
    positions) counts what that says."""
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
    import statistics

    import torch
    import torch.nn as nn

    import models
    from workbench.train.decode import graphed_step, greedy_steps, next_token
    from workbench.train.measure import ExtraPeak, StepClock, peak_memory_mb, pick_device, sync

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

    graph_note = "off" if spec.get("cuda_graphs", "auto") == "off" else ""
    with torch.inference_mode():
        logits, st = start(prompt[:, :8])        # warm-up: lazy inits, kernels loaded
        greedy_steps(step, next_token(logits), st, 2)
        del logits, st
        extra = ExtraPeak(device)
        sync(device)
        t0 = time.perf_counter()
        logits, st = start(prompt)
        sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        per_seq = state_bytes(st) / batch
        tok = next_token(logits)
        run_step = step
        if not graph_note:
            if device.type == "cuda" and hasattr(bb, "static_state"):   # a KV cache of fixed size
                st = bb.static_state(st, P + spec["warmup"] + spec["tokens"])
            run_step, graph_note = graphed_step(step, tok, st)
        tok, logits, st = greedy_steps(run_step, tok, st, spec["warmup"])
        sync(device)
        clock = StepClock(device)
        out = torch.empty(batch, spec["tokens"], dtype=torch.long, device=device)
        tok, logits, st = greedy_steps(run_step, tok, st, spec["tokens"], out=out, clock=clock)
        times = clock.collect()
        finite = bool(torch.isfinite(logits).all())
    decode_s = statistics.median(times)
    return {
        "model": spec["label"],
        "prompt_len": P,
        "batch": batch,
        "params": models.param_count(bb),
        "prefill_ms": round(prefill_ms, 2),
        "decode_ms": round(decode_s * 1e3, 3),
        "decode_min_ms": round(min(times) * 1e3, 3),   # on a loaded machine: the least disturbed step
        "tok_s": round(batch / decode_s),
        "state_bytes": int(per_seq),
        "peak_mib": round(peak_memory_mb(device), 1),
        "extra_mib": round(extra.mib(), 1),
        "backend": models.backend(bb),
        "device": str(device),
        "finite": finite,
        "cuda_graph": not graph_note,
        "cuda_graph_note": graph_note,
        "d_model": d,
        "n_layers": spec["n_layers"],
        "vocab": vocab,
        "tokens": spec["tokens"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,   # uptime's, at the end
    }


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One spec per (model, prompt_len, batch) of the grid (``--grid``); see :func:`plan_matched`."""
    return plan_matched(args)[0]


def plan_matched(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One spec per (model, prompt_len, batch) of the grid (``--grid``), each model sized by
    ``--match`` when given (workbench.cli.bench_models.match_size, the training-step table's
    solver and code path: one width per model, solved at the longest prompt's ``max_len`` as
    the training table solves at its longest length); and the models the match refuses,
    ``{"model", "reason"}`` each (they get no spec). SystemExit (one line) on a bad choice."""
    import models
    from workbench.cli.bench_models import match_size

    if not args.generate:
        return [], []
    names = args.models or [m for m in DEFAULT_MODELS if m in models.names()]
    prompt_lens = args.prompt_lens or list(DEFAULT_PROMPT_LENS)
    batches = args.batches or list(DEFAULT_BATCHES)
    grid = getattr(args, "grid", "product")
    if grid not in GRIDS:
        raise SystemExit(f"--grid: {grid!r} is not one of {', '.join(GRIDS)}")
    too_long = [p for p in prompt_lens if p > MAX_PROMPT_LEN]
    if too_long:
        raise SystemExit(f"--prompt-lens: {too_long[0]:,} is past {MAX_PROMPT_LEN:,} tokens")
    if grid == "product":
        pairs = [(P, B) for P in prompt_lens for B in batches]
    else:   # every batch at the shortest prompt, every prompt at the smallest batch
        p0, b0 = min(prompt_lens), min(batches)
        pairs = list(dict.fromkeys([(p0, B) for B in batches] + [(P, b0) for P in prompt_lens]))
    tokens = args.gen_tokens
    specs: list[dict[str, Any]] = []
    refused: list[dict[str, str]] = []
    takes_of, options_of, sized_of = {}, {}, {}
    for name in names:
        takes_of[name] = takes = models.entry(name).options()   # unknown model: error listing the known ones
    for name in names:
        takes = takes_of[name]
        options = {k: v for k, v in args.opt if k in takes}
        if args.backend and "backend" in takes:
            options["backend"] = args.backend[0]
        at = dict(options)
        if "max_len" in takes and "max_len" not in at:
            at["max_len"] = max(prompt_lens) + args.warmup + tokens
        sized = match_size(name, args, at, refused)
        if sized is None:
            continue
        d_model, solved, matched = sized
        # the finer knob the solver set, where one; max_len stays each config's own (below)
        options_of[name] = {**options, **{k: v for k, v in solved.items() if k not in at}}
        sized_of[name] = d_model, matched
    # the models interleaved in time (each config measured for every model before the next),
    # so a change of the machine's load between configs falls on all models alike
    for P, B in pairs:
        for name, options in options_of.items():
            takes = takes_of[name]
            d_model, matched = sized_of[name]
            opts = dict(options)
            need = P + args.warmup + tokens
            if "max_len" in takes:
                if "max_len" in options and options["max_len"] < need:
                    raise SystemExit(f"{name}: a {P:,}-token prompt + {args.warmup + tokens:,} generated tokens need "
                                     f"{need:,} cache positions, past --opt max_len={options['max_len']:,}")
                opts.setdefault("max_len", need)
            specs.append(dict(kind="generate", model=name, label=name, options=opts, prompt_len=P, batch=B,
                              tokens=tokens, warmup=args.warmup, vocab=args.vocab, d_model=d_model,
                              n_layers=args.n_layers, device=args.device, threads=args.threads,
                              cuda_graphs=getattr(args, "cuda_graphs", "auto"),
                              **({"match": matched} if matched else {})))
    return specs, refused


def read_table(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an earlier ``bench --generate`` output: ``--format json`` (its
    "generate" list) or ``--format csv`` (numbers parsed back; a ``--match`` table's solved
    widths, counts and errors too); SystemExit in one line naming the file when it is
    neither (:func:`read_match` reads a JSON table's match)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SystemExit(f"--from-table {p}: cannot read it ({e.strerror or e})") from None
    if text.lstrip().startswith("{"):
        try:
            rows = json.loads(text).get("generate")
        except (json.JSONDecodeError, AttributeError):
            rows = None
        if not isinstance(rows, list):
            raise SystemExit(f"--from-table {p}: not the JSON of bench --generate --format json (no 'generate' list)")
        return rows
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or not {"model", "prompt_len", "batch", "decode_ms", "tok_s"} <= set(rows[0]):
        raise SystemExit(f"--from-table {p}: not a bench --generate table (--format json or csv with the "
                         f"columns {', '.join(GENERATE_COLUMNS)})")
    out = []
    for r in rows:
        try:   # an empty cell: a column of another row (a finer knob solved for another model)
            row = {k: (int(v) if k in _INT_COLUMNS else float(v) if k in _FLOAT_COLUMNS else v)
                   for k, v in r.items() if v != ""}
        except ValueError:
            row = {}
        # a row that failed: its numbers are empty
        out.append(row if "decode_ms" in row else {"model": r["model"], "error": "no numbers in the table"})
    return out


def read_match(path: str | Path) -> tuple[tuple[str, int] | None, list[dict[str, str]]]:
    """The ``--match`` of an earlier ``--format json`` table (target, value) and the models
    it refused; (None, []) for a table without one (or a CSV, which holds the rows alone)."""
    try:
        doc = json.loads(Path(path).read_text())
        m = doc["match"]
        return (m["target"], int(m["value"])), list(m.get("unmatched", []))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, []


def generate_rows(args: argparse.Namespace, run: Run) -> tuple[list[dict[str, Any]], tuple[str, int] | None,
                                                                list[dict[str, str]]]:
    """--generate: every spec of :func:`plan_matched` measured by ``run(spec, timeout)``
    (or the rows of ``--from-table``), with the match's solved knobs, count and error in
    each row under ``--match``; the figure written when ``--figure`` names a path. Returns
    (rows, the match: --match's or the JSON table's, the models it refused)."""
    if not args.generate:
        return [], None, []
    if getattr(args, "from_table", None):
        rows = read_table(args.from_table)
        match, refused = read_match(args.from_table)
    else:
        rows = []
        specs, refused = plan_matched(args)
        match = args.match
        for spec in specs:
            res = run(spec, args.timeout)
            if "error" in res:
                res = {"model": spec["label"], "prompt_len": spec["prompt_len"], "batch": spec["batch"],
                       "d_model": spec["d_model"], "n_layers": spec["n_layers"], **res}
            rows.append({**res, **spec.get("match", {})})
            print(f"  generated {spec['label']} prompt={spec['prompt_len']} batch={spec['batch']}",
                  file=sys.stderr, flush=True)
        order = list(dict.fromkeys(s["label"] for s in specs))   # the table: one model after another
        rows.sort(key=lambda r: order.index(r["model"]))
    if rows and getattr(args, "figure", None):
        paths = figure(rows, args.figure, getattr(args, "figure_stat", "median"), match)
        print(f"  figure: {', '.join(str(p) for p in paths)}", file=sys.stderr, flush=True)
    return rows, match, refused


def _most(ok: list[dict[str, Any]], key: str, other: str, prefer) -> Any:
    """The value of ``key`` measured at the most values of ``other`` (ties: ``prefer``)."""
    counts: dict[Any, set] = {}
    for r in ok:
        counts.setdefault(r[key], set()).add(r[other])
    top = max(len(v) for v in counts.values())
    return prefer(k for k, v in counts.items() if len(v) == top)


def figure(rows: list[dict[str, Any]], out, stat: str = "median",
           match: tuple[str, int] | None = None) -> list[Path]:
    """Figure 8 of the Mamba paper, from the rows of a table: (left) tokens/s against batch
    size at the prompt length measured at the most batch sizes (ties: the longest),
    (middle) per-token decode ms against prompt length at the batch measured at the most
    prompt lengths (ties: the smallest), (right) the state or KV cache per sequence (MiB)
    against prompt length there; one colour and marker per model, log axes ticked at the
    values measured. ``out``: a folder (``generate.png`` / ``.svg`` in it) or a file name
    ending in .png / .svg (that stem, both formats). ``stat``: "median" draws decode_ms and
    tok_s; "min" the fastest step of each row (decode_min_ms, and batch / it as tokens/s),
    what the hardware does when nothing else runs, for a machine shared with other work.
    Rows of ``--match`` (carrying ``matched``): each model's solved width in its legend
    entry, and the title names the target (``match``: target, value) instead of one width.
    Returns the paths written ([] when no row has numbers)."""
    from workbench.results import figure_base as fb

    ok = [r for r in rows if "error" not in r]
    if not ok:
        return []
    if stat == "min":
        if any("decode_min_ms" not in r for r in ok):
            raise SystemExit("--figure-stat min: the rows have no decode_min_ms (a --format json table has it, csv not)")
        ok = [{**r, "decode_ms": r["decode_min_ms"], "tok_s": r["batch"] / r["decode_min_ms"] * 1e3} for r in ok]
    elif stat != "median":
        raise SystemExit(f"--figure-stat: {stat!r} is not median or min")
    out = Path(out)
    out_dir, stem = (out.parent, out.stem) if out.suffix.lower() in (".png", ".svg") else (out, "generate")
    labels = list(dict.fromkeys(r["model"] for r in ok))
    colors = fb.model_colors(labels)
    at_prompt = _most(ok, "prompt_len", "batch", max)
    at_batch = _most(ok, "batch", "prompt_len", min)
    device = ok[0].get("device", "")
    shape = ", ".join(f"{k} {ok[0][k]}" for k in ("d_model", "n_layers") if k in ok[0])
    matched = any("matched" in r for r in ok)
    legend = {m: m for m in labels}
    if matched:   # one width per model: in its legend entry
        widths = {r["model"]: r["d_model"] for r in ok if "d_model" in r}
        legend = {m: f"{m} (d_model {widths[m]})" if m in widths else m for m in labels}
        what = (f"{match[0]} matched to {match[1]:,}" if match else "sizes matched")
        shape = ", ".join(filter(None, [f"n_layers {ok[0]['n_layers']}" if "n_layers" in ok[0] else "",
                                        f"{what} (within 2%)"]))
    with fb._style():
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(3 * fb.FIGSIZE[0] * 0.75, fb.FIGSIZE[1]), layout="constrained")
        FigureCanvasAgg(fig)
        left, mid, right = fig.subplots(1, 3)
        xs: dict[Any, set] = {left: set(), mid: set(), right: set()}
        for i, m in enumerate(labels):
            style = dict(color=colors[m], marker=fb.MARKERS[i % len(fb.MARKERS)], label=legend[m])
            mine = [r for r in ok if r["model"] == m]
            for ax, pts in (
                    (left, sorted((r["batch"], r["tok_s"]) for r in mine if r["prompt_len"] == at_prompt)),
                    (mid, sorted((r["prompt_len"], r["decode_ms"]) for r in mine if r["batch"] == at_batch)),
                    (right, sorted((r["prompt_len"], r["state_bytes"] / 2**20) for r in mine
                                   if r["batch"] == at_batch and r.get("state_bytes")))):
                if pts:
                    ax.plot(*zip(*pts), **style)
                    xs[ax].update(p[0] for p in pts)
        left.set(yscale="log", xlabel="batch size", ylabel="generation throughput (tokens/s)",
                 title=f"throughput, prompt {at_prompt:,} tokens")
        mid.set(yscale="log", xlabel="prompt length (tokens)", ylabel="per-token decode time (ms)",
                title=f"latency per token, batch {at_batch}")
        right.set(yscale="log", xlabel="prompt length (tokens)", ylabel="state or KV cache per sequence (MiB)",
                  title="memory per sequence")
        for ax in (left, mid, right):
            if xs[ax]:
                fb._log2_x(ax, sorted(xs[ax]))
        each = "median step" if stat == "median" else "fastest step"
        fig.suptitle(f"generation ({device}{', ' + shape if shape else ''}; random weights; {each} of each config)")
        handles, names = left.get_legend_handles_labels()
        if not handles:
            handles, names = mid.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncols=min(5, len(handles)), frameon=False)
    return fb.save(fig, out_dir, stem)
