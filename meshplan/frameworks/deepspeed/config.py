"""A DeepSpeed JSON config as a meshplan Strategy: ``meshplan cost --deepspeed-config FILE``
costs the run a DeepSpeed user already has (the ``config`` of ``deepspeed.initialize``); the
model comes from ``--model``, the GPUs from ``--cluster`` / ``--nodes``, and what the training
script sets rather than the config from its flags (``--tp``, ``--pp``, ``--recompute``,
``--sequence-parallel``, ``--schedule``, ...). The inverse of ``meshplan export --to
deepspeed`` (:mod:`meshplan.frameworks.deepspeed.export`).

Names, defaults and meanings are those of DeepSpeed's configuration reference
(https://www.deepspeed.ai/docs/config-json/) and of its source at deepspeedai/DeepSpeed
edaa7221 (0.19.6 development), read for facts (paths below under ``deepspeed/``):

- dp = GPUs / (tp x pp): DeepSpeed's data-parallel world is the ranks outside the model-
  parallel groups (``runtime/config.py`` ``DeepSpeedConfig.__init__``: the mpu's
  data-parallel size). tp: ``tensor_parallel.autotp_size`` (AutoTP; 0, its default, is
  off: ``runtime/tensor_parallel/config.py`` ``TPTrainingConfig``), else ``--tp`` (tensor
  parallelism of the script's own mpu, Megatron-DeepSpeed's); both given must agree. pp:
  ``--pp``, which has no config key (``deepspeed.pipe.PipelineModule(num_stages=pp)`` in
  the script).
- batch: ``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x
  ``gradient_accumulation_steps`` x dp (with AutoTP x all the GPUs: ``deepspeed/__init__.py``
  passes no mpu, so ``DeepSpeedConfig`` takes the world size; the tp ranks of a group
  share their micro-batches, so a step trains train_batch_size / autotp_size sequences;
  with ``--pp`` the PipelineModule's default topology counts the world over pp), asserted
  (``runtime/config.py``
  ``_batch_assertion``); any two of the three give the third (by integer division, then
  the assertion), one alone means one accumulation step, and ``train_batch_size`` or
  ``train_micro_batch_size_per_gpu`` must be given (``_set_batch_related_parameters``).
  global batch = ``train_batch_size``, micro-batch = ``train_micro_batch_size_per_gpu``
  (with pp, the pipeline engine runs ``gradient_accumulation_steps`` micro-batches a step).
- zero: ``zero_optimization.stage`` (0; ``"zero_optimization": true`` is the old spelling
  of stage 1, ``runtime/zero/config.py`` ``read_zero_config_deprecated``). ZeRO-2 and 3
  with pp > 1 are refused as ``runtime/pipe/engine.py`` ``PipelineEngine.__init__``
  asserts. AutoTP with ZeRO-3 is read: ``runtime/engine.py``
  ``_configure_tensor_parallel_states`` at edaa722 ("AutoTP + ZeRO stage 3 is supported
  for both inference and training"; commit eec237ee8, released in 0.19.4; earlier releases
  assert stage <= 2).
- HSDP: ``zero_optimization.mics_shard_size`` (-1: off) with stage 3 = shard groups of
  that many ranks (MiCS, ``runtime/zero/mics_utils.py``: the size divides dp; a group of
  all dp is plain ZeRO-3); DeepSpeed reads it with stage 3 only, below it is warned about.
- dtype: ``bf16.enabled`` (``bfloat16``, the older section name, when ``bf16`` is absent:
  ``runtime/precision_config.py``) bfloat16, ``fp16.enabled`` float16, neither float32;
  both on is refused as ``runtime/config.py`` asserts.
- optimizer: ``optimizer.type`` Adam or AdamW, any case (DeepSpeed lower-cases the names it
  knows); its Adam runs in ``adam_w_mode`` unless told (``runtime/engine.py``
  ``_configure_basic_optimizer``), with AdamW's states either way. No ``optimizer``
  section: the script's torch optimizer, costed as AdamW.
- recompute: the script's ``deepspeed.checkpointing.checkpoint`` calls decide which layers
  recompute (``activation_checkpointing`` only configures those calls): ``--recompute``,
  with a warning when the section is present and ``--recompute`` is not given. With pp >
  1, ``pipeline.activation_checkpoint_interval`` 1 checkpoints every PipelineModule layer
  (full recompute; ``runtime/pipe/engine.py``), a larger interval is refused.
- the framework profile is ``deepspeed`` unless ``--framework`` says otherwise; the
  schedule, vpp, sequence parallelism, expert parallelism, attention and pipeline split
  come from their flags.

Refused, naming the key: CPU / NVMe offload (``offload_optimizer`` / ``offload_param``
``device`` cpu or nvme, the deprecated ``cpu_offload`` / ``cpu_offload_param``,
``zenflow``, ``activation_checkpointing.cpu_checkpointing``), ZeRO++
(``zero_hpz_partition_size`` > 1, ``zero_quantized_*``), Ulysses
``sequence_parallel_size`` > 1, AutoEP (``expert_parallel``), apex ``amp``,
``torch_autocast``, 16-bit master weights or optimizer states, ``elasticity.enabled``,
``compile.deepcompile``, and ``"auto"`` in a key that is read (the Hugging Face Trainer's
placeholders; in keys left alone it passes). Keys that leave the step's cost alone (logging,
``steps_per_print``, ``wall_clock_breakdown``, ``scheduler``, ``gradient_clipping``,
communication buckets, checkpointing) are accepted silently; an unknown top-level or
``zero_optimization`` key gets one warning per section naming it (a misspelled key would
otherwise be costed as its default; DeepSpeed itself refuses an unknown
``zero_optimization`` key).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError

#: ``optimizer.type`` lower-cased (DeepSpeed's reading) -> meshplan optimizer
OPTIMIZERS = {"adam": "adam", "adamw": "adamw"}
#: ``offload_optimizer`` / ``offload_param`` ``device`` values (``runtime/zero/offload_config.py``)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: the top-level keys DeepSpeed edaa722 reads (``runtime/config.py _initialize_params`` and
#: the sections it hands on); another one is warned about
TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "managed_gradient_accumulation", "steps_per_print", "dump_state", "disable_allgather",
    "communication_data_type", "seq_parallel_communication_data_type", "prescale_gradients",
    "gradient_predivide_factor", "gradient_allreduce_op", "sparse_gradients", "zero_optimization",
    "activation_checkpointing", "comms_logger", "tensorboard", "wandb", "csv_monitor", "comet",
    "gradient_clipping", "fp16", "bf16", "bfloat16", "amp", "torch_autocast", "compression_training",
    "graph_harvesting", "optimizer", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "scheduler", "flops_profiler", "wall_clock_breakdown", "memory_breakdown", "autotuning",
    "eigenvalue", "use_data_before_expert_parallelism", "hybrid_engine", "sparse_attention",
    "pipeline", "progressive_layer_drop", "curriculum_learning", "data_efficiency", "checkpoint",
    "data_types", "aio", "dataloader_drop_last", "log_level", "nebula", "datastates_ckpt",
    "weight_quantization", "compile", "timers", "tensor_parallel", "expert_parallel", "elasticity",
    "sequence_parallel_size", "vocabulary_size",
}
#: the ``zero_optimization`` keys of ``runtime/zero/config.py DeepSpeedZeroConfig`` at
#: edaa722 (field names, their ``stage3_`` aliases and the deprecated spellings)
ZERO_KEYS = {
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size", "overlap_comm",
    "load_from_fp32_weights", "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow",
    "sub_group_size", "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload",
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "module_granularity_threshold", "use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_model_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
    "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param",
    "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
}
PIPE_ASSERT = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"


class DeepSpeedConfigError(MeshplanError):
    """A DeepSpeed JSON config meshplan cannot read or model; the message names the file
    and the key (dotted: ``zero_optimization.offload_optimizer.device``)."""


def _warn(msg: str) -> None:
    import warnings

    warnings.warn(msg, UserWarning, stacklevel=4)


def _warn_unknown(sec: dict[str, Any], known: set[str], name: str, src: str) -> None:
    """One warning naming the keys of ``sec`` DeepSpeed does not read."""
    unknown = sorted(set(sec) - known)
    if unknown:
        _warn(f"{src}: {name} has keys DeepSpeed does not read, ignored: {', '.join(unknown)}")


def _no_auto(v: Any, key: str, src: str) -> None:
    if v == "auto":
        raise DeepSpeedConfigError(f"{src}: {key} is \"auto\", a placeholder the Hugging Face Trainer "
                                   "fills in before DeepSpeed reads the config; give the value", field=key)


def _int(sec: dict[str, Any], key: str, path: str, src: str, low: int = 1,
         nullable: bool = True) -> int | None:
    """``sec[key]`` as an integer >= ``low``; None when absent (or null, for a key DeepSpeed
    reads with ``get_scalar_param``, where null is the default). A key of one of DeepSpeed's
    pydantic config models (``nullable`` False: ``DeepSpeedZeroConfig.stage: ZeroStageEnum =
    0``, ``zero_hpz_partition_size: int``, ``TPTrainingConfig.autotp_size: int`` at edaa722)
    refuses null, as pydantic does: it was read as the default in silence."""
    v = sec.get(key)
    if v is None and key in sec and not nullable:
        raise DeepSpeedConfigError(f"{src}: {path} is null; DeepSpeed's config model takes an "
                                   f"integer there (and refuses null): give one, or leave the key "
                                   f"out for its default", field=path)
    if v is None:
        return None
    _no_auto(v, path, src)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise DeepSpeedConfigError(f"{src}: {path} must be an integer >= {low}, got {v!r}", field=path)
    return v


def _on(sec: dict[str, Any], key: str, path: str, src: str) -> bool:
    """``sec[key]`` as a boolean (absent: False)."""
    v = sec.get(key, False)
    _no_auto(v, path, src)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise DeepSpeedConfigError(f"{src}: {path} must be true or false, got {v!r}", field=path)
    return v


def _section(doc: dict[str, Any], name: str, src: str) -> dict[str, Any]:
    sec = doc.get(name)
    if sec is None:
        return {}
    if not isinstance(sec, dict):
        raise DeepSpeedConfigError(f"{src}: {name} must be an object, got {sec!r}", field=f"{name}")
    return sec


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise MeshplanError(f"the key {twice[0]!r} is given twice")
    return dict(pairs)


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path`` (strict JSON; DeepSpeed reads the file with hjson, which
    also takes comments). Raises DeepSpeedConfigError naming the file (and the line and
    column of a JSON syntax error) when it cannot be read, is not an object, or repeats a
    key in one object (DeepSpeed refuses that too: ``runtime/config_utils.py``
    ``dict_raise_error_on_duplicate_keys``)."""
    from completion.nesting import json_depth, too_deep

    src = str(path)
    try:
        text = Path(path).read_text()
        deep = too_deep(json_depth(text), "the DeepSpeed config")  # named with src below
        if deep:
            raise DeepSpeedConfigError(deep)
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except OSError as e:
        raise DeepSpeedConfigError(f"{src}: cannot read the DeepSpeed config ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DeepSpeedConfigError(f"{src}: not a JSON file ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"{src}: not a JSON file: line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:  # a key twice (_no_duplicates)
        raise DeepSpeedConfigError(f"{src}: {e}") from None
    if not isinstance(doc, dict):
        raise DeepSpeedConfigError(f"{src}: a DeepSpeed config is a JSON object, got {type(doc).__name__}")
    return doc


def batch_sizes(doc: dict[str, Any], dp: int, src: str, why: str = "") -> tuple[int, int]:
    """(micro-batch, global batch) in sequences of the config's batch keys on ``dp``
    data-parallel ranks, by DeepSpeed's rule (``runtime/config.py``
    ``_set_batch_related_parameters`` then ``_batch_assertion``): any two of
    ``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``
    give the third by integer division, one alone means one accumulation step, and
    train_batch_size = micro x accumulation x dp must hold. ``why``: how dp was found (for
    the message). Raises DeepSpeedConfigError naming the keys when it does not hold, or
    when neither batch key is given."""
    tb = _int(doc, "train_batch_size", "train_batch_size", src)
    mb = _int(doc, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", src)
    ga = _int(doc, "gradient_accumulation_steps", "gradient_accumulation_steps", src)
    if tb is None and mb is None:
        raise DeepSpeedConfigError(f"{src}: give train_batch_size or train_micro_batch_size_per_gpu "
                                   "(DeepSpeed: \"Either train_batch_size or "
                                   "train_micro_batch_size_per_gpu needs to be provided\")")
    derived = ""
    if mb is None:  # from train_batch_size (and the accumulation, 1 when absent)
        total, acc = int(tb or 0), ga or 1
        micro = total // dp // acc
        derived = f" (train_micro_batch_size_per_gpu = {total} // {dp} // {acc}, as DeepSpeed derives it)"
    elif tb is None:
        micro, acc = mb, ga or 1
        total = micro * acc * dp
    elif ga is None:
        total, micro = tb, mb
        acc = total // micro // dp
        derived = f" (gradient_accumulation_steps = {total} // {micro} // {dp}, as DeepSpeed derives it)"
    else:
        total, micro, acc = tb, mb, ga
    if micro < 1 or acc < 1 or total != micro * acc * dp:
        raise DeepSpeedConfigError(
            f"{src}: train_batch_size {total} != train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {acc} x dp {dp} = {micro * acc * dp}{derived}; DeepSpeed "
            f"asserts they agree{why}", field="train_batch_size")
    return micro, total


def _tensor_parallel(doc: dict[str, Any], tp: int | None, sp: bool, src: str) -> tuple[int, bool]:
    """(tp, whether it is AutoTP's ``tensor_parallel.autotp_size``)."""
    auto = _int(_section(doc, "tensor_parallel", src), "autotp_size", "tensor_parallel.autotp_size",
                src, low=0, nullable=False) or 0
    if auto > 1 and tp is not None and tp != auto:
        raise DeepSpeedConfigError(f"{src}: tensor_parallel.autotp_size {auto}, but --tp {tp}: give one "
                                   "of them, or the same value", field="tensor_parallel.autotp_size")
    if auto > 1 and sp:
        raise DeepSpeedConfigError(f"{src}: tensor_parallel.autotp_size {auto}: AutoTP shards the linear "
                                   "layers only, without Megatron sequence parallelism; drop "
                                   "--sequence-parallel", field="tensor_parallel.autotp_size")
    return (auto, True) if auto > 1 else (tp or 1, False)


def _zero(doc: dict[str, Any], dp: int, pp: int, src: str) -> tuple[int, int | None]:
    """(ZeRO stage, HSDP shard group or None) of ``zero_optimization``; the offload and
    ZeRO++ refusals."""
    raw = doc.get("zero_optimization")
    if isinstance(raw, bool):  # the old spelling: true is stage 1
        return int(raw), None
    zero = _section(doc, "zero_optimization", src)
    _warn_unknown(zero, ZERO_KEYS, "zero_optimization", src)
    stage = _int(zero, "stage", "zero_optimization.stage", src, low=0, nullable=False) or 0
    if stage > 3:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage}", field="zero_optimization.stage")
    if pp > 1 and stage >= 2:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.stage {stage} with pp {pp} (--pp): "
                                   f"DeepSpeed's PipelineEngine asserts \"{PIPE_ASSERT}\" "
                                   "(deepspeed/runtime/pipe/engine.py); use stage 0 or 1", field="zero_optimization.stage")
    for key in ("offload_optimizer", "offload_param"):
        sec = zero.get(key)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise DeepSpeedConfigError(f"{src}: zero_optimization.{key} must be an object, got {sec!r}", field=f"zero_optimization.{key}")
        dev = sec.get("device", "none")
        _no_auto(dev, f"zero_optimization.{key}.device", src)
        if dev not in OFFLOAD_DEVICES:
            raise DeepSpeedConfigError(f"{src}: zero_optimization.{key}.device {dev!r}: one of "
                                       f"{', '.join(OFFLOAD_DEVICES)}", field=f"zero_optimization.{key}.device")
        if dev != "none":
            raise DeepSpeedConfigError(f"{src}: zero_optimization.{key}.device {dev!r}: offloading to CPU "
                                       "or NVMe is not modelled (meshplan costs the states in GPU "
                                       "memory); set it to \"none\" to cost the run without it", field=f"zero_optimization.{key}.device")
    for key in ("cpu_offload", "cpu_offload_param"):
        if _on(zero, key, f"zero_optimization.{key}", src):
            raise DeepSpeedConfigError(f"{src}: zero_optimization.{key} (the old spelling of "
                                       "offload_optimizer / offload_param device \"cpu\"): CPU offload "
                                       "is not modelled", field=f"zero_optimization.{key}")
    if zero.get("zenflow") is not None:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.zenflow (ZenFlow's CPU-offloaded optimizer "
                                   "steps) is not modelled", field="zero_optimization.zenflow")
    hpz = _int(zero, "zero_hpz_partition_size", "zero_optimization.zero_hpz_partition_size", src, low=0,
               nullable=False)
    if hpz is not None and hpz > 1:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.zero_hpz_partition_size {hpz} (ZeRO++ hpZ, "
                                   "a secondary weight copy per group) is not modelled", field="zero_optimization.zero_hpz_partition_size")
    for key in ("zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"):
        if _on(zero, key, f"zero_optimization.{key}", src):
            raise DeepSpeedConfigError(f"{src}: zero_optimization.{key} (ZeRO++ quantized collectives) "
                                       "is not modelled", field=f"zero_optimization.{key}")
    return stage, _mics(zero, stage, dp, src)


