"""Registry entries for the S6 / Mamba family."""
