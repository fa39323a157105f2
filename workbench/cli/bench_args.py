"""The ``ssm-workbench bench`` command line: its options and their value types (see
workbench.cli.bench), and ``Run``, how the parts have a config measured."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

# (spec, timeout seconds) -> the measured row, or {"error": ...}; in the CLI a fresh process
# per spec (bench._run_subprocess), in tests the same measurement in-process
Run = Callable[[dict[str, Any], float], dict[str, Any]]


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


_SUFFIX = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}


def _match(text: str) -> tuple[str, int]:
    """``params=N`` or ``state_size=N`` (N an integer, or with a k / M / G suffix: 3.2M)."""
    target, sep, raw = text.partition("=")
    target, raw = target.strip(), raw.strip()
    if not sep or target not in ("params", "state_size"):
        raise argparse.ArgumentTypeError(f"expected params=N or state_size=N, got {text!r}")
    scale = _SUFFIX.get(raw[-1:], 1) if raw else 1
    number = raw[:-1] if scale > 1 else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{target}: expected a whole number such as 3200000 or 3.2M, "
                                         f"got {raw!r}") from None
    if not value.is_integer() or value < 1:
        raise argparse.ArgumentTypeError(f"{target}: expected a whole number >= 1, got {raw!r}")
    return target, int(value)


class _Parser(argparse.ArgumentParser):
    """``--batch`` takes a comma list (``batches``) for --generate; every other table
    measures one batch size (``batch``, default 8)."""

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        ns.batches = ns.batch
        if ns.batch is not None and len(ns.batch) > 1 and not ns.generate:
            self.error("--batch: one size (a comma list is for --generate)")
        ns.batch = ns.batch[0] if ns.batch else 8
        if ns.match is not None:
            other = [flag for flag, on in (("--estimate", ns.estimate), ("--stream-tokens", ns.stream_tokens))
                     if on]
            if other:
                self.error(f"--match sizes the models of the training-step table or --generate; "
                           f"{other[0]} does not take it")
            if ns.generate and ns.from_table:
                self.error("--match sizes the models --generate measures; --from-table measures none "
                           "(a matched table's rows keep their solved widths)")
        return ns, rest


def build_parser(description: str) -> argparse.ArgumentParser:
    """Every bench option; ``description`` heads ``--help``."""
    p = _Parser(prog="ssm-workbench bench", description=description)
    p.add_argument("--models", type=_csv_list, default=None,
                   help="comma-separated registry names (default: mamba,transformer where registered)")
    p.add_argument("--seq-lens", type=_int_list, default=[256, 1024])
    p.add_argument("--batch", type=_int_list, default=None,
                   help="batch size (default 8); with --generate a comma list (default 1,8,32)")
    p.add_argument("--d-model", type=_positive, default=64)
    p.add_argument("--n-layers", type=_positive, default=2)
    p.add_argument("--backend", type=_csv_list, default=None,
                   help="scan backend(s) for models that take `backend` (e.g. ref,torch)")
    p.add_argument("--opt", type=_option, action="append", default=[], metavar="KEY=VALUE",
                   help="model option (JSON value) for every model that takes it; repeatable")
    p.add_argument("--match", type=_match, default=None, metavar="TARGET=N",
                   help="params=N (non-embedding parameters) or state_size=N (state floats per sequence): "
                        "solve each model's width (or d_state, expand_v, ...) to N within 2%% as a profile's "
                        "[sweep.match] does (workbench.spec.match), at --n-layers; --d-model is the width where "
                        "another knob is solved. Models that cannot be matched are named with the reason, the "
                        "others measured. With --generate: the decoding models, the solved d_model, matched "
                        "and match_err_%% in the generation table")
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
    p.add_argument("--generate", action="store_true",
                   help="autoregressive decoding (workbench.cli.bench_generate): prefill, per-token time, "
                        "tokens/s and state bytes per (model, --prompt-lens, --batch); --models default "
                        "transformer,mamba,mamba2,gated_deltanet; --match sizes each model (its solved width "
                        "in the table)")
    p.add_argument("--prompt-lens", type=_int_list, default=None,
                   help="--generate: prompt lengths (default 256,1024,4096; at most 16384)")
    p.add_argument("--gen-tokens", type=_positive, default=32,
                   help="--generate: timed decode steps (after --warmup untimed ones)")
    p.add_argument("--vocab", type=_positive, default=512, help="--generate: ids of the random LM head")
    p.add_argument("--figure", metavar="PATH", default=None,
                   help="--generate: the Figure-8-style figure (throughput vs batch, latency and memory vs "
                        "prompt): a folder gets generate.png and .svg, NAME.png or NAME.svg both formats")
    p.add_argument("--figure-stat", default="median", choices=["median", "min"],
                   help="--generate --figure: each config's median decode step, or its fastest (a loaded machine)")
    p.add_argument("--grid", default="product", choices=["product", "axes"],
                   help="--generate: every (prompt, batch), or the figure's two axes only (every batch at "
                        "the shortest prompt, every prompt at the smallest batch)")
    p.add_argument("--from-table", metavar="FILE", default=None,
                   help="--generate: the rows of an earlier --format json or csv output, not measured again "
                        "(with --figure: redraw the figure)")
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "off"],
                   help="--generate on CUDA: decode a fixed-size state through a captured CUDA graph (auto) "
                        "or eagerly (off)")
    p.add_argument("--one", metavar="SPEC_JSON", help=argparse.SUPPRESS)  # internal: one config
    return p