def _mics(zero: dict[str, Any], stage: int, dp: int, src: str) -> int | None:
    mics = zero.get("mics_shard_size", -1)
    _no_auto(mics, "zero_optimization.mics_shard_size", src)
    if isinstance(mics, bool) or not isinstance(mics, int):
        raise DeepSpeedConfigError(f"{src}: zero_optimization.mics_shard_size must be an integer "
                                   f"(-1: off), got {mics!r}", field="zero_optimization.mics_shard_size")
    if mics <= 0:
        return None
    if stage != 3:
        _warn(f"{src}: zero_optimization.mics_shard_size {mics}: DeepSpeed shards in MiCS groups "
              f"with stage 3 only; stage {stage} is costed without them")
        return None
    if mics > dp or dp % mics:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.mics_shard_size {mics} must divide dp {dp} "
                                   "(MiCS: \"dp group size is not dividable by dp_shard_size\")", field="zero_optimization.mics_shard_size")
    if mics == 1:
        raise DeepSpeedConfigError(f"{src}: zero_optimization.mics_shard_size 1 keeps a whole copy of "
                                   "the states on every rank, which meshplan's HSDP (shard groups of 2 "
                                   "or more) does not model", field="zero_optimization.mics_shard_size")
    return None if mics == dp else mics  # one group of all dp ranks: plain ZeRO-3


