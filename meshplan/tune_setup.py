"""The search one ``meshplan tune`` command line runs, as a ``tuner.study.TuneConfig``
(search space, pattern templates of the model, scorer settings): :func:`tune_config`, the
one builder that ``meshplan tune``, ``meshplan demo`` and the search-quality experiment
share, so that what they search cannot drift apart. Library code (no CLI import); errors
are :class:`meshplan.errors.MeshplanError` (or the tuner's SpaceError) naming the option.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import MeshplanError


def _either(names: Any) -> str:
    """``a, b or c``: the choices of a message."""
    *first, last = list(names)
    return f"{', '.join(first)} or {last}" if first else last


#: the fewest tokens a context-parallel rank keeps in a default search: the Llama 3 report
#: (Dubey et al. 2024, Table 4) trains 8,192-token sequences without cp and 131,072-token
#: ones with cp 16, 8,192 tokens per cp rank; ``--search-cp`` searches every degree
CP_MIN_TOKENS = 8192
#: the interleaving degrees (model chunks per pipeline rank) a default search tries: 2 to 8,
#: the range of the published recipes (NeMo's Llama 3 70B: pp 4 x vpp 5; Narayanan et al.
#: 2021, Figure 13: 2 to 8 chunks); the legality rules keep at least one layer per chunk
VPP_DEGREES = tuple(range(2, 9))


def tune_config(model: str, cluster: str, nodes: int | None, global_batch: int,
                seq_len: int | None, mode: str, seed: int, pareto: bool,
                fix: str | dict[str, Any] | None,
                sampler: str | None, layers: int | None, cross_node_tp: bool,
                dtype: str = "bfloat16", framework: str = "megatron-core",
                attention: str | None = None,
                memory_headroom: float | None = None, hsdp: bool = False,
                fp8: bool | None = None, layer_split: str | None = None,
                all_schedules: bool = False, search_cp: bool | None = None,
                cp_comm: str = "p2p", objective: dict[str, Any] | None = None) -> Any:
    """The ``tuner.study.TuneConfig`` of one ``meshplan tune`` command line (search space,
    pattern templates of the model, scorer settings); ``fix``: the ``--fix`` text or the
    pinned knobs already parsed (``meshplan.commands.tune._pins``).

    The space is the framework's (issue 36): every knob ``framework`` runs is a dimension
    -- tp, pp, vpp (:data:`VPP_DEGREES`), dp, cp, ep (a mixture-of-experts model),
    micro-batch, recompute (the modes its profile's ``memory.recompute`` lists), ZeRO /
    FSDP stage (``memory.zero_stages``, ``pipeline.zero_stages``), sequence parallelism, FP8
    recipe, schedule (``pipeline.schedules``; every one the tuner knows with
    ``all_schedules``) and the pipeline layer split (the cost model's balanced split, which
    frameworks run as an explicit layout: pp need not divide the layers; ``layer_split``
    ``even``: Megatron-LM's default split, pp dividing them).

    ``search_cp``: context parallelism (:func:`cp_degrees`): None (the default) searches
    the degrees that keep at least :data:`CP_MIN_TOKENS` tokens per cp rank where the
    framework runs cp (its profile's ``kernels.cp_comms``) and cp is not pinned, True every
    degree ``meshplan.tuning.search_cp_degrees`` gives (refused where the framework runs
    none), False none; ``cp_comm``: the K/V exchange of every plan with cp > 1
    (:func:`check_cp`). ``fp8``: also the FP8 recipes ``framework`` runs
    (``completion.strategy.FP8_RECIPES``) beside BF16, refused with a message naming the
    device or framework where there is none; off by default (None, False): FP8 changes the
    numerics, a choice the user makes (``--search-fp8``, ``--dtype``, ``--fix fp8``). ``hsdp``: also search HSDP shard groups with ZeRO-3
    (``tuner.space.SearchSpace.hsdp``). ``objective``: an ``ObjectiveSettings`` dict the
    scorer minimises (``meshplan.objective_scoring``; None or ``time``: the step time).
    Raises ValueError (SpaceError, ModelConfigError,
    ClusterError, MeshplanError) naming the bad option. ``memory_headroom`` None: the
    default, ``clusters.spec.DEFAULT_MEMORY_HEADROOM`` (imported here: ``meshplan --help``
    imports this module's callers and must not pull in pydantic)."""
    from dataclasses import replace

    from clusters.spec import DEFAULT_MEMORY_HEADROOM
    from completion.strategy import CP_COMM_ALIASES
    from meshplan.tuning import (
        SCORER_FACTORY,
        framework_schedules,
        framework_sequence_parallel,
        search_problem,
        template_kinds,
    )
    from tuner.space import SearchSpace, parse_fix
    from tuner.study import TuneConfig

    if memory_headroom is None:
        memory_headroom = DEFAULT_MEMORY_HEADROOM
    prob = search_problem(model, cluster, nodes, global_batch, seq_len, cross_node_tp, layers)
    # the balanced split is an explicit layout (Megatron --pipeline-model-parallel-layout,
    # torchtitan's per-stage modules): any pp up to the layers; the even one needs pp | layers
    prob = replace(prob, uneven_pp=layer_split != "even")
    fixed = fix if isinstance(fix, dict) else parse_fix(fix)
    zeros, pp_zeros, ddp_alone = check_zero(framework, fixed)
    if pp_zeros is not None or ddp_alone:
        prob = replace(prob, pp_zero_stages=pp_zeros, ddp_alone=ddp_alone)
    if framework_sequence_parallel(framework) == "always":  # torchtitan: tp > 1 shards the sequence
        prob = replace(prob, sp_always=True)
    sc = {"model": model, "cluster": cluster, "nodes": nodes, "global_batch_size": global_batch,
          "seq_len": prob.seq_len, "dtype": dtype, "num_layers": layers,
          "framework": framework, "attention": attention, "memory_headroom": memory_headroom}
    if layer_split == "even":  # absent otherwise: a balanced search resumes as before
        sc["layer_split"] = "even"
    cp_comm = CP_COMM_ALIASES.get(cp_comm, cp_comm)  # Megatron-LM's allgather
    cps = cp_degrees(framework, fixed.get("cp"), search_cp, cp_comm, prob.world_size, prob.seq_len)
    if cp_comm != "p2p":  # absent otherwise: a study stored before the option resumes
        sc["cp_comm"] = cp_comm
    if objective and objective.get("name", "time") != "time":  # likewise (meshplan.objective_scoring)
        sc["objective"] = dict(objective)
    check_fp8_pin(cluster, nodes, fixed.get("fp8"), dtype, framework)
    recipes = fp8_choices(cluster, nodes, framework, dtype, fp8, fixed.get("fp8"))
    if hsdp and fixed.get("zero", 3) != 3:
        raise MeshplanError(f"--search-hsdp searches HSDP shard groups of ZeRO-3 plans, but ZeRO is "
                            f"pinned to stage {fixed['zero']}; pin --zero 3 or drop --search-hsdp")
    space = SearchSpace(prob, fix=fixed, hsdp=hsdp, fp8_recipes=recipes, cp_degrees=cps,
                        schedules=framework_schedules(framework, all_schedules),
                        recompute=framework_recompute(framework), vpp_degrees=VPP_DEGREES,
                        **({"zero_stages": zeros} if zeros is not None else {}))
    return TuneConfig(space, mode=mode,
                      template_kinds=template_kinds(model, prob.seq_len), sampler=sampler,
                      seed=seed, pareto=pareto, scorer_factory=SCORER_FACTORY, scorer_config=sc)


def framework_recompute(framework: str) -> tuple[str, ...]:
    """The recompute modes a search under ``framework`` tries: its profile's
    ``memory.recompute`` (every one of ``tuner.space.RECOMPUTE`` when it does not say)."""
    from simulator.profiles import load_profile
    from tuner.space import RECOMPUTE

    runs = load_profile(framework).memory.recompute
    return RECOMPUTE if runs is None else tuple(runs.value)


def cp_degrees(framework: str, pinned: Any, search: bool | None, cp_comm: str, world: int,
               seq_len: int) -> tuple[int, ...]:
    """The context-parallel degrees of a search (:func:`tune_config`'s ``search_cp``),
    after :func:`check_cp`: a pinned cp is the space's pin (``(1,)`` here); where the
    framework runs cp, every degree ``meshplan.tuning.search_cp_degrees`` gives
    (``search`` True) or, by default (None), those that keep at least
    :data:`CP_MIN_TOKENS` tokens per cp rank; none with ``search`` False."""
    from meshplan.tuning import framework_cp_comms, search_cp_degrees

    check_cp(framework, pinned, bool(search), cp_comm, search is None and seq_len >= 2 * CP_MIN_TOKENS)
    if search is False or pinned is not None or not framework_cp_comms(framework):
        return (1,)
    every = search_cp_degrees(world, seq_len)
    return every if search else tuple(c for c in every if c == 1 or seq_len // c >= CP_MIN_TOKENS)


def fp8_choices(cluster: str, nodes: int | None, framework: str, dtype: str, search: bool | None,
                pinned: Any) -> tuple[str | None, ...]:
    """The FP8 recipes of a search (:func:`tune_config`'s ``fp8``): :func:`fp8_recipes` when
    asked (True); else none (a pinned recipe is the space's pin): FP8 changes the
    numerics, so a search tries it only when asked."""
    del pinned  # the space's fix pins it
    return fp8_recipes(cluster, nodes, framework, dtype) if search else (None,)


def check_zero(framework: str, fixed: dict[str, Any]) -> tuple[tuple[int, ...] | None,
                                                             tuple[int, ...] | None, bool]:
    """The ZeRO stages ``framework`` offers (its profile's ``memory.zero_stages``: FSDP has
    no ZeRO-1), those it runs beside pipeline parallelism (``pipeline.zero_stages``:
    DeepSpeed's 0 and 1; None: every one), and whether it runs ZeRO 0 only as the one
    parallel dimension (``memory.ddp_alone``: torchtitan). Raises MeshplanError naming the
    pins when the pinned ZeRO stage (with the pinned pp, dp, tp, cp) is not run."""
    from meshplan.tuning import zero_not_run
    from simulator.profiles import load_profile

    prof = load_profile(framework)
    zeros = None if prof.memory.zero_stages is None else tuple(prof.memory.zero_stages.value)
    pp_zeros = None if prof.pipeline.zero_stages is None else tuple(prof.pipeline.zero_stages.value)
    zero = fixed.get("zero")
    dims = {k: fixed.get(k, 1) for k in ("pp", "dp", "tp")}  # cp at ZeRO 0 is searched (zero0_alone)
    why = None if zero is None else zero_not_run(prof, zero, **dims)
    if why is not None:
        pins = [f"--zero {zero}"]
        if zeros is None or zero in zeros:  # offered: a rule on the pinned degrees refused it
            pins[:0] = [f"--{k} {v}" for k, v in dims.items() if k in fixed and v > 1]
        raise MeshplanError(f"{' and '.join(pins)}: framework {framework} {why}")
    ddp_alone = prof.memory.ddp_alone is not None and prof.memory.ddp_alone.value
    return zeros, pp_zeros, ddp_alone


def check_cp(framework: str, pinned: Any, search: bool, cp_comm: str, default: bool = False) -> None:
    """The context parallelism of a search: ``--search-cp`` beside a pinned cp, or under a
    framework that runs none (its profile's ``kernels.cp_comms`` empty), and a ``--cp-comm``
    other than p2p when no plan can have cp > 1 (cp neither searched nor pinned above 1) or
    that the framework does not run, raise MeshplanError naming the option. ``default``:
    cp is searched by default (``--search-cp`` not given), wherever the framework runs it."""
    from meshplan.tuning import framework_cp_comms

    runs = framework_cp_comms(framework)
    search = search or (default and pinned is None and bool(runs))
    if search and pinned is not None:
        raise MeshplanError(f"--search-cp searches the context-parallel degree, but cp is pinned to "
                            f"{pinned}; drop one of them")
    if search and not runs:
        raise MeshplanError(f"--search-cp: framework {framework} runs no context parallelism (its "
                            "profile's kernels.cp_comms is empty); choose a --framework that does "
                            "(megatron-core, fsdp2, ...)")
    if cp_comm == "p2p":
        return
    if not search and (pinned or 1) == 1:
        raise MeshplanError(f"--cp-comm {cp_comm} sets the K/V exchange of context-parallel plans, "
                            "but no plan has cp > 1: add --search-cp or pin --cp N (N > 1)")
    if runs and cp_comm not in runs:  # none at all: the pinned cp's note says it (as for p2p)
        raise MeshplanError(f"--cp-comm {cp_comm}: framework {framework} runs {_either(runs)}")


def check_fp8_pin(cluster: str, nodes: int | None, pinned: Any, dtype: str,
                   framework: str = "megatron-core") -> None:
    """An FP8 recipe pinned with ``--fix fp8=NAME`` or an FP8 ``--dtype`` needs a framework
    that runs it (``completion.strategy.FP8_RECIPES``) and a device with an FP8 peak: refused
    before the search starts (every plan would be refused by the engine,
    ``meshplan.engine``), naming the framework or the device, as ``cost`` does."""
    from clusters import load_cluster
    from completion.strategy import FP8_DTYPES, FP8_RECIPES

    if dtype in FP8_DTYPES and pinned is not None and pinned != FP8_DTYPES[dtype]:
        raise MeshplanError(f"--dtype {dtype} runs the {FP8_DTYPES[dtype]} recipe but --fix fp8={pinned} "
                            "pins another; give one of them")
    recipe = FP8_DTYPES.get(dtype) or (pinned if pinned not in (None, "none") else None)
    if recipe is None:
        return
    how = f"--dtype {dtype}" if dtype in FP8_DTYPES else f"--fix fp8={recipe}"
    runs = FP8_RECIPES.get(recipe, ())
    if runs and framework not in runs:
        raise MeshplanError(f"{how} runs under --framework {_either(runs)}, not {framework}: "
                            f"give one of them")
    dev = load_cluster(cluster, nodes).spec.device
    if "fp8" not in dev.peak_flops:
        raise MeshplanError(f"{how}: FP8 training needs FP8 tensor cores, and {cluster}'s device "
                            f"{dev.name} lists no fp8 peak_flops (A100 has none; H100 / H200: "
                            f"1979 TFLOP/s dense)")


def fp8_recipes(cluster: str, nodes: int | None, framework: str, dtype: str) -> tuple[str | None, ...]:
    """``--search-fp8``: BF16 (None) and every FP8 recipe ``framework`` runs. Raises
    MeshplanError naming the device when its ``peak_flops`` lists no ``fp8`` (A100), the
    framework when it runs none, or the FP8 ``--dtype`` that already fixes one."""
    from clusters import load_cluster
    from completion.strategy import FP8_DTYPES, FP8_RECIPES

    if dtype in FP8_DTYPES:
        raise MeshplanError(f"--search-fp8 searches the FP8 recipe; --dtype {dtype} already fixes "
                            f"one (give --dtype bfloat16, or drop --search-fp8)")
    dev = load_cluster(cluster, nodes).spec.device
    if "fp8" not in dev.peak_flops:
        raise MeshplanError(f"--search-fp8: {cluster}'s device {dev.name} has no FP8 peak "
                            f"(peak_flops lists {', '.join(sorted(dev.peak_flops))}): no FP8 to search")
    runs = tuple(r for r, fws in FP8_RECIPES.items() if framework in fws)
    if not runs:
        raise MeshplanError(f"--search-fp8: framework {framework} runs no FP8 recipe (recipes and "
                            f"their frameworks: {dict(FP8_RECIPES)})")
    return (None, *runs)


__all__ = ["CP_MIN_TOKENS", "VPP_DEGREES", "check_fp8_pin", "cp_degrees", "fp8_choices", "fp8_recipes", "framework_recompute", "tune_config"]
