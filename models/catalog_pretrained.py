"""Registry entries for pretrained backbones read from local checkpoint folders (models.pretrained).

``d_model`` and ``n_layers`` are the checkpoint's; the values a profile passes are ignored
(compose reads the width from the built backbone). ``train_mode``: ``full`` fine-tunes
everything, ``freeze`` trains only the task head, ``lora`` trains LoRA adapters (peft;
``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_targets``) and the head.
"""
from __future__ import annotations

from models.registry import register


@register("pretrained_mamba",
          "Pretrained Mamba from a local Hugging Face -hf checkpoint folder (path), on the workbench's own kernels",
          family="pretrained")
def pretrained_mamba(d_model: int, n_layers: int, path: str, train_mode: str = "full",
                     lora_r: int = 16, lora_alpha: float = 32, lora_dropout: float = 0.1,
                     lora_targets: list | None = None, backend: str = "auto"):
    from models.pretrained import apply_training_mode, mamba_from_checkpoint

    stack = mamba_from_checkpoint(path, backend=backend)
    apply_training_mode(stack, train_mode, lora_r, lora_alpha, lora_dropout, lora_targets, "mamba")
    return stack


@register("pretrained_causal_lm",
          "Pretrained causal LM (GPT-Neo, ...) from a local Hugging Face checkpoint folder (path), via transformers",
          family="pretrained")
def pretrained_causal_lm(d_model: int, n_layers: int, path: str, train_mode: str = "full",
                         lora_r: int = 16, lora_alpha: float = 32, lora_dropout: float = 0.1,
                         lora_targets: list | None = None):
    from models.pretrained import HFCausalLMBackbone, apply_training_mode

    backbone = HFCausalLMBackbone(path)
    apply_training_mode(backbone, train_mode, lora_r, lora_alpha, lora_dropout, lora_targets,
                        backbone.model_type)
    return backbone