def _dtype(doc: dict[str, Any], src: str) -> str:
    bf_key = "bf16" if "bf16" in doc else "bfloat16"
    bf, fp = _section(doc, bf_key, src), _section(doc, "fp16", src)
    bf_on = _on(bf, "enabled", f"{bf_key}.enabled", src)
    fp_on = _on(fp, "enabled", "fp16.enabled", src)
    if bf_on and fp_on:
        raise DeepSpeedConfigError(f"{src}: {bf_key}.enabled and fp16.enabled are both true (DeepSpeed "
                                   "asserts \"bfloat16 and fp16 modes cannot be simultaneously "
                                   "enabled\"); enable one", field=f"{bf_key}.enabled")
    for sec, name, key in ((bf, bf_key, "bf16_master_weights_and_grads"), (bf, bf_key, "bf16_optimizer_states"),
                           (fp, "fp16", "fp16_master_weights_and_grads")):
        if _on(sec, key, f"{name}.{key}", src):
            raise DeepSpeedConfigError(f"{src}: {name}.{key}: 16-bit master weights, gradients or "
                                       "optimizer states are not modelled (meshplan keeps them in "
                                       "fp32, the deepspeed profile's optimizer.master_weights)", field=f"{name}.{key}")
    for name in ("amp", "torch_autocast"):
        if _on(_section(doc, name, src), "enabled", f"{name}.enabled", src):
            raise DeepSpeedConfigError(f"{src}: {name}.enabled: {'apex AMP' if name == 'amp' else 'torch autocast over fp32 weights'} "
                                       "is not modelled; use bf16 or fp16", field=f"{name}.enabled")
    return "bfloat16" if bf_on else "float16" if fp_on else "float32"


