"""executor: runs a plan on torch.distributed, measures it and verifies its numerics.

Public API: :func:`run_plan` -> :class:`Measurement`, :func:`verify` / :func:`verify_many`
-> :class:`VerifyResult`, :func:`calibrate` (see ``executor.calibrate``), :func:`launch`.
Pipeline plans take their schedule as an argument (``schedule=``, read duck-typed, see
``executor.actions``): the executor imports only ``completion`` and ``clusters``;
``meshplan.validation`` builds schedules with the simulator and passes them in.
"""

from executor.actions import ActionOrderError, StepAction
from executor.launch import LaunchError, LaunchTimeout, RankFailure, launch
from executor.run import Measurement, PlanMismatchError, PlanScheduleError, run_plan, run_plans
from executor.verify import VerifyResult, verify, verify_many

__all__ = ["LaunchError", "LaunchTimeout", "Measurement", "PlanMismatchError", "PlanScheduleError",
           "RankFailure", "ActionOrderError", "StepAction", "VerifyResult", "launch", "run_plan",
           "run_plans", "verify", "verify_many"]
