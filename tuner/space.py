"""The strategy search space: what a candidate plan is and which values each knob may take.

A :class:`Candidate` is one point: the process mesh ``dp x cp x tp x pp`` (their product =
world size; cp, context parallelism, is searched only over ``SearchSpace.cp_degrees``, by
default just 1, or pinned with ``--fix cp=N``), the virtual pipeline degree ``vpp``, the pipeline schedule, the micro-batch size (the
number of micro-batches follows from the global batch: m = B / (dp * mbs)), activation
recompute, the ZeRO stage over the data-parallel group, the HSDP shard group of ZeRO-3
(``fsdp_shard_size``: searched over the divisors N of dp with 2 <= N < dp when
``SearchSpace.hsdp`` is set, else None = shard over all of dp), Megatron sequence
parallelism and the intra-op annotation (pattern templates, a full_random seed, or the
user's annotation).

A :class:`SearchProblem` is what the search is about (model dims, cluster shape, batch and
sequence); a :class:`SearchSpace` lists the allowed values of each knob for that problem,
with ``fix`` pinning any of them (``--fix dp=8,tp=8``).

The knob names are the project's one vocabulary (``completion.strategy``: ``dp``, ``tp``,
``pp``, ``vpp``, ``schedule``, ``micro_batch_size``, ``recompute``, ``zero``,
``sequence_parallel``); ``--fix`` also reads ``mp``, ``mbs``, ``sp``, ``sharding_stage`` and
``schedule_mode``. ``history.csv`` uses the same names (``tuner.result``; PaddlePaddle's
auto-tuner column names only through ``tuner.result.paddle_view``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from completion import choices
from completion.models.config import MAX_MODEL_SIZES
from completion.strategy import FP8_RECIPES, MAX_BATCH, StrategyError, canonical_schedule
from tuner.errors import TunerError

#: Pipeline schedules the tuner searches (ZB is ZB-2p of Qi et al. 2024).
SCHEDULES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBVPP", "ZB")
#: Schedules a search may be pinned to (``--fix schedule=...``, ``--schedule``): the searched
#: ones and the engine's ZB-H2 and ZB-1p, which no search tries unasked.
PINNABLE_SCHEDULES = (*SCHEDULES, "ZBH2", "ZB-1p")


def tuner_schedule(name: Any) -> str:
    """A schedule name in the tuner's vocabulary: any spelling ``cost --schedule`` takes
    (case-insensitive; aliases such as ``GPipe``, ``ZB-V``; ``completion.strategy.
    canonical_schedule``), with ZB-2p as ``ZB``. Raises SpaceError naming the known ones."""
    try:
        canon = canonical_schedule(name)
    except StrategyError:
        raise SpaceError(f"schedule {name!r} is not one of {list(PINNABLE_SCHEDULES)} (or their "
                         "aliases, as cost's --schedule takes them)") from None
    return "ZB" if canon == "ZB-2p" else canon
#: Recompute modes a space may hold (``completion.choices.RECOMPUTE``, the one list:
#: ``selective-op`` is torchtitan's op-level selective checkpointing); :data:`DEFAULT_RECOMPUTE`
#: is a space's default (``meshplan tune`` searches the framework's, ``meshplan.tune_setup``).
RECOMPUTE = choices.RECOMPUTE
DEFAULT_RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MODES = ("pattern-based", "full_random", "semi-auto")
#: Knobs that ``fix`` may pin, with their types.
FIXABLE: dict[str, type] = {
    "dp": int, "tp": int, "pp": int, "vpp": int, "schedule": str, "micro_batch_size": int,
    "recompute": str, "zero": int, "sequence_parallel": bool, "cp": int, "fsdp_shard_size": int,
    "fp8": str, "ep": int,
}
_FIX_ALIASES = {"hsdp": "fsdp_shard_size", "mbs": "micro_batch_size", "sharding_stage": "zero", "sp": "sequence_parallel",
                "schedule_mode": "schedule", "mp": "tp", "context_parallel_size": "cp"}


class SpaceError(TunerError):
    """A bad search problem or space; the message names the field at fault."""


@dataclass(frozen=True)
class ModelDims:
    """The model sizes legality needs (a view of ``completion.models.ModelConfig``).

    Attributes: num_layers (l), hidden_size (h), num_heads (a), num_kv_heads, ffn_hidden_size,
    vocab_size (V); num_experts (E: routed experts of a mixture-of-experts model, 0 for a
    dense one); name for messages.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_experts: int = 0

    @classmethod
    def of(cls, cfg: Any) -> ModelDims:
        """From any object with ModelConfig's attribute names. A config whose experts no
        layer uses (``is_moe_layer`` false everywhere: ``mlp_only_layers`` naming every
        layer, a ``decoder_sparse_step`` above the depth) is dense: 0 experts."""
        experts = int(getattr(cfg, "num_experts", None) or 0)
        has_moe = getattr(cfg, "has_moe_layers", None)  # a ModelConfig (duck-typed views lack it)
        if experts and has_moe is not None and not has_moe():
            experts = 0
        return cls(str(cfg.name), cfg.num_layers, cfg.hidden_size, cfg.num_heads,
                   cfg.num_kv_heads, cfg.ffn_hidden_size, cfg.vocab_size, experts)