def _optimizer(doc: dict[str, Any], src: str) -> str:
    sec = _section(doc, "optimizer", src)
    typ = sec.get("type")
    if typ is None:  # the script's torch optimizer (passed to deepspeed.initialize)
        return "adamw"
    _no_auto(typ, "optimizer.type", src)
    if not isinstance(typ, str) or typ.lower() not in OPTIMIZERS:
        raise DeepSpeedConfigError(f"{src}: optimizer.type {typ!r}: meshplan costs Adam and AdamW", field="optimizer.type")
    return OPTIMIZERS[typ.lower()]


def _refuse_unmodelled(doc: dict[str, Any], src: str) -> None:
    sp = _int(doc, "sequence_parallel_size", "sequence_parallel_size", src)
    if sp is not None and sp > 1:
        raise DeepSpeedConfigError(f"{src}: sequence_parallel_size {sp} (DeepSpeed-Ulysses, an all-to-all "
                                   "over the attention heads) is not modelled", field="sequence_parallel_size")
    ep = _section(doc, "expert_parallel", src)
    if _on(ep, "enabled", "expert_parallel.enabled", src) or (
            _int(ep, "autoep_size", "expert_parallel.autoep_size", src) or 1) > 1:
        raise DeepSpeedConfigError(f"{src}: expert_parallel (AutoEP) is not read; cost the experts' "
                                   "split with --ep", field="expert_parallel")
    ac = _section(doc, "activation_checkpointing", src)
    if _on(ac, "cpu_checkpointing", "activation_checkpointing.cpu_checkpointing", src):
        raise DeepSpeedConfigError(f"{src}: activation_checkpointing.cpu_checkpointing: checkpoints "
                                   "offloaded to CPU memory are not modelled", field="activation_checkpointing.cpu_checkpointing")
    if _on(_section(doc, "elasticity", src), "enabled", "elasticity.enabled", src):
        raise DeepSpeedConfigError(f"{src}: elasticity.enabled: DeepSpeed then chooses the batch and "
                                   "micro-batch from the GPU count (runtime/config.py "
                                   "compute_elastic_config), not the batch keys; give the batch the "
                                   "run uses without elasticity", field="elasticity.enabled")
    if _on(_section(doc, "compile", src), "deepcompile", "compile.deepcompile", src):
        raise DeepSpeedConfigError(f"{src}: compile.deepcompile: DeepCompile's compiled ZeRO passes "
                                   "(scheduling, prefetch, offload) are not modelled", field="compile.deepcompile")


