"""Training compute per token of a registry backbone: parameters and FLOPs at a sequence length.

>>> import models
>>> c = models.flops("mamba", seq_len=2048, d_model=768, n_layers=24)
>>> c.total, c.matmul, c.extra, c.terms          # training FLOPs per token (forward + backward)

Conventions (the same for every entry; the docstrings of the terms below derive each one):

- FLOPs, not multiply-adds: a multiply-add counts 2. Training = forward + backward =
  3 x forward (the backward computes the gradients of the inputs and of the weights, each as
  costly as the forward: Kaplan et al. 2020, section 2.1; Hoffmann et al. 2022, appendix F).
- ``matmul``: 2 x (weights of every ``nn.Linear`` and recurrent ``nn.LSTM`` matrix applied
  once per token) forward, so 6 x those weights for training: the "6N" rule
  (Kaplan et al. 2020, C ~ 6N). It is read from the built module, so options (expand,
  d_state, heads, ...) change it without a table per entry. Biases are left out, as 6N does.
- ``extra``: each family's own work per token, read from the modules' real shapes:
  attention's scores and weighted sums, selective scans, linear-attention / delta-rule
  state updates, FFT long convolutions and short depthwise convolutions. Element-wise work
  (norms, activations, gates, the D skip, softmax, feature maps) is left out, as Kaplan's
  and Chinchilla's counts leave out norms and activations.
- Work done once per batch and not per token is not per-token compute and is left out:
  kernel generation of S4 / S4D / S4-DPLR (Vandermonde, Cauchy, matrix powers), Hyena's
  implicit filter MLP (run over L positions once per batch) and the FFT of those kernels.
- Parameters: a backbone has no token embedding (that is the task's encoder); its
  "embedding" parameters are position tables (a Transformer's learned ``pos_emb``) and any
  ``nn.Embedding`` inside it. ``non_embedding`` = total - embedding, Kaplan's N. A composed
  model (task encoder + backbone + head) adds the task's embedding table and its head; a run
  records both (workbench.train.summary).

``python -m models.compute --table`` prints each entry's FLOPs per token at d_model 768,
L 2048 (12 layers for entries whose layer is attention + MLP, 24 for one-mixer layers, as the
Mamba paper doubles Mamba's depth) against 6N.
"""
from __future__ import annotations

import argparse
import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

# the registry, not the package: ``models/__init__.py`` imports this module for
# ``models.flops`` (importing ``models.registry`` runs that __init__ first, so every catalogue
# has registered its entries by the time a function here runs)
from models import registry

#: where a backbone is trained as one token-mixer per layer (no MLP): the table gives it
#: twice the layers of attention + MLP entries, as the Mamba paper does (section 4.2).
TABLE_D_MODEL, TABLE_SEQ_LEN = 768, 2048
TABLE_MLP_ENTRIES = frozenset({"transformer", "interleaved", "hybrid", "hybrid_parallel"})


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int       # position tables / nn.Embedding inside the backbone
    non_embedding: int   # total - embedding: Kaplan et al.'s N


@dataclass(frozen=True)
class FlopCount:
    """Training FLOPs per token (forward + backward = 3 x forward) at ``seq_len``."""
    seq_len: int
    matmul: float                # 6 x weights of the per-token nn.Linear / LSTM matrices
    extra: float                 # the family terms (sum of ``terms``)
    terms: dict[str, float] = field(default_factory=dict)   # name -> training FLOPs / token
    params: ParamCount | None = None

    @property
    def total(self) -> float:
        return self.matmul + self.extra

    @property
    def forward(self) -> float:
        return self.total / 3

    def six_n(self) -> float | None:
        """Kaplan's 6N with N = non-embedding parameters (the rule of thumb to compare with)."""
        return None if self.params is None else 6.0 * self.params.non_embedding


TRAIN_FACTOR = 3  # forward + backward (grad of inputs + grad of weights) = 3 x forward


# ---------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------
def param_counts(module: nn.Module) -> ParamCount:
    """Total, embedding (nn.Embedding tables and ``*pos_emb`` / ``*token_embedding``
    parameters) and non-embedding parameters of ``module``."""
    total = sum(p.numel() for p in module.parameters())
    emb_ids: set[int] = set()
    for m in module.modules():
        if isinstance(m, nn.Embedding):
            emb_ids.update(id(p) for p in m.parameters())
    for name, p in module.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if last.endswith("pos_emb") or "token_embedding" in name or last == "wpe" or ".wpe." in name:
            emb_ids.add(id(p))
    emb = sum(p.numel() for p in module.parameters() if id(p) in emb_ids)
    return ParamCount(total, emb, total - emb)


