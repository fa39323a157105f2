"""State-space models (registry family "ssm"): HiPPO, S4 / S4-DPLR / S4D, S6 and Mamba, Mamba-2 (SSD),
Mamba-3, H3, and the Table-1 block grid around an inner layer. Modules are imported by name
(``from models.ssm.mamba import Mamba``); this file imports none of them."""