def _recompute(doc: dict[str, Any], pp: int, tp: int, recompute: str | None, src: str) -> str:
    interval = _int(_section(doc, "pipeline", src), "activation_checkpoint_interval",
                    "pipeline.activation_checkpoint_interval", src, low=0) if pp > 1 else None
    if interval is not None and interval > 1:
        raise DeepSpeedConfigError(f"{src}: pipeline.activation_checkpoint_interval {interval} "
                                   f"checkpoints {interval} layers as one block, which is not modelled "
                                   "(1: every layer, full recompute)", field="pipeline.activation_checkpoint_interval")
    if interval == 1:
        if recompute not in (None, "full"):
            raise DeepSpeedConfigError(f"{src}: pipeline.activation_checkpoint_interval 1 recomputes "
                                       f"every layer (full), but --recompute {recompute}", field="pipeline.activation_checkpoint_interval")
        recompute = "full"
    ac = doc.get("activation_checkpointing")
    if recompute is None:
        if ac is not None:
            _warn(f"{src}: activation_checkpointing configures the training script's "
                  "deepspeed.checkpointing.checkpoint calls; which layers recompute is the script's "
                  "choice: costed without recompute (give --recompute full when it checkpoints every "
                  "layer)")
        return "none"
    if recompute != "none" and tp > 1 and isinstance(ac, dict) and _on(
            ac, "partition_activations", "activation_checkpointing.partition_activations", src):
        _warn(f"{src}: activation_checkpointing.partition_activations: the checkpointed layer "
              f"inputs split over the {tp} tensor-parallel ranks are not modelled (costed whole)")
    return recompute


