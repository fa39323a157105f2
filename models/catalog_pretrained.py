"""Registry entries for pretrained backbones read from local checkpoint folders (models.pretrained).

``d_model`` and ``n_layers`` are the checkpoint's; the values a profile passes are ignored
(compose reads the width from the built backbone). ``train_mode``: ``full`` fine-tunes
everything, ``freeze`` trains only the task head.
"""
from __future__ import annotations

from models.registry import register


@register("pretrained_mamba",
          "Pretrained Mamba from a local Hugging Face -hf checkpoint folder (path), on the workbench's own kernels",
          family="pretrained")
def pretrained_mamba(d_model: int, n_layers: int, path: str, train_mode: str = "full",
                     backend: str = "auto"):
    from models.pretrained import apply_training_mode, mamba_from_checkpoint

    stack = mamba_from_checkpoint(path, backend=backend)
    apply_training_mode(stack, train_mode)
    return stack


@register("pretrained_causal_lm",
          "Pretrained causal LM (GPT-Neo, ...) from a local Hugging Face checkpoint folder (path), via transformers",
          family="pretrained")
def pretrained_causal_lm(d_model: int, n_layers: int, path: str, train_mode: str = "full"):
    from models.pretrained import HFCausalLMBackbone, apply_training_mode

    backbone = HFCausalLMBackbone(path)
    apply_training_mode(backbone, train_mode)
    return backbone
