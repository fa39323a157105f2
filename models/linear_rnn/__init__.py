"""Linear RNNs with a matrix state (registry family "linear-rnn"): linear attention, GLA, RetNet,
Based, the delta rules (DeltaNet, Gated DeltaNet, Gated DeltaProduct) and the generalised delta
rules (KDA, RWKV-7); their operators live in models/kernels/. Modules are imported by name; this
file imports none of them."""
