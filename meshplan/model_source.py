"""Resolve what a user passes as a model into programs the engine can cost.

Accepted: a built-in model name (``llama2-7b``), a path to a Hugging Face style
``config.json``, a path to a PIR program text file (``*.pir`` or any other text file), a
``completion.Program``, or a ``torch.nn.Module`` (captured with ``completion.from_torch``;
``example_inputs`` required).

For a model given by configuration, the engine costs one representative layer: every
decoder layer of a built-in model is identical, so the forward program is built with
one layer (``num_layers=1``) and its costs stand for all ``num_layers`` layers. A given
program is costed as it is, layer by layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion import Program, append_backward, build_model, get_model_config, parse_program
from completion.ir import OpRole


class ModelSourceError(ValueError):
    """A model argument that is none of the accepted forms."""


@dataclass
class ModelSource:
    """A resolved model.

    Attributes:
        name: how reports name it. config: the ModelConfig (None for a given program).
        program: a given program (None for a config). num_layers: layers of the model.
        seq_len: tokens per sequence.
    """

    name: str
    config: Any = None
    program: Program | None = None
    num_layers: int = 0
    seq_len: int = 0

    def representative(self, batch_size: int, dtype: str) -> Program:
        """The program to cost (forward + backward), with batch ``batch_size`` when it is
        built from a config. A given program is used as is (backward appended if it has
        none)."""
        if self.program is not None:
            prog = self.program
        else:
            prog = build_model(self.config, batch_size=batch_size, seq_len=self.seq_len,
                               dtype=dtype, num_layers=1)
        if not any(op.role == OpRole.BACKWARD for op in prog.ops):
            append_backward(prog)
        return prog


def _from_program(prog: Program, name: str, seq_len: int | None = None) -> ModelSource:
    """Layers from struct names; seq_len from ``input_ids`` [b, s] unless given."""
    from simulator.blocks import layer_of

    layers = {layer_of(op) for op in prog.ops} - {None}
    if seq_len is None:
        ids = [op.results[0] for op in prog.ops if op.type == "data" and op.results
               and op.results[0] is not None and op.results[0].name == "input_ids"]
        seq_len = ids[0].shape[1] if ids and len(ids[0].shape) == 2 else 0
    return ModelSource(name=name, program=prog, num_layers=len(layers), seq_len=seq_len)


def resolve_model(model: Any, seq_len: int | None = None, example_inputs: Any = None) -> ModelSource:
    """A :class:`ModelSource` for ``model`` (see module docstring).

    Raises ModelSourceError (ValueError) for an unsupported object, FileNotFoundError for a
    missing path, and the builders' / parser's errors for bad configs or program text."""
    if isinstance(model, Program):
        return _from_program(model, "program", seq_len)
    if isinstance(model, (str, Path)):
        text = str(model)
        path = Path(text)
        if path.suffix == ".pir" or (path.is_file() and path.suffix != ".json"):
            if not path.is_file():
                raise FileNotFoundError(f"program file not found: {path}")
            return _from_program(parse_program(path.read_text()), path.stem, seq_len)
        if path.suffix == ".json" and not path.is_file():
            raise FileNotFoundError(f"model config not found: {path}")
        cfg = get_model_config(text)
        s = cfg.seq_len if seq_len is None else seq_len
        return ModelSource(name=cfg.name, config=cfg, num_layers=cfg.num_layers, seq_len=s)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ModelSourceError("a torch module needs example_inputs (a tuple of tensors)")
        from completion import from_torch

        return _from_program(from_torch(model, example_inputs), type(model).__name__, seq_len)
    raise ModelSourceError(
        f"model must be a built-in name, a config.json path, a PIR program path, a Program "
        f"or a torch module; got {type(model).__name__}")
