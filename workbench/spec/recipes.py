"""Size presets and named training recipes: data, resolved per run by :func:`resolve`.

**Sizes** (``model.size``, a sweep entry's ``size``, or the grid axis ``"model.size"``) set
``d_model``, ``n_layers`` and the learning rate. The GPT-3 sizes are the four the Mamba
paper's scaling laws use (Gu & Dao 2023, section 4.2 and its appendix table of model
sizes), with GPT-3's widths, depths and peak learning rates (Brown et al. 2020, Table 2.1):

=========  ========  =======  =======  =====================================
size       n_layers  d_model  lr       GPT-3 heads x head width (not applied)
=========  ========  =======  =======  =====================================
125m       12        768      6e-4     12 x 64
350m       24        1024     3e-4     16 x 64
760m       24        1536     2.5e-4   16 x 96
1.3b       24        2048     2e-4     24 x 128
=========  ========  =======  =======  =====================================

A model whose layer is one token mixer with no MLP (Mamba, Mamba-2, the linear-RNN layers,
S4, H3, Hyena, LSTM, ...) gets **twice the layers** at the same width: one Mamba block
stands for a Transformer layer's attention plus MLP (the Mamba paper, section 4.2, trains
Mamba with 2x the layers of the GPT-3 Transformer of the same size). Layers that carry
both are :data:`MIXER_AND_MLP` (the same set models.compute's table uses), and any model
whose ``channel_mixer`` option is set to something other than ``"none"``.

Parameters of the backbone (``models.flops(...).params.non_embedding``, Kaplan's N: the
task's token embedding and head are not counted), Transformer with GPT-3's 4x GELU MLP:
125m 85.0M, 350m 302M, 760m 680M, 1.3b 1.21B; GPT-3's nominal sizes count its 50,257 x
d_model token embedding too, and with it these are 124M, 354M, 757M and 1.31B (all within
1.2%). Mamba at 2x depth: 90.5M, 320M, 716M, 1.27B; with the GPT-NeoX embedding (50,280
rows) 129M, 372M, 793M and 1.37B, the Mamba paper's 130M, 370M, 790M and 1.4B within 2.1%.

The tiny sizes are ours (no paper's), for CPUs; their learning rate is GPT-3's smallest
size's (6e-4: GPT-3's table stops at 125M). A training step of 16 x 256 tokens with a
4,096-token embedding and head, measured on the 2-core box at a load of 8-9 from other jobs
(so noisy), Transformer / Mamba: tiny-1m 2.1 / 3.1 s, tiny-3m 3.5 / 13.8 s, tiny-10m
11.8 / 10.5 s; a budget of 1M tokens (245 such steps) takes 9 to 55 minutes there. Non-embedding parameters of the backbone (Transformer / Mamba at 2x depth):
tiny-1m 0.79M / 0.93M (4 / 8 x 128), tiny-3m 2.66M / 3.02M (6 / 12 x 192), tiny-10m
9.85M / 10.8M (8 / 16 x 320) (``python -m workbench.spec.recipes`` prints them).

The GPT-3 heads are recorded here but not applied: ``n_heads`` is a model option of only
some entries; set it per model (``[model.options.transformer] n_heads = 12``).

**Recipes** (``recipe`` at the profile's top level, or a sweep entry's own ``recipe``)
are presets of profile keys: a key the profile writes (in its table, a sweep entry or a
grid point) wins over the recipe's. Two keys are the recipes' own and are resolved with
the size: ``lr_scale`` (the peak learning rate is the size's GPT-3 lr times it; without a
size the lr is the profile's) and ``min_lr`` (an absolute floor of the cosine decay,
turned into ``train.min_lr_ratio = min_lr / lr``). Architecture options apply to the
models named in each recipe's ``options``; other models get the training keys only. The
warm-up length is left to the profile (``train.warmup_steps``, default 0): GPT-3 warms up
over 375M tokens, far more than a small run has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Size:
    d_model: int
    n_layers: int        # a Transformer's (attention + MLP) layers; one-mixer models get 2x
    lr: float            # peak learning rate (GPT-3's for the GPT-3 sizes)
    n_heads: int | None = None  # GPT-3's, recorded only (see the module docstring)
    source: str = ""


GPT3 = "Brown et al. 2020, Table 2.1 (the Mamba paper's scaling-law sizes)"
SIZES: dict[str, Size] = {
    "tiny-1m": Size(128, 4, 6e-4, source="ours: 2-core CPU in minutes"),
    "tiny-3m": Size(192, 6, 6e-4, source="ours: 2-core CPU in minutes"),
    "tiny-10m": Size(320, 8, 6e-4, source="ours: 2-core CPU in minutes"),
    "125m": Size(768, 12, 6e-4, 12, GPT3),
    "350m": Size(1024, 24, 3e-4, 16, GPT3),
    "760m": Size(1536, 24, 2.5e-4, 16, GPT3),
    "1.3b": Size(2048, 24, 2e-4, 24, GPT3),
}
SIZE_NAMES = tuple(SIZES)

#: entries whose layer holds a token mixer and an MLP (or two mixers): not doubled
MIXER_AND_MLP = frozenset({"transformer", "interleaved", "hybrid", "hybrid_parallel"})


def doubles_depth(model: str, options: dict[str, Any]) -> bool:
    """Whether ``model`` with ``options`` gets 2x a size's layers (one mixer, no MLP)."""
    if model in MIXER_AND_MLP or model.startswith("pretrained"):
        return False
    return options.get("channel_mixer", "none") == "none"


@dataclass(frozen=True)
class Recipe:
    doc: str
    train: dict[str, Any]                                   # train.<key> presets
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # model name -> options
    lr_scale: float = 1.0          # x the size's GPT-3 lr
    min_lr: float | None = None    # absolute end of the cosine decay (-> min_lr_ratio)


