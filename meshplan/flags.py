"""The command-line spellings of the Strategy fields and the plan's sizes, in one table.

Each field has meshplan's own flags and, where Megatron-LM has an argument that sets it one
to one, that argument as an alias (:data:`MEGATRON_FIELD_ARGS`): ``cost --tensor-model-parallel-size 4``
is ``cost --tp 4``, and ``meshplan.frameworks.megatron.strategy_from_args`` reads a launch
line's same arguments from the same table. :data:`FLAGS` and :data:`SIZE_FLAGS` are derived
here (long own spellings first, the Megatron-LM alias next, a short flag last) and are what
the command line declares (``meshplan.commands.options``) and names in its errors.

Nothing here imports typer, click or a framework module: both the CLI and the library read it.
"""

from __future__ import annotations

from typing import Any

#: Megatron-LM argument -> the Strategy field (or plan size) it sets one to one, and its type
#: (Megatron-LM d98e8a64 ``megatron/training/arguments.py``)
MEGATRON_FIELD_ARGS: dict[str, tuple[str, Any]] = {
    "--tensor-model-parallel-size": ("tp", int),
    "--pipeline-model-parallel-size": ("pp", int),
    "--context-parallel-size": ("cp", int),
    "--expert-model-parallel-size": ("ep", int),
    "--expert-tensor-parallel-size": ("etp", int),
    "--moe-expert-capacity-factor": ("moe_capacity_factor", float),
    "--cp-comm-type": ("cp_comm", str),
    "--num-virtual-stages-per-pipeline-rank": ("vpp", int),
    "--micro-batch-size": ("micro_batch_size", int),
    "--global-batch-size": ("global_batch_size", int),
    "--sequence-parallel": ("sequence_parallel", bool),
    "--attention-backend": ("attention", str),
    "--seq-length": ("seq_len", int),
    "--num-layers": ("num_layers", int),
}

#: Strategy field -> meshplan's own flags (a field Megatron-LM spells as meshplan does has none)
_OWN: dict[str, tuple[str, ...]] = {
    "dp": ("--dp",),
    "tp": ("--tp", "--mp"),
    "pp": ("--pp",),
    "cp": ("--cp",),
    "ep": ("--ep",),
    "etp": ("--etp",),
    "moe_capacity_factor": ("--moe-capacity-factor",),
    "moe_load_imbalance": ("--moe-load-imbalance",),
    "cp_comm": ("--cp-comm",),
    "vpp": ("--vpp",),
    "schedule": ("--schedule",),
    "micro_batch_size": (),
    "global_batch_size": ("--global-batch",),
    "recompute": ("--recompute",),
    "zero": ("--zero", "--zero-stage"),
    "fsdp_shard_size": ("--fsdp-shard-size", "--hsdp"),
    "sequence_parallel": (),
    "dtype": ("--dtype",),
    "framework": ("--framework",),
    "attention": ("--attention",),
    "layers_per_stage": ("--layers-per-stage",),
}
#: the plan's sizes besides the Strategy fields -> meshplan's own flags
_OWN_SIZES: dict[str, tuple[str, ...]] = {
    "seq_len": ("--seq-len", "-s"),
    "num_layers": ("--layers", "-l"),
}


def _spellings(own: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Field -> its flags: the own long ones, the Megatron-LM alias, the own short one."""
    alias: dict[str, list[str]] = {}
    for flag, (field, _) in MEGATRON_FIELD_ARGS.items():
        alias.setdefault(field, []).append(flag)
    return {field: (*(f for f in flags if f.startswith("--")), *alias.get(field, ()),
                    *(f for f in flags if not f.startswith("--")))
            for field, flags in own.items()}


#: Strategy field -> its CLI flags (the first is the canonical one, the rest aliases)
FLAGS: dict[str, tuple[str, ...]] = _spellings(_OWN)
#: flags of the plan's sizes besides the Strategy fields (named in errors as the user typed)
SIZE_FLAGS: dict[str, tuple[str, ...]] = _spellings(_OWN_SIZES)

__all__ = ["FLAGS", "MEGATRON_FIELD_ARGS", "SIZE_FLAGS"]
