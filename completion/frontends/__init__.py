"""Frontends that produce programs: torch capture (``from_torch``). Importing this package
does not import torch; ``from_torch`` imports it on first use."""

from __future__ import annotations

from completion.frontends.torch_capture import TorchCaptureError, from_torch

__all__ = ["TorchCaptureError", "from_torch"]
