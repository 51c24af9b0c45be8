"""executor: runs a plan on torch.distributed, measures it and verifies its numerics.

Public API: :func:`run_plan` -> :class:`Measurement`, :func:`verify` / :func:`verify_many`
-> :class:`VerifyResult`, :func:`calibrate` (see ``executor.calibrate``), :func:`launch`.
"""

from executor.launch import LaunchError, LaunchTimeout, RankFailure, launch
from executor.run import Measurement, PlanMismatchError, run_plan, run_plans
from executor.verify import VerifyResult, verify, verify_many

__all__ = ["LaunchError", "LaunchTimeout", "Measurement", "PlanMismatchError", "RankFailure",
           "VerifyResult", "launch", "run_plan", "run_plans", "verify", "verify_many"]
