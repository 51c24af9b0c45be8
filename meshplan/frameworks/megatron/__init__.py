"""Megatron-LM: its arguments as Strategy fields (:mod:`.arguments`), a launch line's other
arguments (:mod:`.launch`), its MoE arguments checked against a model (:mod:`.moe`), a
whole launch line as a Strategy (:func:`strategy_from_args`), and a plan as its arguments
(:mod:`.export`, ``meshplan.frameworks.export_plan(plan, "megatron")``)."""

from meshplan.frameworks.megatron.launch_line import strategy_from_args

__all__ = ["strategy_from_args"]
