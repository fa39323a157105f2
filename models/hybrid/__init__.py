"""Hybrids of attention and recurrent mixers (registry family "hybrid"): Transformer/recurrent
hybrids and MambaFormer, the interleaved letter-pattern stacks, and the parallel GPT-Neo || Mamba
hybrid with its projectors. Modules are imported by name; this file imports none of them."""
