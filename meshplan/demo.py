"""``make demo``: the main job on a built-in model and cluster.

1. the cluster catalog and the collective-time table of a 4-node DGX A100 cluster
   (the same functions ``meshplan clusters list/show`` use);
2. the predicted step of llama2-7b on 4 x dgx-a100-80g under one Megatron-style plan
   (``meshplan cost``): step time, tokens/s, MFU, time and memory breakdowns.
"""

from __future__ import annotations

from clusters import load_cluster
from meshplan.commands.clusters import make_console, render_catalog, render_collectives

COST_ARGS = [
    "cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "4",
    "--dp", "4", "--mp", "4", "--pp", "2", "--schedule", "1F1B",
    "--micro-batch-size", "1", "--global-batch", "64",
]


def main() -> int:
    """Print the demo to stdout; returns the exit code (0 on success)."""
    from meshplan.cli import main as cli_main

    console = make_console()
    render_catalog(console)
    render_collectives(console, load_cluster("dgx-a100-80g", num_nodes=4))
    console.rule("meshplan " + " ".join(COST_ARGS))
    return cli_main(COST_ARGS)


if __name__ == "__main__":
    raise SystemExit(main())
