"""Export a plan as a torchtitan job TOML (``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, ``[optimizer]``).

Names and meanings are those of ``torchtitan/config/job_config.py`` at pytorch/torchtitan
commit 238fa9953e4aec2a62582121564273d7cbb1e9f1 (Feb 2026), the last one that reads TOML
job files: commit 9810191 ("Config System Refactor: TOML to Python Dataclass Registry")
replaced them with Python ``Trainer.Config`` functions, whose ``ParallelismConfig`` keeps
the ``[parallelism]`` names used here (``torchtitan/config/configs.py`` at b5bcd76) while
``[training]``'s batch fields became token counts. Mapping:

- dp: ZeRO 0 -> ``data_parallel_replicate_degree`` (DDP); ZeRO 3 ->
  ``data_parallel_shard_degree`` (FSDP2, parameters resharded after forward; with pp > 1
  ``fsdp_reshard_after_forward = "always"``, since torchtitan's ``default`` then keeps them
  gathered, ``models/llama3/infra/parallelize.py``); ZeRO 2 -> the
  shard degree with ``fsdp_reshard_after_forward = "never"`` (parameters kept gathered
  between forward and backward, gradients and optimizer states sharded); ZeRO 1 (only the
  optimizer states sharded) has no FSDP2 form: written as ZeRO 2, noted.
- tp: ``tensor_parallel_degree``; torchtitan's tensor parallelism always shards the norms
  along the sequence (``SequenceParallel`` in ``models/llama3/infra/parallelize.py``), so
  sequence parallelism is on whenever tp > 1 (noted where the plan says otherwise).
- pp: ``pipeline_parallel_degree`` and ``pipeline_parallel_schedule`` (torch's
  ``torch.distributed.pipelining`` names: GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble);
  model chunks per rank: torchtitan builds 1 for a single-stage schedule and 2 for a
  looped one unless ``module_fqns_per_model_part`` lists each stage's modules, which is
  written (with the llama modules ``tok_embeddings``, ``layers.<i>``, ``norm``,
  ``output``) for the plan's ``layers_per_stage`` (``meshplan export`` pins the cost
  model's split: ``meshplan.frameworks.recost.costed_plan``), else for an even split, noted.
- batch: with pp > 1 ``local_batch_size`` = global / dp sequences per step and
  ``pipeline_parallel_microbatch_size`` = the micro-batch (m = local / micro pipeline
  micro-batches); with pp = 1 ``local_batch_size`` = the micro-batch and
  ``global_batch_size`` > local x dp makes torchtitan accumulate m micro-batches.
- recompute: ``[activation_checkpoint] mode`` none / full, ``selective`` with
  ``selective_ac_option = "op"`` (op-level SAC); Megatron's selective recompute (core
  attention) has no equivalent (written as op-level, noted).
- cp: ``context_parallel_degree`` and ``context_parallel_rotate_method`` (``alltoall``
  for the ring, ``allgather``; written always, torchtitan's default being ``allgather``).
- ep: ``expert_parallel_degree`` and ``expert_tensor_parallel_degree`` (the plan's etp, 1
  or tp; :func:`_expert_parallel`).
- dtype: ``mixed_precision_param`` bfloat16 / float32 (fp32 master weights,
  ``training.dtype`` left at float32); float16 is not offered (noted).
"""

from __future__ import annotations

from typing import Any

from meshplan.frameworks.targets import Export, Note, framework_note, layout, routing_notes
from meshplan.frameworks.torchtitan.config import expert_ep_problem
from simulator.profiles import load_profile
from tuner.legality import replicated_beside_others

TORCHTITAN_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"
FAMILIES = ("fsdp2", "fsdp2-eager", "fsdp2-async-tp")
#: plan cp_comm -> ``context_parallel_rotate_method``: ``alltoall`` rotates each rank's K/V
#: shard to the next at every sub-SDPA (the ring, p2p), ``allgather`` gathers them all after
#: the first (torchtitan's default)
ROTATE_METHODS = {"p2p": "alltoall", "all_gather": "allgather"}
#: plan schedule -> torch.distributed.pipelining schedule name
SCHEDULES = {"FThenB": "GPipe", "1F1B": "1F1B", "VPP": "Interleaved1F1B", "ZBVPP": "ZBVZeroBubble"}
#: torch pipelining schedules that run one stage per rank
SINGLE_STAGE = ("GPipe", "1F1B")
#: plan recompute -> (mode, selective_ac_option or None)
RECOMPUTE = {"none": ("none", None), "full": ("full", None), "selective-op": ("selective", "op")}
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam"}
MIXED_PRECISION = {"bfloat16": "bfloat16", "float32": "float32"}


