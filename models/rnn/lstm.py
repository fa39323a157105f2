"""Stacked LSTM as pre-norm residual blocks.

    x -> n_layers x [ x + LSTM_i(norm_i(x)) ] -> final norm

Each mixer is a single-layer ``nn.LSTM`` with hidden size d_model (Hochreiter & Schmidhuber
1997), so it maps (batch, length, d_model) to the same shape and is causal by construction.
The recurrent state per layer is (h, c), 2 * d_model floats; the whole model carries
n_layers * 2 * d_model floats per sequence.

Step mode (:meth:`LSTMBackbone.init_state`, :meth:`LSTMBackbone.step`) runs one token at a
time and gives the same outputs as the full forward.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from models.common import ResidualStack, stack_with_state

State = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (h, c), each (batch, d_model)


class LSTMMixer(nn.Module):
    """One LSTM layer: (batch, length, d_model) -> (batch, length, d_model)."""

    backend = "torch"

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.lstm = nn.LSTM(d_model, d_model, num_layers=1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        return y

    def step(self, x_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """x_t: (batch, d_model); state (h, c) each (batch, d_model) -> (y_t, (h, c))."""
        y, state = self.forward_with_state(x_t[:, None, :], state)
        return y[:, 0], state

    def forward_with_state(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """x: (batch, length, d_model) continuing from state (h, c) -> (y, final (h, c))."""
        h, c = state
        y, (h, c) = self.lstm(x, (h[None], c[None]))
        return y, (h[0], c[0])

    def state_size(self) -> int:
        return 2 * self.d_model


class LSTMBackbone(nn.Module):
    """Pre-norm residual stack of LSTM layers; (batch, length, d_model) -> same shape."""

    backend = "torch"

    def __init__(self, d_model: int, n_layers: int, norm: str = "rms", dropout: float = 0.0):
        super().__init__()
        self.d_model = d_model
        self.stack = ResidualStack(d_model, n_layers, lambda i: LSTMMixer(d_model),
                                   norm=norm, dropout=dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, length, d_model) -> (batch, length, d_model)."""
        return self.stack(x)

    def state_size(self) -> int:
        return self.stack.state_size()

    def init_state(self, batch: int, device=None, dtype=None) -> State:
        """Zero (h, c) for every layer, each (batch, d_model) (what nn.LSTM starts from)."""
        p = next(self.parameters())
        device = device or p.device
        dtype = dtype or p.dtype
        z = lambda: torch.zeros(batch, self.d_model, device=device, dtype=dtype)  # noqa: E731
        return [(z(), z()) for _ in self.stack.layers]

    def forward_with_state(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """x: (batch, length, d_model) continuing from ``state`` -> (y, state after x)."""
        return stack_with_state(self.stack, x, state, "forward_with_state")

    def forward_chunked(self, x: torch.Tensor, chunk_len: int) -> torch.Tensor:
        """The same output as forward(x), computed chunk by chunk with the (h, c) state
        carried across, so the LSTM's working memory does not grow with length."""
        state = self.init_state(x.shape[0], x.device, x.dtype)
        out = []
        for chunk in x.split(chunk_len, dim=1):
            y, state = self.forward_with_state(chunk, state)
            out.append(y)
        return torch.cat(out, dim=1)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """x_t: (batch, d_model) -> (y_t: (batch, d_model), new state)."""
        y, state = self.forward_with_state(x_t[:, None, :], state)
        return y[:, 0], state
