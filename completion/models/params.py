"""Parameter counts of a model config: all of them, and those one token uses.

A token passes every parameter except the routed experts it is not sent to: of the E
experts of a mixture-of-experts layer it uses k (``experts_per_token``), so the active
count is the total less ``(E - k) / E`` of each MoE layer's routed expert parameters
(Fedus et al. 2022, sec. 2; the "activated parameters" of the DeepSeek-V3 report, Table 1,
and the model cards of Qwen3, GPT-OSS and Llama 4). Vendors differ on the embeddings: the
count here includes every parameter a token touches (the token embedding row and the LM
head whole); DeepSeek's 37B and OpenAI's 5.1B leave the input embedding out
(``tests/completion/test_models_frontier.py`` states each convention).
"""

from __future__ import annotations

import pathlib
import re

from completion.models.catalog import get_model_config
from completion.models.config import ModelConfig
from completion.models.transformer import build_decoder

#: parameter names of the routed experts (``completion.models.moe``; the shared expert is
#: ``mlp.shared_expert``)
ROUTED = re.compile(r"\.mlp\.experts\.")


def parameter_counts(model: str | pathlib.Path | ModelConfig) -> tuple[int, int]:
    """(total, active) parameter elements of a catalog name, ``config.json`` path or config
    (module docstring). Builds the model's program at one token (shapes only: no tensor
    is allocated). Raises ModelConfigError as :func:`~completion.models.get_model_config`."""
    cfg = get_model_config(model)
    prog = build_decoder(cfg, 1, 1, "bfloat16")
    total = routed = 0
    for v in prog.parameters():
        n = v.type.numel
        total += n
        if ROUTED.search(v.name or ""):
            routed += n
    if not routed:
        return total, total
    e, k = cfg.num_experts, cfg.experts_per_token
    assert e is not None and k is not None
    return total, total - routed * (e - k) // e