#: Largest value of each SearchProblem size (issue 16 item 8): ranks as a cluster may have
#: (``clusters.spec.MAX_WORLD_SIZE``), sequences per step as a Strategy may take
#: (``completion.strategy.MAX_BATCH``), tokens per sequence as a model config may give
#: (``completion.models.config.MAX_MODEL_SIZES``).
PROBLEM_BOUNDS = {"world_size": 2**20, "devices_per_node": 2**20, "global_batch_size": MAX_BATCH,
                  "seq_len": MAX_MODEL_SIZES["seq_len"]}


@dataclass(frozen=True)
class SearchProblem:
    """What is searched: a model on a cluster at a batch and sequence length.

    Attributes:
        model: the model sizes; world_size: GPUs; devices_per_node: GPUs per node (tensor
        parallelism stays inside one unless ``allow_cross_node_tp``); global_batch_size:
        sequences per step; seq_len: tokens per sequence; uneven_pp: allow a layer count not
        divisible by pp (stages differ by at most one layer); pp_zero_stages: the ZeRO
        stages the framework runs beside pp > 1 (None: every one); ddp_alone: ZeRO 0 only as
        the one parallel dimension (``tuner.legality.zero0_alone``, torchtitan); sp_always:
        tp > 1 only with sequence parallelism (``tuner.legality.sequence_parallel_always``,
        torchtitan).

    Raises SpaceError naming the field when a number is not a positive integer.
    """

    model: ModelDims
    world_size: int
    devices_per_node: int
    global_batch_size: int
    seq_len: int
    allow_cross_node_tp: bool = False
    uneven_pp: bool = False
    pp_zero_stages: tuple[int, ...] | None = None
    ddp_alone: bool = False
    sp_always: bool = False

    def __post_init__(self) -> None:
        if self.pp_zero_stages is not None:
            object.__setattr__(self, "pp_zero_stages", tuple(self.pp_zero_stages))
        for name in ("world_size", "devices_per_node", "global_batch_size", "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpaceError(f"search problem field {name!r} must be an integer >= 1, got {v!r}")
            if v > PROBLEM_BOUNDS[name]:
                raise SpaceError(f"search problem field {name!r} is {v}, above the limit of "
                                 f"{PROBLEM_BOUNDS[name]} (tuner.space.PROBLEM_BOUNDS)")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready; ``model`` as a nested dict, without
        ``num_experts`` for a dense model, as studies written before MoE hold it)."""
        d = asdict(self)
        if not d["model"].get("num_experts"):
            d["model"].pop("num_experts", None)
        if d["pp_zero_stages"] is None:  # absent, as in studies stored before the field
            del d["pp_zero_stages"]
        if not d["ddp_alone"]:  # likewise
            del d["ddp_alone"]
        if not d["sp_always"]:  # likewise
            del d["sp_always"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SearchProblem:
        """Inverse of ``to_dict``. Raises SpaceError on out-of-range fields (``__post_init__``)."""
        d = dict(d)
        return cls(model=ModelDims(**d.pop("model")), **d)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (hashable; equal candidates are the same plan).

    ``templates`` is a sorted tuple of (pattern kind, template name) for pattern-based
    search; ``annotation_seed`` seeds the random dims_mappings of full_random; both empty /
    None for semi-auto (the user's annotation, ``annotation`` names it).
    ``fsdp_shard_size``: the HSDP shard group of ZeRO-3 (``completion.strategy``), None:
    shard over all of dp. ``fp8``: the FP8 training recipe of the decoder linears
    (``completion.strategy.FP8_RECIPES``), None: none. ``ep``: expert-parallel ranks of a
    mixture-of-experts model (``completion.strategy.Strategy.ep``; 1 for a dense one);
    ``etp``: its expert tensor-parallel degree (``Strategy.etp``; None: tp, 1: whole experts
    folded over tensor-parallel ranks too, ``completion.expert_layout``).
    """

    dp: int
    tp: int
    pp: int
    vpp: int = 1
    schedule: str = "1F1B"
    micro_batch_size: int = 1
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    templates: tuple[tuple[str, str], ...] = ()
    annotation_seed: int | None = None
    annotation: str = "megatron"
    cp: int = 1
    fsdp_shard_size: int | None = None
    fp8: str | None = None
    ep: int = 1
    etp: int | None = None

    @property
    def world_size(self) -> int:
        """Ranks the plan uses: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    def num_microbatches(self, global_batch_size: int) -> int:
        """m = B / (dp * mbs) (integer division; legality checks divisibility)."""
        return global_batch_size // (self.dp * self.micro_batch_size)

    def key(self) -> tuple[Any, ...]:
        """Identity of the plan (the cache key)."""
        return astuple_fast(self)

    def template_dict(self) -> dict[str, str]:
        """Pattern kind -> template name (empty unless pattern-based)."""
        return dict(self.templates)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready; ``templates`` as a dict). ``fsdp_shard_size`` and
        ``fp8`` are left out when None, so that a plan's record (and its dedup key) is the one studies
        written before HSDP hold."""
        d = asdict(self)
        d["templates"] = dict(self.templates)
        for opt_in in ("fsdp_shard_size", "fp8", "etp"):  # opt-in knobs: absent when unset
            if d[opt_in] is None:
                del d[opt_in]
        if d["ep"] == 1:  # absent for a dense plan, as in studies written before MoE
            del d["ep"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        """Inverse of ``to_dict`` (``templates`` back to a sorted tuple of pairs)."""
        d = dict(d)
        d["templates"] = tuple(sorted(dict(d.get("templates") or {}).items()))
        return cls(**d)

    def replace(self, **kw: Any) -> Candidate:
        """A copy with the fields in ``kw`` changed (``dataclasses.replace``)."""
        return replace(self, **kw)


def astuple_fast(c: Candidate) -> tuple[Any, ...]:
    """The fields of ``c`` as a tuple, in declaration order (what ``dataclasses.astuple``
    returns, without its deep copies); used as the candidate's cache key."""
    return (c.dp, c.tp, c.pp, c.vpp, c.schedule, c.micro_batch_size, c.recompute,
            c.zero, c.sequence_parallel, c.templates, c.annotation_seed, c.annotation, c.cp,
            c.fsdp_shard_size, c.fp8, c.ep, c.etp)


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_fix(text: str | None) -> dict[str, Any]:
    """``"dp=8,tp=8,schedule=VPP,sp=true"`` -> ``{"dp": 8, "tp": 8, ...}``.

    Raises SpaceError naming the unknown knob or the bad value."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise SpaceError(f"--fix item {item!r} is not NAME=VALUE")
        k, v = (s.strip() for s in item.split("=", 1))
        k = _FIX_ALIASES.get(k, k)
        if k not in FIXABLE:
            raise SpaceError(f"--fix: unknown knob {k!r}; known: {sorted(FIXABLE)}")
        if k in out:
            raise SpaceError(f"--fix: knob {k!r} is given twice (in {text!r})")
        typ = FIXABLE[k]
        if k == "schedule":
            try:
                out[k] = tuner_schedule(v)
            except SpaceError as e:
                raise SpaceError(f"--fix: {e}") from None
            continue
        try:
            if typ is bool:
                if v.lower() not in ("true", "false", "1", "0"):
                    raise TunerError(v)
                out[k] = v.lower() in ("true", "1")
            else:
                out[k] = typ(v)
        except ValueError:
            raise SpaceError(f"--fix: {k}={v!r} is not a valid {typ.__name__}") from None
    return out


_FIX_CHOICES: dict[str, tuple[Any, ...]] = {
    "schedule": PINNABLE_SCHEDULES, "recompute": RECOMPUTE, "zero": ZERO_STAGES,
    "sequence_parallel": (False, True), "fp8": ("none", *FP8_RECIPES)}


def _check_fix(fix: Mapping[str, Any], world_size: int) -> None:
    """Each pinned value is one the knob can take: a known schedule / recompute / ZeRO
    stage, an integer >= 1 for degrees and sizes, and dp, tp, pp, cp (and their product)
    dividing the world size. Raises SpaceError naming the knob and value."""
    for k, v in fix.items():
        if k in _FIX_CHOICES:
            if v not in _FIX_CHOICES[k] or isinstance(v, bool) != (k == "sequence_parallel"):
                raise SpaceError(f"--fix: {k}={v!r} is not one of {list(_FIX_CHOICES[k])}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpaceError(f"--fix: {k}={v!r} must be an integer >= 1")
    mesh = {k: fix[k] for k in ("dp", "tp", "pp", "cp") if k in fix}
    prod = 1
    for v in mesh.values():
        prod *= v
    if world_size % prod:
        pinned = ",".join(f"{k}={v}" for k, v in mesh.items())
        raise SpaceError(f"--fix: {pinned} does not divide the world size {world_size} "
                         f"(dp * tp * pp * cp must equal it)")
    if all(k in mesh for k in ("dp", "tp", "pp")) and "cp" not in fix and prod != world_size:
        raise SpaceError(f"--fix: dp*tp*pp = {prod} but the world size is {world_size}")
    if len(mesh) == 4 and prod != world_size:
        raise SpaceError(f"--fix: dp*tp*pp*cp = {prod} but the world size is {world_size}")


@dataclass(frozen=True)
class SearchSpace:
    """Allowed values per knob for one problem.

    Attributes:
        problem: the :class:`SearchProblem`.
        schedules, vpp_degrees (> 1, used with VPP / ZBVPP), micro_batch_sizes, recompute,
        zero_stages, sequence_parallel, cp_degrees (context parallelism; default (1,): the
        search adds cp only when asked): allowed values.
        fix: knob -> pinned value (overrides the lists).
        hsdp: also search HSDP shard groups with ZeRO-3 (:meth:`shard_choices`); default
        False keeps the space (and its candidate count) of plain ZeRO.
        fp8_recipes: FP8 recipes to try (None: BF16 linears); default (None,): the search
        adds FP8 only when asked (FP8 changes the numerics, not only the speed).
    """

    problem: SearchProblem
    schedules: tuple[str, ...] = SCHEDULES
    vpp_degrees: tuple[int, ...] = (2, 4)
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = DEFAULT_RECOMPUTE
    zero_stages: tuple[int, ...] = ZERO_STAGES
    sequence_parallel: tuple[bool, ...] = (False, True)
    fix: Mapping[str, Any] = field(default_factory=dict)
    cp_degrees: tuple[int, ...] = (1,)
    hsdp: bool = False
    fp8_recipes: tuple[str | None, ...] = (None,)

    def __post_init__(self) -> None:
        bad_f = [f for f in self.fp8_recipes if f is not None and f not in FP8_RECIPES]
        if not self.fp8_recipes or bad_f:
            raise SpaceError(f"search space: unknown fp8 recipe(s) {bad_f or '(none given)'}; known: "
                             f"{list(FP8_RECIPES)} and None")
        if not isinstance(self.hsdp, bool):
            raise SpaceError(f"search space: hsdp must be true or false, got {self.hsdp!r}")
        bad = [s for s in self.schedules if s not in SCHEDULES]
        if bad:
            raise SpaceError(f"search space: unknown schedule(s) {bad}; known: {list(SCHEDULES)}")
        bad_r = [r for r in self.recompute if r not in RECOMPUTE]
        if bad_r:
            raise SpaceError(f"search space: unknown recompute {bad_r}; known: {list(RECOMPUTE)}")
        if not self.cp_degrees or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                      for c in self.cp_degrees):
            raise SpaceError(f"search space: cp_degrees must be integers >= 1, got {list(self.cp_degrees)}")
        for k in self.fix:
            if k not in FIXABLE:
                raise SpaceError(f"search space: cannot fix unknown knob {k!r}")
        _check_fix(self.fix, self.problem.world_size)
        ep, experts = self.fix.get("ep", 1), self.problem.model.num_experts
        if ep > 1 and experts <= 1:
            raise SpaceError(f"--fix: ep={ep} but model {self.problem.model.name} has no "
                             "mixture-of-experts layer (of more than one expert)")
        if ep > 1 and experts % ep:
            raise SpaceError(f"--fix: ep={ep} does not divide the model's {experts} experts "
                             "(each expert-parallel rank holds an equal share)")
        layers = self.problem.model.num_layers
        if "pp" in self.fix and self.fix["pp"] > layers:
            raise SpaceError(f"--fix: pp={self.fix['pp']} exceeds the model's {layers} layers")
        if "pp" in self.fix and layers % self.fix["pp"] and not self.problem.uneven_pp:
            # every trial would be pruned (tuner.legality.pp_divides_layers), and no number
            # of trials could help: refused before the search
            raise SpaceError(f"--fix: pp={self.fix['pp']} does not divide the model's {layers} layers "
                             f"(the search keeps the layers even over its stages; `meshplan cost "
                             f"--pp {self.fix['pp']}` costs an uneven split)")
        if self.fix.get("vpp", 1) > 1 and not set(self.schedule_choices()) & {"VPP", "ZBVPP"}:
            raise SpaceError(f"--fix: vpp={self.fix['vpp']} needs an interleaved schedule (VPP or "
                             f"ZBVPP), and the search tries {list(self.schedule_choices())} (the "
                             "framework's: --all-schedules or another --framework widens it)")
        chunks = self.fix.get("pp", 1) * self.fix.get("vpp", 1)
        uneven = self.problem.uneven_pp
        if self.fix.get("vpp", 1) > 1 and "pp" in self.fix and (chunks > layers if uneven else layers % chunks):
            raise SpaceError(f"--fix: pp={self.fix['pp']} x vpp={self.fix['vpp']} = {chunks} virtual "
                             f"stages {'exceed' if uneven else 'do not divide'} the model's {layers} layers")
        object.__setattr__(self, "fix", dict(self.fix))

    # choices per knob, after fix -------------------------------------------------------
    def _pick(self, name: str, options: tuple[Any, ...] | list[Any]) -> list[Any]:
        return [self.fix[name]] if name in self.fix else list(options)

    def tp_choices(self) -> list[int]:
        """Tensor-parallel degrees to try: the fixed value, else every divisor of the world size."""
        return self._pick("tp", divisors(self.problem.world_size))

    def pp_choices(self) -> list[int]:
        """Pipeline degrees to try: the fixed value, else every divisor of the world size."""
        return self._pick("pp", divisors(self.problem.world_size))

    def schedule_choices(self) -> list[str]:
        """Pipeline schedules to try: the fixed value, else ``schedules``."""
        return self._pick("schedule", self.schedules)

    def vpp_choices(self) -> list[int]:
        """VPP degrees (chunks per rank) to try: the fixed value, else ``vpp_degrees``."""
        return self._pick("vpp", self.vpp_degrees)

    def mbs_choices(self) -> list[int]:
        """Micro-batch sizes to try: the fixed value, else ``micro_batch_sizes``."""
        return self._pick("micro_batch_size", self.micro_batch_sizes)

    def recompute_choices(self) -> list[str]:
        """Recompute modes to try: the fixed value, else ``recompute``."""
        return self._pick("recompute", self.recompute)

    def zero_choices(self) -> list[int]:
        """ZeRO stages to try: the fixed value, else ``zero_stages``."""
        return self._pick("zero", self.zero_stages)

    def cp_choices(self) -> list[int]:
        """Context-parallel degrees to try: the fixed value, else ``cp_degrees``."""
        return self._pick("cp", self.cp_degrees)

    def shard_choices(self, dp: int, zero: int) -> list[int | None]:
        """HSDP shard groups to try for a candidate with ``dp`` and ZeRO stage ``zero``:
        the fixed value; else, with :attr:`hsdp` and zero 3, None (shard over all of dp)
        and every divisor N of dp with 2 <= N < dp; else [None]."""
        if "fsdp_shard_size" in self.fix:
            return [self.fix["fsdp_shard_size"]]
        if not self.hsdp or zero != 3:
            return [None]
        return [None] + [n for n in divisors(dp) if 2 <= n < dp]

    def ep_choices(self, dp: int, cp: int, zero: int, tp: int = 1) -> list[tuple[int, int | None]]:
        """(ep, etp) pairs to try for a candidate with ``dp``, ``cp``, ``tp`` and ZeRO stage
        ``zero``: the fixed ep (etp None when it divides dp x cp, else 1); else, for a
        mixture-of-experts model with zero <= 1, every ep dividing its experts that folds
        onto the stage (``completion.expert_layout``): ep | dp x cp with etp = tp (None), and
        with tp > 1 the multiples of tp dividing dp x cp x tp with etp 1 (whole experts over
        tensor-parallel ranks too); else [(1, None)]."""
        if "ep" in self.fix:
            ep = self.fix["ep"]
            return [(ep, None if (dp * cp) % ep == 0 else 1)]
        experts = self.problem.model.num_experts
        if experts <= 1 or zero > 1:
            return [(1, None)]
        out: list[tuple[int, int | None]] = [(e, None) for e in divisors(dp * cp) if experts % e == 0]
        if tp > 1:
            out += [(e, 1) for e in divisors(dp * cp * tp) if e % tp == 0 and experts % e == 0]
        return out

    def fp8_choices(self) -> list[str | None]:
        """FP8 recipes to try: the fixed value (``--fix fp8=te-delayed``; ``none``: None),
        else :attr:`fp8_recipes`."""
        if "fp8" in self.fix:
            v = self.fix["fp8"]
            return [None if v == "none" else v]
        return list(self.fp8_recipes)

    def sp_choices(self) -> list[bool]:
        """Sequence-parallel flags to try: the fixed value, else ``sequence_parallel``."""
        return self._pick("sequence_parallel", self.sequence_parallel)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready; the problem nested, ``fix`` a plain dict).
        ``hsdp`` is left out when False, so that a study stored before HSDP resumes."""
        d = asdict(self)
        d["problem"] = self.problem.to_dict()
        d["fix"] = dict(self.fix)
        if not d["hsdp"]:
            del d["hsdp"]
        if d["fp8_recipes"] == (None,):  # a study stored before the FP8 dimension resumes
            del d["fp8_recipes"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SearchSpace:
        """Inverse of ``to_dict`` (lists back to tuples). Raises SpaceError as the constructor does."""
        d = dict(d)
        prob = SearchProblem.from_dict(d.pop("problem"))
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(problem=prob, **fields)


def iter_base_candidates(space: SearchSpace) -> Iterator[Candidate]:
    """Every combination of the non-annotation knobs (legal or not), in a fixed order.

    vpp is 1 for schedules other than VPP / ZBVPP; dp = world / (tp * pp * cp) (combinations
    where that is not an integer, or contradicts a fixed dp, are skipped); with dp = 1 the
    ZeRO stage is 0, pinned or not (sharding over one rank is no sharding, the plan of
    stage 0: ``tuner.legality.zero_needs_dp``)."""
    w = space.problem.world_size
    for tp, pp, cp in itertools.product(space.tp_choices(), space.pp_choices(), space.cp_choices()):
        if w % (tp * pp * cp):
            continue
        dp = w // (tp * pp * cp)
        if "dp" in space.fix and space.fix["dp"] != dp:
            continue
        # a ZeRO stage over one data-parallel rank shards nothing: stage 0 (also when pinned)
        zeros = [0] if dp == 1 else space.zero_choices()
        for sched in space.schedule_choices():
            vpps = space.vpp_choices() if sched in ("VPP", "ZBVPP") else [1]
            for vpp, mbs, rc, z, sp in itertools.product(
                    vpps, space.mbs_choices(), space.recompute_choices(), zeros,
                    space.sp_choices()):
                for shard, fp8, (ep, etp) in itertools.product(space.shard_choices(dp, z), space.fp8_choices(),
                                                               space.ep_choices(dp, cp, z, tp)):
                    yield Candidate(dp, tp, pp, vpp, sched, mbs, rc, z, sp, cp=cp,
                                    fsdp_shard_size=shard, fp8=fp8, ep=ep, etp=etp)
