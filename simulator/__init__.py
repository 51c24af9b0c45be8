"""simulator: op cost (roofline), memory model, pipeline schedules, the SimPy engine, the
step model and traces. Imports completion and clusters; knows nothing about Optuna.

The step model: :class:`StepModel` (``StepModel.from_program(plan_program, cluster,
roofline, seq_len=...)``) assembles one training step from a plan program's costs
(:class:`ProgramCosts`) under a :class:`StepConfig` and plays it (:class:`StepResult`)."""

from simulator.errors import SimulatorError
from simulator.pipeline_sim import simulate_pipeline
from simulator.program_costs import ProgramCostError, ProgramCosts
from simulator.reshard_cost import cluster_step_cost, plan_reshard_on, reshard_time, step_time
from simulator.result import SimResult, TimelineEvent
from simulator.roofline import Roofline
from simulator.schedules import SCHEDULES, Action, Schedule, ScheduleError, build_schedule
from simulator.step import StepConfig, StepModel, StepResult

__all__ = [
    "SCHEDULES",
    "Action",
    "ProgramCostError",
    "ProgramCosts",
    "Roofline",
    "Schedule",
    "ScheduleError",
    "SimResult",
    "SimulatorError",
    "StepConfig",
    "StepModel",
    "StepResult",
    "TimelineEvent",
    "build_schedule",
    "cluster_step_cost",
    "plan_reshard_on",
    "reshard_time",
    "step_time",
    "simulate_pipeline",
]
