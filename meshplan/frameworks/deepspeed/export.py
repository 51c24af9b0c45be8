"""Export a plan as a DeepSpeed JSON config (the ``ds_config`` of ``deepspeed.initialize``).

Keys are those of DeepSpeed's configuration reference (https://www.deepspeed.ai/docs/
config-json/) and its AutoTP training tutorial (https://www.deepspeed.ai/tutorials/
autotp-training/, DeepSpeed >= 0.16.4). Mapping:

- batch: ``train_micro_batch_size_per_gpu`` = micro, ``gradient_accumulation_steps`` = m
  and, without AutoTP, ``train_batch_size`` = global. DeepSpeed asserts train_batch_size =
  micro x m x its world size, which it takes from the mpu's data-parallel size when the
  script passes an mpu (a PipelineModule always does: world / pp) and else from every rank
  (``runtime/config.py`` ``DeepSpeedConfig.__init__`` and ``_batch_assertion`` in the
  0.19.8 release). With AutoTP both happen (its tutorial passes an mpu "optional"), and the
  world size then either is dp or counts the tp ranks sharing a micro-batch, so no single
  train_batch_size passes both: it is left out and DeepSpeed derives it (micro x m x its
  world size, ``_set_batch_related_parameters``); micro x m x dp = global either way.
- ``zero_optimization.stage`` = ZeRO stage; ``tensor_parallel.autotp_size`` = tp (AutoTP
  combines with ZeRO stages 0-3 from DeepSpeed 0.19.4 on, ``docs/_pages/config-json.md``
  at edaa722; ZeRO 3 with tp > 1 is noted for older releases).
- HSDP (ZeRO-3 in shard groups of N) has no DeepSpeed form: MiCS (Zhang et al. 2022,
  ``zero_optimization.mics_shard_size``) is removed in 0.19.8, whose ``DeepSpeedConfig``
  refuses the key (``runtime/config.py`` ``_REMOVED_ZERO_CONFIG_KEYS``), and ZeRO++ hpZ
  (``zero_hpz_partition_size``) is not the same thing (it keeps only a secondary copy of
  the weights per group; gradients and optimizer states stay sharded over all of dp). ZeRO-3
  over all of dp is written, noted.
- pp: DeepSpeed's pipeline stages are not a config key (``deepspeed.pipe.PipelineModule
  (num_stages=pp)`` in the training script), so pp is noted and the world size must be dp x
  tp x pp; its pipeline engine runs 1F1B only, one chunk per rank.
- ``bf16.enabled`` / ``fp16.enabled``; ``optimizer.type`` Adam / AdamW; recompute full ->
  ``activation_checkpointing`` (applies to the layers the script wraps in
  ``deepspeed.checkpointing.checkpoint``); selective recompute and sequence parallelism
  have no config key (noted).
"""

from __future__ import annotations

import json
from typing import Any

from meshplan.frameworks.targets import Export, Note, framework_note, layout, routing_notes

FAMILIES = ("deepspeed",)
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam"}
#: the one pipeline schedule DeepSpeed's pipeline engine runs
SCHEDULE = "1F1B"


def _notes(eff: dict[str, Any], notes: list[Note]) -> None:
    """What the config cannot carry or DeepSpeed runs otherwise, noted, with ``eff`` set to
    what DeepSpeed runs."""
    if eff["ep"] > 1:
        notes.append(Note("ep", f"DeepSpeed sets expert parallelism in the model code "
                                f"(deepspeed.moe.layer.MoE(ep_size={eff['ep']})), not in the config; "
                                f"it is not written"))
        eff["ep"] = 1
    if eff["cp"] > 1:
        notes.append(Note("cp", f"DeepSpeed has no ring-attention context parallelism (its "
                                f"Ulysses sequence parallelism is an all-to-all over heads, set "
                                f"up in the script); cp {eff['cp']} is not written: launch "
                                f"dp x tp x pp ranks"))
        eff["cp"], eff["cp_comm"] = 1, "p2p"
    _pipeline_notes(eff, notes)
    if eff["zero"] == 3 and eff["tp"] > 1:
        notes.append(Note("zero", "AutoTP with ZeRO-3 trains from DeepSpeed 0.19.4 on (runtime/"
                                  "engine.py _configure_tensor_parallel_states); earlier releases "
                                  "assert ZeRO stage <= 2"))
    if eff["fsdp_shard_size"]:
        notes.append(Note("fsdp_shard_size", f"HSDP shard groups of {eff['fsdp_shard_size']} have no "
                                             f"DeepSpeed form (MiCS's mics_shard_size is refused "
                                             f"by DeepSpeed 0.19.8; hpZ shards only a secondary "
                                             f"weight copy per group): ZeRO-3 over all dp "
                                             f"{eff['dp']} is written"))
        eff["fsdp_shard_size"] = None
    if eff["recompute"] in ("selective", "selective-op"):
        notes.append(Note("recompute", "DeepSpeed checkpoints whole wrapped layers; selective "
                                       "recompute is not a config option (none written)"))
        eff["recompute"] = "none"
    if eff["sequence_parallel"]:
        notes.append(Note("sequence_parallel", "AutoTP has no Megatron sequence parallelism"))
        eff["sequence_parallel"] = False
    if eff["attention"] is not None:
        notes.append(Note("attention", f"the model code chooses the attention kernel "
                                       f"({eff['attention']}); not a config key"))


