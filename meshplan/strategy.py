"""``Strategy``: how one training step is split over the cluster.

Fields follow Megatron-LM / PaddlePaddle auto-parallel names: dp x mp x pp ranks (data,
tensor/model, pipeline parallel), ``vpp`` model chunks per pipeline rank, the pipeline
``schedule_mode``, micro-batch and global batch sizes (sequences), activation
``recompute``, ZeRO ``sharding_stage`` over the dp group, Megatron ``sequence_parallel``,
the compute ``dtype`` and the intra-op ``annotation``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

SCHEDULE_MODES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBH2", "ZBVPP", "ZB", "ZB-1p", "ZB-2p")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bfloat16", "float16", "float32")
OPTIMIZERS = ("adamw", "adam", "sgd")
_INT_FIELDS = ("dp", "mp", "pp", "vpp", "micro_batch_size", "global_batch_size")


class StrategyError(ValueError):
    """An invalid strategy; the message names the field at fault."""


def _placement_ok(p: Any) -> bool:
    s = str(p).replace(" ", "")
    if s in ("R", "Replicate()", "P", "Partial()"):
        return True
    if not s.endswith(")"):
        return False
    if s.startswith(("S(", "Shard(")):
        inner = s[s.index("(") + 1:-1]
        return inner.lstrip("-").isdigit()
    return s.startswith("Partial(") and s[8:-1].lower() in ("sum", "avg", "mean", "max", "min")


@dataclass(frozen=True)
class Strategy:
    """A parallel strategy (frozen, hashable except for a mapping annotation).

    Attributes:
        dp, mp, pp: data / tensor (model) / pipeline parallel degrees (>= 1).
        vpp: model chunks per pipeline rank (1; > 1 needs VPP, exactly 2 for ZBVPP).
        schedule_mode: FThenB, 1F1B, VPP, ZBH1, ZBH2, ZBVPP, ZB (ZB-2p), ZB-1p or ZB-2p.
        micro_batch_size: sequences per micro-batch; global_batch_size: sequences per step,
            a multiple of dp * micro_batch_size (m = global / (dp * micro)).
        recompute: none | selective | full. sharding_stage: ZeRO stage 0-3 over dp.
        sequence_parallel: Megatron sequence parallelism (needs mp > 1).
        dtype: bfloat16 | float16 | float32. optimizer: adamw | adam | sgd.
        annotation: "megatron", "none", or a mapping value name -> placements (one
            placement string per mesh dim, e.g. ``["Replicate()", "Shard(1)"]``).

    Raises:
        StrategyError: naming the first invalid field.
    """

    dp: int = 1
    mp: int = 1
    pp: int = 1
    vpp: int = 1
    schedule_mode: str = "1F1B"
    micro_batch_size: int = 1
    global_batch_size: int = 1
    recompute: str = "none"
    sharding_stage: int = 0
    sequence_parallel: bool = False
    dtype: str = "bfloat16"
    optimizer: str = "adamw"
    annotation: Any = field(default="megatron")

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise StrategyError(f"strategy field {name!r} must be an integer >= 1, got {v!r}")
        self._check_choices()
        self._check_combinations()
        ann = self.annotation
        if isinstance(ann, Mapping):
            for k, pl in ann.items():
                if not isinstance(pl, (list, tuple)) or not all(_placement_ok(p) for p in pl):
                    raise StrategyError(
                        f"strategy field 'annotation': value {k!r} needs a list of placements "
                        f"(Shard(i), Replicate(), Partial(sum)), got {pl!r}")
            object.__setattr__(self, "annotation", {str(k): [str(p) for p in v] for k, v in ann.items()})
        elif ann not in ("megatron", "none"):
            raise StrategyError(f"strategy field 'annotation' must be 'megatron', 'none' or a "
                                f"mapping value name -> placements, got {ann!r}")

    def _check_choices(self) -> None:
        for name, allowed in (("schedule_mode", SCHEDULE_MODES), ("recompute", RECOMPUTE),
                              ("dtype", DTYPES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in allowed:
                raise StrategyError(f"strategy field {name!r} must be one of {list(allowed)}, "
                                    f"got {getattr(self, name)!r}")
        if self.sharding_stage not in (0, 1, 2, 3) or isinstance(self.sharding_stage, bool):
            raise StrategyError(f"strategy field 'sharding_stage' must be 0, 1, 2 or 3, got {self.sharding_stage!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise StrategyError(f"strategy field 'sequence_parallel' must be true or false, got {self.sequence_parallel!r}")

    def _check_combinations(self) -> None:
        per_step = self.dp * self.micro_batch_size
        if self.global_batch_size % per_step:
            raise StrategyError(
                f"strategy field 'global_batch_size' ({self.global_batch_size}) must be a multiple "
                f"of dp * micro_batch_size = {per_step}")
        if self.schedule_mode == "ZBVPP" and self.vpp != 2:
            raise StrategyError(f"strategy field 'vpp' must be 2 for ZBVPP (two chunks per rank in a V), got {self.vpp}")
        if self.vpp > 1 and self.schedule_mode not in ("VPP", "ZBVPP"):
            raise StrategyError(f"strategy field 'vpp' is {self.vpp} but schedule_mode "
                                f"{self.schedule_mode!r} runs one chunk per rank; use VPP")
        if self.sequence_parallel and self.mp == 1:
            raise StrategyError("strategy field 'sequence_parallel' needs mp > 1")

    # -- derived ---------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks the strategy uses: dp * mp * pp."""
        return self.dp * self.mp * self.pp

    @property
    def num_microbatches(self) -> int:
        """m: micro-batches per pipeline per step."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline rank (= ``vpp``; 2 for ZBVPP)."""
        return self.vpp

    def schedule(self) -> tuple[str, float | None]:
        """(registered schedule name, ZB memory limit in units of M_B or None):
        ZB-1p -> ("ZB", pp), ZB-2p and ZB -> ("ZB", 2 pp) (Qi et al. 2024)."""
        if self.schedule_mode == "ZB-1p":
            return "ZB", float(self.pp)
        if self.schedule_mode in ("ZB-2p", "ZB"):
            return "ZB", float(2 * self.pp)
        return self.schedule_mode, None

    def replace(self, **kw: Any) -> Strategy:
        """A copy with the fields in ``kw`` changed; re-validated (raises StrategyError)."""
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (every field; JSON-ready); :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Strategy:
        """Inverse of :meth:`to_dict`; unknown keys raise StrategyError naming them."""
        if not isinstance(data, Mapping):
            raise StrategyError(f"a strategy must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise StrategyError(f"unknown strategy field(s) {extra}; known: {sorted(known)}")
        return cls(**dict(data))
