"""RMSNorm with a hand-written backward, for the residual stacks' norms on a CPU (issue 43
item 2, training at language-model shapes).

    y = x * r * w,   r = rsqrt(mean(x^2) + eps) over the last dim   (models.common.rms_norm)
    dx = r * (g - x_hat * mean(g * x_hat)),  g = dy * w,  x_hat = x * r
    dw = sum of dy * x_hat over every leading dim

Autograd keeps x and r (one float per row); the backward is four passes over x. The
recomputed form (``models.common.recomputed_in_slices`` of the plain arithmetic) keeps x
alone but runs the forward twice and autograd's backward of six elementwise ops: 2.4x the
time of this one at (2, 2048, 256) on 2 cores, and with a stack's 2 n_layers + 1 norms that
was ~20% of a Mamba step at d_model 256. The same numbers as the plain arithmetic to
round-off (tests/models/test_ssm_lm_shape_paths.py compares values and gradients in float64).
"""
from __future__ import annotations

import torch


class RMSNormFn(torch.autograd.Function):
    """rms_norm(x, weight, eps): x (..., d), weight (d,), same dtype (float32 / float64)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        r = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, r)
        return (x * r).mul_(weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        x_hat = x * r
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * x_hat).reshape(-1, x.shape[-1]).sum(0)
        dx = None
        if ctx.needs_input_grad[0]:
            g = dy * weight
            c = (g * x_hat).mean(-1, keepdim=True)
            dx = g.sub_(x_hat.mul_(c)).mul_(r)
        return dx, dw, None


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The plain arithmetic (autograd through it): the twin the tests compare with."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :class:`RMSNormFn` runs for x: a CPU tensor in float32 / float64 with a weight
    of its dtype (half precision keeps the upcasting path of models.common.rms_norm)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and weight.dtype == x.dtype)
