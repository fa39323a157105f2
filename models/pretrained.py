"""Pretrained backbones from local Hugging Face checkpoint folders (issue 11).

A checkpoint folder is what ``save_pretrained`` writes: ``config.json`` plus
``model.safetensors`` (or ``pytorch_model.bin``), and for text tasks the tokenizer files.
Where a folder is asked for, a Hugging Face Hub id (``state-spaces/mamba-130m-hf``) works
too: ``models.hub`` fetches its snapshot into the standard cache (offline mode honoured)
and the same code reads that folder. A missing or incomplete folder is an error that says
what was expected and how to get it.

- **Mamba** (``model_type = "mamba"``, the ``state-spaces/mamba-*-hf`` checkpoints) is
  loaded into the workbench's own Mamba (``models.ssm.mamba``): its parameter names are the
  official ones, so ``backbone.layers.{i}.mixer.*`` map one to one and the model runs on
  the workbench's kernels (C on CPU, Triton on GPU). Widths come from the config
  (``intermediate_size`` -> d_inner, ``time_step_rank`` -> dt_rank, ``state_size``,
  ``conv_kernel``, ``layer_norm_epsilon``); ``tests/workbench/train/test_pretrained.py`` checks the outputs
  against ``transformers``' own ``MambaModel`` on the same weights.
- **Causal LMs** (GPT-Neo and any other ``AutoModel`` checkpoint) run through
  ``transformers`` itself, fed ``inputs_embeds``.

Both return a backbone ``(batch, length, d_model) -> (batch, length, d_model)`` (the final
norm included) that carries the checkpoint's token embedding as ``token_embedding``;
``workbench.train.compose`` uses it as the encoder. ``d_model`` and the depth come from the
checkpoint, not from the profile.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

EXTRA_HINT = "install the optional extra: pip install 'ssm-workbench[pretrained]'"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message says what was expected."""


def _how_to_get(path: Path, example: str) -> str:
    return (f"expected a Hugging Face checkpoint folder at {path} (config.json and "
            f"{' or '.join(WEIGHT_FILES)}, as save_pretrained writes it), or a Hub id such as "
            f"{example} (fetched into the Hugging Face cache); to copy one here run e.g. "
            f"`hf download {example} --local-dir {path}`")


