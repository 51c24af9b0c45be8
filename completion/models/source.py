"""Resolve what a user passes as a model into something the plan pipeline can build.

Accepted: a built-in model name (``llama2-7b``), a path to a Hugging Face style
``config.json``, a :class:`completion.models.ModelConfig`, a path to a PIR program text
file (``*.pir`` or any other text file), a :class:`completion.Program`, or a
``torch.nn.Module`` (captured with
``completion.from_torch``; ``example_inputs`` required).

A model given by configuration is rebuilt for every batch size and layer count it is asked
for (:meth:`ModelSource.forward_program`); a given program is used as it is, layer by layer.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.chunks import DEFAULT_SEG_METHOD
from completion.errors import CompletionError
from completion.ir import Program
from completion.models import build_model, get_model_config
from completion.models.config import MAX_MODEL_SIZES, ModelConfig, ModelConfigWarning
from completion.pir import parse_program

_LAYER_RE = re.compile(DEFAULT_SEG_METHOD)


#: default tokens per sequence of a config.json whose ``max_position_embeddings`` (the
#: context window a model supports, e.g. Llama-3.1's 131,072) is longer: Llama 3's
#: pre-training length (Meta, "The Llama 3 Herd of Models", 2024, sec. 3.4: 8K tokens
#: before the long-context stage)
DEFAULT_TRAIN_SEQ = 8192


class ModelSourceError(CompletionError):
    """A model argument that is none of the accepted forms, or a missing model file."""


@dataclass
class ModelSource:
    """A resolved model.

    Attributes:
        name: how reports name it. config: the ModelConfig (None for a given program).
        program: a given program (None for a config). num_layers: decoder layers of the
            model. seq_len: tokens per sequence. context_window: a config.json's
            ``max_position_embeddings`` when it was above :data:`DEFAULT_TRAIN_SEQ` and the
            default sequence was capped to that (0: not capped).
    """

    name: str
    config: Any = None
    program: Program | None = None
    num_layers: int = 0
    seq_len: int = 0
    context_window: int = 0

    @property
    def is_program(self) -> bool:
        """True for a given program (text file, Program or torch capture)."""
        return self.program is not None

    def forward_program(self, batch_size: int, dtype: str, num_layers: int | None = None,
                        attention: str | None = None) -> Program:
        """The forward program (with loss): built from the config with ``batch_size``
        sequences, ``num_layers`` layers (default: the model's) and ``attention``
        (``flash`` / ``unfused``; None: the config's, else flash), or the given program
        itself (its batch, layers and attention are its own; it may already hold backward
        and optimizer ops)."""
        if self.program is not None:
            return self.program
        return build_model(self.config, batch_size=batch_size, seq_len=self.seq_len, dtype=dtype,
                           num_layers=num_layers or self.config.num_layers, attention=attention)

    @property
    def attention(self) -> str | None:
        """The attention implementation the model states (``ModelConfig.attention``), None
        for a given program or a config that states none."""
        return getattr(self.config, "attention", None)


def _from_program(prog: Program, name: str, seq_len: int | None = None) -> ModelSource:
    """Layers from struct names; seq_len from ``input_ids`` [b, s] unless given."""
    layers = {m.group(1) for op in prog.ops if op.struct_name
              for m in [_LAYER_RE.search(op.struct_name)] if m}
    if seq_len is None:
        ids = [op.results[0] for op in prog.ops if op.type == "data" and op.results
               and op.results[0] is not None and op.results[0].name == "input_ids"]
        seq_len = ids[0].shape[1] if ids and len(ids[0].shape) == 2 else 0
    return ModelSource(name=name, program=prog, num_layers=len(layers), seq_len=seq_len)


#: Largest program text read (bytes): the seed programs are a few KiB, a whole model's
#: partitioned program a few MiB.
MAX_PROGRAM_BYTES = 64 * 2**20


def read_program_file(path: str | Path) -> Program:
    """Parse the PIR program text file at ``path``. Raises ModelSourceError (one line,
    naming the path) when it is missing, not a file, larger than
    :data:`MAX_PROGRAM_BYTES` or not UTF-8 text, and the parser's PirParseError (line and
    column) on bad text."""
    p = Path(path)
    if not p.is_file():
        raise ModelSourceError(f"program file not found: {p}")
    size = p.stat().st_size
    if size > MAX_PROGRAM_BYTES:
        raise ModelSourceError(f"program file {p} is {size} bytes, above the limit of "
                               f"{MAX_PROGRAM_BYTES} (completion.models.source.MAX_PROGRAM_BYTES)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ModelSourceError(f"program file {p} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ModelSourceError(f"program file {p} cannot be read: {e.strerror or e}") from None
    return parse_program(text)


def is_program_path(model: Any) -> bool:
    """True when ``model`` names a PIR program text: ``*.pir``, or an existing file that is
    not a JSON config (a ``.json`` name in any case, or text that opens with ``{``, as a
    config.json saved under another name does)."""
    if not isinstance(model, (str, Path)):
        return False
    path = Path(str(model))
    if path.suffix.lower() == ".pir":
        return True
    if not path.is_file() or path.suffix.lower() == ".json":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(4096).lstrip()
    except OSError:
        return True  # the program reader names what is wrong with it
    return not head.startswith(b"{")


def resolve_model(model: Any, seq_len: int | None = None, example_inputs: Any = None,
                  num_layers: int | None = None) -> ModelSource:
    """A :class:`ModelSource` for ``model`` (see module docstring).

    ``num_layers`` overrides the layer count: a config model becomes the same model with
    that many layers (a smaller model of the same shape); for a given program whose decoder
    layers are identical it is the number of layers the model really has, its first layer
    standing for all of them in the cost model.

    Raises ModelSourceError (a CompletionError) for an unsupported object, a missing
    file (naming the path), or a ``seq_len`` / ``num_layers`` that is not an integer in
    [1, ``MAX_MODEL_SIZES``], and the builders' / parser's errors for bad configs or
    program text."""
    for what, val in (("num_layers", num_layers), ("seq_len", seq_len)):
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelSourceError(f"{what} must be an integer >= 1, got {val!r}")
        if val > MAX_MODEL_SIZES[what]:
            raise ModelSourceError(f"{what} is {val}, above the limit of {MAX_MODEL_SIZES[what]} "
                                   f"(completion.models.config.MAX_MODEL_SIZES)")
    src = _resolve(model, seq_len, example_inputs)
    if num_layers is not None:
        if src.config is not None:
            src.config = src.config.replace(num_layers=num_layers)
        src.num_layers = num_layers
    return src


def check_positions(cfg: ModelConfig, seq_len: int) -> None:
    """A sequence longer than the model's positions (``cfg.seq_len``: a config.json's
    ``max_position_embeddings``, a catalog model's trained length): with a learned position
    table (GPT-2, Megatron GPT: ``[max_position_embeddings, h]`` rows, one per position) the
    positions past its end do not exist, so ModelSourceError; with rotary positions (no
    table: RoFormer, Su et al. 2021, eq. 13 rotates q and k by the position) the model runs
    but was not trained there, so a ModelConfigWarning. Costing is the same either way."""
    if seq_len <= cfg.seq_len:
        return
    if cfg.resolved_positions == "learned":
        raise ModelSourceError(f"seq_len {seq_len} is longer than the learned "
                               f"position table of model {cfg.name} ({cfg.seq_len} positions, max_position_embeddings): "
                               f"give at most {cfg.seq_len}")
    warnings.warn(ModelConfigWarning(
        f"seq_len {seq_len} is longer than the {cfg.seq_len} positions of model {cfg.name} "
        f"(max_position_embeddings): its rotary positions were not trained that far (costed as "
        f"given)"), stacklevel=3)


def _resolve(model: Any, seq_len: int | None, example_inputs: Any) -> ModelSource:
    if isinstance(model, Program):
        return _from_program(model, "program", seq_len)
    if isinstance(model, ModelConfig):  # built like a catalog model, from the object itself
        s = model.seq_len if seq_len is None else seq_len
        check_positions(model, s)
        return ModelSource(name=model.name, config=model, num_layers=model.num_layers, seq_len=s)
    if isinstance(model, (str, Path)):
        text = str(model)
        path = Path(text)
        if is_program_path(text):
            return _from_program(read_program_file(path), path.stem, seq_len)
        if path.suffix == ".json" and not path.is_file():
            raise ModelSourceError(f"model config not found: {path}")
        cfg = get_model_config(text)
        s = cfg.seq_len if seq_len is None else seq_len
        check_positions(cfg, s)
        window = 0
        if seq_len is None and path.suffix == ".json" and s > DEFAULT_TRAIN_SEQ:
            window, s = s, DEFAULT_TRAIN_SEQ
            warnings.warn(ModelConfigWarning(
                f"{path.name}: max_position_embeddings {window} is the context window, not a "
                f"training length: costing {s} tokens per sequence (--seq-len sets it)"), stacklevel=2)
        return ModelSource(name=cfg.name, config=cfg, num_layers=cfg.num_layers, seq_len=s,
                           context_window=window)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ModelSourceError("a torch module needs example_inputs (a tuple of tensors)")
        from completion.frontends import from_torch

        return _from_program(from_torch(model, example_inputs), type(model).__name__, seq_len)
    raise ModelSourceError(
        f"model must be a built-in name, a config.json path, a ModelConfig, a PIR program "
        f"path, a Program or a torch module; got {type(model).__name__}")
