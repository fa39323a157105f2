"""The Mamba mixer (Gu & Dao 2023, Figure 3) and recurrent backbones built from it.

Mamba(x), for x: (batch, length, d_model), with d_inner = expand * d_model (or given):

    x, z  = in_proj(x)                   two (batch, length, d_inner) streams
    x     = silu(causal depthwise conv1d(x))   kernel d_conv, left-padded, per channel
    y     = S6(x)  gated by silu(z)       selective scan (models.ssm.s6 / models.kernels)
    out   = out_proj(y)                  (batch, length, d_model)

``allow_neg_eigval`` (Grazzi et al., ICLR 2025, adankow/unlocking_state_tracking): the
scan's transition 2 exp(delta A) - 1 in (-1, 1) instead of exp(delta A) in (0, 1), what lets
Mamba learn parity; the ``torch`` scan (or ``ref``) runs it (``models.kernels.selective_scan``).

No norm or residual inside: the backbone (``RecurrentStack``) adds pre-norm residuals.
Parameter names match mamba-ssm's ``Mamba`` (in_proj, conv1d, x_proj, dt_proj, A_log, D,
out_proj) so official checkpoints load with ``load_state_dict``.

Recurrent inference: ``Mamba.step`` runs one token with state
``(conv_state (batch, d_inner, d_conv - 1), ssm_state (batch, d_inner, d_state))``;
``forward_with_state`` runs a chunk from a state and returns the next one, which is exact
and much faster than stepping; :func:`stream` chains chunks of an arbitrarily long sequence
with memory that does not grow with its length.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import ResidualStack, RMSNorm, stack_with_state
from models.kernels import cpu_kernels, mamba_step_cpu, triton_kernels
from models.kernels import selective_scan as ss
from models.ssm.s6 import SelectiveSSM, resolve_dt_rank

MambaState = tuple[torch.Tensor, torch.Tensor]  # (conv_state, ssm_state)


class Mamba(SelectiveSSM):
    """Mamba mixer: (batch, length, d_model) -> (batch, length, d_model), causal."""

    def __init__(
        self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
        dt_rank="auto", dt_min: float = 0.001, dt_max: float = 0.1,
        dt_init_floor: float = 1e-4, bias: bool = False, conv_bias: bool = True,
        backend: str = "auto", d_inner: int | None = None, allow_neg_eigval: bool = False,
    ):
        super().__init__()
        if d_conv < 1 or expand < 1:
            raise ValueError("d_conv and expand must be >= 1")
        if d_inner is not None and (isinstance(d_inner, bool) or not isinstance(d_inner, int)
                                    or d_inner < 1):
            raise ValueError(f"d_inner must be a positive int, got {d_inner!r}")
        # An explicit width overrides expand: Hugging Face configs fix intermediate_size
        # (1536 in mamba-130m's) whatever hidden_size is, so a small model built from such a
        # config has a width no integer expand gives (issue 10).
        d_inner = expand * d_model if d_inner is None else d_inner
        self.d_model, self.d_conv, self.expand = d_model, d_conv, d_inner / d_model
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=bias)
        self.conv1d = nn.Conv1d(d_inner, d_inner, kernel_size=d_conv, groups=d_inner,
                                padding=d_conv - 1, bias=conv_bias)
        # mamba-ssm sets dt_rank from d_model, not d_inner
        self._init_ssm(d_inner, d_state, resolve_dt_rank(dt_rank, d_model), dt_min, dt_max,
                       dt_init_floor, backend, allow_neg_eigval=allow_neg_eigval)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)

    # -- full sequence -----------------------------------------------------------------
    def _conv(self, x: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """silu(causal depthwise conv(x)), time-major: x (batch, L, d_inner) -> same shape.

        ``left`` (batch, d_conv - 1, d_inner) holds the inputs before x (None = zeros). The
        conv follows the scan backend: causal-conv1d's kernel with "cuda" (the Triton conv
        when it is missing), the Triton conv with "triton", the C kernel with "cpu",
        PyTorch's conv1d otherwise (so a forced "torch" run is PyTorch throughout).
        """
        backend = self.backend
        if backend == "cpu":
            return cpu_kernels.CausalConv1dCPU.apply(x, self.conv1d.weight, self.conv1d.bias,
                                                     left, True)
        conv_cuda = ss.causal_conv1d_cuda() if backend == "cuda" else None
        x_bdl = x.transpose(1, 2)
        if conv_cuda is not None and left is None:
            y = conv_cuda(x_bdl.contiguous(), self.conv1d.weight.squeeze(1), self.conv1d.bias,
                          activation="silu")
            return y.transpose(1, 2)
        # The Triton conv with "triton", and with "cuda" when causal-conv1d is missing or a
        # streaming chunk carries inputs from before it (causal-conv1d takes none).
        if backend in ("triton", "cuda") and triton_kernels.available(x.device):
            return triton_kernels.causal_conv1d(x, self.conv1d.weight, self.conv1d.bias, left)
        x_bdl = (F.pad(x_bdl, (self.d_conv - 1, 0)) if left is None
                 else torch.cat([left.transpose(1, 2).to(x.dtype), x_bdl], dim=-1))
        y = F.conv1d(x_bdl, self.conv1d.weight, self.conv1d.bias, groups=self.d_inner)
        return F.silu(y).transpose(1, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (batch, length, d_model) -> (batch, length, d_model)."""
        x, z = self.in_proj(hidden).chunk(2, dim=-1)   # (b, L, d_inner) views, time-major
        y = self._scan(self._conv(x), z)               # (b, L, d_inner)
        return self.out_proj(y)

    def forward_with_state(self, hidden: torch.Tensor, state: MambaState) -> tuple[torch.Tensor, MambaState]:
        """Run a chunk from ``state``; returns (out (batch, length, d_model), next state).

        Chaining chunks this way equals one forward over their concatenation.
        """
        conv_state, ssm_state = state                  # (b, d_inner, d_conv - 1), (b, d_inner, N)
        x, z = self.in_proj(hidden).chunk(2, dim=-1)
        left = conv_state.transpose(1, 2).to(x.dtype)  # the conv sees the previous inputs
        k1 = self.d_conv - 1
        new_conv_state = torch.cat([left, x], dim=1)[:, x.shape[1]:].transpose(1, 2) if k1 else conv_state
        y, ssm_state = self._scan(self._conv(x, left), z, initial_state=ssm_state,
                                  return_last_state=True)
        return self.out_proj(y), (new_conv_state.contiguous(), ssm_state)

    # -- recurrent mode ----------------------------------------------------------------
    def init_state(self, batch: int) -> MambaState:
        p = self.A_log
        return (torch.zeros(batch, self.d_inner, self.d_conv - 1, device=p.device, dtype=p.dtype),
                torch.zeros(batch, self.d_inner, self.d_state, device=p.device, dtype=p.dtype))

    def step(self, hidden_t: torch.Tensor, state: MambaState) -> tuple[torch.Tensor, MambaState]:
        """One token: hidden_t (batch, d_model) -> (out_t (batch, d_model), next state).

        Without autograd (decode: ``torch.no_grad`` / ``inference_mode``) the C step
        :meth:`_fused_step` where it applies, else (and with autograd recording) the torch
        step :meth:`_torch_step`, which the tests hold it to. The next state is new tensors;
        the state passed in is not written."""
        if not torch.is_grad_enabled():
            fused = self._fused_step(hidden_t, state)
            if fused is not None:
                return fused
        return self._torch_step(hidden_t, state)

    def _fused_step(self, hidden_t: torch.Tensor, state: MambaState):
        """The decode step as in_proj, one C call (``models.kernels.mamba_step_cpu``: the
        conv window + SiLU, x_proj, dt_proj, softplus, exp(delta A), the state update, the
        readout, D skip and gate), out_proj; A = -exp(A_log) kept between steps while A_log
        is unchanged. On a CPU in float32 / float64 with backend "auto" or "cpu" (a forced
        "torch" or "ref" stays PyTorch throughout); None where it does not apply."""
        if self.backend_request not in ("auto", "cpu"):
            return None
        # parameters read from the modules' dicts, not through nn.Module.__getattr__: at
        # batch 1 the lookups are a fair part of the step
        mods, params = self._modules, self._parameters
        ip, cp = mods["in_proj"]._parameters, mods["conv1d"]._parameters
        dp, op = mods["dt_proj"]._parameters, mods["out_proj"]._parameters
        xw, A_log, D = mods["x_proj"]._parameters["weight"], params["A_log"], params["D"]
        conv_state, h = state
        if mamba_step_cpu.unsupported(hidden_t, conv_state, h, ip["weight"], ip["bias"],
                                      cp["weight"], cp["bias"], xw, dp["weight"], dp["bias"], A_log,
                                      D, op["weight"], op["bias"]):
            return None
        y, cache2, h2 = mamba_step_cpu.mamba_step(
            F.linear(hidden_t, ip["weight"], ip["bias"]), conv_state, cp["weight"], cp["bias"],
            xw, dp["weight"], dp["bias"], mamba_step_cpu.neg_exp(self, A_log), D, h,
            allow_neg_eigval=self.allow_neg_eigval)
        return F.linear(y, op["weight"], op["bias"]), (cache2, h2)

    def _torch_step(self, hidden_t: torch.Tensor, state: MambaState) -> tuple[torch.Tensor, MambaState]:
        """:meth:`step` in PyTorch ops (any device and dtype, autograd)."""
        conv_state, ssm_state = state
        x, z = self.in_proj(hidden_t).chunk(2, dim=-1)                # (b, d_inner) each
        window = torch.cat([conv_state, x[:, :, None]], dim=-1)      # (b, d_inner, d_conv)
        x = (window * self.conv1d.weight[:, 0, :]).sum(-1)
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        x = F.silu(x)
        y, ssm_state = self._ssm_step(x, ssm_state)
        y = y * F.silu(z)
        return self.out_proj(y), (window[:, :, 1:], ssm_state)

    def state_size(self) -> int:
        return self.d_inner * (self.d_state + self.d_conv - 1)