def module_fqns(layers_per_stage: tuple[int, ...]) -> list[list[str]]:
    """``module_fqns_per_model_part`` of a llama-family torchtitan model: the embedding in
    the first stage, decoder layers ``layers.<i>`` in order, the final norm and the output
    projection in the last."""
    out, first = [], 0
    for n in layers_per_stage:
        out.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "output"]
    return out


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """``layers`` over ``stages`` as evenly as possible, the earlier stages one more
    (``simulator.layer_split.even_split``)."""
    from simulator.layer_split import even_split as split

    return split(layers, stages)


def _pipeline(eff: dict[str, Any], notes: list[Note], par: dict[str, Any]) -> None:
    pp, vpp = eff["pp"], eff["vpp"]
    if pp == 1:
        if vpp > 1:
            notes.append(Note("vpp", f"without pipeline parallelism torchtitan runs one model "
                                     f"chunk; {vpp} chunks are one"))
            if eff["layers_per_stage"] is not None:
                notes.append(Note("layers_per_stage", "one stage holds all layers"))
            eff["vpp"], eff["layers_per_stage"] = 1, None
        if eff["schedule"] != "1F1B":
            notes.append(Note("schedule", f"one stage: torchtitan accumulates gradients micro-batch "
                                          f"by micro-batch (1F1B order), not {eff['schedule']}"))
            eff["schedule"] = "1F1B"
        return
    name = SCHEDULES.get(eff["schedule"])
    if name is None:
        runs = "Interleaved1F1B" if vpp > 1 else "1F1B"
        notes.append(Note("schedule", f"torch.distributed.pipelining has no {eff['schedule']} for "
                                      f"{vpp} chunk(s) per rank; {runs} is written"))
        name, eff["schedule"] = runs, ("VPP" if vpp > 1 else "1F1B")
    par["pipeline_parallel_degree"] = pp
    par["pipeline_parallel_schedule"] = name
    par["pipeline_parallel_microbatch_size"] = eff["micro_batch_size"]
    default_chunks = 1 if name in SINGLE_STAGE else 2
    lps, layers = eff["layers_per_stage"], eff["num_layers"]
    if lps is None and vpp != default_chunks:
        if layers is None:
            notes.append(Note("vpp", f"the model's layer count is unknown, so the modules of "
                                     f"{vpp} chunks per rank cannot be listed; torchtitan builds "
                                     f"{default_chunks}"))
            eff["vpp"] = default_chunks
            return
        lps = even_split(layers, pp * vpp)
        notes.append(Note("layers_per_stage", f"torchtitan needs each stage's modules for {vpp} "
                                              f"chunks per rank; an even split {list(lps)} is written"))
        eff["layers_per_stage"] = lps
    elif lps is None and layers is not None:
        # torchtitan's own split weighs the embedding and the output as layers
        # (b5bcd76 generate_llm_fqn_per_model_part): the even split costed is stated
        lps = even_split(layers, pp * vpp)
        notes.append(Note("layers_per_stage", f"torchtitan's default split counts the embedding "
                                              f"and the output as layers; the "
                                              f"{'even' if len(set(lps)) == 1 else 'near-even'} "
                                              f"split {list(lps)} is written"))
        eff["layers_per_stage"] = lps
    if lps is not None:
        par["module_fqns_per_model_part"] = module_fqns(lps)


def _data_parallel(eff: dict[str, Any], notes: list[Note], par: dict[str, Any]) -> None:
    dp, zero = eff["dp"], eff["zero"]
    if zero == 1:
        beside = (f"; meshplan models no FSDP beside expert parallelism (ep {eff['ep']}), so this "
                  "job is not re-costed" if eff["ep"] > 1 else "")
        notes.append(Note("zero", "FSDP2 has no ZeRO-1 (optimizer states only); ZeRO-2 "
                                  "(reshard_after_forward never: gradients sharded too) is written"
                                  + beside))
        zero = eff["zero"] = 2
    if zero == 0 and replicated_beside_others(dp, eff["tp"], eff["pp"], eff["cp"]):
        # torchtitan runs DDP only as the one mesh dim (parallelize: "DDP has not supported > 1D
        # parallelism"), and with cp it shards over dp_shard x cp anyway (ParallelDims
        # fsdp_enabled): FSDP2 without resharding
        notes.append(Note("zero", "torchtitan's DDP (ZeRO 0) runs only without tp, pp and cp, and "
                                  "with cp it shards over the cp ranks; ZeRO-2 (FSDP2 shards, "
                                  "reshard_after_forward never) is written"))
        zero = eff["zero"] = 2
    shard = eff["fsdp_shard_size"] or dp  # HSDP: replicate outer, shard inner
    par["data_parallel_replicate_degree"] = dp if zero == 0 else dp // shard
    par["data_parallel_shard_degree"] = 1 if zero == 0 else shard
    if zero == 2:
        par["fsdp_reshard_after_forward"] = "never"
    elif zero == 3 and shard > 1 and eff["pp"] > 1:
        # "default" keeps the parameters gathered after forward under pp (ZeRO-2): say always
        par["fsdp_reshard_after_forward"] = "always"
    par["tensor_parallel_degree"] = eff["tp"]
    if eff["cp"] > 1:  # torchtitan's context parallelism over the cp mesh dim
        par["context_parallel_degree"] = eff["cp"]
        # written always: torchtitan's default is allgather, not the ring
        par["context_parallel_rotate_method"] = ROTATE_METHODS[eff["cp_comm"]]
    if eff["ep"] > 1:
        _expert_parallel(eff, notes, par)
    if eff["sequence_parallel"] != (eff["tp"] > 1):
        notes.append(Note("sequence_parallel", "torchtitan's tensor parallelism always shards the "
                                               "norms along the sequence (sequence parallel on "
                                               "iff tp > 1)"))
        eff["sequence_parallel"] = eff["tp"] > 1


