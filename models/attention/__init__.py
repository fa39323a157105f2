"""Softmax-attention layers and backbones (registry family "attention"): causal multi-head
attention, the Transformer, sliding-window attention and the Forgetting Transformer. Modules are
imported by name; this file imports none of them."""
