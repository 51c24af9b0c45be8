"""Program passes after completion: :func:`apply_partition_pass` inserts ``reshard`` ops
where a value's layout differs from what its user needs (:mod:`completion.passes.partition`);
:func:`apply_reshard_pass` resolves each into collectives and local steps
(:mod:`completion.passes.reshard`); :func:`rank_program` is one rank's view."""

from completion.passes.partition import apply_partition_pass
from completion.passes.reshard import RankOp, apply_reshard_pass, rank_program

__all__ = ["RankOp", "apply_partition_pass", "apply_reshard_pass", "rank_program"]
