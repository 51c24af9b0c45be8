"""A torchtitan job TOML as a meshplan Strategy: ``meshplan cost --torchtitan-config FILE``
costs the job a torchtitan user already has (the model comes from ``--model``, the GPUs
from ``--cluster`` / ``--nodes``).

Names, defaults and meanings are those of ``torchtitan/config/job_config.py`` at
pytorch/torchtitan 238fa9953e4a (the last commit that reads TOML job files; the one
``meshplan export --to torchtitan`` writes for), read for facts:

- dp: ``data_parallel_replicate_degree`` (1) x ``data_parallel_shard_degree`` (-1: the
  ranks left over); shard 1 is DDP (ZeRO 0), shard > 1 FSDP2: ZeRO 3 when parameters are
  resharded after forward, ZeRO 2 when not (``fsdp_reshard_after_forward``: ``always`` /
  ``never``; ``default`` reshards unless pp > 1, ``models/llama3/infra/parallelize.py``);
  replicate x shard both > 1 is HSDP (shard groups of the shard degree).
- ``tensor_parallel_degree`` (sequence parallel on with tp > 1: torchtitan always shards
  the norms), ``context_parallel_degree`` with ``context_parallel_rotate_method``
  (``allgather``, the default, or ``alltoall``: the ring), ``expert_parallel_degree`` with
  ``expert_tensor_parallel_degree`` (1, the default: whole experts, meshplan's etp 1; or tp).
- pp: ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` (GPipe, 1F1B,
  Interleaved1F1B, ZBVZeroBubble), ``pipeline_parallel_microbatch_size`` (1). Stages:
  ``module_fqns_per_model_part`` when given, else ``pipeline_parallel_layers_per_stage``,
  else one stage per rank for GPipe / 1F1B and two for a looped schedule; their layers as
  ``distributed/pipeline_parallel.py generate_llm_fqn_per_model_part`` splits them (the
  embedding and the output weigh ``pipeline_parallel_first_stage_less_layers`` /
  ``_last_stage_less_layers`` layers, 1 each).
- batch: ``[training] local_batch_size`` (8) per data-parallel rank per step
  (``global_batch_size`` -1: local x dp; larger: gradient accumulation); with pp the
  micro-batch is ``pipeline_parallel_microbatch_size``, else the local batch.
- ``seq_len`` (2048), ``mixed_precision_param`` (bfloat16); ``[activation_checkpoint]
  mode`` (``selective`` with ``selective_ac_option`` ``"2"`` by default: every second layer
  fully recomputed, which meshplan does not model and refuses; ``op``, ``full``, ``none``);
  ``[compile] enable`` (the ``fsdp2`` profile; off: ``fsdp2-eager``), async TP (the
  ``fsdp2-async-tp`` profile); ``[model] converters`` with ``float8`` /
  ``quantize.linear.float8`` and its ``recipe_name`` (tensorwise by default, rowwise);
  ``[optimizer] name`` (AdamW, Adam).

A value of the keys read that meshplan does not model is an error naming its section and
key; keys that leave the step's cost alone (model name and flavor, data, checkpointing,
logging, float8 filter lists) are not read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError

#: torch.distributed.pipelining schedule -> meshplan schedule
SCHEDULES = {"GPipe": "FThenB", "1F1B": "1F1B", "Interleaved1F1B": "VPP", "ZBVZeroBubble": "ZBVPP"}
SINGLE_STAGE = ("GPipe", "1F1B")
OPTIMIZERS = {"AdamW": "adamw", "Adam": "adam"}
ROTATE = {"allgather": "all_gather", "alltoall": "p2p"}
FP8_CONVERTERS = ("float8", "quantize.linear.float8")
#: the keys of the sections read (job_config.py at 238fa99); another one is warned about
#: (a misspelled ``tensor_parallel_degre`` would be costed as its default)
KNOWN_KEYS = {
    "training": {"dataloader", "dataset", "dataset_path", "dtype", "enable_cpu_offload", "gc_debug",
                 "gc_freq", "global_batch_size", "local_batch_size", "max_norm", "mixed_precision_param",
                 "mixed_precision_reduce", "seq_len", "steps", "compile"},  # compile: before [compile]
    "parallelism": {"context_parallel_degree", "context_parallel_load_balancer",
                    "context_parallel_rotate_method", "data_parallel_replicate_degree",
                    "data_parallel_shard_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "expert_parallel_comm_backend", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "fsdp_reshard_after_forward",
                    "module_fqns_per_model_part", "pipeline_parallel_degree",
                    "pipeline_parallel_expert_parallel_overlap", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "tensor_parallel_degree"},
    "activation_checkpoint": {"debug", "determinism_check", "early_stop", "memory_budget", "mode",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "preserve_rng_state",
                              "selective_ac_option", "visualize_memory_budget_pareto"},
    "compile": {"backend", "components", "enable"},
}
#: the sections of torchtitan 238fa99's ``JobConfig`` (``torchtitan/config/job_config.py``),
#: plus ``float8``, the section of the older float8 converter that this reader also takes;
#: torchtitan's ``ConfigManager._dict_to_dataclass`` raises on any other (unless
#: ``[job] custom_config_module`` extends the config)
SECTIONS = frozenset({"job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training",
                      "parallelism", "checkpoint", "activation_checkpoint", "compile", "quantize",
                      "comm", "memory_estimation", "fault_tolerance", "experimental", "validation",
                      "debug", "float8"})
FLOAT8_KEYS = {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
               "recipe_name", "filter_fqns", "emulate"}


class TorchtitanConfigError(MeshplanError):
    """A torchtitan job TOML meshplan cannot read or model; the message names the file,
    section and key."""


def default_split(layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...]:
    """Decoder layers per stage as torchtitan 238fa99 splits them when no module list is
    given (``generate_llm_fqn_per_model_part``): ``layers + first_less + last_less``
    effective layers over ``stages``, the earlier stages one more, the first stage
    ``first_less`` fewer (the embedding) and the last ``last_less`` fewer (norm and output).
    E.g. 32 layers on 4 stages: 34 = 9 + 9 + 8 + 8 -> (8, 9, 8, 7). Raises
    TorchtitanConfigError where torchtitan raises (a stage left without room)."""
    if stages == 1:
        return (layers,)
    eff = layers + first_less + last_less
    base, extra = divmod(eff, stages)
    if base == 0 or first_less > base or last_less > base:
        raise TorchtitanConfigError(f"torchtitan cannot split {layers} layers (+ {first_less} + "
                                    f"{last_less} for the embedding and output) over {stages} stages")
    counts = [base + (i < extra) for i in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return tuple(counts)


def _fqn_split(fqns: Any, where: str) -> tuple[int, ...]:
    """Layers per stage of ``module_fqns_per_model_part``: llama modules in order
    (``tok_embeddings`` first, ``layers.<i>``, ``norm`` and ``output`` last)."""
    if not isinstance(fqns, list) or not all(isinstance(p, list) for p in fqns) or not fqns:
        raise TorchtitanConfigError(f"{where}: a list of module-name lists, one per stage")
    flat = [m for part in fqns for m in part]
    n = sum(str(m).startswith("layers.") for m in flat)
    if flat != ["tok_embeddings", *(f"layers.{i}" for i in range(n)), "norm", "output"]:
        raise TorchtitanConfigError(f"{where}: meshplan reads a llama model's modules in order "
                                    "(tok_embeddings, layers.0 ..., norm, output)")
    return tuple(sum(str(m).startswith("layers.") for m in part) for part in fqns)


def _warn_unknown(sec: dict[str, Any], known: set[str], name: str, src: str) -> None:
    """One warning naming the keys of ``sec`` torchtitan 238fa99 does not have (a
    misspelling is otherwise costed as the key's default)."""
    import warnings

    unknown = sorted(set(sec) - known)
    if unknown:
        warnings.warn(f"{src}: {name} has keys torchtitan does not read, ignored: {', '.join(unknown)}",
                      UserWarning, stacklevel=3)


def _check_sections(doc: dict[str, Any], src: str) -> None:
    """Refuse a section torchtitan 238fa99 does not have (:data:`SECTIONS`; torchtitan
    raises "Invalid field names" on it, and a misspelled ``[paralelism]`` was read as no
    parallelism at all); with ``[job] custom_config_module`` (a config extended by the
    user's module) only warn. Raises TorchtitanConfigError naming the file and sections."""
    import warnings

    unknown = sorted(k for k in doc if k not in SECTIONS)
    if not unknown:
        return
    names = ", ".join(f"[{k}]" for k in unknown)
    job = doc.get("job")
    if isinstance(job, dict) and job.get("custom_config_module"):
        warnings.warn(f"{src}: sections {names} come from [job] custom_config_module; meshplan does "
                      "not read them", UserWarning, stacklevel=3)
        return
    raise TorchtitanConfigError(f"{src}: {names}: not a section of torchtitan's job config "
                                f"(torchtitan refuses it too); known: {', '.join(sorted(SECTIONS))}")


def _int(sec: dict[str, Any], key: str, default: int, where: str, low: int = 1) -> int:
    v = sec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or (v < low and v != default):
        raise TorchtitanConfigError(f"{where}.{key} must be an integer >= {low}, got {v!r}",
                                    field=where.rsplit("[", 1)[-1].rstrip("]") + "." + key)
    return v


def _section(doc: dict[str, Any], name: str, src: str) -> dict[str, Any]:
    sec = doc.get(name, {})
    if not isinstance(sec, dict):
        raise TorchtitanConfigError(f"{src}: [{name}] must be a table", field=f"{name}")
    return sec


def _data_parallel(par: dict[str, Any], world: int, pp: int, where: str) -> dict[str, Any]:
    rep = _int(par, "data_parallel_replicate_degree", 1, where)
    shard = _int(par, "data_parallel_shard_degree", -1, where)
    tp = _int(par, "tensor_parallel_degree", 1, where)
    cp = _int(par, "context_parallel_degree", 1, where)
    rest = rep * tp * pp * cp
    if shard == -1:  # the ranks left over (torchtitan ParallelDims)
        if world % rest:
            raise TorchtitanConfigError(f"{where}: replicate {rep} x tp {tp} x pp {pp} x cp {cp} = {rest} "
                                        f"does not divide the {world} GPUs", field="parallelism.data_parallel_shard_degree")
        shard = world // rest
    if rest * shard != world:
        raise TorchtitanConfigError(f"{where}: replicate {rep} x shard {shard} x tp {tp} x pp {pp} x "
                                    f"cp {cp} = {rest * shard}, but the cluster has {world} GPUs "
                                    "(--nodes sets it)", field="parallelism.data_parallel_shard_degree")
    policy = par.get("fsdp_reshard_after_forward", "default")
    if policy not in ("default", "always", "never"):
        raise TorchtitanConfigError(f"{where}.fsdp_reshard_after_forward {policy!r}: default, always or never", field="parallelism.fsdp_reshard_after_forward")
    reshard = policy == "always" or (policy == "default" and pp == 1)
    if shard == 1 and rep > 1 and (tp > 1 or pp > 1):
        raise TorchtitanConfigError(f"{where}: data_parallel_replicate_degree {rep} with shard degree 1 "
                                    "is DDP, which torchtitan runs only without tp and pp (\"DDP has "
                                    "not supported > 1D parallelism\"); shard the data-parallel ranks", field="parallelism.data_parallel_shard_degree")
    if shard == 1 and rep > 1 and cp > 1:
        raise TorchtitanConfigError(f"{where}: replicate {rep} with shard degree 1 and cp {cp} is "
                                    "torchtitan's FSDP over the cp ranks only (HSDP over cp), which "
                                    "meshplan does not model", field="parallelism.data_parallel_shard_degree")
    # FSDP runs over dp_shard x cp (torchtitan ParallelDims: fsdp_enabled with cp too)
    zero = 0 if shard == 1 and cp == 1 else (3 if reshard else 2)
    if rep > 1 and shard > 1 and zero == 2:
        raise TorchtitanConfigError(f"{where}: HSDP (replicate {rep} x shard {shard}) is modelled with "
                                    "parameters resharded after forward: set "
                                    "fsdp_reshard_after_forward = \"always\"", field="parallelism.fsdp_reshard_after_forward")
    rotate = par.get("context_parallel_rotate_method", "allgather")
    if rotate not in ROTATE:
        raise TorchtitanConfigError(f"{where}.context_parallel_rotate_method {rotate!r}: allgather or alltoall", field="parallelism.context_parallel_rotate_method")
    ep, etp = _expert(par, shard, cp, tp, where)
    return {"dp": rep * shard, "tp": tp, "cp": cp, "cp_comm": ROTATE[rotate] if cp > 1 else "p2p",
            "ep": ep, "etp": etp, "zero": zero,
            "fsdp_shard_size": shard if rep > 1 and shard > 1 else None, "sequence_parallel": tp > 1}


def expert_ep_problem(dp_shard: int, cp: int, tp: int, ep: int, etp: int) -> str | None:
    """Why torchtitan 238fa99's ``ParallelDims`` refuses ``ep`` x ``etp`` on a dense mesh of
    ``dp_shard`` x ``cp`` x ``tp`` ranks (per pipeline stage and replica), or None: etp must be
    1 or tp (line 59) and ``efsdp = dp_shard x cp x tp / (etp x ep)`` a whole number >= 1
    (line 138, the sparse mesh unflattened from the same ranks). E.g. dp_shard 1, tp 4: ep 4
    with etp 1 fits (efsdp 1), ep 4 with etp 4 does not (16 > 4 ranks)."""
    if etp not in (1, tp):
        return f"expert_tensor_parallel_degree {etp} must be 1 or tensor_parallel_degree {tp}"
    ranks = dp_shard * cp * tp
    if ranks % (ep * etp):
        return (f"expert_parallel_degree {ep} x expert_tensor_parallel_degree {etp} must divide "
                f"data_parallel_shard_degree x context_parallel_degree x tensor_parallel_degree = "
                f"{dp_shard} x {cp} x {tp} = {ranks}")
    return None


def _expert(par: dict[str, Any], shard: int, cp: int, tp: int, where: str) -> tuple[int, int | None]:
    """(ep, etp) of ``expert_parallel_degree`` and ``expert_tensor_parallel_degree`` (1, its
    default: whole experts over dp_shard x cp x tp; tp: each expert split as the dense MLP,
    ep over dp_shard x cp), refused where torchtitan's ParallelDims asserts
    (:func:`expert_ep_problem`); etp None (meshplan's tp) without experts to spread, where
    torchtitan ignores it."""
    ep = _int(par, "expert_parallel_degree", 1, where)
    etp = _int(par, "expert_tensor_parallel_degree", 1, where)
    if ep == 1:
        return 1, None
    why = expert_ep_problem(shard, cp, tp, ep, etp)
    if why:
        raise TorchtitanConfigError(f"{where}: {why} (torchtitan's ParallelDims asserts it)",
                                    field="parallelism.expert_parallel_degree")
    return ep, (None if etp == tp else 1)


def _pipeline(par: dict[str, Any], pp: int, num_layers: Any, where: str) -> dict[str, Any]:
    if pp == 1:
        return {"schedule": "1F1B", "vpp": 1}
    typed = par.get("pipeline_parallel_schedule", "1F1B")
    name = {k.lower(): k for k in SCHEDULES}.get(str(typed).lower())  # torch reads it case-blind
    if name is None:
        raise TorchtitanConfigError(f"{where}.pipeline_parallel_schedule {typed!r}: meshplan costs "
                                    f"{', '.join(SCHEDULES)}", field="parallelism.pipeline_parallel_schedule")
    if par.get("pipeline_parallel_schedule_csv"):
        raise TorchtitanConfigError(f"{where}.pipeline_parallel_schedule_csv: a schedule from a CSV "
                                    "is not modelled", field="parallelism.pipeline_parallel_schedule_csv")
    fqns = par.get("module_fqns_per_model_part")
    if fqns is not None:
        split = _fqn_split(fqns, f"{where}.module_fqns_per_model_part")
        if sum(split) != int(num_layers()):
            raise TorchtitanConfigError(f"{where}.module_fqns_per_model_part lists {sum(split)} "
                                        f"decoder layers, the model has {int(num_layers())}", field="parallelism.module_fqns_per_model_part")
    else:
        layers = int(num_layers())
        first = _int(par, "pipeline_parallel_first_stage_less_layers", 1, where, low=0)
        last = _int(par, "pipeline_parallel_last_stage_less_layers", 1, where, low=0)
        per = par.get("pipeline_parallel_layers_per_stage")
        if per is not None:
            per = _int(par, "pipeline_parallel_layers_per_stage", 1, where)
            stages = math.ceil((layers + first + last) / per)
        else:
            stages = pp * (1 if name in SINGLE_STAGE else 2)
        split = default_split(layers, stages, first, last)
    if len(split) % pp:
        raise TorchtitanConfigError(f"{where}: {len(split)} pipeline stages do not divide over "
                                    f"pipeline_parallel_degree {pp}", field="parallelism.pipeline_parallel_degree")
    vpp = len(split) // pp
    if (name in SINGLE_STAGE) != (vpp == 1):
        raise TorchtitanConfigError(f"{where}.pipeline_parallel_schedule {name} runs "
                                    f"{'one stage' if name in SINGLE_STAGE else 'several stages'} "
                                    f"per rank, but the config gives {vpp}", field="parallelism.pipeline_parallel_schedule")
    if name == "ZBVZeroBubble" and vpp != 2:
        raise TorchtitanConfigError(f"{where}: ZBVZeroBubble runs two stages per rank, got {vpp}",
                                    field="parallelism.pipeline_parallel_schedule")
    return {"schedule": SCHEDULES[name], "vpp": vpp, "layers_per_stage": split}


def _recompute(ac: dict[str, Any], src: str) -> str:
    mode = ac.get("mode", "selective")
    option = str(ac.get("selective_ac_option", "2"))
    if mode in ("none", "full"):
        return str(mode)
    if mode == "selective" and option == "op":
        return "selective-op"
    if mode == "selective" and option == "1":  # every layer checkpointed: full recompute
        return "full"
    if mode == "selective":
        raise TorchtitanConfigError(
            f"{src}: [activation_checkpoint] selective_ac_option {option!r} (torchtitan's default: "
            "every N-th layer fully recomputed) is not modelled; set selective_ac_option = \"op\", "
            "or mode = \"full\" / \"none\"", field="activation_checkpoint.selective_ac_option")
    raise TorchtitanConfigError(f"{src}: [activation_checkpoint] mode {mode!r} is not modelled "
                                "(none, full, selective with selective_ac_option \"op\")", field="activation_checkpoint.mode")


def _fp8(doc: dict[str, Any], src: str) -> str | None:
    converters = _section(doc, "model", src).get("converters", [])
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    if not isinstance(converters, list):
        raise TorchtitanConfigError(f"{src}: [model] converters must be a list of names, got {converters!r}", field="model.converters")
    used = [c for c in converters if c in FP8_CONVERTERS]
    other = [c for c in converters if c not in FP8_CONVERTERS]
    if other:
        raise TorchtitanConfigError(f"{src}: [model] converters {other} are not modelled", field="model.converters")
    if not used:
        return None
    sec: Any = doc
    path = ("float8",) if "float8" in used and "float8" in doc else ("quantize", "linear", "float8")
    for key in path:  # [quantize.linear.float8] (238fa99); [float8] of the older converter
        sec = sec.get(key, {}) if isinstance(sec, dict) else None
        if not isinstance(sec, dict):
            raise TorchtitanConfigError(f"{src}: [{'.'.join(path)}] must be a table", field=".".join(path))
    _warn_unknown(sec, FLOAT8_KEYS, f"[{'.'.join(path)}]", src)
    if sec.get("enable_fsdp_float8_all_gather"):
        raise TorchtitanConfigError(f"{src}: [{'.'.join(path)}] enable_fsdp_float8_all_gather: FSDP "
                                    "all-gathers of float8 weights are not modelled (bf16 ones are)",
                                    field=".".join((*path, "enable_fsdp_float8_all_gather")))
    recipe = sec.get("recipe_name") or "tensorwise"
    if recipe not in ("tensorwise", "rowwise"):
        raise TorchtitanConfigError(f"{src}: float8 recipe_name {recipe!r}: meshplan costs tensorwise "
                                    "and rowwise", field=".".join((*path, "recipe_name")))
    return str(recipe)


def torchtitan_knobs(path: str | Path, world: int, num_layers: Any) -> dict[str, Any]:
    """Strategy keyword arguments (and ``seq_len``) of the torchtitan job TOML at ``path`` on
    ``world`` GPUs (module docstring); ``num_layers`` gives the model's decoder layers
    (called only for a pipeline without a module list). Raises TorchtitanConfigError naming
    the file, section and key of a value it cannot read or meshplan does not model."""
    src = str(path)
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        raise TorchtitanConfigError("--torchtitan-config reads TOML with Python 3.11's tomllib; "
                                    "this is Python 3.10") from None
    from completion.nesting import toml_depth, too_deep

    try:
        text = Path(path).read_text()
        deep = too_deep(toml_depth(text), f"{src}: the torchtitan config")
        if deep:
            raise TorchtitanConfigError(deep)
        doc = tomllib.loads(text)
    except OSError as e:
        raise TorchtitanConfigError(f"{src}: cannot read the torchtitan config ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TorchtitanConfigError(f"{src}: not a TOML file: {e}") from None
    _check_sections(doc, src)
    par, tr = _section(doc, "parallelism", src), _section(doc, "training", src)
    for name, known in KNOWN_KEYS.items():
        _warn_unknown(_section(doc, name, src), known, f"[{name}]", src)
    where = f"{src}: [parallelism]"
    pp = _int(par, "pipeline_parallel_degree", 1, where)
    knobs = _data_parallel(par, world, pp, where) | {"pp": pp} | _pipeline(par, pp, num_layers, where)
    local = _int(tr, "local_batch_size", 8, f"{src}: [training]")
    glob = tr.get("global_batch_size", -1)
    if isinstance(glob, bool) or not isinstance(glob, int):
        raise TorchtitanConfigError(f"{src}: [training].global_batch_size must be an integer, got {glob!r}", field="training.global_batch_size")
    glob = local * knobs["dp"] if glob < 0 else glob  # torchtitan: negative = local x dp
    if glob % (local * knobs["dp"]):
        raise TorchtitanConfigError(f"{src}: [training] global_batch_size {glob} is not a multiple of "
                                    f"local_batch_size {local} x dp {knobs['dp']} (torchtitan asserts it)", field="training.global_batch_size")
    if pp > 1 and glob > local * knobs["dp"]:
        raise TorchtitanConfigError(f"{src}: [training] global_batch_size {glob} > local_batch_size x dp "
                                    f"under pp: torchtitan runs {glob // (local * knobs['dp'])} pipeline "
                                    "passes a step, which meshplan does not model (one pass of "
                                    "local_batch_size / pipeline_parallel_microbatch_size micro-batches)", field="training.global_batch_size")
    if tr.get("enable_cpu_offload"):
        raise TorchtitanConfigError(f"{src}: [training] enable_cpu_offload: FSDP CPU offload is not modelled", field="training.enable_cpu_offload")
    micro = _int(par, "pipeline_parallel_microbatch_size", 1, where) if pp > 1 else local
    if local % micro:
        raise TorchtitanConfigError(f"{where}.pipeline_parallel_microbatch_size {micro} does not "
                                    f"divide [training] local_batch_size {local}", field="parallelism.pipeline_parallel_microbatch_size")
    comp = _section(doc, "compile", src)
    compiled = bool(comp.get("enable", tr.get("compile", False)))  # [training] compile: older torchtitan
    if compiled and "model" not in (comp.get("components") or ["model", "loss"]):
        raise TorchtitanConfigError(f"{src}: [compile] components {comp.get('components')!r}: meshplan "
                                    "costs a compiled model or an eager one (components with \"model\", "
                                    "or enable = false)", field="compile.components")
    async_tp = bool(par.get("enable_async_tensor_parallel", False)) and knobs["tp"] > 1
    if async_tp and not compiled:
        raise TorchtitanConfigError(f"{where}.enable_async_tensor_parallel needs [compile] enable", field="parallelism.enable_async_tensor_parallel")
    name = _section(doc, "optimizer", src).get("name", "AdamW")
    if name not in OPTIMIZERS:
        raise TorchtitanConfigError(f"{src}: [optimizer] name {name!r}: meshplan costs {', '.join(OPTIMIZERS)}", field="optimizer.name")
    dtype = tr.get("mixed_precision_param", "bfloat16")
    if dtype not in ("bfloat16", "float32"):
        raise TorchtitanConfigError(f"{src}: [training] mixed_precision_param {dtype!r}: bfloat16 or float32", field="training.mixed_precision_param")
    return knobs | {
        "micro_batch_size": micro,
        "global_batch_size": glob,
        "recompute": _recompute(_section(doc, "activation_checkpoint", src), src),
        "dtype": dtype, "fp8": _fp8(doc, src), "optimizer": OPTIMIZERS[name],
        "framework": "fsdp2-async-tp" if async_tp else ("fsdp2" if compiled else "fsdp2-eager"),
        "seq_len": _int(tr, "seq_len", 2048, f"{src}: [training]"),
    }


__all__ = ["TorchtitanConfigError", "default_split", "expert_ep_problem", "torchtitan_knobs"]
