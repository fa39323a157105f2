"""Registry entries for the S4 family, Hyena, H3 and the block grid of the Mamba paper's Table 1.

Stand-alone entries: ``s4`` (dense), ``s4_dplr``, ``s4d``, ``hyena``, ``h3``.
Grid entries ``{block}_{inner}`` for block in {none, h3, mamba} and inner in
{s4, s4_dplr, s4d_real, s4d_lin, s4d_inv, s6, hyena} (see ``models.ssm.blocks``); e.g.
``mamba_s4d_real``, ``h3_s6``, ``none_hyena``.  (``s6`` and ``mamba`` themselves belong to
``catalog_s6``.)
"""
from __future__ import annotations

import inspect

from models.ssm.blocks import BLOCKS, DEFAULT_D_STATE, INNERS, NoGateBlock, SSMStack, grid_backbone
from models.common import ResidualStack
from models.ssm.h3 import H3
from models.conv.hyena import Hyena
from models.registry import register
from models.ssm.s4 import S4
from models.ssm.s4_dplr import S4DPLR
from models.ssm.s4d import S4D


@register("s4", "S4 dense: per-channel N x N HiPPO-LegS, bilinear, kernel by repeated squaring; "
          "+GELU+linear, pre-norm residual stack (exact, slow reference)", family="ssm")
def build_s4(d_model: int, n_layers: int, d_state: int = 64, learn_AB: bool = True,
             dt_min: float = 1e-3, dt_max: float = 1e-1, norm: str = "rms", dropout: float = 0.0):
    return SSMStack(d_model, n_layers, lambda i: NoGateBlock(d_model, S4(
        d_model, d_state, dt_min=dt_min, dt_max=dt_max, learn_AB=learn_AB)), norm=norm, dropout=dropout)


@register("s4_dplr", "S4 (DPLR HiPPO-LegS, Cauchy kernel + Woodbury; disc bilinear or zoh) "
          "+GELU+linear, pre-norm residual stack", family="ssm")
def build_s4_dplr(d_model: int, n_layers: int, d_state: int = 64, disc: str = "bilinear",
                  dt_min: float = 1e-3, dt_max: float = 1e-1, freq_chunk: int = 512,
                  norm: str = "rms", dropout: float = 0.0):
    return SSMStack(d_model, n_layers, lambda i: NoGateBlock(d_model, S4DPLR(
        d_model, d_state, disc=disc, dt_min=dt_min, dt_max=dt_max, freq_chunk=freq_chunk)),
        norm=norm, dropout=dropout)


@register("s4d", "S4D diagonal SSM (init lin|inv|real|legs, ZOH, Vandermonde kernel) +GELU+linear, "
          "pre-norm residual stack, with step mode; state d_model*N per layer", family="ssm")
def build_s4d(d_model: int, n_layers: int, d_state: int = 64, init: str = "lin", disc: str = "zoh",
              kernel_mode: str = "split", dt_min: float = 1e-3, dt_max: float = 1e-1,
              norm: str = "rms", dropout: float = 0.0):
    return SSMStack(d_model, n_layers, lambda i: NoGateBlock(d_model, S4D(
        d_model, d_state, init=init, disc=disc, dt_min=dt_min, dt_max=dt_max,
        kernel_mode=kernel_mode)), norm=norm, dropout=dropout)


@register("hyena", "Hyena operator (implicit MLP filters with decay window, short conv, order-N gating), "
          "pre-norm residual stack", family="conv")
def build_hyena(d_model: int, n_layers: int, order: int = 2, short_width: int = 3,
                filter_width: int = 64, emb_dim: int = 33, l_max: int = 1024,
                norm: str = "rms", dropout: float = 0.0):
    return ResidualStack(d_model, n_layers, lambda i: Hyena(
        d_model, order=order, short_width=short_width, filter_width=filter_width,
        emb_dim=emb_dim, l_max=l_max), norm=norm, dropout=dropout)


@register("h3", "H3: Q * S4D-Lin(shift-SSM(K) * V), output projection; pre-norm residual stack, step mode",
          family="ssm")
def build_h3(d_model: int, n_layers: int, d_state: int = 64, shift_size: int = 4,
             norm: str = "rms", dropout: float = 0.0):
    return SSMStack(d_model, n_layers, lambda i: H3(
        d_model, d_state=d_state, shift_size=shift_size), norm=norm, dropout=dropout)


# -- the grid ------------------------------------------------------------------------------
_BLOCK_TEXT = {
    "none": "no gate: W_o GELU(inner(x))",
    "h3": "H3 block: W_o(Q * inner(shift(K) * V))",
    "mamba": "Mamba block: W_o(inner(SiLU(conv4(W_x x))) * SiLU(W_z x)), expand 2",
}
_INNER_TEXT = {
    "s4": "dense S4 (HiPPO-LegS)", "s4_dplr": "S4 DPLR (complex)", "s4d_real": "S4D-Real",
    "s4d_lin": "S4D-Lin", "s4d_inv": "S4D-Inv", "s6": "S6 selective scan",
    "hyena": "Hyena implicit long conv",
}
_P = inspect.Parameter


def _grid_factory(block: str, inner: str):
    params = [_P("d_model", _P.KEYWORD_ONLY), _P("n_layers", _P.KEYWORD_ONLY)]
    if inner != "hyena":
        params.append(_P("d_state", _P.KEYWORD_ONLY, default=DEFAULT_D_STATE[inner]))
    if block == "h3":
        params.append(_P("shift_size", _P.KEYWORD_ONLY, default=4))
    if block == "mamba":
        params += [_P("expand", _P.KEYWORD_ONLY, default=2), _P("d_conv", _P.KEYWORD_ONLY, default=4)]
    params += [_P("norm", _P.KEYWORD_ONLY, default="rms"), _P("dropout", _P.KEYWORD_ONLY, default=0.0)]
    sig = inspect.Signature(params)

    def factory(**kwargs):
        bound = sig.bind(**kwargs)   # unknown options are a TypeError here too
        bound.apply_defaults()
        return grid_backbone(block, inner, **bound.arguments)

    factory.__signature__ = sig
    factory.__name__ = f"build_{block}_{inner}"
    return factory


GRID_NAMES = []
for _block in BLOCKS:
    for _inner in INNERS:
        _name = f"{_block}_{_inner}"
        register(_name, f"Table-1 grid: {_BLOCK_TEXT[_block]} with inner {_INNER_TEXT[_inner]}; "
                 "pre-norm residual stack", family="ssm")(_grid_factory(_block, _inner))
        GRID_NAMES.append(_name)