class RecurrentStack(ResidualStack):
    """A pre-norm residual stack whose mixers all have a fixed-size recurrent state.

    Mixers must provide ``init_state(batch)``, ``step(x_t, state)`` and
    ``forward_with_state(x, state)`` (Mamba and S6 do). Adds the same three methods for
    the whole stack, plus :meth:`forward_chunked`.
    """

    def init_state(self, batch: int) -> list:
        return [layer.mixer.init_state(batch) for layer in self.layers]

    def step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x_t: (batch, d_model) -> (y_t (batch, d_model), next state). Without autograd
        (decode) :meth:`_fused_step` where it applies, else the layers one after another
        (``models.common.stack_with_state``)."""
        if not torch.is_grad_enabled():
            fused = self._fused_step(x_t, state)
            if fused is not None:
                return fused
        return stack_with_state(self, x_t, state, "step")

    def _fused_step(self, x_t: torch.Tensor, state: list) -> tuple[torch.Tensor, list] | None:
        """The decode step with each residual add and the following RMS norm (the next
        layer's pre-norm, or the final norm) in one C call
        (``models.kernels.mamba_step_cpu.add_rmsnorm``): at d_model 16 the norm module's
        PyTorch ops cost as much as a whole Mamba layer's C step. For stacks of plain
        RMSNorms without channel mixers or active dropout, on a CPU in float32 / float64;
        None elsewhere (the caller then runs ``stack_with_state``)."""
        plan = self._plain_rms_norms()
        if plan is None:
            return None
        mixers, norms = plan
        weights = [n._parameters["weight"] for n in norms]
        if mamba_step_cpu.unsupported(x_t, *weights):
            return None
        x, h = mamba_step_cpu.add_rmsnorm(x_t, None, weights[0], norms[0].eps)
        new_state = []
        for i, (mixer, s) in enumerate(zip(mixers, state)):
            y, s = mixer.step(h, s)
            new_state.append(s)
            nxt = norms[i + 1]
            if y.dtype == x.dtype and y.shape == x.shape and y.is_cpu:
                x, h = mamba_step_cpu.add_rmsnorm(x, y, weights[i + 1], nxt.eps)
            else:                                   # a mixer answering in another dtype
                x = x + y
                h = nxt(x)
        return h, new_state

    def _plain_rms_norms(self) -> tuple[list, list] | None:
        """([each layer's mixer], [each layer's norm, the final norm]) when the norms are all
        plain RMSNorms and the stack has no channel mixers and no dropout that acts; else
        None. Modules read from the dicts, not through nn.Module.__getattr__ (at d_model 16
        the lookups were a fair part of the step)."""
        mods = self._modules
        norm_f = mods["norm_f"]
        if self.mlps is not None or type(norm_f) is not RMSNorm:
            return None
        mixers, norms = [], []
        for layer in mods["layers"]._modules.values():
            lm = layer._modules
            norm, drop = lm["norm"], lm["dropout"]
            if type(norm) is not RMSNorm or (drop.training and type(drop) is not nn.Identity):
                return None
            mixers.append(lm["mixer"])
            norms.append(norm)
        norms.append(norm_f)
        return mixers, norms

    def forward_with_state(self, x: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """x: (batch, length, d_model) from ``state`` -> (y, next state)."""
        return stack_with_state(self, x, state, "forward_with_state")

    def forward_chunked(self, x: torch.Tensor, chunk_len: int) -> torch.Tensor:
        """Same result as ``forward(x)``, computed chunk by chunk from carried states."""
        return torch.cat(list(stream(self, x.split(chunk_len, dim=1))), dim=1)


def stream(backbone: RecurrentStack, x_chunks: Iterable[torch.Tensor],
           state: list | None = None) -> Iterator[torch.Tensor]:
    """Yield the backbone's output for each chunk (batch, chunk_len, d_model) in turn.

    Only the recurrent state travels between chunks, so memory stays flat however many
    chunks come (use under ``torch.no_grad()`` for inference).
    """
    for chunk in x_chunks:
        if state is None:
            state = backbone.init_state(chunk.shape[0])
        y, state = backbone.forward_with_state(chunk, state)
        yield y
