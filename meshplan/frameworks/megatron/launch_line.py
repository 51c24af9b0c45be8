"""A whole Megatron-LM launch line (the ``pretrain_gpt.py`` arguments) as a meshplan
Strategy, without the CLI: :func:`strategy_from_args`.

The arguments are read as ``meshplan cost`` reads them after ``--model`` and ``--cluster``:
the parallelism and batch arguments that are one-to-one Strategy fields
(:data:`FIELD_ARGS`), the Megatron-only ones :mod:`.arguments` translates
(:data:`~.arguments.MEGATRON_FLAGS`), and the rest of a launch line :mod:`.launch` takes
(cost-neutral ones, named in a note; architecture ones, checked against ``model`` when one
is given). Names and defaults: Megatron-LM d98e8a6 ``megatron/training/arguments.py``;
the data-parallel size is the world over tp x pp x cp (``validate_args``: ``world_size``
must divide by that product, ``data_parallel_size = world_size // total_model_size``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.flags import MEGATRON_FIELD_ARGS
from meshplan.frameworks.given import GivenFlags
from meshplan.frameworks.megatron import arguments as mg
from meshplan.frameworks.megatron import launch

#: Megatron-LM argument -> the Strategy field (or size) it sets one to one, and its type: the
#: CLI's aliases of the same fields (one table, ``meshplan.flags``)
FIELD_ARGS: dict[str, tuple[str, Any]] = MEGATRON_FIELD_ARGS
#: the :class:`~.arguments.MegatronArgs` field each Megatron-only argument sets, and its type
#: (``--fp8-amax-history-len`` is taken and changes nothing: no field)
MEGATRON_ARGS: dict[str, tuple[str | None, Any]] = {
    "--num-layers-per-virtual-pipeline-stage": ("vpp_layers", int),
    "--recompute-granularity": ("granularity", str),
    "--recompute-method": ("method", str),
    "--recompute-num-layers": ("recompute_layers", int),
    "--recompute-activations": ("recompute_activations", bool),
    "--use-distributed-optimizer": ("distributed_optimizer", bool),
    "--bf16": ("bf16", bool),
    "--fp16": ("fp16", bool),
    "--fp8-format": ("fp8_format", str),
    "--fp8-recipe": ("fp8_recipe", str),
    "--fp8-amax-history-len": (None, int),
    "--fp8-amax-compute-algo": ("fp8_amax_algo", str),
    "--optimizer": ("optimizer", str),
    "--pipeline-model-parallel-layout": ("pipeline_layout", str),
    "--use-megatron-fsdp": ("megatron_fsdp", bool),
    "--data-parallel-sharding-strategy": ("dp_sharding", str),
    "--num-distributed-optimizer-instances": ("optimizer_instances", int),
    "--outer-dp-sharding-strategy": ("outer_sharding", str),
    "--grad-reduce-in-bf16": ("grad_reduce_bf16", bool),
    "--overlap-grad-reduce": ("overlap_grad_reduce", bool),
    "--overlap-param-gather": ("overlap_param_gather", bool),
    "--tp-comm-overlap": ("tp_comm_overlap", bool),
}
#: the closed value sets of the Megatron-only arguments (their Enums in :mod:`.arguments`)
CHOICES: dict[str, Any] = {"--recompute-granularity": mg.Granularity, "--recompute-method": mg.Method,
                           "--fp8-format": mg.Fp8Format, "--fp8-recipe": mg.Fp8Recipe,
                           "--optimizer": mg.MegatronOptimizer,
                           "--data-parallel-sharding-strategy": mg.DpSharding}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit; a MeshplanError instead
        raise MeshplanError(f"Megatron-LM arguments: {message}")


def _parse(kept: Sequence[str]) -> dict[str, Any]:
    """Flag -> value of the arguments of :data:`FIELD_ARGS` and :data:`MEGATRON_ARGS` in
    ``kept`` (None / False: not given). Raises MeshplanError naming an argument that is
    neither, a value of the wrong type, or one outside its choices."""
    parser = _Parser(add_help=False, allow_abbrev=False)
    for flag, (_, typ) in {**FIELD_ARGS, **MEGATRON_ARGS}.items():
        if typ is bool:
            parser.add_argument(flag, action="store_true")
        else:
            choices = [c.value for c in CHOICES[flag]] if flag in CHOICES else None
            parser.add_argument(flag, type=typ, choices=choices)
    ns, unknown = parser.parse_known_args(list(kept))
    if unknown:
        raise MeshplanError(f"{unknown[0]}: not a Megatron-LM argument meshplan reads (parallelism, "
                            "batch, recompute, precision, optimizer, overlap; the architecture "
                            "comes from the model)", field=unknown[0])
    values = vars(ns)
    return {flag: values[flag[2:].replace("-", "_")] for flag in {**FIELD_ARGS, **MEGATRON_ARGS}}


def strategy_from_args(argv: Sequence[str], world: int, *, model: str | None = None,
                       framework: str = "megatron-core") -> tuple[Any, list[str]]:
    """The Strategy a Megatron-LM launch line ``argv`` trains with on ``world`` GPUs, as
    ``meshplan cost --model M --cluster C ARGV`` costs it, and its notes.

    Args:
        argv: the ``pretrain_gpt.py`` arguments (``["--tensor-model-parallel-size", "4",
            "--bf16", ...]``; ``--flag=value`` too).
        world: GPUs of the run; dp = world / (tp x pp x cp).
        model: a model name or config.json (``completion.models.source.resolve_model``):
            gives the decoder layers when ``--num-layers`` is absent and the translation
            needs them, and the config the architecture arguments are checked against
            (without it they are named in a note, unchecked).
        framework: the framework profile costed (``Strategy.framework``).

    Returns:
        ``(strategy, notes)``: a ``meshplan.Strategy`` (micro-batches of
        ``--micro-batch-size`` sequences, a global batch of ``--global-batch-size``), and
        one string per note (cost-neutral arguments not read, ``--sequence-parallel`` at tp
        1, what is costed as something else).

    Raises:
        MeshplanError: an argument meshplan does not read, a bad value, tp x pp x cp not
            dividing ``world``, a contradiction (``.field``: the argument at fault); what
            the Megatron translation raises (:func:`.arguments.apply`).
        StrategyError: the Strategy's own refusals.
    """
    from meshplan.strategy import Strategy

    kept, neutral, arch = launch.split(argv)
    v = _parse(kept)
    fields = {FIELD_ARGS[f][0]: v[f] for f in FIELD_ARGS if v[f] not in (None, False)}
    m = mg.MegatronArgs(**{name: v[f] for f, (name, _) in MEGATRON_ARGS.items()
                           if name is not None and v[f] is not None})
    tp, pp, cp = (int(fields.get(k, 1)) for k in ("tp", "pp", "cp"))
    if world < 1 or world % (tp * pp * cp):
        raise MeshplanError(f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
                            f"--context-parallel-size {cp} = {tp * pp * cp} does not divide the {world} "
                            "GPUs (Megatron-LM's data-parallel size is the world over them)",
                            field="--tensor-model-parallel-size")
    layers = fields.pop("num_layers", None)
    seq_len = fields.pop("seq_len", None)

    def num_layers() -> int:
        if layers is None and model is None:
            raise MeshplanError("the Megatron-LM arguments need the model's decoder layers: give "
                                "--num-layers or a model", field="--num-layers")
        return mg.model_layers(model or "", seq_len, layers)

    notes: list[str] = []
    cl = GivenFlags(tuple(kept), {field: (flag,) for flag, (field, _) in FIELD_ARGS.items()})
    knobs = {"pp": pp, "vpp": fields.pop("vpp", 1), "schedule": "1F1B", "recompute": "none", "zero": 0,
             "dtype": "bfloat16", "fsdp_shard_size": None}
    knobs = mg.apply(cl, knobs, m, num_layers, dp=world // (tp * pp * cp), note=notes.append)
    mg.check_grad_reduce(m, framework, knobs["dtype"])
    mg.check_overlaps(m, framework)
    fields["sequence_parallel"] = launch.sequence_parallel(neutral, bool(fields.get("sequence_parallel")), tp)
    fields.pop("pp", None)
    strategy = Strategy(**{**fields, **knobs, "dp": world // (tp * pp * cp), "framework": framework})
    if arch and model is not None:
        from completion.models.source import resolve_model

        notes += launch.finish(arch, neutral, lambda: resolve_model(model, seq_len))
    else:
        notes += launch.finish({}, neutral, lambda: None)
        if arch:
            notes.append(f"Megatron-LM architecture arguments not checked (no model given): {', '.join(arch)}")
    return strategy, notes


__all__ = ["CHOICES", "FIELD_ARGS", "MEGATRON_ARGS", "strategy_from_args"]