def read_config(path: str | Path, example: str = "state-spaces/mamba-130m-hf") -> dict[str, Any]:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist: " + _how_to_get(path, example))
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} is missing: " + _how_to_get(path, example))
    try:
        return json.loads(cfg_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({e})") from None


def check_folder(path: str | Path, example: str = "state-spaces/mamba-130m-hf") -> dict[str, Any]:
    """The config of a usable checkpoint folder (config.json and weights present), without
    reading the weights: what ``profile check`` verifies before any run starts. A Hub id
    is checked in the cache only (nothing is fetched): not there, it is fine online (the run
    fetches it; ``{}``) and a :class:`models.hub.HubError` offline."""
    from models import hub

    if hub.is_hub_id(str(path)):
        snap = hub.cached(hub.parse(str(path)))
        if snap is None:
            if hub.offline():
                hub.snapshot(str(path), "checkpoint")  # raises the one-line error
            return {}
        path = snap
    cfg = read_config(path, example)
    path = Path(path).expanduser()
    if not any((path / f).is_file() for f in WEIGHT_FILES) and not any(path.glob("model-*.safetensors")):
        raise CheckpointError(f"no weights in {path}: " + _how_to_get(path, example))
    return cfg


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (safetensors preferred, else a torch pickle, weights only)."""
    path = Path(path).expanduser()
    st, pt = path / WEIGHT_FILES[0], path / WEIGHT_FILES[1]
    if st.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise CheckpointError(f"reading {st} needs the safetensors package: {EXTRA_HINT}") from None
        return load_file(str(st))
    if pt.is_file():
        return _load_weights_only(pt)
    sharded = sorted(path.glob("model-*.safetensors"))
    if sharded:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in sharded:
            out.update(load_file(str(f)))
        return out
    raise CheckpointError(f"no weights in {path}: " + _how_to_get(path, "state-spaces/mamba-130m-hf"))


def _load_weights_only(pt: Path) -> dict[str, torch.Tensor]:
    """``pytorch_model.bin`` read with ``weights_only=True``: tensors and plain values only,
    so nothing in the file runs. torch's own error for a file holding anything else advises
    loading with ``weights_only=False``, which would run whatever the pickle says: that
    advice never reaches the user; the error says what the file holds and how to convert it."""
    import pickle

    try:
        return torch.load(pt, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # refused for an object (a class or function the pickle would call), e.g. "Unsupported
        # global: GLOBAL io.open was not an allowed global by default"; else not a pickle at all
        if "Unsupported global:" not in str(e):
            raise CheckpointError(f"{pt} cannot be read as PyTorch weights ({_first_line(e)})") from None
        what = next((ln.split("Unsupported global:", 1)[1].split(" was not")[0].strip()
                     for ln in str(e).splitlines() if "Unsupported global:" in ln), None)
        raise CheckpointError(
            f"{pt} holds a pickled Python object{f' ({what})' if what else ''}, not only tensors; "
            f"the workbench loads weights only and will not execute it. Convert the checkpoint to "
            f"safetensors where you trust its source (load it there, then "
            f"`model.save_pretrained(folder, safe_serialization=True)` writes model.safetensors), "
            f"or use a folder that has model.safetensors") from None
    except Exception as e:  # a cut or damaged file
        raise CheckpointError(f"{pt} cannot be read as PyTorch weights ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    """torch's error in one line, without its advice to load with ``weights_only=False``."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip() and "weights_only" not in ln),
                 type(e).__name__)
    return first[:300]


# ------------------------------------------------------------------------------- Mamba
def mamba_from_checkpoint(path: str | Path, backend: str = "auto"):
    """The workbench's Mamba stack with a ``-hf`` checkpoint's weights (see module doc)."""
    from models import hub
    from models.common import RMSNorm
    from models.ssm.mamba import Mamba, RecurrentStack

    given, path = path, hub.checkpoint_folder(str(path), "Mamba checkpoint")
    cfg = read_config(path)
    if cfg.get("model_type") != "mamba":
        raise CheckpointError(f"{path}: config.json has model_type {cfg.get('model_type')!r}; "
                              "pretrained_mamba reads Mamba checkpoints (model_type 'mamba'); "
                              "use pretrained_causal_lm for other causal LMs")
    sd = load_state_dict(path)
    missing_keys = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k not in cfg]
    if missing_keys:
        raise CheckpointError(f"{path}/config.json lacks {', '.join(missing_keys)}: not a complete "
                              "Mamba config")
    d, n = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    d_inner = int(cfg.get("intermediate_size") or cfg.get("expand", 2) * d)
    stack = RecurrentStack(
        d, n,
        lambda i: Mamba(d, d_state=int(cfg.get("state_size", 16)), d_conv=int(cfg.get("conv_kernel", 4)),
                        d_inner=d_inner, dt_rank=int(cfg["time_step_rank"]) if cfg.get("time_step_rank")
                        not in (None, "auto") else "auto",
                        bias=bool(cfg.get("use_bias", False)),
                        conv_bias=bool(cfg.get("use_conv_bias", True)), backend=backend),
        norm="rms")
    eps = float(cfg.get("layer_norm_epsilon", 1e-5))
    for m in stack.modules():
        if isinstance(m, RMSNorm):
            m.eps = eps
    stack.token_embedding = nn.Embedding(int(cfg["vocab_size"]), d)
    prefix = "backbone." if any(k.startswith("backbone.") for k in sd) else ""
    mapped = {}
    for k, v in sd.items():
        if not k.startswith(prefix) or k.startswith("lm_head"):
            continue
        k = k[len(prefix):]
        mapped["token_embedding.weight" if k == "embeddings.weight" else k] = v
    missing, unexpected = stack.load_state_dict(mapped, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path}: the weights do not fit the config: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    stack.checkpoint = str(given)  # the folder or Hub id the profile gave
    return stack


