"""``Engine(model, cluster, strategy)``: the cost of one plan, composed from the parts that
compute it.

Mirrors Paddle auto-parallel's ``Engine`` (``engine.cost(mode="train") -> (time_ms,
max_memory_bytes)``). The engine only composes: the model is resolved by
``completion.models.source``, the program is built by the one plan pipeline
(``completion.plan_program.build_plan_program``, the function the executor uses too), and
the step is costed and simulated by ``simulator.StepModel.from_program``. For costing the
pipeline builds the representative program (two decoder layers: the first standing for
every layer but the last, on pipeline stage 0's mesh: stages run the same [dp, tp] layout
shifted by stage * dp * tp ranks); :meth:`Engine.plan_program` builds the whole program
the executor runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from clusters import Cluster, load_cluster
from completion import Program
from completion.context_parallel import fold_strategy
from completion.models.source import ModelSource, resolve_model
from completion.plan_program import (
    PlanProgram,
    build_plan_program,
    check_plan,
    expert_group_strategy,
    plan_strategy,
    resolve_attention,
)
from completion.strategy import Strategy
from meshplan.errors import MeshplanError
from simulator.profiles import load_profile
from simulator.program_costs import (
    ByIdentity,
    CostCache,
    ProgramCosts,
    ProgramTables,
    costing_strategy,
)
from simulator.roofline import Roofline
from simulator.stage_cost import StageCoster
from simulator.step import StepConfig, StepModel, StepResult

#: block costs of representative programs, shared by every Engine of this process
COSTS: CostCache[ProgramCosts] = CostCache()
#: the representative program of a costing strategy with recompute ``none`` and its rank-0
#: block costs, shared by the recompute modes of one layout (:meth:`Engine.program_costs`);
#: programs are large, so fewer are kept than costs
PROGRAMS: CostCache[tuple[PlanProgram, dict[Any, Any], ProgramTables]] = CostCache(maxsize=128)


class EngineError(MeshplanError):
    """A strategy that does not fit the cluster or the engine's options; names the field."""


