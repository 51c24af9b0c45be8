"""``Strategy``: how one training step is split over the cluster (plain data).

One name per knob, used alike by the Strategy, the tuner's candidates, the step model's
config, the CLI and plan JSON. The names are Megatron-LM's (Narayanan et al. 2021):

- ``dp`` x ``cp`` x ``tp`` x ``pp`` ranks: data, context, tensor and pipeline parallel
  degrees (ranks are laid out tensor-parallel innermost, then context, then data, then
  pipeline -- Megatron-LM's ``tp-cp-ep-dp-pp`` order, ``megatron/core/parallel_state.py``:
  rank = stage * dp * cp * tp + (d * cp + c) * tp + t);
- ``cp``: context parallelism (Megatron's ``--context-parallel-size``): the sequence of every
  micro-batch split over ``cp`` ranks, causal load balancing by chunk reordering (rank c
  holds chunks c and 2cp-1-c of 2cp), attention over the whole sequence by ``cp_comm``:
  ``p2p`` (ring attention, K/V blocks passed peer to peer beside the blockwise attention;
  Liu et al. 2023, Megatron ``--cp-comm-type p2p``) or ``all_gather`` (K/V all-gathered
  before the attention, ``--cp-comm-type allgather``, which spelling is accepted too);
  ``completion.context_parallel``;
- ``ep``, ``etp``: expert parallelism (Megatron's ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size``): the routed experts of a mixture-of-experts model split
  over ``ep`` ranks, tokens sent to their experts' ranks by all_to_all and back
  (``completion.spmd.moe``); each expert split over ``etp`` tensor-parallel ranks (None:
  tp, Megatron's default; 1: whole experts). The expert layers fold onto the stage's ranks
  with their own degrees, tp x cp x dp = etp x ep x edp (:mod:`completion.expert_layout`:
  Megatron-Core's expert rank order ``tp-ep-dp-pp``), so ep may exceed dp (etp 1: an ep
  group spans whole tensor-parallel groups) and combine with cp; the ``edp`` ranks holding
  the same experts form the expert-data-parallel group over which expert gradients are
  reduced and, with the distributed optimizer (``zero`` 1), expert optimizer states
  sharded; dense ones over dp (``simulator.expert_parallel``). Not with zero > 1;
  ``completion.plan_program.check_plan`` checks the model (ep divides the experts);
- ``moe_capacity_factor``: expert capacity of a mixture-of-experts model (Megatron-Core's
  ``--moe-expert-capacity-factor``; GShard, Lepikhin et al. 2021, sec. 2.2): each expert
  takes at most ``ceil(c * s * k / E)`` (token, choice) pairs per sequence and drops the
  rest; None (default): dropless, as Megatron-Core's default;
- ``moe_load_imbalance``: tokens of the busiest expert over the mean, f >= 1 (1: uniform
  routing, as Megatron-Core's ``moe_router_force_load_balancing`` runs it). The step waits
  for the busiest expert's rank, so every expert is costed with ``ceil(min(c, f) * s * k /
  E)`` slots per sequence (:attr:`Strategy.expert_slot_factor`; the dispatch / combine
  ``capacity_factor``, ``completion.ops.moe``): its grouped GEMMs and its all_to_all grow
  with f, up to the capacity when tokens are dropped;
- ``vpp``: model chunks per pipeline rank (interleaved 1F1B; 2 for ZB-V); 0, the default,
  chooses by the schedule: 2 for an interleaved one (:data:`INTERLEAVED`) on pp > 1, else 1
  (the CLI's ``--schedule VPP`` without ``--vpp`` runs 2, by this rule);
- ``schedule``: the pipeline schedule (:data:`SCHEDULES`, case-insensitive, with the aliases of
  :data:`SCHEDULE_ALIASES`);
- ``micro_batch_size`` / ``global_batch_size``: sequences per micro-batch / per step;
- ``recompute``: activation recompute ``none`` | ``selective`` (Megatron: the attention core) |
  ``selective-op`` (torchtitan's op-level SAC) | ``full`` (``simulator.recompute``);
- ``zero``: ZeRO stage 0-3 over the dp group (Rajbhandari et al. 2020);
- ``fsdp_shard_size``: HSDP (hybrid sharded data parallelism, ZeRO-3 only): weights,
  gradients and optimizer states sharded over groups of ``fsdp_shard_size`` consecutive dp
  ranks and replicated over the ``dp / fsdp_shard_size`` groups (torch FSDP2
  ``fully_shard(mesh=(replicate, shard))``; torchtitan ``data_parallel_replicate_degree`` x
  ``data_parallel_shard_degree``, replicate outer, torchtitan b5bcd76
  ``torchtitan/distributed/parallel_dims.py``; DeepSpeed MiCS); None: shard over all of dp;
- ``sequence_parallel``: Megatron sequence parallelism (Korthikanti et al. 2022);
- ``dtype``, ``optimizer``; ``annotation``: the intra-op layout ("megatron", "none" or a
  mapping value name -> one placement per mesh dim [dp, tp]);
- ``layers_per_stage``: decoder layers per virtual stage in model order (None: the cost
  model balances them; the executor runs what the plan states);
- ``framework``: the software that runs the plan (:data:`FRAMEWORKS`: which kernels fuse,
  what overlaps, how gradients accumulate; ``simulator.profiles``);
- ``attention``: the attention implementation (:data:`ATTENTIONS`; None: the model's, else
  the framework's default).
- ``fp8``: an FP8 training recipe (:data:`FP8_RECIPES`; None: none): the decoder layers'
  linear GEMMs run in FP8, everything else in ``dtype`` (BF16). ``dtype`` also takes the
  recipes' spellings (:data:`FP8_DTYPES`, e.g. ``fp8-delayed``), which set ``dtype`` to
  bfloat16 and ``fp8`` to the recipe.

It lives in ``completion`` (which knows nothing about hardware or time) so that the cost
model and the executor read the same object. Old plan files spelled three knobs
differently (``mp``, ``schedule_mode``, ``sharding_stage``); :meth:`Strategy.from_dict`
still reads them (:data:`LEGACY_KEYS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from completion.choices import (
    ATTENTIONS,
    CP_COMM_ALIASES,
    CP_COMMS,
    DTYPES,
    FP8_DTYPES,
    FRAMEWORKS,
    INTERLEAVED,
    OPTIMIZERS,
    RECOMPUTE,
    SCHEDULE_ALIASES,
    SCHEDULES,
)
from completion.dist_attr import parse_placement
from completion.errors import CompletionError, DistAttrError
from completion.expert_layout import layout_problem

_SCHEDULE_BY_LOWER = {**{s.lower(): s for s in SCHEDULES}, **SCHEDULE_ALIASES}
#: schedules whose two chunks per rank run in a V (rank i holds virtual stages i and
#: 2 pp - 1 - i): ZB-V (Qi et al. 2024, sec. 6) and DualPipeV (``simulator.schedules.dualpipe``)
V_SHAPED = ("ZBVPP", "DualPipeV")
#: the Zero Bubble paper's named memory limits: schedule -> limit in units of p M_B (p the
#: pipeline stages) of the automatic ZB schedule (Qi et al. 2024, sec. 4); "ZB" alone
#: runs at ZB-2p's (``Strategy.registered_schedule``; ``meshplan simulate``)
ZB_LIMITS = {"ZB-1p": 1, "ZB-2p": 2}
#: the framework profiles that run Transformer Engine FP8 / torchao ``Float8Linear``
_TE_FP8 = ("megatron-core", "megatron-bridge", "nemo", "llm-foundry")
_TORCHAO_FP8 = ("fsdp2", "fsdp2-eager", "fsdp2-async-tp")
#: FP8 training recipes -> the framework profiles that run them: ``te-delayed``
#: (Transformer Engine ``DelayedScaling``: per-tensor scales from an amax history; NVIDIA
#: Megatron-Core / NeMo ``--fp8-format hybrid``, Composer/llm-foundry ``amp_fp8``),
#: ``tensorwise`` and ``rowwise`` (torchao ``Float8Linear`` dynamic scaling per tensor or
#: per row, as torchtitan's ``--float8`` runs it under FSDP2). The tuples name
#: :data:`FRAMEWORKS` entries (tests/completion/test_fp8.py checks it); they are not read from the
#: profiles because the Strategy checks ``fp8`` against its framework and ``completion``
#: does not import ``simulator``.
FP8_RECIPES: dict[str, tuple[str, ...]] = {
    "te-delayed": _TE_FP8,
    "tensorwise": _TORCHAO_FP8,
    "rowwise": _TORCHAO_FP8,
}
ZERO_STAGES = (0, 1, 2, 3)
#: knob names of earlier plan files -> today's
LEGACY_KEYS = {"mp": "tp", "schedule_mode": "schedule", "sharding_stage": "zero"}
_INT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "global_batch_size")
#: Largest value of each integer knob (issue 16 item 8: sizes are bounded where they
#: enter, so no size makes a command run for minutes). Degrees: at most the ranks a
#: cluster may have (``clusters.spec.MAX_WORLD_SIZE``, 2**20), also for their product;
#: vpp: 64 chunks per rank; batch sizes: 2**24 sequences (GPT-3 trained with 1536).
MAX_DEGREE = 2**20
MAX_VPP = 64
MAX_BATCH = 2**24
#: most decoder layers one virtual stage may hold (a model has at most 2**14)
MAX_LAYERS = 2**14
MAX_VALUES = {"dp": MAX_DEGREE, "tp": MAX_DEGREE, "pp": MAX_DEGREE, "cp": MAX_DEGREE, "ep": MAX_DEGREE,
              "vpp": MAX_VPP,
              "micro_batch_size": MAX_BATCH, "global_batch_size": MAX_BATCH}


class StrategyError(CompletionError):
    """An invalid strategy; the message names the field at fault."""


def interleaved(name: Any) -> bool:
    """Whether schedule ``name`` (any spelling or alias) runs several model chunks per
    pipeline rank (:data:`INTERLEAVED`: VPP, ZBVPP); False for an unknown name (the
    Strategy then names it)."""
    return _SCHEDULE_BY_LOWER.get(str(name).strip().lower()) in INTERLEAVED


def default_vpp(schedule: Any, pp: Any) -> int:
    """Model chunks per pipeline rank of a strategy that does not give ``vpp`` (vpp 0): 2 for
    an interleaved schedule (:data:`INTERLEAVED`, any spelling) on pp > 1 (one chunk per
    rank would be plain 1F1B), else 1."""
    return 2 if interleaved(schedule) and pp != 1 else 1


def canonical_schedule(name: Any) -> str:
    """The canonical spelling of a schedule name (case-insensitive; aliases such as
    ``GPipe`` -> ``FThenB``, ``ZB-V`` -> ``ZBVPP``). Raises StrategyError for an unknown one."""
    key = str(name).strip().lower()
    if key not in _SCHEDULE_BY_LOWER:
        raise StrategyError(f"strategy field 'schedule' must be one of {list(SCHEDULES)} "
                            f"(case-insensitive), got {name!r}", field="schedule")
    return _SCHEDULE_BY_LOWER[key]


@dataclass(frozen=True)
class Strategy:
    """A parallel strategy (frozen; hashable unless ``annotation`` is a mapping).

    Attributes: see the module docstring. ``global_batch_size`` must be a multiple of
    ``dp * micro_batch_size`` (m = global / (dp * micro) micro-batches per pipeline; the cp
    ranks of a data-parallel replica share its sequences). Each integer knob is at most
    :data:`MAX_VALUES` (and dp * cp * tp * pp at most :data:`MAX_DEGREE`).

    Raises:
        StrategyError: naming the first invalid field.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 0
    schedule: str = "1F1B"
    micro_batch_size: int = 1
    global_batch_size: int = 1
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    dtype: str = "bfloat16"
    optimizer: str = "adamw"
    annotation: Any = field(default="megatron")
    layers_per_stage: tuple[int, ...] | None = None
    framework: str = "megatron-core"
    attention: str | None = None
    cp: int = 1
    cp_comm: str = "p2p"
    fp8: str | None = None
    fsdp_shard_size: int | None = None
    ep: int = 1
    etp: int | None = None
    moe_capacity_factor: float | None = None
    moe_load_imbalance: float = 1.0

    def __post_init__(self) -> None:
        spelled = None  # the dtype spelling of an FP8 recipe (fp8-delayed), for messages
        if isinstance(self.dtype, str) and self.dtype in FP8_DTYPES:
            spelled = self.dtype
            recipe = FP8_DTYPES[self.dtype]
            if self.fp8 is not None and self.fp8 != recipe:
                raise StrategyError(f"strategy field 'dtype' {self.dtype!r} means fp8 {recipe!r} "
                                    f"but field 'fp8' is {self.fp8!r}", field="dtype")
            object.__setattr__(self, "dtype", "bfloat16")
            object.__setattr__(self, "fp8", recipe)
        self._resolve_vpp()
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise StrategyError(f"strategy field {name!r} must be an integer >= 1, got {v!r}", field=name)
            if v > MAX_VALUES[name]:
                raise StrategyError(f"strategy field {name!r} is {v}, above the limit of "
                                    f"{MAX_VALUES[name]} (completion.strategy.MAX_VALUES)", field=name)
        if self.world_size > MAX_DEGREE:
            raise StrategyError(f"strategy field 'dp' x 'cp' x 'tp' x 'pp' = {self.world_size} "
                                f"ranks is above the limit of {MAX_DEGREE} (completion.strategy.MAX_DEGREE)", field="dp")
        object.__setattr__(self, "schedule", canonical_schedule(self.schedule))
        self._check_choices(spelled)
        self._check_combinations()
        self._check_hsdp()
        self._check_annotation()
        self._check_layers_per_stage()

    def _check_choices(self, spelled: str | None = None) -> None:
        if isinstance(self.cp_comm, str) and self.cp_comm in CP_COMM_ALIASES:
            object.__setattr__(self, "cp_comm", CP_COMM_ALIASES[self.cp_comm])
        if self.cp_comm in ("a2a", "a2a+p2p"):
            raise StrategyError(f"strategy field 'cp_comm' {self.cp_comm!r} (Megatron-LM's "
                                "all-to-all, Ulysses-style context parallelism) is not modelled; "
                                f"one of {list(CP_COMMS)}", field="cp_comm")
        for name, allowed in (("recompute", RECOMPUTE), ("dtype", DTYPES), ("optimizer", OPTIMIZERS),
                              ("framework", FRAMEWORKS), ("cp_comm", CP_COMMS)):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in allowed:
                raise StrategyError(f"strategy field {name!r} must be one of {list(allowed)}, "
                                    f"got {getattr(self, name)!r}", field=name)
        if self.attention is not None and (not isinstance(self.attention, str) or self.attention not in ATTENTIONS):
            raise StrategyError(f"strategy field 'attention' must be one of {list(ATTENTIONS)} or "
                                f"null (the model's own), got {self.attention!r}", field="attention")
        if self.fp8 is not None:
            if not isinstance(self.fp8, str) or self.fp8 not in FP8_RECIPES:
                raise StrategyError(f"strategy field 'fp8' must be one of {list(FP8_RECIPES)} or "
                                    f"null (no FP8), got {self.fp8!r}", field="fp8")
            self._check_fp8_framework(spelled)
            if self.dtype != "bfloat16":
                raise StrategyError(f"strategy field 'fp8' {self.fp8!r} keeps BF16 outside the "
                                    f"FP8 GEMMs; 'dtype' must be bfloat16, got {self.dtype!r}", field="fp8")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in ZERO_STAGES:
            raise StrategyError(f"strategy field 'zero' (ZeRO stage) must be 0, 1, 2 or 3, got {self.zero!r}", field="zero")
        if not isinstance(self.sequence_parallel, bool):
            raise StrategyError(f"strategy field 'sequence_parallel' must be true or false, "
                                f"got {self.sequence_parallel!r}", field="sequence_parallel")

    def _resolve_vpp(self) -> None:
        """vpp 0 (the default): :func:`default_vpp` of the schedule and pp."""
        if self.vpp == 0 and not isinstance(self.vpp, bool):
            object.__setattr__(self, "vpp", default_vpp(self.schedule, self.pp))

    def _check_fp8_framework(self, spelled: str | None = None) -> None:
        """Refuse an FP8 recipe the framework does not run (:data:`FP8_RECIPES`); the
        message names the ``dtype`` spelling when the recipe came from one (``spelled``)."""
        runs = FP8_RECIPES.get(self.fp8) if isinstance(self.fp8, str) else None
        if runs is None or self.framework in runs:
            return
        *first, last = runs
        names = f"{', '.join(first)} or {last}" if first else last
        if spelled is not None:
            raise StrategyError(f"strategy field 'dtype' {spelled} runs under strategy field "
                                f"'framework' {names}, not {self.framework}: give one of them",
                                field="dtype")
        raise StrategyError(f"strategy field 'fp8' {self.fp8!r} runs under framework "
                            f"{names}, not {self.framework!r}", field="fp8")

    def _check_combinations(self) -> None:
        per_step = self.dp * self.micro_batch_size
        if self.global_batch_size % per_step:
            raise StrategyError(
                f"strategy field 'global_batch_size' ({self.global_batch_size}) must be a multiple "
                f"of dp * micro_batch_size = {per_step}", field="global_batch_size")
        if self.schedule == "DualPipeV" and self.num_microbatches < 2 * self.pp:
            raise StrategyError(f"schedule DualPipeV needs at least 2 x pp = {2 * self.pp} micro-batches "
                                f"per step, got {self.num_microbatches} (global_batch_size / (dp x "
                                "micro_batch_size))")
        if self.schedule in V_SHAPED and self.vpp != 2:
            raise StrategyError(f"strategy field 'vpp' must be 2 for {self.schedule} (two chunks per rank in "
                                f"a V), got {self.vpp}", field="vpp")
        if self.pp == 1 and self.vpp == 1 and self.schedule != "1F1B":
            raise StrategyError(f"strategy field 'schedule' {self.schedule} orders the micro-batches "
                                f"of a pipeline, and pp 1 has none: give pp > 1, or schedule 1F1B "
                                f"(the default)", field="schedule")
        if self.schedule == "VPP" and self.vpp == 1 and self.pp > 1:
            raise StrategyError("strategy field 'vpp' 1 with schedule VPP runs one model chunk per "
                                "pipeline rank, which is 1F1B: give vpp 2 or more (or leave it "
                                "out), or schedule 1F1B", field="vpp")
        if self.vpp > 1 and self.schedule not in INTERLEAVED:
            raise StrategyError(f"strategy field 'vpp' is {self.vpp} but schedule "
                                f"{self.schedule!r} runs one chunk per rank; use schedule VPP (or ZBVPP at vpp 2)", field="vpp")
        if self.cp == 1 and self.cp_comm != "p2p":
            raise StrategyError(f"strategy field 'cp_comm' {self.cp_comm} needs cp > 1: without "
                                "context parallelism there is no K/V exchange", field="cp_comm")
        if self.sequence_parallel and self.tp == 1:
            raise StrategyError("strategy field 'sequence_parallel' needs tp > 1", field="sequence_parallel")
        why = layout_problem(self.dp, self.cp, self.tp, self.ep, self.etp)
        if why is not None:
            raise StrategyError(why)
        if self.ep > 1 and self.zero > 1:
            raise StrategyError(f"strategy field 'ep' = {self.ep} with 'zero' = {self.zero}: only the "
                                "distributed optimizer (zero 1, optimizer states sharded over the "
                                "expert-data-parallel group for experts) is modelled with experts; "
                                "use zero 0 or 1", field="ep")
        self._check_moe_routing()
        if self.cp > 1 and self.attention == "unfused":
            raise StrategyError(f"strategy field 'cp' = {self.cp} needs the fused (flash) attention: "
                                "context parallelism splits the attention into blockwise kernels "
                                "(Megatron-LM runs it with Transformer Engine's fused attention)", field="cp")

    def _check_hsdp(self) -> None:
        """HSDP needs ZeRO-3 and a shard group size N with 2 <= N < dp, N | dp (0 reads as
        None: shard over all of dp)."""
        n = self.fsdp_shard_size
        if n is None or (n == 0 and not isinstance(n, bool)):
            object.__setattr__(self, "fsdp_shard_size", None)
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise StrategyError(f"strategy field 'fsdp_shard_size' (HSDP shard group) must be an "
                                f"integer >= 2 or null, got {n!r}", field="fsdp_shard_size")
        if self.zero != 3:
            raise StrategyError(f"strategy field 'fsdp_shard_size' = {n} (HSDP) shards weights, "
                                f"gradients and optimizer states: it needs zero 3, got zero {self.zero}", field="fsdp_shard_size")
        if n < 2 or n >= self.dp or self.dp % n:
            raise StrategyError(f"strategy field 'fsdp_shard_size' = {n} must divide dp = {self.dp} "
                                f"and lie in 2..dp/2 (HSDP: dp / {n} replicas of a shard group; "
                                f"null shards over all of dp)", field="fsdp_shard_size")

    @property
    def zero_shard_degree(self) -> int:
        """Ranks one copy of the ZeRO-sharded states is split over: ``fsdp_shard_size``
        under HSDP, else dp."""
        return self.fsdp_shard_size or self.dp

    @property
    def replicate_degree(self) -> int:
        """HSDP replicas of the shard group: dp / :attr:`zero_shard_degree` (1 without HSDP)."""
        return self.dp // self.zero_shard_degree

    def _check_annotation(self) -> None:
        ann = self.annotation
        if isinstance(ann, Mapping):
            out: dict[str, list[str]] = {}
            for k, pl in ann.items():
                if not isinstance(pl, (list, tuple)):
                    raise StrategyError(f"strategy field 'annotation': value {k!r} needs a list of "
                                        f"placements (one per mesh dim), got {pl!r}", field="annotation")
                try:
                    out[str(k)] = [repr(parse_placement(p)) for p in pl]
                except DistAttrError as e:
                    raise StrategyError(f"strategy field 'annotation': value {k!r}: {e}", field="annotation") from None
            object.__setattr__(self, "annotation", out)
        elif ann not in ("megatron", "none"):
            raise StrategyError(f"strategy field 'annotation' must be 'megatron', 'none' or a "
                                f"mapping value name -> placements, got {ann!r}", field="annotation")

    def _check_layers_per_stage(self) -> None:
        lps = self.layers_per_stage
        if lps is None:
            return
        if isinstance(lps, (str, bytes, dict)) or not hasattr(lps, "__iter__"):
            raise StrategyError(f"strategy field 'layers_per_stage' must be a list of integers, got {lps!r}", field="layers_per_stage")
        vals = tuple(lps)
        if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_LAYERS for x in vals):
            raise StrategyError(f"strategy field 'layers_per_stage' must hold integers in 0..{MAX_LAYERS}, "
                                f"got {list(vals)[:16]}{' ...' if len(vals) > 16 else ''}", field="layers_per_stage")
        if len(vals) != self.pp * self.vpp:
            raise StrategyError(f"strategy field 'layers_per_stage' has {len(vals)} entries; pp * vpp "
                                f"= {self.pp} * {self.vpp} = {self.pp * self.vpp} virtual stages need one each", field="layers_per_stage")
        object.__setattr__(self, "layers_per_stage", vals)

    # -- derived ---------------------------------------------------------------------------
    def check_micro_batches(self) -> None:
        """Raise StrategyError, naming the batch fields, when the schedule cannot run this
        many micro-batches per step: Megatron-LM's interleaved schedule (VPP with vpp > 1)
        runs them in groups of pp (``simulator.schedules.classic.interleaved``). A check of
        a step to simulate or run, not of the strategy itself (``complete`` builds a VPP
        program of any batch)."""
        per_step = self.dp * self.micro_batch_size
        m = self.global_batch_size // per_step
        if self.schedule == "VPP" and self.vpp > 1 and m % self.pp:
            raise StrategyError(
                f"strategy field 'global_batch_size' ({self.global_batch_size}) gives {m} "
                f"micro-batches per step (global_batch_size / (dp x micro_batch_size) = "
                f"{self.global_batch_size} / {per_step}); VPP with vpp {self.vpp} needs a multiple "
                f"of pp = {self.pp}", field="global_batch_size")

    def _check_moe_routing(self) -> None:
        """moe_capacity_factor None or a number in (0, 64]; moe_load_imbalance in [1, 64]."""
        c, f = self.moe_capacity_factor, self.moe_load_imbalance
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or not 0 < c <= 64):
            raise StrategyError(f"strategy field 'moe_capacity_factor' must be a number in (0, 64] "
                                f"(left out: dropless), got {c!r}", field="moe_capacity_factor")
        if isinstance(f, bool) or not isinstance(f, int | float) or not 1 <= f <= 64:
            raise StrategyError(f"strategy field 'moe_load_imbalance' must be a number in [1, 64] "
                                f"(the busiest expert's tokens over the mean), got {f!r}", field="moe_load_imbalance")

    @property
    def expert_slot_factor(self) -> float:
        """The slots per expert per sequence the plan builds and costs, over the uniform
        ``s * k / E``: ``min(moe_capacity_factor, moe_load_imbalance)`` when tokens are
        dropped, ``moe_load_imbalance`` when dropless (module docstring)."""
        f = float(self.moe_load_imbalance)
        c = self.moe_capacity_factor
        return f if c is None else min(float(c), f)

    @property
    def world_size(self) -> int:
        """Ranks the strategy uses: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def num_microbatches(self) -> int:
        """m: micro-batches per pipeline per step."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def num_vstages(self) -> int:
        """Virtual pipeline stages: pp * vpp."""
        return self.pp * self.vpp

    def registered_schedule(self) -> tuple[str, float | None]:
        """(registered schedule builder name, ZB memory limit in units of M_B or None):
        ZB-1p -> ("ZB", pp), ZB-2p and ZB -> ("ZB", 2 pp) (Qi et al. 2024, sec. 4)."""
        if self.schedule in ZB_LIMITS or self.schedule == "ZB":
            return "ZB", float(ZB_LIMITS.get(self.schedule, ZB_LIMITS["ZB-2p"]) * self.pp)
        return self.schedule, None

    @property
    def chunk_schedule(self) -> str:
        """The schedule name the Completer places chunks by: the ZB heuristics place them
        like 1F1B (one chunk per rank)."""
        return "1F1B" if self.schedule in ("ZB", "ZB-1p", "ZB-2p") else self.schedule

    def replace(self, **kw: Any) -> Strategy:
        """A copy with the fields in ``kw`` changed; re-validated (raises StrategyError)."""
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (every field; JSON-ready); :meth:`from_dict` reads it back."""
        d = asdict(self)
        if d["layers_per_stage"] is not None:
            d["layers_per_stage"] = list(d["layers_per_stage"])
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Strategy:
        """Inverse of :meth:`to_dict`. Earlier knob names (:data:`LEGACY_KEYS`) are read as
        today's; unknown keys, or a knob given under both names, raise StrategyError."""
        if not isinstance(data, Mapping):
            raise StrategyError(f"a strategy must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {}
        for k, v in data.items():
            name = LEGACY_KEYS.get(k, k)
            if name in out:
                raise StrategyError(f"strategy field {name!r} is given twice (as {k!r})", field=name)
            out[name] = v
        extra = sorted(set(out) - known)
        if extra:
            raise StrategyError(f"unknown strategy field(s) {extra}; known: {sorted(known)}")
        return cls(**out)
