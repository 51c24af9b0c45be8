"""The strategy of a framework's config file on ``meshplan cost``: ``--deepspeed-config``
(:func:`deepspeed_strategy`) and ``--torchtitan-config`` (:func:`torchtitan_strategy`). The
files are read by :mod:`meshplan.frameworks.deepspeed` and :mod:`meshplan.frameworks.torchtitan`;
here the command's options are checked against what the file states, and the strategy is
built as the other strategy options build it (``options.build_strategy``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.commands import options as opt
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg


def deepspeed_strategy(ctx: Any, path: str, p: dict[str, Any], cluster: str, nodes: int | None,
                       layers_per_stage: str | None, num_layers: Callable[[], int]) -> Any:
    """The Strategy of the DeepSpeed JSON config ``path`` for ``cost --deepspeed-config``
    (``p``: the strategy options, Strategy field -> value; ``num_layers()`` the model's
    decoder layers, for ``--layers-per-stage even``): on the cluster's GPUs (``cluster`` / ``nodes``),
    with what the training script sets from the flags (``--tp``, ``--pp``, ``--recompute``,
    ``--sequence-parallel``, ``--schedule``, ``--vpp``, ``--ep``, ``--attention``,
    ``--layers-per-stage``, ``--framework``; the profile ``deepspeed`` by default). Raises
    MeshplanError for a flag of what the file states (dp, batch, ZeRO, HSDP, dtype; the
    Megatron-LM runtime arguments) or of context parallelism, DeepSpeedConfigError (module
    docstring), and StrategyError in the flags' words (``options.build_strategy``)."""
    from clusters import load_cluster
    from meshplan.frameworks.deepspeed.config import deepspeed_knobs

    stated = (opt.given_flags(ctx, "dp", "micro_batch_size", "global_batch_size", "zero", "fsdp_shard_size",
                              "dtype") + opt.typed_flags(ctx, *mg.MEGATRON_FLAGS))
    if stated:
        raise MeshplanError(f"--deepspeed-config {path} states the batch, ZeRO stage and precision (dp is "
                            f"the GPUs over tp x pp); drop {', '.join(stated)}")
    cp = opt.given_flags(ctx, "cp", "cp_comm")
    if cp:
        raise MeshplanError(f"--deepspeed-config: DeepSpeed has no ring-attention context parallelism (its "
                            f"Ulysses sequence parallelism is not modelled); drop {', '.join(cp)}")
    world = load_cluster(cluster, nodes).world_size
    typed_tp = p["tp"] if opt.given_flags(ctx, "tp") else None
    typed_rc = opt.value(p["recompute"]) if opt.given_flags(ctx, "recompute") else None
    knobs = deepspeed_knobs(path, world, typed_tp, p["pp"], typed_rc, bool(p["sequence_parallel"]))
    framework = p["framework"] if opt.given_flags(ctx, "framework") else "deepspeed"
    strategy = opt.build_strategy(ctx, **knobs, sequence_parallel=p["sequence_parallel"], vpp=p["vpp"],
                                  schedule=p["schedule"], ep=p["ep"],
                                  moe_capacity_factor=p["moe_capacity_factor"],
                                  moe_load_imbalance=p["moe_load_imbalance"], framework=framework,
                                  attention=p["attention"])
    return opt.pipeline_split(ctx, layers_per_stage, strategy, num_layers)


def torchtitan_strategy(ctx: Any, path: str, model: str, cluster: str, nodes: int | None,
                        seq_len: int | None, layers: int | None) -> tuple[Any, int]:
    """``(Strategy, seq_len)`` of the torchtitan job TOML ``path`` for ``cost
    --torchtitan-config``: on the cluster's GPUs (``--cluster`` / ``--nodes``), the model's
    layers for the pipeline split (``--layers`` applies). Raises MeshplanError for a strategy
    option typed beside it (the file states the strategy), a ``--seq-len`` other than the
    file's, and what :func:`torchtitan_knobs` and the Strategy raise (naming the file)."""
    from clusters import load_cluster
    from meshplan.frameworks.torchtitan.config import TorchtitanConfigError, torchtitan_knobs
    from meshplan.strategy import Strategy, StrategyError

    typed = opt.given_flags(ctx, *opt.FLAGS) + opt.typed_flags(ctx, *mg.MEGATRON_FLAGS)
    if typed:
        raise MeshplanError(f"--torchtitan-config {path} states the strategy; drop {', '.join(typed)}")
    world = load_cluster(cluster, nodes).world_size

    def model_layers() -> int:  # the layer count only: the model's warnings come with the cost
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return mg.model_layers(model, seq_len, layers)

    knobs = torchtitan_knobs(path, world, model_layers)
    toml_seq = knobs.pop("seq_len")
    if seq_len is not None and seq_len != toml_seq:
        raise MeshplanError(f"--seq-len {seq_len}, but {path} trains at [training] seq_len {toml_seq}")
    try:
        return Strategy(**knobs), toml_seq
    except StrategyError as e:
        raise TorchtitanConfigError(f"{path}: {e}") from None