def _expert_parallel(eff: dict[str, Any], notes: list[Note], par: dict[str, Any]) -> None:
    """``expert_parallel_degree`` and ``expert_tensor_parallel_degree``: torchtitan's MoE
    experts run on the sparse mesh ``(pp, dp_replicate, efsdp, ep, etp)`` with ``efsdp =
    dp_shard x cp x tp / (etp x ep)``, etp being tp (ep drawn from dp_shard x cp) or 1 (whole
    experts, ep drawn from dp_shard x cp x tp; its default), asserted in ``ParallelDims``
    (torchtitan/distributed/parallel_dims.py lines 59 and 138 at 238fa99; the same in the
    torchtitan 0.2.2 wheel): the plan's etp (None: tp) is written as it is, so the job reads
    back as the same expert layout (``config.expert_ep_problem``). A plan whose dp replicates
    (ZeRO 0) is written with its dp as FSDP shards (ZeRO-2, the nearest that torchtitan
    runs), with a note, where ep x etp would not divide the sparse ranks otherwise; one
    that still does not fit is an ExportError."""
    from meshplan.frameworks.targets import ExportError

    ep, etp, dp, cp, tp = eff["ep"], eff["etp"], eff["dp"], eff["cp"], eff["tp"]
    why = expert_ep_problem(par["data_parallel_shard_degree"], cp, tp, ep, etp)
    if why and eff["zero"] == 0:
        shard = eff["fsdp_shard_size"] or dp
        notes.append(Note("zero", f"torchtitan's expert parallelism borrows FSDP ranks ({why}): dp "
                                  f"{dp} is written as FSDP shards of {shard} with "
                                  "reshard_after_forward never (ZeRO-2), not replicated (ZeRO 0); "
                                  "meshplan models no FSDP beside expert parallelism, so this job "
                                  "is not re-costed"))
        eff["zero"] = 2
        par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"] = dp // shard, shard
        par["fsdp_reshard_after_forward"] = "never"
        why = expert_ep_problem(shard, cp, tp, ep, etp)
    if why:
        hsdp = eff["fsdp_shard_size"]
        raise ExportError(f"torchtitan: {why} (its ParallelDims refuses it at start-up)"
                          + (f"; the plan's HSDP shard group {hsdp} is too small for ep {ep}" if hsdp else ""),
                          field="ep")
    par["expert_parallel_degree"] = ep
    par["expert_tensor_parallel_degree"] = etp


def _activation_checkpoint(eff: dict[str, Any], notes: list[Note]) -> dict[str, Any]:
    if eff["recompute"] == "selective":
        notes.append(Note("recompute", "Megatron-style selective recompute (core attention) has "
                                       "no torchtitan option; op-level selective AC is written"))
        eff["recompute"] = "selective-op"
    mode, option = RECOMPUTE[eff["recompute"]]
    return {"mode": mode} if option is None else {"mode": mode, "selective_ac_option": option}


def _training(eff: dict[str, Any], notes: list[Note]) -> dict[str, Any]:
    dp, micro, glob = eff["dp"], eff["micro_batch_size"], eff["global_batch_size"]
    tr: dict[str, Any] = {"local_batch_size": glob // dp if eff["pp"] > 1 else micro,
                          "global_batch_size": glob}
    if eff["seq_len"] is not None:
        tr["seq_len"] = eff["seq_len"]
    if eff["dtype"] not in MIXED_PRECISION:
        notes.append(Note("dtype", f"torchtitan's mixed precision offers bfloat16 or float32, "
                                   f"not {eff['dtype']}; bfloat16 is written"))
        eff["dtype"] = "bfloat16"
    tr["mixed_precision_param"] = MIXED_PRECISION[eff["dtype"]]
    return tr