# ------------------------------------------------------------------------- causal LMs
class HFCausalLMBackbone(nn.Module):
    """A ``transformers`` base model fed embeddings: (batch, length, d) -> last hidden state."""

    backend = "transformers"

    def __init__(self, path: str | Path):
        super().__init__()
        try:
            from transformers import AutoModel
        except ImportError:
            raise CheckpointError(f"pretrained_causal_lm needs transformers: {EXTRA_HINT}") from None
        from models import hub

        given, path = path, hub.checkpoint_folder(str(path))
        cfg = read_config(path, example="EleutherAI/gpt-neo-125m")
        load_state_dict(path)  # a clear error for a folder without weights, before transformers'
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True)
        self.d_model = int(self.model.config.hidden_size)
        self.model_type = cfg.get("model_type", "?")
        self.token_embedding = self.model.get_input_embeddings()
        self.checkpoint = str(given)  # the folder or Hub id the profile gave

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=x).last_hidden_state

    def state_size(self) -> None:
        return None


LORA_TARGETS = {
    # the attention and MLP projections (GPT-Neo's module names)
    "gpt_neo": ("q_proj", "k_proj", "v_proj", "out_proj", "c_fc", "c_proj"),
    # the block's input and output projections; x_proj may be added. dt_proj cannot: its
    # weight is applied inside the fused selective scan, not by calling the module
    "mamba": ("in_proj", "out_proj"),
}
TRAIN_MODES = ("full", "freeze", "lora")


def apply_training_mode(backbone: nn.Module, mode: str, lora_r: int = 16, lora_alpha: float = 32,
                        lora_dropout: float = 0.1, lora_targets: list[str] | None = None,
                        model_type: str = "mamba") -> None:
    """``full``: everything trains; ``freeze``: nothing in the backbone (nor its embedding)
    does, only the task head; ``lora``: LoRA adapters (peft) on ``lora_targets`` train and
    the rest is frozen. Defaults r 16, alpha 32, dropout 0.1 (the e5-mistral adapter recipe);
    targets by model type: ``LORA_TARGETS``."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"train_mode must be one of {', '.join(TRAIN_MODES)}, got {mode!r}")
    if mode == "full":
        return
    backbone.requires_grad_(False)
    if mode == "freeze":
        return
    targets = list(lora_targets) if lora_targets else list(LORA_TARGETS.get(model_type, ()))
    if not targets:
        raise ValueError(f"no default LoRA targets for model type {model_type!r}: give "
                         "lora_targets (names of Linear modules)")
    if "dt_proj" in targets:
        raise ValueError("LoRA cannot wrap dt_proj: the fused scan applies its weight directly; "
                         "use in_proj, out_proj and x_proj")
    if not (isinstance(lora_r, int) and lora_r > 0) or not lora_alpha > 0 or not 0 <= lora_dropout < 1:
        raise ValueError(f"need lora_r > 0, lora_alpha > 0, 0 <= lora_dropout < 1; got "
                         f"{lora_r}, {lora_alpha}, {lora_dropout}")
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise CheckpointError(f"train_mode = 'lora' needs peft: {EXTRA_HINT}") from None
    names = {n.rsplit(".", 1)[-1] for n, m in backbone.named_modules() if isinstance(m, nn.Linear)}
    unknown = sorted(set(targets) - names)
    if unknown:
        raise ValueError(f"lora_targets {unknown} name no Linear layer of this model; it has "
                         f"{', '.join(sorted(names))}")
    config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                        target_modules=targets, bias="none")
    inject_adapter_in_model(config, backbone)
    for name, p in backbone.named_parameters():
        p.requires_grad_("lora_" in name)