class Engine:
    """Cost model facade for one (model, cluster, strategy).

    Args:
        model: built-in name, config.json path, PIR program path, Program or torch module.
        cluster: catalog name, YAML path or ``clusters.Cluster``; nodes: node count.
        strategy: a :class:`completion.strategy.Strategy` (default: everything 1).
        seq_len: tokens per sequence (default: the model's).
        overlap: fraction of in-stage collective time hidden behind compute (default 0).
        overlap_dp_sync: hide the gradient sync behind the last backward where possible.
        layers_per_stage: explicit layers per virtual stage (e.g. [1, 2, 2, 3]); the same
            as the strategy's ``layers_per_stage``.
        example_inputs: for a torch module.
        num_layers: the number of decoder layers to cost. For a model given by name or
            config it overrides the config's layer count (a smaller model of the same
            shape, e.g. a 4-layer llama2-7b for small search spaces); for a given program
            whose decoder layers are identical, the number of layers the model really has:
            its first layer stands for all of them.
        gemm_efficiency: overrides the cluster spec's ``device.efficiency.gemm`` (used when
            fitting that constant, e.g. on Megatron 2021 Table 1).

    Raises:
        EngineError: dp * cp * tp * pp exceeds the cluster, or an option is out of range.
        PlanProgramError: (``completion.plan_program``) a plan the model cannot take.
    """

    def __init__(self, model: Any, cluster: Any, strategy: Strategy | None = None, *,
                 nodes: int | None = None, seq_len: int | None = None, overlap: float = 0.0,
                 overlap_dp_sync: bool = False, layers_per_stage: list[int] | None = None,
                 example_inputs: Any = None, num_layers: int | None = None,
                 gemm_efficiency: float | None = None) -> None:
        if strategy is not None and not isinstance(strategy, Strategy):
            raise EngineError(f"strategy must be a meshplan.Strategy (Strategy.from_dict makes one "
                              f"from a mapping), got {type(strategy).__name__}")
        for name, v in (("overlap", overlap), ("gemm_efficiency", gemm_efficiency)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise EngineError(f"{name} must be a number, got {v!r}")
        if overlap is None:
            raise EngineError("overlap must be a number in [0, 1], got None")
        s = strategy or Strategy()
        if layers_per_stage is not None:
            s = s.replace(layers_per_stage=tuple(layers_per_stage))
        self.strategy = s
        self.cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster, nodes)
        if s.world_size > self.cluster.world_size:
            raise EngineError(f"strategy dp*cp*tp*pp = {s.dp}*{s.cp}*{s.tp}*{s.pp} = {s.world_size} ranks "
                              f"exceeds cluster {self.cluster.name!r} with {self.cluster.world_size} "
                              f"({self.cluster.num_nodes} node(s) of {self.cluster.devices_per_node}): "
                              f"give more nodes (--nodes) or smaller degrees")
        if s.fp8 is not None and "fp8" not in self.cluster.device.peak_flops:
            dev = self.cluster.device.name
            raise EngineError(f"FP8 training (fp8 {s.fp8!r}) needs FP8 tensor cores: device {dev!r} "
                              f"of cluster {self.cluster.name!r} lists no fp8 peak_flops (A100 has "
                              f"none; H100 / H200: 1979 TFLOP/s dense)")
        if not 0.0 <= overlap <= 1.0:
            raise EngineError(f"overlap must be in [0, 1], got {overlap}")
        if gemm_efficiency is not None and not 0.0 < gemm_efficiency <= 1.0:
            raise EngineError(f"gemm_efficiency must be in (0, 1], got {gemm_efficiency}")
        if num_layers is not None and (isinstance(num_layers, bool) or not isinstance(num_layers, int)
                                       or num_layers < 1):
            raise EngineError(f"num_layers must be an integer >= 1, got {num_layers!r}")
        self.source: ModelSource = resolve_model(model, seq_len, example_inputs, num_layers)
        check_plan(self.source, s)  # the executor's check too: refuse before building anything
        s.check_micro_batches()
        self.profile = load_profile(s.framework)
        if s.attention is None:  # the model's own implementation, else the framework's default
            s = self.strategy = s.replace(
                attention=resolve_attention(s, self.source, self.profile.kernels.attention.value))
        self.roofline = Roofline.from_device(self.cluster.device, gemm_efficiency,
                                             self.profile.kernels.attention_kernel.value)
        self.gemm_efficiency = gemm_efficiency
        self.overlap, self.overlap_dp_sync = overlap, overlap_dp_sync
        self.num_layers = num_layers
        self._costed: PlanProgram | None = None

    @classmethod
    def from_plan(cls, plan: Any, cluster: Any = None, **kwargs: Any) -> Engine:
        """The Engine of a :class:`meshplan.plan.Plan`: its model, cluster (or ``cluster``,
        e.g. a calibrated YAML), nodes, seq_len and num_layers, and its strategy with the
        plan's annotations (when it has any) as the annotation. ``plan`` may also be the path
        of a plan JSON (``Plan.load``: FileNotFoundError, PlanError). ``kwargs`` go to the
        constructor."""
        if isinstance(plan, (str, Path)):
            from meshplan.plan import Plan

            plan = Plan.load(plan)
        return cls(plan.model, cluster or plan.cluster, plan_strategy(plan), nodes=plan.nodes,
                   seq_len=plan.seq_len, num_layers=plan.num_layers, **kwargs)

    # -- programs ------------------------------------------------------------------------
    def costed_program(self) -> PlanProgram:
        """The representative plan program the engine costs (built once)."""
        if self._costed is None:
            self._costed = build_plan_program(self.source, self.strategy, representative=True,
                                              resolve_reshards=False,
                                              fp8_weights=self.profile.fp8_weights)
        return self._costed

    def partition(self) -> Program:
        """The costed program: completed, with the partition pass's reshard ops (Paddle's
        ``Engine`` exposes the same stage)."""
        return self.costed_program().program

    def plan_program(self) -> PlanProgram:
        """The whole program the executor runs for this plan (every layer and stage,
        reshards resolved), with the layer split of :meth:`resolved_strategy`."""
        return build_plan_program(self.source, self.resolved_strategy(),
                                  fp8_weights=self.profile.fp8_weights)

    def resolved_strategy(self) -> Strategy:
        """The strategy with the pipeline layer split the cost model chose
        (``StepResult.layers_per_vstage``) filled in when it has more than one virtual
        stage and fixes none: what a run of this plan must use to match the prediction."""
        s = self.strategy
        if s.layers_per_stage is None and s.pp * s.vpp > 1:
            s = s.replace(layers_per_stage=tuple(self.step_model().split))
        return s

    # -- costing ---------------------------------------------------------------------------
    def program_costs(self) -> ProgramCosts:
        """The per-block costs of the representative program on rank 0.

        For a model built from a config they come from :data:`COSTS`, keyed by the model,
        the costing strategy (``simulator.program_costs.costing_strategy``: the pipeline,
        the schedule and ZeRO do not change rank 0's block costs), the cluster and the GEMM
        efficiency: a search costs each layer layout once. A given program is costed as it
        is."""
        layers = self.num_layers or (None if self.source.is_program else self.source.num_layers)
        if self.source.is_program:
            return ProgramCosts.of(self.costed_program(), self.cluster, self.roofline, layers,
                                   self.profile)
        cs = costing_strategy(self.strategy)
        key = self._cost_key(cs)

        def build() -> ProgramCosts:
            # the program and its block costs do not depend on the recompute mode (the
            # completion reads none); only the saved activations and recompute FLOPs do
            prog, blocks, tables = self.shared_program(cs)
            return ProgramCosts.of(prog, self.cluster, self.roofline, layers, self.profile,
                                   recompute=cs.recompute, block_costs=blocks, tables=tables)

        return COSTS.get(key, build)

    def _cost_key(self, cs: Strategy) -> tuple:
        """The :data:`COSTS` key of costing strategy ``cs`` for this engine's model, cluster,
        GEMM efficiency, layer count and profile."""
        layers = self.num_layers or (None if self.source.is_program else self.source.num_layers)
        ann = cs.annotation
        if isinstance(ann, dict):  # a mapping annotation: its hashable form
            ann = tuple(sorted((k, tuple(v)) for k, v in ann.items()))
        return (self.source.config, self.source.seq_len, cs.replace(annotation="none"), ann,
                ByIdentity(self.cluster), self.gemm_efficiency, layers, self.profile)

    def shared_program(self, cs: Strategy) -> tuple[PlanProgram, dict[Any, Any], ProgramTables]:
        """The representative program of costing strategy ``cs``
        (``simulator.program_costs.costing_strategy``) at recompute ``none``, its rank-0
        block costs (``StageCoster.block_costs``) and its :class:`ProgramTables`, from
        :data:`PROGRAMS`: built once for every recompute mode of the layout (a model given
        by config only), and, with ``1 < ep < dp`` and no cp, once for every dp of the same
        ep: such a plan's program is its ep group's
        (``completion.plan_program.expert_group_strategy``), only the PlanProgram's plan
        fields (strategy, micro-batches, world size, dp / ep replicas) are the plan's own."""
        base = cs.replace(recompute="none")
        group = expert_group_strategy(base) if base.cp == 1 else base

        def build() -> tuple[PlanProgram, dict[Any, Any], ProgramTables]:
            prog = build_plan_program(self.source, group, representative=True, resolve_reshards=False,
                                      fp8_weights=self.profile.fp8_weights)
            return prog, StageCoster(prog.program, self.cluster, self.roofline, rank=0,
                                     profile=self.profile).block_costs(), ProgramTables(prog.program)

        prog, blocks, tables = PROGRAMS.get(self._cost_key(group), build)
        if group is not base:  # the fields build_plan_program(base) gives its PlanProgram
            prog = dataclasses.replace(prog, strategy=base, num_microbatches=base.num_microbatches,
                                       world_size=base.world_size, replicas=base.dp // base.ep)
        return prog, blocks, tables

    def step_model(self, accumulate_grads: bool | None = None,
                   costs: ProgramCosts | None = None) -> StepModel:
        """The :class:`simulator.step.StepModel` of this plan under its framework profile.
        ``accumulate_grads`` overrides the profile's gradient accumulation (see
        ``StepConfig.accumulate_grads``); ``costs`` replaces :meth:`program_costs` (the
        same layout's costs from elsewhere: ``meshplan.bounds.layout``). Raises EngineError
        for a split the pipeline cannot take."""
        costs = self.program_costs() if costs is None else costs
        # a cp plan steps as its folded strategy: dp * cp replicas of seq_len / cp tokens
        # (completion.context_parallel); the identity for cp = 1
        cfg = StepConfig.of(fold_strategy(self.strategy), self.roofline,
                            boundary_bytes=costs.boundary_bytes,
                            seq_len=self.source.seq_len // self.strategy.cp, profile=self.profile,
                            overlap=self.overlap, overlap_dp_sync=self.overlap_dp_sync,
                            accumulate_grads=accumulate_grads, cp=self.strategy.cp)
        try:
            return StepModel(costs, self.cluster, self.roofline, cfg)
        except ValueError as e:
            s = self.strategy
            raise EngineError(f"strategy pp={s.pp} vpp={s.vpp}: {e}") from None

    def simulate(self) -> StepResult:
        """Simulate one training step: step time, tokens/s, TFLOP/s per GPU, MFU, time and
        memory breakdowns, the schedule it played (see ``simulator.step.StepResult``)."""
        return self.step_model().run()

    def lower_bound(self, costs: ProgramCosts | None = None) -> tuple[float, int]:
        """``(seconds, bytes)`` no greater than :meth:`simulate`'s step time and peak memory,
        from the stage times alone (``simulator.bounds.step.step_lower_bound``: no schedule
        is built or played); ``costs`` as in :meth:`step_model`. Raises EngineError as
        :meth:`step_model` does."""
        from simulator.bounds.step import step_lower_bound

        return step_lower_bound(self.step_model(costs=costs))

    def cost(self, mode: str = "train") -> tuple[float, int]:
        """``(step time in ms, max memory over ranks in bytes)`` of one training step,
        equal to ``simulate()``'s ``step_time * 1e3`` and ``max_memory_bytes``.

        Raises EngineError for a mode other than "train"."""
        if mode != "train":
            raise EngineError(f"cost mode {mode!r} is not supported; use 'train'")
        res = self.simulate()
        return float(res.step_time * 1e3), int(res.max_memory_bytes)


__all__ = ["Engine", "EngineError"]