def _float8(eff: dict[str, Any], notes: list[Note]) -> dict[str, Any]:
    """``[quantize.linear.float8]`` of a torchao recipe (tensorwise / rowwise;
    torchtitan 238fa99 ``Float8Linear``, converter ``quantize.linear.float8``): the output
    projection stays BF16 (``filter_fqns``), as the cost model keeps the head in BF16, and
    the FSDP all-gather stays BF16 (``enable_fsdp_float8_all_gather`` false: the cost model
    gathers BF16 weights). Transformer Engine's delayed scaling has no torchao recipe: noted,
    BF16 linears written. Empty without FP8."""
    fp8 = eff["fp8"]
    if fp8 is None:
        return {}
    if fp8 not in ("tensorwise", "rowwise"):
        notes.append(Note("fp8", f"torchtitan's float8 (torchao) has no {fp8} scaling (delayed "
                                 f"scaling is Transformer Engine's); BF16 linears are written"))
        eff["fp8"] = None
        return {}
    return {"recipe_name": fp8, "filter_fqns": ["output"], "enable_fsdp_float8_all_gather": False}


def _compile_and_async_tp(framework: str, eff: dict[str, Any], notes: list[Note],
                          par: dict[str, Any]) -> bool:
    """True when the plan's profile is costed compiled (its ``kernels.compile``: then
    ``[compile] enable``, job_config.py ``Compile`` at 238fa99). A profile that overlaps the
    forward TP collectives with the GEMMs beside them (``overlap.tp_forward``: torchtitan's
    async TP, ``fsdp2-async-tp``) also sets ``parallelism.enable_async_tensor_parallel``
    with tp > 1 (torchtitan runs it only compiled); with tp 1 there is no TP collective to
    overlap: noted, not written."""
    prof = load_profile(framework)
    if prof.overlap.tp_forward.value and framework in FAMILIES:
        if eff["tp"] > 1:
            par["enable_async_tensor_parallel"] = True
        else:
            notes.append(Note("framework", "async tensor parallel needs tp > 1; not written"))
    return bool(prof.kernels.compile.value)


def export(plan: Any) -> Export:
    """A torchtitan job TOML for ``plan`` (see the module docstring for the mapping); notes
    are ``#`` comments at the top."""
    eff = layout(plan)
    notes: list[Note] = framework_note(plan, FAMILIES, "torchtitan")
    par: dict[str, Any] = {}
    _data_parallel(eff, notes, par)
    _pipeline(eff, notes, par)
    ac = _activation_checkpoint(eff, notes)
    tr = _training(eff, notes)
    if eff["optimizer"] not in OPTIMIZERS:
        notes.append(Note("optimizer", f"torchtitan builds Adam or AdamW, not {eff['optimizer']}; "
                                       f"AdamW is written"))
        eff["optimizer"] = "adamw"
    if eff["attention"] == "unfused":
        notes.append(Note("attention", "torchtitan's llama runs fused scaled_dot_product_attention"))
        eff["attention"] = "flash"
    if plan.num_layers is not None:
        notes.append(Note("num_layers", f"torchtitan takes the layer count from the [model] "
                                        f"flavor; choose one with {plan.num_layers} layers"))
    notes += routing_notes(plan, "torchtitan", "has no expert capacity setting (its MoE routes "
                                               "every token, dropless)")
    fp8 = _float8(eff, notes)
    compiled = _compile_and_async_tp(plan.strategy.framework, eff, notes, par)
    head = [f"# torchtitan job config for {plan.model} (meshplan export; names of "
            f"torchtitan/config/job_config.py at pytorch/torchtitan {TORCHTITAN_COMMIT[:12]})",
            f"# launch: NGPU=<per node> ./run_train.sh --job.config_file <this file> on "
            f"{eff['dp'] * eff['cp'] * eff['tp'] * eff['pp']} ranks; set [model] name and flavor"]
    head += [f"# note: {n}" for n in notes]
    body = _section("training", tr) + _section("parallelism", par)
    body += _section("activation_checkpoint", ac)
    body += _section("optimizer", {"name": OPTIMIZERS[eff["optimizer"]]})
    if compiled:
        body += _section("compile", {"enable": True, "components": ["model"]})  # loss eager, as costed
    if fp8:
        body += _section("model", {"converters": ["quantize.linear.float8"]})
        body += _section("quantize.linear.float8", fp8)
    return Export("torchtitan", "\n".join(head) + "\n" + body, notes, eff)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def _section(name: str, values: dict[str, Any]) -> str:
    lines = [f"\n[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