# ---------------------------------------------------------------------------------------
# family terms: forward FLOPs per token of one module, from its shapes (x 3 for training)
# ---------------------------------------------------------------------------------------
def causal_mean_keys(seq_len: int, window: int | None = None) -> float:
    """Mean number of keys a query attends to under a causal mask (position t, 1-based,
    sees min(t, window) keys): (L + 1) / 2 for full attention; for a window w < L,
    (w (w + 1) / 2 + (L - w) w) / L, which tends to w."""
    L = seq_len
    if window is None or window >= L:
        return (L + 1) / 2
    return (window * (window + 1) / 2 + (L - window) * window) / L


def attention_fwd(d_attn: int, seq_len: int, window: int | None = None) -> float:
    """Softmax attention, forward FLOPs per token per layer.

    Per (query, key) pair: q.k over d_head channels and the weighted sum a * v over d_head
    channels, 2 multiply-adds per channel, summed over heads: 2 x 2 x d_attn FLOPs. A causal
    query at position t has t keys (min(t, w) with a window), (L + 1) / 2 on average, so
    forward = 4 d_attn (L + 1) / 2 = 2 d_attn (L + 1); training 6 d_attn (L + 1) per layer.

    Convention: only the pairs the causal mask keeps (Kaplan et al. 2020, Table 1, whose
    forward attention term is 2 n_layer n_ctx d_attn, the same number for L >> 1). Hoffmann
    et al. 2022 (Chinchilla, appendix F) count every pair of the L x L square, 2x this; a
    dense kernel that computes the masked half does that work too, but it is not useful
    work, and block-sparse kernels (FlashAttention) skip most of it. Sliding windows replace
    (L + 1) / 2 by the mean of min(t, w).
    """
    return 4.0 * d_attn * causal_mean_keys(seq_len, window)


def selective_scan_fwd(d_inner: int, d_state: int) -> float:
    """S6 selective scan (Mamba), forward FLOPs per token per layer: 9 d_inner N.

    Per channel and state entry and step: discretise (delta * A, exp: ~2), B-bar x
    (delta x B: ~1 given delta x per channel), h = A-bar h + B-bar x (2), y += C h (2) = 7,
    plus the parallel scan's ~2 combine operations per step; A. Gu gives 9 L N per channel
    for the scan (state-spaces/mamba issue #110), i.e. 9 d_inner N per token. The input-
    dependent projections (x_proj, dt_proj) are nn.Linear and counted in the matmul part.
    """
    return 9.0 * d_inner * d_state


#: multiply-add work of one recurrent step per head, in units of d_k x d_v (FLOPs):
#:   state update  S = S + k v^T                 2 d_k d_v   (outer product, accumulate)
#:   read-out      o = S^T q                     2 d_k d_v
#:   decay         S = diag(a) S  (GLA, RetNet, Mamba-2, gated delta)   + 1 d_k d_v
#:   delta rule    u = S^T k, then S += k (beta (v - u))^T              + 2 d_k d_v
#: The chunked algorithms (fla's, the project's torch/C backends) do this work in chunks
#: plus an intra-chunk quadratic part of O(chunk x (d_k + d_v)) per token; the count is the
#: recurrent form's, which every backend computes the same function of (Yang et al. 2024,
#: GLA section 3; Yang et al. 2024, DeltaNet section 3).
#: Gated DeltaProduct (n Householder steps per token): decay 1 + n x (delta 2 + update 2)
#: + read-out 2 = 3 + 4 n (n = 1: the gated delta rule's 7).
#: KDA (Kimi Delta Attention): the gated delta rule with a per-key-channel decay, one
#: multiply per state element all the same: 7. RWKV-7's generalised delta rule
#: S = diag(w) S + b (a^T S) + k v^T, read out by q: decay 1 + a^T S 2 + the b outer
#: product 2 + k v^T 2 + read-out 2 = 9.
STATE_UPDATE_UNITS = {"linear_attention": 4, "simple_gla": 5, "gla": 5, "delta_rule": 6,
                      "gated_delta_rule": 7, "gated_delta_product": 7, "kda": 7, "rwkv7": 9}


