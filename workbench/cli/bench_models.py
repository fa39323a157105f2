"""``ssm-workbench bench``'s model bench: the training step of registry backbones, one
config (model, backend, seq_len) a row; ``measure_one`` runs inside the ``--one`` process
(workbench.train.measure does the measuring), the rest plans and collects (see workbench.cli.bench).

``--match params=N`` / ``state_size=N`` sizes each model as a profile's ``[sweep.match]``
does, with the same solver (workbench.spec.match.solve, at ``--n-layers``, with the
model's ``--opt`` options): its solved width (and finer knob, where the solver needed one)
replaces ``--d-model``, so the table compares models of one size. A model the solver
refuses is not measured; its reason, the solver's own words, is reported beside the table
(:func:`plan_matched`), and the other models are measured all the same."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.cli.bench_args import Run


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


def _default_models() -> list[str]:
    import models
    return [m for m in ("mamba", "transformer") if m in models.names()]


def model_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The --opt options ``name`` takes, and a position table long enough for --seq-lens."""
    import models

    takes = models.entry(name).options()
    base = {k: v for k, v in args.opt if k in takes}
    if "max_len" in takes and "max_len" not in base:
        # absolute/learned position tables must cover the longest benchmarked length
        base["max_len"] = max(takes["max_len"] or 0, max(args.seq_lens))
    return base


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Expand the arguments into one spec per (model, backend, seq_len) (see :func:`plan_matched`)."""
    return plan_matched(args)[0]


def _solve(name: str, args: argparse.Namespace, options: dict[str, Any]):
    """``name`` sized by ``--match`` (workbench.spec.match.solve): (its width, its options
    with the finer knob where one was solved, the solver's record); MatchError with the
    solver's reason where the target cannot be met."""
    from workbench.spec import match

    target, value = args.match
    s = match.solve(name, target, value, d_model=args.d_model, n_layers=args.n_layers, options=options)
    solved = dict(s.solved)
    return solved.pop("d_model", args.d_model), {**options, **solved}, s


def match_size(name: str, args: argparse.Namespace, options: dict[str, Any],
               refused: list[dict[str, str]]) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """``name``'s width and options under ``--match`` (as given without it): (d_model, the
    options with any finer knob solved, the row's match columns: the finer knob, ``matched``
    and ``match_err_%``; {} without --match). None where the solver refuses the model: its
    reason is appended to ``refused`` and named on stderr. The training-step table and
    ``--generate`` (workbench.cli.bench_generate) size their models here, alike."""
    from workbench.spec.match import MatchError

    if getattr(args, "match", None) is None:
        return args.d_model, options, {}
    try:
        d_model, options, solved = _solve(name, args, options)
    except MatchError as e:
        refused.append({"model": name, "reason": str(e)})
        print(f"  not matched {name}: {e}", file=sys.stderr, flush=True)
        return None
    print(f"  matched {name}: {solved.text()}", file=sys.stderr, flush=True)
    return d_model, options, {**{k: v for k, v in solved.solved.items() if k != "d_model"},
                              "matched": solved.got, "match_err_%": round(100 * solved.error, 2)}


def plan_matched(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Expand the arguments into one spec per (model, backend, seq_len), each model sized by
    ``--match`` when given; and the models the match refuses, ``{"model", "reason"}`` each
    (they get no spec)."""
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
    specs, refused = [], []
    for name in names:
        sized = match_size(name, args, model_options(name, args), refused)
        if sized is None:
            continue
        d_model, base, matched = sized
        backends = args.backend if (args.backend and "backend" in takes[name]) else [None]
        for backend in backends:
            options = dict(base, **({"backend": backend} if backend else {}))
            label = f"{name}[{backend}]" if backend and len(backends) > 1 else name
            for L in args.seq_lens:
                specs.append(dict(kind="train", model=name, label=label, options=options, seq_len=L,
                                  batch=args.batch, d_model=d_model, n_layers=args.n_layers,
                                  repeats=args.repeats, warmup=args.warmup, device=args.device,
                                  threads=args.threads, **({"match": matched} if matched else {})))
    return specs, refused


def train_rows(args: argparse.Namespace, run: Run) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The training-step table: every spec of ``plan_matched(args)`` measured by
    ``run(spec, timeout)`` (in the CLI, a fresh process each), with the match's solved
    knobs, count and error in each row under ``--match``; and the models the match refused."""
    specs, refused = plan_matched(args)
    rows = []
    for spec in specs:
        res = run(spec, args.timeout)
        if "error" in res:
            res = {"model": spec["label"], "seq_len": spec["seq_len"],
                   "backend": spec["options"].get("backend", ""), "d_model": spec["d_model"],
                   "n_layers": spec["n_layers"], **res}
        rows.append({**res, **spec.get("match", {})})
        print(f"  measured {spec['label']} L={spec['seq_len']}", file=sys.stderr, flush=True)
    return rows, refused
