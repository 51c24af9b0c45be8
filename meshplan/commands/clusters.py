"""``meshplan clusters list | show NAME [--nodes N] | time NAME KIND | validate FILE``
(rich tables, or --json for machines).

Bad input raises a ``clusters.ClusterError`` (a ``ValueError``); ``meshplan.cli.main``
prints it as one ``error: ...`` line and exits with code 2. The tables are
:mod:`meshplan.cluster_tables`."""

from __future__ import annotations

import json

import typer

from meshplan import cluster_inputs as ci

#: clusters.collectives.KINDS (listed here so that ``meshplan --help`` does not import the
#: cluster model; tests/meshplan/test_cli_options.py checks that they agree)
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of tables.")
NAME_ARG = typer.Argument(..., help="Catalog name or path to a cluster YAML.")
NODES_OPT = typer.Option(None, "--nodes", help="Number of nodes (default: the spec's).")


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def list_cmd(as_json: bool = JSON_OPT) -> None:
    """List the built-in cluster catalog."""
    from clusters.report import catalog_rows
    from meshplan.cluster_tables import make_console, render_catalog

    if as_json:
        _echo_json(catalog_rows())
    else:
        render_catalog(make_console())


def show_cmd(
    name: str = NAME_ARG,
    nodes: int = NODES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Topology, device specs and a collective time / busbw table (1 KiB .. 1 GiB)."""
    from clusters.report import collective_rows
    from meshplan.cluster_tables import make_console, render_collectives, render_topology

    c = ci.load_with_nodes(name, nodes)
    if as_json:
        _echo_json(
            {
                "cluster": c.describe(),
                "spec": c.spec.model_dump(),
                "collectives": collective_rows(c),
            }
        )
        return
    console = make_console()
    render_topology(console, c)
    render_collectives(console, c)


def time_cmd(
    name: str = NAME_ARG,
    kind: str = typer.Argument(..., help=f"One of: {', '.join(KINDS)}."),
    nbytes: str = typer.Option("1GiB", "--nbytes", help="Buffer size in bytes (nccl-tests), e.g. 64MiB or 64MB; not bits (64Mb)."),
    ranks: str = typer.Option(None, "--ranks", help="Group, e.g. 0-7 or 0,8 (default: all)."),
    nodes: int = NODES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Time and busbw of one collective on one group (every candidate algorithm shown)."""
    from meshplan.cluster_tables import fmt_bytes, fmt_time

    c = ci.load_with_nodes(name, nodes)
    group = ci.parse_ranks(ranks) if ranks is not None else list(range(c.world_size))
    size = ci.parse_nbytes(nbytes)
    algs = c.collective_algorithms(kind, size, group)
    out = {
        "cluster": c.name,
        "kind": kind,
        "nbytes": size,
        "ranks": group,
        "topology": c.group(group).describe(),
        "time_s": c.collective_time(kind, size, group),
        "busbw_Bps": c.busbw(kind, size, group),
        "algorithms_s": algs,
    }
    if as_json:
        _echo_json(out)
        return
    alg = ", ".join(f"{a} {fmt_time(t)}" for a, t in algs.items()) or "none (no traffic)"
    typer.echo(
        f"{kind} of {fmt_bytes(size)} on {out['topology']} of {c.name}: "
        f"{fmt_time(out['time_s'])}, busbw {out['busbw_Bps'] / 1e9:.1f} GB/s [{alg}]"
    )


def validate_cmd(
    path: str = typer.Argument(..., help="Cluster YAML file."), as_json: bool = JSON_OPT
) -> None:
    """Validate a cluster YAML file; one-line error naming the bad field on failure."""
    from clusters import Cluster, load_spec_file
    from meshplan.cluster_tables import shape

    spec = load_spec_file(path)
    c = Cluster(spec, spec.cluster.num_nodes.value)
    if as_json:
        _echo_json({"ok": True, "name": spec.name, "world_size": c.world_size})
    else:
        typer.echo(f"ok: {spec.name} ({shape(c)})")


def register(app: typer.Typer) -> None:
    """Attach the ``clusters`` command group (list, show, time, validate) to ``app``."""
    group = typer.Typer(help="Cluster catalog, topology and collective cost model.",
                        no_args_is_help=True)
    group.command("list")(list_cmd)
    group.command("show")(show_cmd)
    group.command("time")(time_cmd)
    group.command("validate")(validate_cmd)
    app.add_typer(group, name="clusters")