def _pipeline_notes(eff: dict[str, Any], notes: list[Note]) -> None:
    """DeepSpeed's pipeline engine: stages set in the script, ZeRO 0-1 beside it (bf16 at
    stage 0 runs BF16_Optimizer, ZeRO-1), one chunk, 1F1B, its own layer partition."""
    if eff["pp"] > 1:
        notes.append(Note("pp", f"set deepspeed.pipe.PipelineModule(num_stages={eff['pp']}) in the "
                                f"training script (no config key); launch dp x tp x pp = "
                                f"{eff['dp'] * eff['tp'] * eff['pp']} ranks"))
    if eff["pp"] > 1 and eff["zero"] > 1:
        notes.append(Note("zero", f"DeepSpeed's pipeline engine refuses ZeRO-2 and 3 "
                                  f"(PipelineEngine asserts stage < 2); ZeRO-1 is written, not "
                                  f"ZeRO-{eff['zero']}"))
        if eff["fsdp_shard_size"]:
            notes.append(Note("fsdp_shard_size", "HSDP shard groups are ZeRO-3's: none with ZeRO-1"))
        eff["zero"], eff["fsdp_shard_size"] = 1, None
    if eff["pp"] > 1 and eff["zero"] == 0 and eff["dtype"] == "bfloat16":
        notes.append(Note("zero", "bf16 beside pipeline parallelism without ZeRO runs DeepSpeed's "
                                  "BF16_Optimizer (runtime/engine.py), which partitions the optimizer "
                                  "states over dp (its own ZeRO-1): ZeRO-1 is written"))
        eff["zero"] = 1
    if eff["vpp"] > 1:
        notes.append(Note("vpp", f"DeepSpeed's pipeline engine runs one model chunk per rank, "
                                 f"not {eff['vpp']}"))
        eff["vpp"] = 1
    if eff["schedule"] != SCHEDULE:
        notes.append(Note("schedule", f"DeepSpeed's pipeline engine runs 1F1B, not {eff['schedule']}"))
        eff["schedule"] = SCHEDULE
    if eff["pp"] > 1:
        costed = (f"the costed split {list(eff['layers_per_stage'])}" if eff["layers_per_stage"]
                  is not None else "the costed split")
        notes.append(Note("layers_per_stage", f"DeepSpeed's PipelineModule takes no list of layers "
                                              f"per stage (partition_method 'parameters', its "
                                              f"default, balances parameter counts; 'uniform' "
                                              f"balances layer counts, an embedding or head in the "
                                              f"layer list counted as a layer): {costed} is not "
                                              f"written; compare the partition DeepSpeed logs"))

def _size_notes(plan: Any, notes: list[Note]) -> None:
    for knob in ("seq_len", "num_layers"):
        if getattr(plan, knob) is not None:
            notes.append(Note(knob, f"{getattr(plan, knob)}: set by the model and data code "
                                    f"(not a config key)"))


def export(plan: Any) -> Export:
    """A DeepSpeed JSON config for ``plan`` (see the module docstring). JSON has no
    comments, so the notes are only in :attr:`Export.notes` (``meshplan export`` prints
    them on stderr)."""
    eff = layout(plan)
    notes: list[Note] = framework_note(plan, FAMILIES, "DeepSpeed")
    _notes(eff, notes)
    _size_notes(plan, notes)
    notes += routing_notes(plan, "DeepSpeed", "sets it in the model code "
                                              "(deepspeed.moe.layer.MoE(capacity_factor=...))")
    if eff["fp8"] is not None:
        notes.append(Note("fp8", f"a DeepSpeed config has no FP8 setting ({eff['fp8']} scaling): "
                                 f"FP8 linears come from the model code (Transformer Engine or "
                                 f"torchao modules); the config runs {eff['dtype']}"))
        eff["fp8"] = None
    m = eff["global_batch_size"] // (eff["dp"] * eff["micro_batch_size"])
    cfg: dict[str, Any] = {
        "train_batch_size": eff["global_batch_size"],
        "train_micro_batch_size_per_gpu": eff["micro_batch_size"],
        "gradient_accumulation_steps": m,
        "zero_optimization": {"stage": eff["zero"]},
        "bf16": {"enabled": eff["dtype"] == "bfloat16"},
        "fp16": {"enabled": eff["dtype"] == "float16"},
    }
    if eff["tp"] > 1:
        # AutoTP: DeepSpeed's batch world is dp with an mpu, dp x tp without (docstring)
        del cfg["train_batch_size"]
        cfg["tensor_parallel"] = {"autotp_size": eff["tp"]}
        notes.append(Note("global_batch_size", f"AutoTP: train_batch_size is left for DeepSpeed to "
                                               f"derive (micro x gradient_accumulation_steps x its "
                                               f"world size, which counts the {eff['tp']} tp ranks "
                                               f"unless the script passes an mpu); the step trains "
                                               f"{eff['global_batch_size']} sequences either way"))
    if eff["optimizer"] in OPTIMIZERS:
        cfg["optimizer"] = {"type": OPTIMIZERS[eff["optimizer"]], "params": {}}
    else:
        notes.append(Note("optimizer", f"DeepSpeed has no built-in {eff['optimizer']}; pass a "
                                       f"torch.optim optimizer to deepspeed.initialize"))
    if eff["recompute"] == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False}
    text = json.dumps(cfg, indent=2) + "\n"
    return Export("deepspeed", text, notes, eff)
