"""Registry entries for pretrained backbones read from local checkpoint folders (models.pretrained):
``pretrained_mamba``, ``pretrained_causal_lm`` and ``pretrained_hybrid``.

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


@register("pretrained_hybrid",
          "GPT-Neo and Mamba checkpoints stitched side by side per block between null/res/gres projectors (gptneo_path, mamba_path)",
          family="pretrained")
def pretrained_hybrid(d_model: int, n_layers: int, gptneo_path: str, mamba_path: str,
                      projector: str = "gres", mamba_per_block: int = 2, train_mode: str = "full",
                      lora_r: int = 16, lora_alpha: float = 32, lora_dropout: float = 0.1,
                      lora_targets: list | None = None, backend: str = "auto"):
    """The projectors are new and always train; ``train_mode`` applies to the checkpoints'
    layers (LoRA targets default to GPT-Neo's and Mamba's together)."""
    from models.pretrained import LORA_TARGETS, apply_training_mode
    from models.pretrained_hybrid import StitchedHybrid

    model = StitchedHybrid(gptneo_path, mamba_path, projector=projector,
                           mamba_per_block=mamba_per_block, backend=backend)
    targets = lora_targets or sorted(set(LORA_TARGETS["gpt_neo"]) | set(LORA_TARGETS["mamba"]))
    apply_training_mode(model, train_mode, lora_r, lora_alpha, lora_dropout, targets, "hybrid")
    for p in model.projector_parameters():
        p.requires_grad_(True)
    return model