# The Mamba paper's training recipes (Gu & Dao 2023, appendix E.2.1 "Training Recipes"):
# AdamW, gradient clip 1.0, weight decay 0.1, no dropout, linear warm-up then cosine decay,
# peak lr GPT-3's; the "improved recipe" (after PaLM and LLaMA): cosine decay to 1e-5 from
# a peak of 5x GPT-3's, no linear biases, RMSNorm instead of LayerNorm, betas (0.9, 0.95).
_ADAMW = {"optimizer": "adamw", "betas": (0.9, 0.95), "weight_decay": 0.1, "grad_clip": 1.0,
          "schedule": "cosine"}
RECIPES: dict[str, Recipe] = {
    "gpt3": Recipe(
        doc="GPT-3 (Brown et al. 2020, section 2.3 and appendix B): AdamW (0.9, 0.95), weight decay "
            "0.1, clip 1.0, warm-up then cosine decay to 10% of the peak; learned positions and "
            "LayerNorm (transformer options pos, norm). The transformer entry's MLP is GELU already "
            "(no option); GPT-3's biases: its attention has none and its MLP has them, with no option "
            "to change either.",
        train={**_ADAMW, "min_lr_ratio": 0.1},
        options={"transformer": {"pos": "learned", "norm": "layer"}},
    ),
    "transformer++": Recipe(
        doc="Transformer++ (the Mamba paper, section 4.2): the improved recipe (5x GPT-3's lr, cosine "
            "to 1e-5, AdamW (0.9, 0.95), wd 0.1, clip 1.0) with RoPE and RMSNorm (transformer options "
            "pos, norm). Not options of the transformer entry, so not applied: SwiGLU (its MLP is "
            "GELU; the interleaved entry with pattern = \"A\" and channel_mixer = \"swiglu\" is a "
            "RoPE + SwiGLU + RMSNorm stack) and biases (its attention has none, its MLP has them).",
        train=dict(_ADAMW),
        options={"transformer": {"pos": "rope", "norm": "rms"}},
        lr_scale=5.0, min_lr=1e-5,
    ),
    "mamba": Recipe(
        doc="The Mamba paper's improved recipe (appendix E.2.1): AdamW (0.9, 0.95), wd 0.1, clip "
            "1.0, linear warm-up then cosine to 1e-5, peak 5x GPT-3's lr, no linear biases and "
            "RMSNorm (mamba and mamba2 options bias, norm).",
        train=dict(_ADAMW),
        options={"mamba": {"bias": False, "norm": "rms"}, "mamba2": {"bias": False, "norm": "rms"}},
        lr_scale=5.0, min_lr=1e-5,
    ),
}
RECIPE_NAMES = tuple(RECIPES)


@dataclass
class Resolved:
    """One model's settings at one grid point after its size and recipe."""
    d_model: int
    n_layers: int
    options: dict[str, Any]
    train: dict[str, Any] | None  # the train keys to validate (None: the section unchanged)
    recipe: dict[str, Any] | None  # {"name", "keys": {dotted key: value taken from the recipe}}
    size: str | None


def resolve(model: str, *, recipe: str | None, size: str | None, written_train: dict[str, Any],
            d_model: int | None, n_layers: int | None, default_d_model: int, default_n_layers: int,
            options: dict[str, Any]) -> Resolved:
    """A model's width, depth, options and train keys under ``size`` and ``recipe``.

    ``written_train``: the train keys the profile writes (they win); ``d_model`` /
    ``n_layers``: written ones (a sweep entry's, or [model]'s when written), else None;
    ``options``: the model's written options (they win over the recipe's)."""
    r = RECIPES[recipe] if recipe else None
    s = SIZES[size] if size else None
    taken: dict[str, Any] = {}
    opts = dict(options)
    for k, v in (r.options.get(model, {}) if r else {}).items():
        if k not in opts:
            opts[k] = taken[f"model.options.{model}.{k}"] = v
    if s is not None:
        depth = s.n_layers * (2 if doubles_depth(model, opts) else 1)
        d_model = d_model if d_model is not None else s.d_model
        n_layers = n_layers if n_layers is not None else depth
    train = None
    if r is not None or s is not None:
        preset: dict[str, Any] = {}
        if r is not None:
            preset.update(r.train)
        if s is not None:
            preset["lr"] = float(f"{s.lr * (r.lr_scale if r else 1.0):.6g}")
        train = {**preset, **written_train}
        if r is not None and r.min_lr is not None and "min_lr_ratio" not in written_train:
            ratio = float(f"{min(1.0, r.min_lr / train.get('lr', 1e-3)):.6g}")
            train["min_lr_ratio"] = preset["min_lr_ratio"] = ratio
        if r is not None:
            taken.update({f"train.{k}": (list(v) if isinstance(v, tuple) else v)
                          for k, v in preset.items() if k not in written_train})
    return Resolved(d_model if d_model is not None else default_d_model,
                    n_layers if n_layers is not None else default_n_layers, opts, train,
                    {"name": recipe, "keys": taken} if r is not None else None, size)


def _table() -> str:  # pragma: no cover - a printout for the docstring's numbers
    import models

    lines = [f"{'size':9} {'model':12} {'layers':>6} {'d':>5} {'params (non-emb)':>17}"]
    for name, s in SIZES.items():
        for m in ("transformer", "mamba"):
            n = s.n_layers * (2 if doubles_depth(m, {}) else 1)
            c = models.flops(m, 256, d_model=s.d_model, n_layers=n)
            lines.append(f"{name:9} {m:12} {n:6} {s.d_model:5} {c.params.non_embedding:17,}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(_table())
