"""Pydantic models of a framework profile: how a software stack runs one training step.

A profile is an input like the cluster: the same plan runs at different speeds under
Megatron-LM 2021, Megatron-Core with Transformer Engine, PyTorch FSDP2, DeepSpeed or this
project's executor. Every value is a ``{value, provenance}`` pair naming its source (a
framework's code at a named commit, a paper, shared/reference/fidelity_notes.md); the
catalog is ``simulator/profiles/catalog/*.yaml``. Units: bytes, seconds.

Sections:

- ``kernels``: which memory-bound ops run fused (:data:`FUSION_GROUPS`), whether
  torch.compile fuses every elementwise chain, the default attention implementation, the
  context-parallel attention implementation (``cp_attention``, ``simulator.cp_impls``;
  absent: Transformer Engine's);
- ``overlap``: which collectives run on their own stream beside which compute
  (tensor-parallel backward / forward, data-parallel gradient reduce and parameter
  gather, FSDP prefetch depth), and the SMs a collective kernel holds while it runs
  (compute beside it runs on the others);
- ``pipeline``: asynchronous or synchronous p2p, scatter-gather of the boundary activation
  over the tensor-parallel group, the schedules the framework runs;
- ``gradients``: fused (into the weight-gradient GEMM) or separate accumulation, the main
  gradient dtype, the reduce dtype, the bucket size;
- ``optimizer``: master weights, fused multi-tensor update;
- ``fixed``: per-iteration work (gradient norm and clip, loss-scale check, embedding
  gradient sync between the first and last pipeline stages);
- ``memory``: how model states are held (:data:`STATE_MODELS`), allocator fragmentation,
  CUDA context and library workspaces, NCCL buffers per communicator.
- ``checkpoint`` (optional): whether the framework saves asynchronously and who writes the
  tensors data-parallel ranks hold alike (``simulator.goodput.checkpoint``).
- ``host`` (optional): the host (CPU) time the framework's eager step spends per kernel it
  launches and per collective it issues (``simulator.host_time``: a block whose kernels
  are shorter than their dispatch runs at the host's pace); absent: dispatch is never the
  bound.

Inheritance: a profile file may start from another and state only what it changes,
``extends: <parent>`` -- a catalog name (``fsdp2``) or a YAML file (a path ending in
``.yaml``/``.yml``, relative to the child file's directory); the parent may itself extend
another. The child's fields go over the parent's (``simulator.profiles.inherit``): a section
(``kernels``, ``overlap``...) merges key by key, at any depth; a ``{value, provenance}`` pair
(or a plain field) is replaced whole, so a changed value comes with its own provenance. The
child states its own ``name`` (the parent's is never inherited). The merged mapping is then
validated as a whole profile, unknown keys still refused. Errors (ProfileError naming the
child file): an unknown parent, a profile that extends itself, a cycle (a extends b extends
a), a child field that the parent's schema does not have (naming the dotted field), a child
without ``name``; a bad parent is reported against the parent's file. Reading:
``simulator.profiles.loader``. In the catalog, ``fsdp2-eager`` and ``fsdp2-async-tp``
extend ``fsdp2``, ``megatron-2021-torch-ddp`` extends ``megatron-2021``, and
``megatron-bridge`` and ``nemo`` extend ``megatron-core``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clusters.spec import Count, Fraction, Latency, NonNegative, Positive
from completion.fp8 import FP8Weights
from simulator.errors import SimulatorError

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: memory-bound op groups a framework may run as one kernel (``simulator.fusion``)
FUSION_GROUPS = ("bias_gelu", "bias_dropout_add", "scale_mask_softmax", "norm", "rope",
                 "swiglu", "cross_entropy", "residual_add")
#: fusion groups whose fused kernel applies only to some shapes (``simulator.fusion``:
#: Megatron's fused softmax, ``softmax_kernel_available``): a profile may list one both as
#: fused and in ``kernels.eager``, the eager implementation being what runs where the
#: kernel does not apply
FALLBACK_GROUPS = ("scale_mask_softmax",)
#: how model states are counted (``simulator.model_states``)
STATE_MODELS = ("megatron", "megatron-ddp", "apex-distributed-adam", "deepspeed", "fsdp", "plain")


class ProfileError(SimulatorError):
    """A malformed or unknown framework profile; names the file and field at fault."""


class _Quantity(BaseModel):
    model_config = _STRICT
    provenance: str = Field(min_length=1)


class Flag(_Quantity):
    """A yes/no fact with its provenance (a YAML boolean, never a string)."""

    value: bool = Field(strict=True)


class Depth(_Quantity):
    """An integer >= 0 (a prefetch depth) with its provenance."""

    value: int = Field(ge=0, strict=True)


class Groups(_Quantity):
    """A list of fusion group names (:data:`FUSION_GROUPS`) with its provenance."""

    value: tuple[str, ...]

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [g for g in v if g not in FUSION_GROUPS]
        if bad:
            raise ValueError(f"unknown fusion group(s) {bad}; known: {list(FUSION_GROUPS)}")
        return v


class AttentionKernel(_Quantity):
    """The flash attention kernel a framework runs (its efficiency is the device's:
    ``device.efficiency.attention_kernels``): ``flash2``, ``cudnn``, ``triton``, ``flash3``."""

    value: Literal["flash2", "cudnn", "triton", "flash3"]


class CpAttention(_Quantity):
    """The context-parallel attention implementation a framework runs
    (``simulator.cp_impls.CP_IMPLS``): how its K/V exchange and merge kernels cost."""

    value: str = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _known(cls, v: str) -> str:
        from simulator.cp_impls import CP_IMPLS

        if v not in CP_IMPLS:
            raise ValueError(f"unknown cp attention implementation {v!r}; known: {sorted(CP_IMPLS)}")
        return v


class CpComms(_Quantity):
    """The context-parallel K/V exchanges a framework runs, as ``completion.strategy.CP_COMMS``
    names them (``p2p``: the ring; ``all_gather``); empty: the framework has no context
    parallelism."""

    value: tuple[str, ...]

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from completion.choices import CP_COMMS

        bad = [x for x in v if x not in CP_COMMS]
        if bad:
            raise ValueError(f"unknown cp exchange(s) {bad}; known: {list(CP_COMMS)}")
        return v


class AttentionChoice(_Quantity):
    """An attention implementation: ``flash`` or ``unfused``."""

    value: Literal["flash", "unfused"]


class P2PMode(_Quantity):
    """Pipeline send mode: ``async`` (a delay on the dependency) or ``sync`` (the exchange
    occupies both stages)."""

    value: Literal["async", "sync"]


class Accumulation(_Quantity):
    """Gradient accumulation: ``fused`` into the weight-gradient GEMM or ``separate`` adds."""

    value: Literal["fused", "separate"]


class GradDtype(_Quantity):
    """A gradient dtype: ``float32`` or ``same`` (the compute dtype)."""

    value: Literal["float32", "same"]


class StateModel(_Quantity):
    """How model states are held (:data:`STATE_MODELS`)."""

    value: Literal["megatron", "megatron-ddp", "apex-distributed-adam", "deepspeed", "fsdp", "plain"]


class MoeProbs(_Quantity):
    """Where a mixture-of-experts layer multiplies the router weights into the expert
    outputs (``simulator.memory.MOE_PROBS``): ``combine`` (the combine weights the expert
    outputs, so its backward reads them) or ``activation`` (the experts' activation
    multiplies them before the second GEMM, Megatron-Core's ``weighted_bias_swiglu``: the
    combine is a plain unpermute that keeps nothing for backward)."""

    value: Literal["combine", "activation"]


class EagerMap(_Quantity):
    """Fusion group -> the eager implementation the framework runs it as when the group
    is not fused (``simulator.eager_ops.EAGER_IMPLS``), with its provenance."""

    value: tuple[tuple[str, str], ...] = ()

    @field_validator("value", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        """A YAML mapping becomes sorted (group, implementation) pairs (hashable)."""
        return tuple(sorted(v.items())) if isinstance(v, dict) else v

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        from simulator.eager_ops import EAGER_IMPLS

        for group, name in v:
            impl = EAGER_IMPLS.get(name)
            if impl is None:
                raise ValueError(f"unknown eager implementation {name!r} for {group!r}; "
                                 f"known: {sorted(EAGER_IMPLS)}")
            if impl.group != group:
                raise ValueError(f"eager implementation {name!r} is of group {impl.group!r}, "
                                 f"not {group!r}")
        return v


_NO_EAGER = EagerMap(value=(), provenance="no eager decomposition: each op one kernel")


class SequenceParallel(_Quantity):
    """Whether the framework's tensor parallelism may run without sequence parallelism:
    ``optional`` (Megatron-LM's ``--sequence-parallel``) or ``always`` (its tensor-parallel
    plan shards the norms and dropouts along the sequence whenever tp > 1: torchtitan)."""

    value: Literal["optional", "always"]


class Kernels(BaseModel):
    """Kernel-level facts: fusion, eager implementations, attention and its
    context-parallel implementation (``cp_attention``; None: ``simulator.cp_impls``'s
    default) and the K/V exchanges it runs (``cp_comms``; None: every one, empty: no context
    parallelism; ``meshplan tune --search-cp`` searches cp only under a framework that runs
    it, and ``cost`` says when a plan's is not run), where MoE router weights are applied
    (``moe_probs``; None: ``combine``), and whether tensor parallelism runs without sequence
    parallelism (``sequence_parallel``; None: ``optional``; ``always``: ``meshplan tune``
    searches no tp > 1 plan without it)."""

    model_config = _STRICT
    fused: Groups
    compile: Flag
    attention: AttentionChoice
    attention_kernel: AttentionKernel
    eager: EagerMap = _NO_EAGER
    cp_attention: CpAttention | None = None
    cp_comms: CpComms | None = None
    moe_probs: MoeProbs | None = None
    sequence_parallel: SequenceParallel | None = None

    @field_validator("eager")
    @classmethod
    def _not_fused(cls, v: EagerMap, info: Any) -> EagerMap:
        fused = info.data.get("fused")
        both = sorted({g for g, _ in v.value} & set(fused.value if fused is not None else ())
                      - set(FALLBACK_GROUPS))
        if both:
            raise ValueError(f"group(s) {both} both fused and run eager")
        return v


class FsdpUnit(_Quantity):
    """What one ZeRO-3 all_gather / reduce_scatter moves: ``block`` (the flat parameters of
    a decoder layer, FSDP's wrapped unit) or ``tensor`` (one parameter tensor per call)."""

    value: Literal["block", "tensor"]


class Overlap(BaseModel):
    """What runs on a communication stream beside compute.

    ``fsdp_unit`` (absent: ``block``): the unit of a ZeRO-3 gather and reduce (FsdpUnit).
    ``fsdp_host_sync`` (absent: false): the host synchronises the device before each ZeRO-3
    gather, so no ZeRO-3 collective (gathers, and the gradient reduce_scatters before them)
    runs beside compute: every one is on the critical path
    (``simulator.stage_timing.StageTimer.stage_time``).
    ``fsdp_rank_copies`` (absent: false): ZeRO-3 calls the list forms of all_gather and
    reduce_scatter, for which torch's ProcessGroupNCCL copies each rank's slice between
    the list and a flat buffer in a kernel of its own: n copy kernels a call
    (``simulator.stage_timing.StageTimer.rank_copies_time``).
    ``fsdp_persist_below`` (absent: none): parameter tensors of fewer elements stay
    gathered between steps and are never all_gathered (``simulator.dp_groups.unit_sizes``)."""

    model_config = _STRICT
    tp_backward: Flag
    tp_forward: Flag
    dp_grad_reduce: Flag
    dp_param_gather: Flag
    fsdp_prefetch: Depth
    fsdp_reshard_after_forward: Flag
    comm_sms: Count
    fsdp_unit: FsdpUnit | None = None
    fsdp_host_sync: Flag | None = None
    fsdp_rank_copies: Flag | None = None
    fsdp_persist_below: Positive | None = None
    moe_a2a: Flag = Field(default_factory=lambda: Flag(
        value=False, provenance="default: one micro-batch's expert-parallel all-to-all is not run beside "
                                "another's compute (Megatron-Core --overlap-moe-expert-parallel-comm is off)"))
    """One micro-batch's expert-parallel all-to-all runs beside another micro-batch's compute
    inside a schedule's overlapped F&B pairs (``simulator.schedules.base.Schedule.pairs``:
    DualPipeV; DeepSeek-V3 report sec. 3.2.1, Fig. 4; Megatron-Core
    ``TransformerConfig.overlap_moe_expert_parallel_comm`` at d98e8a64); ``simulator.step``
    hides each pair's all-to-all behind the other pass's compute."""


class Schedules(_Quantity):
    """The pipeline schedules a framework runs, as ``completion.strategy.SCHEDULES`` names
    them (Megatron-LM: 1F1B and interleaved VPP; torchtitan's torch.distributed.pipelining
    also GPipe and ZB-V; this project's executor every one)."""

    value: tuple[str, ...] = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from completion.choices import SCHEDULES

        bad = [x for x in v if x not in SCHEDULES]
        if bad:
            raise ValueError(f"unknown schedule(s) {bad}; known: {list(SCHEDULES)}")
        return v


class ZeroStages(_Quantity):
    """ZeRO stages (0-3) a framework runs beside pipeline parallelism."""

    value: tuple[int, ...] = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [x for x in v if x not in (0, 1, 2, 3)]
        if bad:
            raise ValueError(f"ZeRO stages are 0-3, got {bad}")
        return v


class RecomputeModes(_Quantity):
    """The activation recompute modes a framework runs, as ``completion.strategy.RECOMPUTE``
    names them (Megatron-LM: none, selective, full; torchtitan: none, its op-level
    selective-op, full; DeepSpeed and FSDP1: whole layers, full)."""

    value: tuple[str, ...] = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from completion.choices import RECOMPUTE

        bad = [x for x in v if x not in RECOMPUTE]
        if bad:
            raise ValueError(f"unknown recompute mode(s) {bad}; known: {list(RECOMPUTE)}")
        return v


class Pipeline(BaseModel):
    """Pipeline point-to-point facts, the schedules the framework runs (``schedules``;
    absent: every schedule meshplan simulates) and the ZeRO stages it runs beside pp > 1
    (``zero_stages``; absent: every one). ``meshplan tune`` searches those by
    default, and ``cost`` / ``export`` say when a plan's schedule is not among them.
    ``fsdp_accumulate_unsharded`` (absent: false): with pp > 1 the pipeline runs every
    micro-batch's backward without FSDP's gradient sync and resharding, so a stage keeps
    its weights gathered and accumulates its gradients unsharded until one reduce_scatter
    after its last backward (torch.distributed.pipelining with FSDP2;
    ``simulator.dp_groups.accumulates_unsharded``)."""

    model_config = _STRICT
    p2p: P2PMode
    scatter_gather: Flag
    schedules: Schedules | None = None
    zero_stages: ZeroStages | None = None
    fsdp_accumulate_unsharded: Flag | None = None


class Gradients(BaseModel):
    """Gradient accumulation and reduction facts."""

    model_config = _STRICT
    accumulation: Accumulation
    main_grad: GradDtype
    reduce_dtype: GradDtype
    bucket_params: Positive


class Optimizer(BaseModel):
    """Optimizer implementation facts."""

    model_config = _STRICT
    master_weights: Flag
    fused: Flag


class Fixed(BaseModel):
    """Per-iteration work outside the layers."""

    model_config = _STRICT
    grad_norm_clip: Flag
    loss_scale_check: Flag
    embedding_grad_sync: Flag


class Memory(BaseModel):
    """What a process holds besides the plan's tensors (``simulator.step_memory``).

    Attributes:
        model_states: how weights, gradients and optimizer states are held
            (``simulator.model_states``); zero_stages: the ZeRO stages the framework offers
            (absent: 0-3; FSDP has no optimizer-only sharding, ZeRO-1); ddp_alone: ZeRO 0
            (replicated, DDP) runs only as the one parallel dimension: beside tp or pp the
            framework refuses it, and with cp it shards (torchtitan; absent: false).
        recompute: the activation recompute modes the framework runs (absent: every
            one); ``meshplan tune`` searches those.
        fragmentation: the caching allocator's reserved-but-unallocated bytes as a fraction
            of the allocated peak (PyTorch ``memory_reserved / memory_allocated - 1``).
        cuda_context_bytes: the CUDA context and library handles (outside the allocator).
        workspace_bytes: library workspaces allocated through the allocator (cuBLAS).
        nccl_buffer_bytes: NCCL's buffers per communicator (outside the allocator).
        loss_saved_bytes / loss_temp_bytes: bytes per local logit element the loss keeps
            from its forward to its backward, and the most it holds on top of that while
            it runs (the fp32 upcast and cross-entropy temporaries). Absent: the program's
            own cross_entropy_with_softmax (its softmax saved in the logits' dtype, its
            operands and results as the working set).
    """

    model_config = _STRICT
    model_states: StateModel
    zero_stages: ZeroStages | None = None
    ddp_alone: Flag | None = None
    recompute: RecomputeModes | None = None
    fragmentation: Fraction
    cuda_context_bytes: NonNegative
    workspace_bytes: NonNegative
    nccl_buffer_bytes: NonNegative
    loss_saved_bytes: NonNegative | None = None
    loss_temp_bytes: NonNegative | None = None


class ReplicaWrites(_Quantity):
    """Who writes a tensor that several data-parallel ranks hold alike in a checkpoint:
    ``balanced`` (each replicated tensor goes to one of its holders, spreading the bytes
    over them: Megatron-LM's fully parallel save, torch DCP's deduplicated save plans) or
    ``first`` (the first data-parallel rank writes every replicated tensor)."""

    value: Literal["balanced", "first"]


class Checkpoint(BaseModel):
    """How the framework saves a checkpoint (``simulator.goodput.checkpoint``):
    ``async_save`` (it can snapshot the states to host memory and write them in the
    background while training goes on) and ``replicas`` (:class:`ReplicaWrites`)."""

    model_config = _STRICT
    async_save: Flag
    replicas: ReplicaWrites


#: the checkpoint facts of a profile that states none: a synchronous ``torch.save`` of each
#: replicated tensor by the first data-parallel rank (the plain PyTorch recipe)
DEFAULT_CHECKPOINT = Checkpoint(
    async_save=Flag(value=False, provenance="the profile states no checkpoint facts: a synchronous save"),
    replicas=ReplicaWrites(value="first", provenance="the profile states no checkpoint facts: the "
                           "first data-parallel rank writes the replicated tensors"))


class Host(BaseModel):
    """Host (CPU) dispatch time of the framework's eager training step
    (``simulator.host_time``), seconds.

    Attributes:
        kernel_launch_s: host seconds per GPU kernel the step launches: the Python of the
            framework's modules and autograd functions, PyTorch's dispatcher and autograd
            recording, and ``cudaLaunchKernel``, spread over the kernels they launch.
        collective_launch_s: host seconds per collective it issues (``torch.distributed``
            and NCCL's enqueue) beyond a kernel launch (absent: 0).
    """

    model_config = _STRICT
    kernel_launch_s: Latency
    collective_launch_s: Latency | None = None


class Fp8(BaseModel):
    """How the framework holds the weights of its FP8 linears (``completion.fp8``: the
    ``fp8_weight_cache`` and ``fp8_param`` attributes it sets on the program).

    Attributes:
        weight_cache: the FP8 copy of each weight is cast once per step and kept across the
            micro-batches (Megatron-Core passes ``is_first_microbatch`` to Transformer
            Engine), rather than cast in every forward.
        params: the weights themselves are FP8 parameters (Megatron ``--fp8-param-gather``,
            NeMo ``fp8_params``): 1 + 1 bytes per element replace the 16-bit weight.
    """

    model_config = _STRICT
    weight_cache: Flag
    params: Flag


class Family(_Quantity):
    """The framework family whose measured runs stand for the profile's (the error band's
    regime, ``simulator.error_band``): ``megatron``, ``fsdp``, ``deepspeed`` or ``eager``."""

    value: Literal["megatron", "fsdp", "deepspeed", "eager"]


class ProfileSpec(BaseModel):
    """A whole framework profile as read from YAML; ``family`` the framework family of its
    measured runs; ``checkpoint`` (optional, :data:`DEFAULT_CHECKPOINT` when absent) says
    how it saves; ``fp8`` (optional) how it holds the weights of FP8 linears."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    description: str = ""
    family: Family
    kernels: Kernels
    overlap: Overlap
    pipeline: Pipeline
    gradients: Gradients
    optimizer: Optimizer
    fixed: Fixed
    memory: Memory
    checkpoint: Checkpoint | None = None
    host: Host | None = None
    fp8: Fp8 | None = None

    @property
    def fp8_weights(self) -> FP8Weights:
        """The :class:`completion.fp8.FP8Weights` of :attr:`fp8` (a profile that states no
        FP8 facts casts every weight in every forward and keeps 16-bit parameters)."""
        if self.fp8 is None:
            return FP8Weights()
        return FP8Weights(cache=self.fp8.weight_cache.value, params=self.fp8.params.value)

    @property
    def checkpointing(self) -> Checkpoint:
        """:attr:`checkpoint`, or :data:`DEFAULT_CHECKPOINT` when the profile states none."""
        return self.checkpoint or DEFAULT_CHECKPOINT
