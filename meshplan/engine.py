"""``Engine(model, cluster, strategy)``: complete, partition, simulate and cost one plan.

Mirrors Paddle auto-parallel's ``Engine`` (``engine.cost(mode="train") -> (time_ms,
max_memory_bytes)``). The pipeline is: build the program (one representative decoder
layer for a model given by configuration; see ``meshplan.model_source``), append
backward and the optimizer, annotate it on the process mesh [dp, mp] (ranks 0..dp*mp-1,
Megatron order: mp innermost), complete, partition (reshard ops), cost every block
(``simulator.stage_cost``), then place layers on pipeline stages and play the step on the
SimPy engine (``simulator.step``). Pipeline stages are the same [dp, mp] layout shifted by
stage * dp * mp ranks, so only the ranks that differ (stage, position) are costed, never
every rank's program.
"""

from __future__ import annotations

from typing import Any

from clusters import Cluster, load_cluster
from completion import ProcessMesh, Program, apply_optimizer
from completion.dist_attr import parse_placements
from completion.dtypes import DTYPE_BYTES
from completion.ir import OpRole
from meshplan.model_source import resolve_model
from meshplan.strategy import Strategy
from simulator.blocks import assign_blocks
from simulator.memory import (
    StageActivations,
    _is_attn_core,
    optimizer_bytes_per_param,
    saved_activations,
)
from simulator.op_cost import op_cost
from simulator.op_signature import local_tensor, op_signature
from simulator.roofline import Roofline
from simulator.stage_cost import StageCoster
from simulator.step import StepConfig, StepModel, StepResult


class EngineError(ValueError):
    """A strategy that does not fit the cluster or the model; names the field."""


