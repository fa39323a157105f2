"""Kernels with several backends (official CUDA, fast pure PyTorch, sequential reference)."""
from models.kernels.scan_reference import selective_scan_ref  # noqa: F401
from models.kernels.selective_scan import (  # noqa: F401
    cuda_unavailable_reason,
    selective_scan_fn,
)
