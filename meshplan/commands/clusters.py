"""``meshplan clusters list | show NAME [--nodes N] | time NAME KIND | validate FILE``
(rich tables, or --json for machines).

Bad input raises a ``clusters.ClusterError`` (a ``ValueError``); ``meshplan.cli.main``
prints it as one ``error: ...`` line and exits with code 2. The tables are
:mod:`meshplan.cluster_tables`."""

from __future__ import annotations

import json
import re
from typing import Any

import typer

#: clusters.collectives.KINDS (listed here so that ``meshplan --help`` does not import the
#: cluster model; tests/test_cli_options.py checks that they agree)
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of tables.")
NAME_ARG = typer.Argument(..., help="Catalog name or path to a cluster YAML.")
NODES_OPT = typer.Option(None, "--nodes", help="Number of nodes (default: the spec's).")


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GIB": 1 << 30,
}


#: Largest --nbytes (1 PiB): far above any collective buffer; larger sizes (and inf, NaN)
#: are refused instead of printing times of 1e290 s.
MAX_NBYTES = float(2**50)
#: Most ranks a --ranks list may name (the cluster spec's world-size limit,
#: clusters.spec.MAX_WORLD_SIZE).
MAX_RANKS = 2**20


def parse_nbytes(text: str) -> float:
    """``"1GiB"``, ``"64MiB"``, ``"4096"``, ``"1e6"`` -> bytes (may be negative; the cost
    model rejects that with a message naming the value). Raises ClusterError naming
    ``--nbytes`` for text that is no size, a size in bits (a lowercase ``b``: ``64Mb``), or a
    size that is not finite or above :data:`MAX_NBYTES`."""
    from clusters import ClusterError

    if re.fullmatch(r"\s*[\d.eE+-]+\s*([kKmMgG]i?)?b\s*", text):  # 64Mb, 1Gib: bits
        raise ClusterError(f"invalid --nbytes {text!r}: a lowercase b means bits; write bytes "
                           f"like 64MB (10^6) or 64MiB (2^20)")
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        val = float(num) * _UNITS[unit]
    except (ValueError, KeyError, OverflowError):
        raise ClusterError(
            f"invalid --nbytes {text!r}: expected bytes like 4096, 64MiB, 1GiB"
        ) from None
    if not abs(val) <= MAX_NBYTES:
        raise ClusterError(f"--nbytes {text!r} must be a finite size of at most 1 PiB "
                           f"({MAX_NBYTES:.0f} bytes)")
    return val


def parse_ranks(text: str) -> list[int]:
    """``"0-7"``, ``"0,1,8,9"``, ``"0-3,8-11"`` -> list of ranks (checked against the
    cluster later). Raises ClusterError naming ``--ranks`` for bad text or more than
    :data:`MAX_RANKS` ranks (counted before any range is expanded)."""
    from clusters import ClusterError

    parts: list[tuple[int, int]] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, sep, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
            parts.append((int(lo), int(hi) if sep else int(lo)))
    except ValueError:
        raise ClusterError(f"invalid --ranks {text!r}: expected e.g. 0-7 or 0,1,8,9") from None
    for lo, hi in parts:
        if hi < lo:
            raise ClusterError(f"invalid --ranks {text!r}: range {lo}-{hi} runs backwards "
                               f"(write {hi}-{lo})")
    count = sum(max(0, hi - lo + 1) for lo, hi in parts)
    if count > MAX_RANKS:
        raise ClusterError(f"--ranks names {count} ranks, above the limit of {MAX_RANKS}")
    return [r for lo, hi in parts for r in range(lo, hi + 1)]


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def load_with_nodes(name: str, nodes: int | None) -> Any:
    """``load_cluster(name, num_nodes=nodes)`` after checking the ``--nodes`` option.

    Raises ClusterError when ``nodes`` < 1 (naming ``--nodes``), or as ``load_cluster`` does
    for an unknown name, a bad YAML file or an oversized world."""
    from clusters import ClusterError, load_cluster

    if nodes is not None and nodes < 1:
        raise ClusterError(f"--nodes must be >= 1, got {nodes}")
    return load_cluster(name, num_nodes=nodes)


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

    c = load_with_nodes(name, nodes)
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

    c = load_with_nodes(name, nodes)
    group = parse_ranks(ranks) if ranks is not None else list(range(c.world_size))
    size = parse_nbytes(nbytes)
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
