"""Convolutional sequence mixers (registry family "conv"): the causal FFT long convolution
that the S4 family and Hyena compute through, Hyena, and the causal depthwise short conv of the
linear-RNN layers. Modules are imported by name; this file imports none of them."""