def state_update_fwd(op_name: str, n_heads: int, d_k: int, d_v: int,
                     num_householder: int = 1) -> float:
    """Linear-attention-style recurrence, forward FLOPs per token per layer:
    units(op) x n_heads (the state's: value heads) x d_k x d_v (see ``STATE_UPDATE_UNITS``;
    gated_delta_product: 3 + 4 num_householder units)."""
    units = (3 + 4 * num_householder if op_name == "gated_delta_product"
             else STATE_UPDATE_UNITS[op_name])
    return float(units * n_heads * d_k * d_v)


def fft_len(seq_len: int) -> int:
    from models.conv.fftconv import _fast_len   # the length fft_conv really transforms at
    return _fast_len(2 * seq_len)


def fft_conv_fwd(channels: int, seq_len: int) -> float:
    """Causal long convolution by FFT (S4, S4D, S4-DPLR, H3's inner, Hyena), forward FLOPs
    per token: channels x (2 x 2.5 n log2 n + 6 (n / 2 + 1)) / L with n = fft_len(L) ~ 2L.

    A complex FFT of n points costs 5 n log2 n real FLOPs (radix-2 Cooley-Tukey, the
    convention FFTW's benchmarks use); a real-input one half that. Per channel and sequence
    fft_conv does rfft(u) and irfft(product) (the kernel's rfft is per batch, not per token)
    and n / 2 + 1 complex products of 6 FLOPs: per token O(log L), 10 log2(2L) + 6.
    """
    n = fft_len(seq_len)
    per_seq = 2 * 2.5 * n * math.log2(n) + 6 * (n // 2 + 1)
    return channels * per_seq / seq_len


def depthwise_conv_fwd(channels: int, kernel: int, in_per_group: int = 1) -> float:
    """Short causal convolution (Mamba's conv1d, ShortConvolution, Hyena's short conv, H3's
    shift SSM, BaseConv): 2 x kernel x (inputs per group) FLOPs per channel per token."""
    return 2.0 * channels * kernel * in_per_group


def _family_terms() -> list[tuple[type, str, Callable[[Any, int], float]]]:
    """(class, term name, forward FLOPs per token(module, L)), most specific class first.
    Imported lazily: the model modules import torch kernels."""
    from models.attention.attention import CausalSelfAttention
    from models.linear_rnn.based import BasedLinearAttention
    from models.conv.fftconv import LongConvLayer
    from models.conv.hyena import Hyena
    from models.linear_rnn.linear_mixers import LinearRNNMixer
    from models.ssm.mamba2 import Mamba2
    from models.ssm.mamba3 import Mamba3
    from models.ssm.s6 import SelectiveSSM
    from models.conv.short_conv import ShortConvolution
    from models.attention.sliding_window import SlidingWindowAttention

    return [
        (CausalSelfAttention, "attention",
         lambda m, L: attention_fwd(m.n_heads * m.d_head, L)),
        (SlidingWindowAttention, "attention",
         lambda m, L: attention_fwd(m.n_heads * m.d_head, L, m.window)),
        (SelectiveSSM, "selective_scan",
         lambda m, L: selective_scan_fwd(m.d_inner, m.d_state)),
        # Mamba-2's SSD: per head a (headdim x d_state) state with a scalar decay: the
        # decayed linear-attention recurrence with d_k = d_state, d_v = headdim
        (Mamba2, "state_update",
         lambda m, L: state_update_fwd("simple_gla", m.nheads, m.d_state, m.headdim)),
        # Mamba-3: the same SSD state update (the trapezoid folds into the key); MIMO writes
        # and reads mimo_rank outer products per step into the one state
        (Mamba3, "state_update",
         lambda m, L: m.mimo_rank * state_update_fwd("simple_gla", m.nheads, m.d_state, m.headdim)),
        # state_v_dim: LinearAttention's normaliser widens the value by one column
        (LinearRNNMixer, "state_update",
         lambda m, L: state_update_fwd(m.op_name, m.state_heads, m.head_k_dim, m.state_v_dim,
                                       getattr(m, "num_householder", 1))),
        # Based: linear attention over Taylor features (1 + f + f^2 per head) with the
        # normaliser as one more value column
        (BasedLinearAttention, "state_update",
         lambda m, L: state_update_fwd("linear_attention", m.n_heads, m.expanded_dim,
                                       m.head_dim + 1)),
        (LongConvLayer, "fft_conv", lambda m, L: fft_conv_fwd(m.d, L)),
        (Hyena, "fft_conv", lambda m, L: fft_conv_fwd((m.order - 1) * m.d, L)),
        (ShortConvolution, "short_conv",
         lambda m, L: depthwise_conv_fwd(m.channels, m.kernel_size)),
    ]


def _per_batch(module: nn.Module) -> bool:
    """Subtrees run once per batch, not per token (left out; see the module docstring)."""
    from models.conv.hyena import ImplicitFilter
    return isinstance(module, ImplicitFilter)


def _lstm_weights(m: nn.LSTM) -> int:
    return sum(p.numel() for n, p in m.named_parameters() if n.startswith("weight_"))


def count(module: nn.Module, seq_len: int) -> FlopCount:
    """Training FLOPs per token of a built backbone at ``seq_len`` (see the module docstring)."""
    if not (isinstance(seq_len, int) and seq_len >= 1):
        raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    terms_by_class = _family_terms()
    matmul = 0.0
    terms: dict[str, float] = {}

    def add(name: str, fwd: float) -> None:
        terms[name] = terms.get(name, 0.0) + TRAIN_FACTOR * fwd

    def walk(m: nn.Module) -> None:
        nonlocal matmul
        if _per_batch(m):
            return
        for cls, name, fn in terms_by_class:
            if isinstance(m, cls):
                add(name, fn(m, seq_len))
                break
        if isinstance(m, nn.Linear):
            # y = x W^T: in x out multiply-adds per token
            matmul += TRAIN_FACTOR * 2.0 * m.in_features * m.out_features
        elif isinstance(m, nn.LSTM):
            # per token: gates = W_ih x + W_hh h, 4 h x (in + h) multiply-adds per layer
            matmul += TRAIN_FACTOR * 2.0 * _lstm_weights(m)
        elif isinstance(m, nn.Conv1d):
            # depthwise (groups = channels) short convs; a dense conv the same formula
            add("short_conv", depthwise_conv_fwd(m.out_channels, m.kernel_size[0],
                                                 m.in_channels // m.groups))
        for child in m.children():
            walk(child)

    walk(module)
    return FlopCount(seq_len, matmul, sum(terms.values()), terms, param_counts(module))


def build_for_count(name: str, d_model: int, n_layers: int, **options: Any) -> nn.Module:
    """Build ``name`` for counting (models.registry.build_shapes): on the CPU while small,
    on the meta device (no memory) past that, on the CPU where an init needs real tensors."""
    return registry.build_shapes(name, d_model=d_model, n_layers=n_layers, **options)


def flops(name: str, seq_len: int, d_model: int = 64, n_layers: int = 2, **options: Any) -> FlopCount:
    """Training FLOPs per token (forward + backward) of registry entry ``name`` built with
    these options, at sequence length ``seq_len``; ``.params`` has its parameter counts."""
    return count(build_for_count(name, d_model, n_layers, **options), seq_len)


# ---------------------------------------------------------------------------------------
# check against torch.utils.flop_counter (tests/workbench/cli/test_flops.py, --table)
# ---------------------------------------------------------------------------------------
MATMUL_OPS = ("mm", "addmm")   # what nn.Linear (2-D and folded 3-D inputs) and LSTM become


@contextlib.contextmanager
def no_recompute():
    """Inside: ``models.common.recomputed*`` keep their intermediates instead of recomputing
    them in the backward, so a FLOP counter sees model FLOPs (each Linear once forward, twice
    backward) rather than hardware FLOPs (the recomputed projections again: the norm, gate and
    o_proj pieces of the linear-RNN mixers and Mamba-2; PaLM's "model FLOPs" leave
    rematerialisation out, Chowdhery et al. 2022, appendix B)."""
    import models.common as common
    saved = common._records
    common._records = lambda args: False
    try:
        yield
    finally:
        common._records = saved


def measured_matmul(module: nn.Module, seq_len: int, d_model: int, recompute: bool = False) -> float:
    """FlopCounterMode's mm + addmm FLOPs per token for forward + backward of ``module``.

    The input requires grad, so every layer's input gradient is counted (as 3 x forward
    assumes). Where the module runs work once per batch (Hyena's filter MLP) the count is
    per sequence: the count at batch 2 minus the count at batch 1. ``recompute=False``
    (model FLOPs) turns the project's activation recomputation off while counting."""
    from torch.utils.flop_counter import FlopCounterMode

    def run(batch: int) -> float:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, seq_len, d_model, generator=g).requires_grad_(True)
        with FlopCounterMode(display=False) as fc:
            module(x).sum().backward()
        glob = fc.get_flop_counts().get("Global", {})
        return float(sum(v for op, v in glob.items()
                         if getattr(op, "__name__", str(op)).split(".")[0] in MATMUL_OPS))

    with (contextlib.nullcontext() if recompute else no_recompute()):
        if any(_per_batch(m) for m in module.modules()):
            return (run(2) - run(1)) / seq_len
        return run(1) / seq_len


#: where FlopCounterMode's matmul count and ours differ by convention (tests/workbench/cli/test_flops.py)
CHECK_NOTES = {
    "mamba2": "the layer computes in_proj's x rows twice (conv and D skip): +6 d_inner d_model per layer",
    "lstm": "FlopCounterMode has no formula for aten.lstm (counts 0)",
}


def table_rows(d_model: int = TABLE_D_MODEL, seq_len: int = TABLE_SEQ_LEN,
               check: bool = True, check_d_model: int = 32, check_seq_len: int = 64):
    """One row per entry (pretrained ones need checkpoints and are left out)."""
    rows = []
    for name in registry.names():
        if registry.entry(name).family == "pretrained":
            continue
        layers = 12 if name in TABLE_MLP_ENTRIES else 24
        c = flops(name, seq_len, d_model=d_model, n_layers=layers)
        row = {"model": name, "n_layers": layers, "params": c.params.non_embedding,
               "six_n": c.six_n(), "matmul": c.matmul, "extra": c.extra, "total": c.total,
               "terms": c.terms}
        if check:
            torch.manual_seed(0)
            opts = {"backend": "torch"} if "backend" in registry.entry(name).options() else {}
            try:
                m = registry.build(name, d_model=check_d_model, n_layers=2, **opts)
            except Exception:
                m = registry.build(name, d_model=check_d_model, n_layers=2)
            ours = count(m, check_seq_len).matmul
            row["check_ratio"] = measured_matmul(m, check_seq_len, check_d_model) / ours
        rows.append(row)
    return rows


def _g(x: float) -> str:
    return f"{x / 1e6:,.1f}M" if x < 1e9 else f"{x / 1e9:,.3f}G"


def format_table(rows, d_model: int = TABLE_D_MODEL, seq_len: int = TABLE_SEQ_LEN) -> str:
    head = ["model", "layers", "N (non-emb.)", "6N", "matmul", "family terms", "total",
            "total / 6N", "largest term"]
    check = any("check_ratio" in r for r in rows)
    if check:
        head.append("FlopCounterMode / ours (matmul, d32 L64)")
    lines = [f"Training FLOPs per token (forward + backward), d_model {d_model}, L = {seq_len}",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        big = max(r["terms"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        cells = [r["model"], str(r["n_layers"]), f"{r['params'] / 1e6:,.1f}M", _g(r["six_n"]),
                 _g(r["matmul"]), _g(r["extra"]), _g(r["total"]),
                 f"{r['total'] / r['six_n']:.2f}" if r["six_n"] else "-",
                 f"{big[0]} {_g(big[1])}" if big[1] else "-"]
        if check:
            ratio = f"{r['check_ratio']:.3f}" if "check_ratio" in r else "-"
            if r["model"] in CHECK_NOTES:
                ratio += f" ({CHECK_NOTES[r['model']]})"
            cells.append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.compute",
                                description="Training FLOPs per token of the registry's entries.")
    p.add_argument("--table", action="store_true", help="every entry, as a Markdown table")
    p.add_argument("--model", help="one entry")
    p.add_argument("--seq-len", type=int, default=TABLE_SEQ_LEN)
    p.add_argument("--d-model", type=int, default=TABLE_D_MODEL)
    p.add_argument("--n-layers", type=int, default=None)
    p.add_argument("--no-check", action="store_true",
                   help="skip the FlopCounterMode check at d_model 32, L 64")
    a = p.parse_args(argv)
    if a.model:
        layers = a.n_layers or (12 if a.model in TABLE_MLP_ENTRIES else 24)
        c = flops(a.model, a.seq_len, d_model=a.d_model, n_layers=layers)
        print(f"{a.model}: d_model {a.d_model}, {layers} layers, L {a.seq_len}: "
              f"{_g(c.total)} FLOPs/token (matmul {_g(c.matmul)}, "
              + ", ".join(f"{k} {_g(v)}" for k, v in c.terms.items())
              + f"); N = {c.params.non_embedding:,}, 6N = {_g(c.six_n())}")
        return 0
    rows = table_rows(a.d_model, a.seq_len, check=not a.no_check)
    print(format_table(rows, a.d_model, a.seq_len))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