def _bf16_optimizer(doc: dict[str, Any], dtype: str, zero: int, pp: int, src: str) -> int:
    """The ZeRO stage costed for DeepSpeed's BF16_Optimizer. ``runtime/engine.py``
    ``_do_optimizer_sanity_check`` (edaa722) runs it for bf16 without ZeRO under pipeline
    parallelism, and for bf16 at stage 1 with ``data_types.grad_accum_dtype`` fp32;
    ``runtime/bf16_optimizer.py`` partitions the fp32 master weights and Adam states over dp
    (its own ZeRO-1) beside a whole gradient buffer in the accumulation dtype. Stage 0 under
    pp is costed as ZeRO-1 (a warning says so); an fp32 accumulation buffer (4 bytes a
    parameter where ZeRO-1 is costed with 16-bit gradients) is warned about."""
    acc = (_section(doc, "data_types", src).get("grad_accum_dtype") or "").lower()
    fp32_acc = acc in ("fp32", "float32", "float")
    if dtype == "bfloat16" and zero == 0 and fp32_acc:
        raise DeepSpeedConfigError(f"{src}: bf16 with data_types.grad_accum_dtype {acc} and "
                                   "zero_optimization.stage 0: DeepSpeed raises NotImplementedError "
                                   "('unsupported mix of model_dtype and grad_accum_dtype', runtime/"
                                   "engine.py _do_optimizer_sanity_check); use stage 1")
    if dtype == "bfloat16" and zero == 0 and pp > 1:
        _warn(f"{src}: bf16 with --pp {pp} and zero_optimization.stage 0: DeepSpeed runs its BF16_Optimizer "
              "(runtime/engine.py), which partitions the fp32 master weights and Adam states over dp: "
              "costed as ZeRO-1")
        zero = 1
    if dtype == "bfloat16" and zero == 1 and fp32_acc:
        _warn(f"{src}: data_types.grad_accum_dtype {acc}: DeepSpeed's BF16_Optimizer keeps a whole fp32 "
              "gradient buffer, 2 bytes a parameter more than the 16-bit gradients costed")
    return zero


