"""``make demo``: the cluster catalog and the collective-time table of a 4-node DGX A100
cluster, printed by the same functions ``meshplan clusters list/show`` use. Later issues
extend it with completion, simulation and tuning."""

from __future__ import annotations

from clusters import load_cluster
from meshplan.commands.clusters import make_console, render_catalog, render_collectives


def main() -> int:
    """Print the demo to stdout; returns the exit code (0)."""
    console = make_console()
    render_catalog(console)
    render_collectives(console, load_cluster("dgx-a100-80g", num_nodes=4))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
