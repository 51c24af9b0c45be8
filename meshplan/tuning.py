"""The bridge between the tuner and the cost model: candidates -> Strategy -> Engine.

The tuner does not import meshplan (docs/design.md dependency direction); it receives a scorer
built here by :func:`make_scorer` (named in the study as ``"meshplan.tuning:make_scorer"``
so workers in other processes and on other machines rebuild the same one).

Annotations: a candidate's pattern templates become a placements mapping over the
representative program's values (``tuner.patterns.apply_templates``); the template set
equal to Megatron's layout (with or without the sequence-parallel norm) is passed as the
Strategy's ``"megatron"`` annotation, which also realises sequence parallelism
(``completion.shard_megatron``). full_random draws one random dims_mapping per parameter
of a one-layer program; the plan pipeline repeats layer 0's layouts on every layer
(``completion.plan_program.expand_layer_annotations``), so every layer shares the draw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusters import load_cluster
from clusters.goodput_spec import goodput_sections
from clusters.spec import DEFAULT_MEMORY_HEADROOM
from completion.models import get_model_config
from meshplan.bounds.layout import SharedLayoutBound
from meshplan.engine import Engine
from meshplan.errors import MeshplanError
from meshplan.objective_scoring import ObjectiveBound, objective_of, objective_score
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.templates import template_program
from simulator.layer_split import SPLITS, even_split
from tuner.exhaustive import Bound
from tuner.patterns import apply_templates, random_annotation, template_choices
from tuner.space import Candidate, ModelDims, SearchProblem
from tuner.study import Score
from tuner.suggest import MEGATRON_BASE, PATTERN, RANDOM

SCORER_FACTORY = "meshplan.tuning:make_scorer"


def template_kinds(model: str, seq_len: int) -> dict[str, tuple[str, ...]]:
    """Pattern kind -> template names for the model (a tied head has one)."""
    _, pats = template_program(model, seq_len)
    kinds = {p.kind for p in pats}
    return {k: tuple(template_choices(k, pats)) for k in sorted(kinds)}


def search_problem(model: str, cluster: str, nodes: int | None, global_batch_size: int,
                   seq_len: int | None, allow_cross_node_tp: bool = False,
                   num_layers: int | None = None) -> SearchProblem:
    """The SearchProblem of a model on ``nodes`` nodes of a catalog cluster."""
    cfg = get_model_config(model)
    if num_layers is not None:
        cfg = cfg.replace(num_layers=num_layers)
    cl = load_cluster(cluster, nodes)
    return SearchProblem(ModelDims.of(cfg), cl.world_size, cl.devices_per_node,
                         global_batch_size, cfg.seq_len if seq_len is None else seq_len,
                         allow_cross_node_tp)


def annotation_of(c: Candidate, model: str, seq_len: int,
                  user: Any = "megatron") -> str | dict[str, list[str]]:
    """The Strategy annotation of a candidate ("megatron", or a placements mapping)."""
    if c.tp == 1:
        return "megatron"  # nothing is sharded inside a rank; the engine skips completion
    if c.annotation == "templates":
        t = c.template_dict()
        if all(t.get(k, v) in (v, "tied") for k, v in MEGATRON_BASE.items()):
            return "megatron"
        prog, pats = template_program(model, seq_len)
        return apply_templates(prog, pats, t)
    if c.annotation == "random":
        prog, _ = template_program(model, seq_len)
        return random_annotation(prog, c.tp, int(c.annotation_seed or 0))
    return user


def to_strategy(c: Candidate, global_batch_size: int, model: str, seq_len: int,
                dtype: str = "bfloat16", user_annotation: Any = "megatron",
                framework: str = "megatron-core", attention: str | None = None,
                cp_comm: str = "p2p") -> Strategy:
    """The meshplan Strategy of a candidate, run by ``framework`` (a profile of
    ``simulator.profiles``) with ``attention`` (None: the model's own); ``cp_comm`` is the
    context-parallel K/V exchange (``completion.strategy.CP_COMMS``) of a candidate with
    cp > 1 (one with cp 1 exchanges nothing: p2p)."""
    return Strategy(dp=c.dp, tp=c.tp, pp=c.pp, cp=c.cp, vpp=c.vpp, schedule=c.schedule,
                    cp_comm=cp_comm if c.cp > 1 else "p2p",
                    micro_batch_size=c.micro_batch_size, global_batch_size=global_batch_size,
                    recompute=c.recompute, zero=c.zero, fsdp_shard_size=c.fsdp_shard_size,
                    sequence_parallel=c.sequence_parallel, dtype=dtype, ep=c.ep, etp=c.etp,
                    annotation=annotation_of(c, model, seq_len, user_annotation),
                    framework=framework, attention=attention,
                    **({"fp8": c.fp8} if c.fp8 is not None else {}))


def _software(config: Mapping[str, Any]) -> dict[str, Any]:
    """The framework, attention and context-parallel exchange of a scorer config (defaults:
    megatron-core, the model's own attention, p2p)."""
    return {"framework": config.get("framework") or "megatron-core",
            "attention": config.get("attention"), "cp_comm": config.get("cp_comm") or "p2p"}


#: the scorer config's ``layer_split`` values (``simulator.layer_split.SPLITS``)
LAYER_SPLITS = SPLITS


def with_layer_split(s: Strategy, config: Mapping[str, Any], num_layers: Any) -> Strategy:
    """``s`` with the split of ``config["layer_split"]``: ``balanced`` or absent leaves it
    to the cost model; ``even`` is ``num_layers() / (pp * vpp)`` layers on every virtual
    stage (Megatron-LM's and torchtitan's default split), nothing for one stage.
    ``num_layers``: a callable giving the model's decoder layers. Raises ValueError for
    another value, or for layers that do not divide (a search with uneven pp
    requested: that trial is refused, with this reason)."""
    split = config.get("layer_split") or "balanced"
    if split not in LAYER_SPLITS:
        raise MeshplanError(f"scorer config 'layer_split' must be one of {LAYER_SPLITS}, got {split!r}")
    stages = s.pp * s.vpp
    if split == "balanced" or stages == 1:
        return s
    n = int(num_layers())
    if n % stages:
        raise MeshplanError(f"an even layer split needs the {n} layers to divide over pp * vpp = "
                         f"{s.pp} * {s.vpp} = {stages} virtual stages")
    return s.replace(layers_per_stage=even_split(n, stages))


def _layers_of(config: Mapping[str, Any]) -> Any:
    """A callable giving the decoder layers the scorer config's model has (its
    ``num_layers`` override first), resolved once, on the first call."""
    from functools import cache

    from completion.models.source import resolve_model

    @cache
    def layers() -> int:
        n = config.get("num_layers")
        return int(n) if n is not None else int(resolve_model(config["model"], int(config["seq_len"])).num_layers)
    return layers


def to_plan(c: Candidate, config: Mapping[str, Any]) -> Plan:
    """The reproducible Plan (plan.json) of a candidate under a scorer config (its
    ``layer_split`` pinned in the strategy when even, :func:`with_layer_split`)."""
    s = to_strategy(c, config["global_batch_size"], config["model"], config["seq_len"],
                    config.get("dtype", "bfloat16"), config.get("annotation", "megatron"),
                    **_software(config))
    s = with_layer_split(s, config, _layers_of(config))
    ann = s.annotation if isinstance(s.annotation, dict) else {}
    if ann:
        s = s.replace(annotation="none")
    return Plan(model=config["model"], cluster=config["cluster"], strategy=s,
                nodes=config.get("nodes"), seq_len=config["seq_len"], annotations=ann,
                num_layers=config.get("num_layers"))


class _LazyTier0:
    """``meshplan.bounds.tier0.Tier0Bound(config)``, built on its first call (a scorer that never
    runs an exhaustive search never builds it)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config, self.bound = config, None

    def __call__(self, c: Candidate) -> Bound:
        if self.bound is None:
            from meshplan.bounds.tier0 import Tier0Bound

            try:
                self.bound = Tier0Bound(self.config)
            except ValueError:  # the engine refuses the model's one-rank plan: no cheap bound
                self.bound = lambda _c: Bound(0.0, 0, 1 << 62)
        return self.bound(c)


def make_scorer(config: Mapping[str, Any]):
    """A scorer ``candidate -> Score`` running ``Engine.simulate()``.

    ``config``: model, cluster, nodes, global_batch_size, seq_len, dtype, annotation (the
    user's, semi-auto), num_layers (optional override, small test spaces), framework and
    attention (optional; the Strategy fields), cp_comm (optional, default p2p: the K/V
    exchange of the candidates with cp > 1), memory_headroom (optional fraction of usable
    memory a plan leaves free, default ``clusters.spec.DEFAULT_MEMORY_HEADROOM``): the
    score's memory limit is ``device.memory_limit(memory_headroom)``; layer_split (optional,
    :func:`with_layer_split`: each candidate costed with that pipeline split); objective
    (optional, ``meshplan.objective_scoring``: the score's ``time_s`` is then that objective
    in seconds per step, and the bounds are its lower bounds)."""
    cl = load_cluster(config["cluster"], config.get("nodes"))
    model, num_layers = config["model"], config.get("num_layers")
    name, seq, gb = config["model"], int(config["seq_len"]), int(config["global_batch_size"])
    # a plan fits when its peak + headroom is within the usable memory (capacity less the
    # driver's reserve): clusters.spec.DeviceSpec.memory_limit
    cap = int(cl.device.memory_limit(config.get("memory_headroom", DEFAULT_MEMORY_HEADROOM)))
    dtype = config.get("dtype", "bfloat16")

    # the objective (meshplan.objective_scoring; "time" unless the config names another)
    goal = objective_of(config)
    sections = None if goal.name == "time" else goodput_sections(cl)

    def score(c: Candidate) -> Score:
        s = strategy_of(c)
        eng = Engine(model, cl, s, seq_len=seq, num_layers=num_layers)
        if sections is None:
            r, value, extra = eng.simulate(), None, {}
        else:
            value, r, extra = objective_score(goal, eng, sections)
        return Score(r.step_time if value is None else value, r.max_memory_bytes, cap,
                     {"tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
                      "tflops_per_gpu": r.tflops_per_gpu, "bubble_ratio": r.sim.bubble_ratio, **extra})

    layers_of = _layers_of(config)

    def strategy_of(c: Candidate) -> Any:
        s = to_strategy(c, gb, name, seq, dtype, config.get("annotation", "megatron"),
                        **_software(config))
        return with_layer_split(s, config, layers_of)

    # what ``--sampler exhaustive`` prunes with (tuner.exhaustive): ``Engine.lower_bound``,
    # one costed program per layout shared by its dp degrees and recompute modes
    score.bound = SharedLayoutBound(config, strategy_of, cl, cap)
    score.cheap_bound = _LazyTier0(config)  # and first, with no completion (meshplan.bounds.tier0)
    if sections is not None:  # the objective's bounds, from the step-time ones
        gpn = cl.devices_per_node
        score.bound = ObjectiveBound(score.bound, goal, sections, gb * seq, gpn)
        score.cheap_bound = ObjectiveBound(score.cheap_bound, goal, sections, gb * seq, gpn)

    return score


def runs_schedule(runs: tuple[str, ...], schedule: str) -> bool:
    """Whether a framework whose profile lists ``runs`` (``pipeline.schedules``) runs
    ``schedule`` (a ``completion.strategy.SCHEDULES`` name): ``ZB`` and ``ZB-2p`` are one
    schedule (the tuner's ``ZB`` is ZB-2p, ``Strategy.registered_schedule``)."""
    same = {"ZB": "ZB-2p"}
    return same.get(schedule, schedule) in {same.get(r, r) for r in runs}


def framework_schedules(framework: str, every: bool = False) -> tuple[str, ...]:
    """The pipeline schedules a search under ``framework`` tries: the tuner's
    (``tuner.space.SCHEDULES``) that the framework runs (its profile's
    ``pipeline.schedules``, :func:`runs_schedule`; a profile without the field runs every
    one), or all of the tuner's with ``every`` (``--all-schedules``)."""
    from simulator.profiles import load_profile
    from tuner.space import SCHEDULES

    runs = load_profile(framework).pipeline.schedules
    if every or runs is None:
        return SCHEDULES
    return tuple(s for s in SCHEDULES if runs_schedule(runs.value, s))


def framework_cp_comms(framework: str) -> tuple[str, ...]:
    """The context-parallel K/V exchanges ``framework`` runs (its profile's
    ``kernels.cp_comms``; every one of ``completion.strategy.CP_COMMS`` when the profile
    does not say); empty: the framework has no context parallelism."""
    from completion.strategy import CP_COMMS
    from simulator.profiles import load_profile

    runs = load_profile(framework).kernels.cp_comms
    return CP_COMMS if runs is None else runs.value


def framework_sequence_parallel(framework: str) -> str:
    """Whether ``framework`` runs tensor parallelism without sequence parallelism: its
    profile's ``kernels.sequence_parallel`` (``optional`` when it does not say, ``always``:
    torchtitan)."""
    from simulator.profiles import load_profile

    sp = load_profile(framework).kernels.sequence_parallel
    return "optional" if sp is None else sp.value


def zero_not_run(profile: Any, zero: int, pp: int, *, dp: int = 1, tp: int = 1, cp: int = 1
                 ) -> str | None:
    """Why a framework ``profile`` cannot run ZeRO stage ``zero`` on ``pp`` pipeline stages
    (beside ``dp``, ``tp``, ``cp``), as a phrase (``offers ZeRO 0, 2, 3, not ZeRO-1``:
    ``memory.zero_stages``, FSDP has no ZeRO-1; ``runs ZeRO 0, 1 beside pipeline
    parallelism, not ZeRO-2``: ``pipeline.zero_stages``, DeepSpeed's PipelineEngine;
    ``runs ZeRO 0 (DDP) only as the one parallel dimension``: ``memory.ddp_alone``,
    torchtitan: replicated dp > 1 beside tp or pp, or any cp > 1, is not DDP there); None
    when it can."""
    offers = profile.memory.zero_stages
    if offers is not None and zero not in offers.value:
        return f"offers ZeRO {', '.join(map(str, offers.value))}, not ZeRO-{zero}"
    if zero == 0 and ddp_beside_others(profile, dp, tp, pp, cp):
        if dp == 1:  # no replication: only cp, which the framework shards over
            return f"shards over the cp ranks (FSDP) where cp > 1, not ZeRO 0 with cp {cp}"
        beside = ", ".join(f"{k} {v}" for k, v in (("tp", tp), ("pp", pp), ("cp", cp)) if v > 1)
        return (f"runs ZeRO 0 (DDP) only as the one parallel dimension (with cp it shards over "
                f"the cp ranks), not beside {beside}")
    runs = profile.pipeline.zero_stages
    if pp > 1 and runs is not None and zero not in runs.value:
        return (f"runs ZeRO {', '.join(map(str, runs.value))} beside pipeline parallelism, "
                f"not ZeRO-{zero}")
    return None


def ddp_beside_others(profile: Any, dp: int, tp: int, pp: int, cp: int) -> bool:
    """Whether ``profile`` says ZeRO 0 runs only as the one parallel dimension
    (``memory.ddp_alone``) and a ZeRO-0 plan of these degrees is not that: dp > 1 beside
    tp > 1 or pp > 1, or cp > 1 (torchtitan then shards over the cp ranks)."""
    from tuner.legality import replicated_beside_others

    fact = profile.memory.ddp_alone
    return fact is not None and fact.value and replicated_beside_others(dp, tp, pp, cp)


def search_cp_degrees(world_size: int, seq_len: int) -> tuple[int, ...]:
    """The context-parallel degrees ``meshplan tune --search-cp`` tries: 1 and every divisor
    c > 1 of the world size with 2c dividing the sequence (the load-balanced causal split,
    ``tuner.legality.cp_load_balance``), increasing."""
    return tuple(c for c in range(1, world_size + 1)
                 if world_size % c == 0 and (c == 1 or seq_len % (2 * c) == 0))


__all__ = ["LAYER_SPLITS", "ddp_beside_others", "framework_cp_comms", "framework_sequence_parallel", "search_cp_degrees", "zero_not_run", "PATTERN", "RANDOM", "SCORER_FACTORY", "with_layer_split", "annotation_of", "make_scorer",
           "framework_schedules", "runs_schedule", "search_problem", "template_kinds", "to_plan", "to_strategy"]
