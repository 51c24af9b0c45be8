"""simulator: op cost (roofline), memory model, pipeline schedules, the SimPy engine and
traces. Imports completion and clusters; knows nothing about Optuna."""

from simulator.pipeline_sim import simulate_pipeline
from simulator.reshard_cost import cluster_step_cost, plan_reshard_on, reshard_time, step_time
from simulator.result import SimResult, TimelineEvent
from simulator.schedules import SCHEDULES, Action, Schedule, ScheduleError, build_schedule

__all__ = [
    "SCHEDULES",
    "Action",
    "Schedule",
    "ScheduleError",
    "SimResult",
    "TimelineEvent",
    "build_schedule",
    "cluster_step_cost",
    "plan_reshard_on",
    "reshard_time",
    "step_time",
    "simulate_pipeline",
]
