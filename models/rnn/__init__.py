"""Nonlinear RNNs (registry family "rnn"): the LSTM. Modules are imported by name; this file
imports none of them."""