class Engine:
    """Cost model facade for one (model, cluster, strategy).

    Args:
        model: built-in name, config.json path, PIR program path, Program or torch module.
        cluster: catalog name, YAML path or ``clusters.Cluster``; nodes: node count.
        strategy: a :class:`Strategy` (default: everything 1).
        seq_len: tokens per sequence (default: the model's).
        overlap: fraction of in-stage collective time hidden behind compute (default 0).
        overlap_dp_sync: hide the gradient sync behind the last backward where possible.
        layers_per_stage: explicit layers per virtual stage (e.g. [1, 2, 2, 3]).
        example_inputs: for a torch module.
        num_layers: the number of decoder layers to cost. For a model given by name or
            config it overrides the config's layer count (a smaller model of the same
            shape, e.g. a 4-layer llama2-7b for small search spaces); for a given program
            whose decoder layers are identical, the number of layers the model really has:
            its first layer stands for all of them.
        gemm_efficiency: overrides the cluster spec's ``device.efficiency.gemm`` (used when
            fitting that constant, e.g. on Megatron 2021 Table 1).

    Raises:
        EngineError: dp * mp * pp exceeds the cluster, or the layers cannot fill the stages.
    """

    def __init__(self, model: Any, cluster: Any, strategy: Strategy | None = None, *,
                 nodes: int | None = None, seq_len: int | None = None, overlap: float = 0.0,
                 overlap_dp_sync: bool = False, layers_per_stage: list[int] | None = None,
                 example_inputs: Any = None, num_layers: int | None = None,
                 gemm_efficiency: float | None = None) -> None:
        self.strategy = strategy or Strategy()
        self.cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster, nodes)
        s = self.strategy
        if s.world_size > self.cluster.world_size:
            raise EngineError(f"strategy dp*mp*pp = {s.dp}*{s.tp}*{s.pp} = {s.world_size} ranks "
                              f"exceeds cluster {self.cluster.name!r} with {self.cluster.world_size}")
        if not 0.0 <= overlap <= 1.0:
            raise EngineError(f"overlap must be in [0, 1], got {overlap}")
        if gemm_efficiency is not None and not 0.0 < gemm_efficiency <= 1.0:
            raise EngineError(f"gemm_efficiency must be in (0, 1], got {gemm_efficiency}")
        self.source = resolve_model(model, seq_len, example_inputs)
        self._check_model_split()
        self.roofline = Roofline.from_device(self.cluster.device, gemm_efficiency)
        self.overlap, self.overlap_dp_sync = overlap, overlap_dp_sync
        self.layers_per_stage = tuple(layers_per_stage) if layers_per_stage else None
        if num_layers is not None and (not isinstance(num_layers, int) or num_layers < 1):
            raise EngineError(f"num_layers must be an integer >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self._program: Program | None = None
        self._file_ranks: tuple[int, ...] = ()
        self._state = "new"
        self._gflops: dict[Any, float] = {}

    def _check_model_split(self) -> None:
        """Megatron's tensor-parallel rules for a model given by configuration: mp divides
        the attention heads and the key/value heads (a head is never split across ranks),
        and with sequence parallelism the sequence length (Megatron-LM
        ``parallel_state`` / ``transformer_config`` checks). Raises EngineError."""
        cfg, s = self.source.config, self.strategy
        if cfg is None or s.tp == 1 or s.annotation != "megatron":
            return
        for field_, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads)):
            if n % s.tp:
                raise EngineError(f"strategy field 'mp' = {s.tp} does not divide model "
                                  f"{cfg.name!r} {field_} = {n}")
        if s.sequence_parallel and self.source.seq_len % s.tp:
            raise EngineError(f"strategy field 'sequence_parallel': seq_len "
                              f"{self.source.seq_len} is not divisible by mp = {s.tp}")

    # -- program pipeline --------------------------------------------------------------
    @property
    def _needs_completion(self) -> bool:
        s = self.strategy
        return s.tp > 1 or isinstance(s.annotation, dict) or (
            self.source.program is not None and s.dp > 1)

    def program(self) -> Program:
        """The program the engine costs (forward + backward + optimizer), built once."""
        if self._program is None:
            s = self.strategy
            batch = s.micro_batch_size * (s.dp if self._needs_completion else 1)
            prog = self.source.representative(batch, s.dtype)
            self._file_ranks = self._file_annotation(prog)
            self._gflops = self._global_flops(prog)
            if not any(op.role == OpRole.OPTIMIZE for op in prog.ops):
                apply_optimizer(prog, s.optimizer)
            self._program = prog
        return self._program

    def _file_annotation(self, prog: Program) -> tuple[int, ...]:
        """The ranks a given program's own dist attrs annotate (then they are the
        annotation: completed as they are, never replaced by the strategy's "megatron" or
        "none"). A one-rank strategy drops them (the program is costed unsharded); otherwise
        they must cover exactly the stage mesh's ranks 0 .. dp*mp-1 (EngineError)."""
        from completion.annotate import annotated_ranks, clear_annotations

        s = self.strategy
        ranks = annotated_ranks(prog) if self.source.program is not None else ()
        if not ranks:
            return ()
        if s.dp * s.tp == 1:
            clear_annotations(prog)
            return ()
        if ranks != tuple(range(s.dp * s.tp)):
            raise EngineError(f"program {self.source.name!r} is annotated for ranks {list(ranks)} "
                              f"but the strategy's mesh dp*mp = {s.dp}*{s.tp} has ranks "
                              f"0..{s.dp * s.tp - 1}")
        return ranks

    def _global_flops(self, prog: Program) -> dict[Any, float]:
        """Model FLOPs per micro-batch (all dp replicas) per block, and the forward FLOPs
        recompute re-runs under ("recompute", block)."""
        names = frozenset(p.name for p in prog.parameters() if p.name)
        reps = 1 if self._needs_completion else self.strategy.dp
        blocks = assign_blocks(prog)
        out: dict[Any, float] = {}
        rec = self.strategy.recompute
        for op in prog.ops:
            blk = blocks.get(id(op))
            if blk is None:
                continue
            fl = sum(k.flops for k in op_cost(op_signature(op, None, names, global_shapes=True))
                     if k.phase in ("F", "B", "W")) * reps
            out[blk] = out.get(blk, 0.0) + fl
            if op.role == OpRole.FORWARD and isinstance(blk, int) and (
                    rec == "full" or (rec == "selective" and _is_attn_core(op))):
                out[("recompute", blk)] = out.get(("recompute", blk), 0.0) + fl
        return out

    @classmethod
    def from_plan(cls, plan: Any, cluster: Any = None, **kwargs: Any) -> Engine:
        """The Engine of a :class:`meshplan.plan.Plan`: its model, cluster (or ``cluster``,
        e.g. a calibrated YAML), nodes, seq_len and num_layers, and its strategy with the
        plan's annotations (when it has any) as the annotation. ``kwargs`` go to the
        constructor."""
        strat = plan.strategy
        if plan.annotations:
            strat = strat.replace(annotation=dict(plan.annotations))
        return cls(plan.model, cluster or plan.cluster, strat, nodes=plan.nodes,
                   seq_len=plan.seq_len, num_layers=plan.num_layers, **kwargs)

    def complete(self) -> Program:
        """Annotate (Megatron layout, or the strategy's mapping) on mesh [dp, mp] and
        complete every op's dist attr. A no-op when nothing is sharded inside a rank."""
        prog = self.program()
        if self._state != "new":
            return prog
        if self._needs_completion:
            from completion.annotate import annotate, shard_megatron
            from completion.completer import Completer

            s = self.strategy
            mesh = ProcessMesh((s.dp, s.tp), tuple(range(s.dp * s.tp)), ("dp", "tp"))
            if self._file_ranks and not isinstance(s.annotation, dict):
                pass  # the program's own annotations (see _file_annotation)
            elif s.annotation == "megatron":
                shard_megatron(prog, mesh, 0, 1, sequence_parallel=s.sequence_parallel)
            elif isinstance(s.annotation, dict):
                for name, pl in s.annotation.items():
                    annotate(prog, name, mesh, placements=parse_placements(pl))
            completer = Completer(prog)
            completer.complete_forward_annotation()
            completer.complete_backward_annotation()
            completer.complete_update_annotation()
        self._state = "completed"
        return prog

    def partition(self) -> Program:
        """Insert reshard ops (``completion.apply_partition_pass``) after completion."""
        prog = self.complete()
        if self._state == "completed" and self._needs_completion:
            from completion import apply_partition_pass

            apply_partition_pass(prog)
        self._state = "partitioned"
        return prog

    # -- costing ---------------------------------------------------------------------
    def _activations(self, prog: Program) -> StageActivations:
        merged = StageActivations()
        for st in saved_activations(prog, self.strategy.recompute).values():
            for table in ("by_block", "w_by_block", "dropped_by_block"):
                for k, v in getattr(st, table).items():
                    merged.add(table, k, v)
        return merged

    def _boundary_bytes(self, prog: Program, blocks: dict) -> float:
        last = None
        for op in prog.ops:
            if op.role == OpRole.FORWARD and isinstance(blocks.get(id(op)), int) and op.results:
                last = op.results[0] or last
        if last is None:
            return 0.0
        t = local_tensor(last, 0)
        n = 1
        for d in t.shape:
            n *= d
        return float(n * DTYPE_BYTES.get(t.dtype, 4))

    def _step_model(self) -> StepModel:
        prog = self.partition()
        s = self.strategy
        costs = StageCoster(prog, self.cluster, self.roofline, rank=0).block_costs()
        layer_ids = sorted(k for k in costs if isinstance(k, int))
        if self.source.program is None:
            n = self.num_layers or self.source.num_layers
            keys = [layer_ids[0]] * n if layer_ids else []
        elif self.num_layers is not None and layer_ids:
            keys = [layer_ids[0]] * self.num_layers
        else:
            keys = layer_ids
        if not keys and s.pp > 1:
            raise EngineError(f"pp={s.pp} needs decoder layers (struct names '...layers.<i>...'); "
                              f"model {self.source.name!r} has none")
        sched, limit = s.registered_schedule()
        dbytes = DTYPE_BYTES[s.dtype]
        cfg = StepConfig(
            dp=s.dp, tp=s.tp, pp=s.pp, vpp=s.vpp, num_microbatches=s.num_microbatches,
            schedule=sched, memory_limit=limit, recompute=s.recompute,
            zero=s.zero, param_bytes=dbytes, grad_bytes=dbytes,
            optimizer_bytes=optimizer_bytes_per_param(s.dtype, s.optimizer),
            boundary_bytes=self._boundary_bytes(prog, assign_blocks(prog)),
            tokens_per_step=s.global_batch_size * self.source.seq_len,
            peak_flops=self.roofline.peak(s.dtype), overlap=self.overlap,
            overlap_dp_sync=self.overlap_dp_sync, layers_per_stage=self.layers_per_stage)
        gflops = {}
        for k, v in self._gflops.items():
            if isinstance(k, int) or (isinstance(k, tuple) and isinstance(k[1], int)):
                continue
            gflops[k] = v
        for i, key in enumerate(keys):  # every model layer, even when one stands for all
            gflops[i] = self._gflops.get(key, 0.0)
            if ("recompute", key) in self._gflops:
                gflops[("recompute", i)] = self._gflops[("recompute", key)]
        try:
            return StepModel([costs[k] for k in keys], costs.get("pre"), costs.get("post"),
                             self._activations(prog), keys, gflops, self.cluster,
                             self.roofline, cfg)
        except ValueError as e:
            raise EngineError(f"strategy pp={s.pp} vpp={s.vpp}: {e}") from None

    def simulate(self) -> StepResult:
        """Simulate one training step: step time, tokens/s, TFLOP/s per GPU, MFU, time and
        memory breakdowns (see ``simulator.step.StepResult``)."""
        return self._step_model().run()

    def cost(self, mode: str = "train") -> tuple[float, int]:
        """``(step time in ms, max memory over ranks in bytes)`` of one training step,
        equal to ``simulate()``'s ``step_time * 1e3`` and ``max_memory_bytes``.

        Raises EngineError for a mode other than "train"."""
        if mode != "train":
            raise EngineError(f"cost mode {mode!r} is not supported; use 'train'")
        res = self.simulate()
        return float(res.step_time * 1e3), int(res.max_memory_bytes)
