"""Activation functions by name, shared by every compute path so they agree exactly."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["apply_activation"]


def apply_activation(x: torch.Tensor, name: str | None) -> torch.Tensor:
    """Apply ``none``/``relu``/``gelu`` (exact erf form)/``tanh`` in place where possible."""
    if name is None or name == "none":
        return x
    if name == "relu":
        return torch.relu_(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "tanh":
        return torch.tanh_(x)
    msg = f"unknown activation {name!r}; expected one of none, relu, gelu, tanh"
    raise ValueError(msg)
