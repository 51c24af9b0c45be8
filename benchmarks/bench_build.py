"""Program building speed: a full training program (forward + ``append_backward`` +
``apply_optimizer("adamw")``) for the largest catalog models.

Target (issue 3): llama2-70b (80 layers, ~7.6e3 ops in the full program) in under 2 s."""

from __future__ import annotations

from benchmarks.harness import BenchResult, measure
from completion import build_model
from completion.backward import append_backward
from completion.optimizer import apply_optimizer


def build_train_program(name: str) -> int:
    """Build ``name`` forward (batch 1, default seq), backward and AdamW; returns the op count."""
    p = build_model(name, 1)
    append_backward(p)
    apply_optimizer(p, "adamw")
    return len(p)


def run() -> list[BenchResult]:
    out = []
    for name, target in (("llama2-70b", 2.0), ("gpt3-175b", 2.0)):
        n_ops = build_train_program(name)
        out.append(measure(f"build {name} fwd+bwd+adamw", lambda n=name: build_train_program(n),
                           target, repeat=3, extra=f"{n_ops} ops"))
    return out