def deepspeed_knobs(path: str | Path | Mapping[str, Any], world: int, tp: int | None = None, pp: int = 1,
                    recompute: str | None = None, sequence_parallel: bool = False) -> dict[str, Any]:
    """Strategy keyword arguments of the DeepSpeed JSON config at ``path`` (or the config
    itself, a mapping as ``json.load`` gives it; messages then name it "the DeepSpeed
    config") on ``world`` GPUs
    (module docstring): ``dp``, ``tp``, ``pp``, ``zero``, ``fsdp_shard_size``,
    ``micro_batch_size`` / ``global_batch_size`` (sequences), ``dtype``, ``optimizer``,
    ``recompute``. ``tp``, ``pp``, ``recompute`` and ``sequence_parallel``: what the
    command line gives (``--tp`` None when not typed: AutoTP's or 1; ``--recompute`` None
    when not typed). Raises DeepSpeedConfigError naming the file and key of a value it
    cannot read or meshplan does not model; warns (UserWarning) of unknown keys."""
    if isinstance(path, Mapping):
        src, doc = "the DeepSpeed config", dict(path)
    else:
        src, doc = str(path), read_config(path)
    _warn_unknown(doc, TOP_KEYS, "the top level", src)
    tp, autotp = _tensor_parallel(doc, tp, sequence_parallel, src)
    if world % (tp * pp):
        raise DeepSpeedConfigError(f"{src}: tp {tp} x pp {pp} = {tp * pp} does not divide the cluster's "
                                   f"{world} GPUs (--nodes sets them); DeepSpeed's data-parallel degree is "
                                   "the GPUs over tp x pp")
    dp = world // (tp * pp)
    zero, shard = _zero(doc, dp, pp, src)
    _refuse_unmodelled(doc, src)
    if autotp:
        # deepspeed/__init__.py passes no mpu with AutoTP (the config sets the groups up), so
        # runtime/config.py takes the world size as the batch keys' dp -- the world over pp
        # under a PipelineModule (its default PipeDataParallelTopology, runtime/pipe/module.py):
        # every rank of a tensor-parallel group counts its micro-batch, though the group shares it
        keys_dp = world // pp
        micro, total = batch_sizes(doc, keys_dp, src, f" (AutoTP: DeepSpeed counts the {keys_dp} GPUs of "
                                                      f"each pipeline stage in the batch keys)")
        glob = total // tp
        _warn(f"{src}: AutoTP: DeepSpeed's batch keys count every GPU of a stage (train_batch_size "
              f"{total} = {micro} x {total // micro // keys_dp} x {keys_dp}); the {tp} tensor-parallel "
              f"ranks of a group share their micro-batches: {glob} sequences a step over dp {dp}")
    else:
        micro, glob = batch_sizes(doc, dp, src, f" (dp = {world} GPUs / (tp {tp} x pp {pp}))")
    dtype = _dtype(doc, src)
    zero = _bf16_optimizer(doc, dtype, zero, pp, src)
    return {"dp": dp, "tp": tp, "pp": pp, "zero": zero, "fsdp_shard_size": shard,
            "micro_batch_size": micro, "global_batch_size": glob, "dtype": dtype,
            "optimizer": _optimizer(doc, src), "recompute": _recompute(doc, pp, tp, recompute, src)}


__all__ = ["DeepSpeedConfigError", "batch_sizes", "deepspeed_knobs", "read_config"]
