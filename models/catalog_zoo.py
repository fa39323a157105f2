"""Registry entries for attention, recurrent, convolutional and S4-family models, blocks and hybrids."""
