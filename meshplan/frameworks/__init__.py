"""The training frameworks meshplan reads and writes, as a Python library (the CLI's
``cost`` / ``export`` / ``tune`` call into it; nothing here imports typer or click):

- :mod:`meshplan.frameworks.megatron`: Megatron-LM arguments
  (``strategy_from_args(argv, world) -> (Strategy, notes)``; :mod:`.megatron.arguments`
  translates the Megatron-only ones, :mod:`.megatron.launch` a launch line's others,
  :mod:`.megatron.moe` the MoE ones, :mod:`.megatron.export` writes them);
- :mod:`meshplan.frameworks.deepspeed`: a DeepSpeed JSON config
  (``strategy_from_config(config, world) -> (Strategy, notes)``; :mod:`.deepspeed.export`);
- :mod:`meshplan.frameworks.torchtitan`: a torchtitan job TOML
  (``strategy_from_toml(path, world) -> (Strategy, seq_len, notes)``; :mod:`.torchtitan.export`);
- :func:`export_plan`: a Plan as what a target framework reads (:mod:`.targets`).

Bad input raises :class:`meshplan.errors.MeshplanError` (or a subclass) with ``.field`` the
argument or config key at fault. Where an adapter needs what the user typed (to name a flag
as typed, to tell a typed value from a default), it takes :class:`GivenFlags`.
"""

from meshplan.frameworks.given import GivenFlags
from meshplan.frameworks.targets import TARGETS, Export, ExportError, Note, export_plan

__all__ = ["TARGETS", "Export", "ExportError", "GivenFlags", "Note", "export_plan"]
