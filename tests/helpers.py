"""Small helpers shared by the model tests."""
import torch


@torch.no_grad()
def run_steps(model, x: torch.Tensor) -> torch.Tensor:
    """Feed x: (batch, length, d) through ``model.step`` one token at a time from
    ``model.init_state(batch)``; returns the stacked outputs (batch, length, d)."""
    state = model.init_state(x.shape[0])
    ys = []
    for x_t in x.unbind(1):
        y_t, state = model.step(x_t, state)
        ys.append(y_t)
    return torch.stack(ys, 1)
