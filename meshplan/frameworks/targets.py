"""The registry of ``meshplan export`` targets and what every exporter shares.

An exporter turns a :class:`~meshplan.plan.Plan` into what one training framework reads
(Megatron-LM command-line arguments, a torchtitan job TOML, a DeepSpeed JSON config) and
says, as :class:`Note` s, which knobs of the plan that framework cannot express and what it
runs instead. It also returns the *effective layout*: the plan's knobs as the framework will
run them (:func:`layout` of the plan, with each inexpressible knob replaced by what the
target does). ``tests/meshplan/test_export.py`` parses each output with a parser written from the
framework's documented names and checks that the parsed layout equals the effective one,
and that every knob where the effective layout differs from the plan's carries a note.

The layout's knobs are the Strategy's names (``completion.strategy``): ``dp``, ``tp``,
``pp``, ``vpp``, ``micro_batch_size``, ``global_batch_size``, ``schedule``, ``recompute``,
``zero``, ``fsdp_shard_size`` (HSDP's shard group, None: all of dp), ``sequence_parallel``,
``dtype``, ``fp8`` (the FP8 recipe of the decoder linears, None: none), ``optimizer``,
``attention`` and
``layers_per_stage`` (None: the framework's own split), plus the tokens per sequence and
decoder layers the plan runs (``seq_len``, ``num_layers``: :func:`model_sizes`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from meshplan.errors import MeshplanError

#: target name -> (module defining ``export(plan) -> Export``, one-line description)
TARGETS: dict[str, tuple[str, str]] = {
    "megatron": ("meshplan.frameworks.megatron.export",
                 "Megatron-LM pretrain_gpt.py command-line arguments"),
    "torchtitan": ("meshplan.frameworks.torchtitan.export",
                   "torchtitan job TOML ([parallelism], [activation_checkpoint], [training])"),
    "deepspeed": ("meshplan.frameworks.deepspeed.export", "DeepSpeed JSON config"),
}

#: targets whose file lists every (virtual) stage's decoder layers whatever the split (torchtitan's
#: ``module_fqns_per_model_part``, read as given by ``pipeline_module_split`` in
#: torchtitan/distributed/pipeline_parallel.py at 238fa99): the cost model's balanced split is
#: written as costed, where the others leave an even split to the framework
#: (``meshplan.frameworks.recost.costed_plan``)
LISTS_EVERY_SPLIT = frozenset({"torchtitan"})

#: every knob of a layout, in print order
LAYOUT_KNOBS = ("dp", "tp", "pp", "cp", "cp_comm", "ep", "vpp", "micro_batch_size", "global_batch_size", "schedule",
                "recompute", "zero", "fsdp_shard_size", "sequence_parallel", "dtype", "fp8", "optimizer",
                "attention", "layers_per_stage", "seq_len", "num_layers")


@dataclass(frozen=True)
class Note:
    """One plan knob the target cannot express as stated: ``knob`` (a name of
    :data:`LAYOUT_KNOBS`, or ``framework``) and what the target runs instead (``text``)."""

    knob: str
    text: str

    def __str__(self) -> str:
        return f"{self.knob}: {self.text}"


@dataclass
class Export:
    """An exporter's output.

    Attributes:
        target: the :data:`TARGETS` name.
        text: the file the framework reads (arguments, TOML or JSON), notes included as
            comments where the format has comments.
        notes: the knobs the target cannot express (:class:`Note`).
        effective: the layout the framework will run (keys :data:`LAYOUT_KNOBS`).
    """

    target: str
    text: str
    notes: list[Note] = field(default_factory=list)
    effective: dict[str, Any] = field(default_factory=dict)


def layout(plan: Any) -> dict[str, Any]:
    """The plan's layout (keys :data:`LAYOUT_KNOBS`). ZeRO over a data-parallel group of one
    rank shards nothing, so ``zero`` is 0 when ``dp`` is 1, and without context parallelism
    there is no K/V exchange, so ``cp_comm`` is ``p2p`` when ``cp`` is 1; ``layers_per_stage`` is a tuple,
    or None when the plan fixes no split or has one virtual stage (whose split is its layer
    count); ``num_layers`` and ``seq_len`` are :func:`model_sizes`."""
    s = plan.strategy
    lps = tuple(s.layers_per_stage) if s.layers_per_stage is not None else None
    if s.pp * s.vpp == 1:
        lps = None
    layers, seq = model_sizes(plan)
    return {"dp": s.dp, "tp": s.tp, "pp": s.pp, "cp": s.cp,
            "cp_comm": s.cp_comm if s.cp > 1 else "p2p", "ep": s.ep,
            "etp": s.tp if s.etp is None else s.etp, "vpp": s.vpp,
            "micro_batch_size": s.micro_batch_size, "global_batch_size": s.global_batch_size,
            "schedule": s.schedule, "recompute": s.recompute, "zero": s.zero if s.dp > 1 else 0,
            "fsdp_shard_size": s.fsdp_shard_size,
            "sequence_parallel": s.sequence_parallel, "dtype": s.dtype, "fp8": s.fp8,
            "optimizer": s.optimizer,
            "attention": s.attention, "layers_per_stage": lps, "seq_len": seq,
            "num_layers": layers}


def model_sizes(plan: Any) -> tuple[int | None, int | None]:
    """(decoder layers, tokens per sequence) the plan runs: ``plan.num_layers`` (else the
    sum of ``layers_per_stage``) and ``plan.seq_len``, each else the built-in /
    ``config.json`` model's; None where the model is a PIR program (whose sizes are not
    config fields)."""
    s = plan.strategy
    layers = plan.num_layers
    if layers is None and s.layers_per_stage is not None:
        layers = sum(s.layers_per_stage)
    seq = plan.seq_len
    if layers is None or seq is None:
        cfg = model_config(plan)
        if cfg is None:
            return layers, seq
        layers = int(cfg.num_layers) if layers is None else layers
        seq = int(cfg.seq_len) if seq is None else seq
    return layers, seq


def model_config(plan: Any) -> Any:
    """The plan's built-in or ``config.json`` model (``completion.get_model_config``), or
    None where the model is a PIR program or cannot be read (the exports then leave its
    sizes and fields out)."""
    from completion.models.catalog import get_model_config

    try:
        return get_model_config(plan.model)
    except (ValueError, KeyError, FileNotFoundError, OSError, TypeError):
        return None


class ExportError(MeshplanError):
    """An unknown export target (names the target and the known ones)."""


def export_plan(plan: Any, target: str) -> Export:
    """Export ``plan`` (a :class:`meshplan.plan.Plan`) to ``target`` (a :data:`TARGETS`
    name): the file's text, the notes on what the target cannot express, the layout it will
    run. Raises ExportError (a MeshplanError) for an unknown target (``.field``
    ``"target"``) or a plan the target cannot run (``.field`` the Strategy field)."""
    if target not in TARGETS:
        raise ExportError(f"unknown export target {target!r}; known: {sorted(TARGETS)}", field="target")
    module = importlib.import_module(TARGETS[target][0])
    out = module.export(plan)
    out.notes += annotation_notes(plan, target)
    return out


def annotation_notes(plan: Any, target: str) -> list[Note]:
    """A note when the plan's intra-op layout is not Megatron's column/row split (a custom
    ``annotation`` mapping, ``none``, or plan-level ``annotations``): every target shards
    tensors its own (Megatron) way."""
    ann = plan.strategy.annotation
    if ann == "megatron" and not plan.annotations:
        return []
    what = "custom placements" if isinstance(ann, dict) or plan.annotations else f"annotation {ann!r}"
    return [Note("annotation", f"the plan's intra-op layout ({what}) is not expressible: "
                               f"{target} shards tensors its own (Megatron-style) way")]


def framework_note(plan: Any, families: tuple[str, ...], target: str) -> list[Note]:
    """A note when the plan was costed for another framework profile than ``target``'s
    (``families``: the Strategy ``framework`` names of the target)."""
    fw = plan.strategy.framework
    if fw in families:
        return []
    return [Note("framework", f"the plan was costed with the {fw!r} profile; {target} runs its "
                              f"own kernels and overlap (re-cost with --framework {families[0]})")]


def routing_notes(plan: Any, target: str, capacity: str | None) -> list[Note]:
    """Notes on a mixture-of-experts plan's routing assumptions that ``target``'s file does
    not carry: a load imbalance (a costing assumption: routing decides it at run time, no
    framework takes it as an argument) and, unless the target writes it (``capacity``
    None), an expert capacity factor, with ``capacity`` saying where the target sets it
    instead (e.g. the model code). [] for a plan with neither."""
    s = plan.strategy
    notes = []
    if s.moe_capacity_factor is not None and capacity is not None:
        notes.append(Note("moe_capacity_factor", f"the plan drops tokens beyond {s.moe_capacity_factor:g}x "
                                                 f"an expert's mean load; {target} {capacity}: it is "
                                                 "not written"))
    if s.moe_load_imbalance != 1.0:
        notes.append(Note("moe_load_imbalance", f"the busiest expert at {s.moe_load_imbalance:g}x the "
                                                "mean load is a costing assumption: routing decides it "
                                                "at run time (no argument)"))
    return notes
