"""The registries of allowed values: one tuple (or mapping) per closed knob, read by the
Strategy (``completion.strategy``), the simulator, the tuner and the CLI, whose choices are
generated from them (``meshplan.commands.options``).

This module imports nothing (no numpy, no pydantic, nothing of ours), and ``completion``'s
``__init__`` is lazy, so ``meshplan --help`` imports it and nothing else of the package
(tests/meshplan/test_cli_structure.py). Each entry is the one list of its knob: add a value here
and to the code that gives it meaning (the checks named beside each one keep them equal).
"""

from __future__ import annotations

#: pipeline schedules (``Strategy.schedule``; ``simulator.schedules`` registers a builder
#: for each, ZB-1p / ZB-2p as the automatic ZB at a memory limit)
SCHEDULES = ("FThenB", "1F1B", "VPP", "ZBH1", "ZBH2", "ZBVPP", "ZB", "ZB-1p", "ZB-2p", "DualPipeV")
#: the schedules that run more than one model chunk per rank (vpp > 1)
INTERLEAVED = ("VPP", "ZBVPP", "DualPipeV")
#: other spellings users bring, lower-case -> canonical name
SCHEDULE_ALIASES = {"gpipe": "FThenB", "1f1b-i": "VPP", "interleaved": "VPP",
                    "interleaved-1f1b": "VPP", "zb-h1": "ZBH1", "zb-h2": "ZBH2",
                    "zb-v": "ZBVPP", "zbv": "ZBVPP", "dualpipe-v": "DualPipeV"}
#: activation recompute modes (``Strategy.recompute``); ``simulator.recompute`` holds one
#: policy per name (its registry is checked against this tuple on import)
RECOMPUTE = ("none", "selective", "selective-op", "full")
#: training dtypes (``Strategy.dtype``)
DTYPES = ("bfloat16", "float16", "float32")
#: ``dtype`` spellings of the FP8 recipes (``--dtype fp8-delayed``): dtype bfloat16 + ``fp8``
FP8_DTYPES = {"fp8-delayed": "te-delayed", "fp8-te": "te-delayed", "fp8-tensorwise": "tensorwise",
              "fp8-rowwise": "rowwise"}
#: software profiles that run a plan (``Strategy.framework``);
#: ``simulator.profiles.check_catalog`` checks that ``simulator/profiles/catalog/*.yaml``
#: holds exactly these files, each ``name:`` its file name
FRAMEWORKS = ("megatron-core", "megatron-bridge", "nemo", "megatron-2021", "megatron-2021-torch-ddp",
              "fsdp2", "fsdp2-eager", "fsdp2-async-tp", "llm-foundry", "deepspeed", "deepspeed-2021",
              "megatron-deepspeed", "eager")
#: attention implementations: flash (fused, FlashAttention), unfused (QK^T, softmax,
#: dropout, AV as separate kernels; Hugging Face's "eager")
ATTENTIONS = ("flash", "unfused")
OPTIMIZERS = ("adamw", "adam", "sgd")
#: how a context-parallel attention gets the other ranks' keys and values (Megatron-LM
#: ``--cp-comm-type``; ``a2a`` (Ulysses) is not modelled)
CP_COMMS = ("p2p", "all_gather")
#: Megatron-LM's spellings of :data:`CP_COMMS` (``--cp-comm-type allgather``)
CP_COMM_ALIASES = {"allgather": "all_gather"}
#: strategy search modes (``tuner.study.MODES``): framework (Megatron's layout),
#: pattern-based, full_random, semi-auto
MODES = ("framework", "pattern-based", "full_random", "semi-auto")
#: pipeline splits given as a word (``--layers-per-stage``, the scorer's ``layer_split``;
#: ``simulator.layer_split``): the cost model's balanced split, or Megatron-LM's even one
SPLITS = ("balanced", "even")
