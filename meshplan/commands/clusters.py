"""``meshplan clusters list | show NAME [--nodes N] | time NAME KIND | validate FILE``
(rich tables, or --json for machines).

Bad input raises a ``clusters.ClusterError`` (a ``ValueError``); ``meshplan.cli.main``
prints it as one ``error: ...`` line and exits with code 2."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table

from clusters import Cluster, ClusterError, load_cluster, load_spec_file
from clusters.collectives import KINDS
from clusters.report import catalog_rows, collective_rows, table_group_sizes

clusters_app = typer.Typer(
    help="Cluster catalog, topology and collective cost model.", no_args_is_help=True
)

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of tables.")
NAME_ARG = typer.Argument(..., help="Catalog name or path to a cluster YAML.")
NODES_OPT = typer.Option(None, "--nodes", help="Number of nodes (default: the spec's).")


def make_console() -> Console:
    """A console on the current stdout (wide when not a terminal, so tables stay whole)."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 150)


def fmt_time(t: float) -> str:
    """Seconds as us / ms / s."""
    if t < 1e-3:
        return f"{t * 1e6:.1f} us"
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.3f} s"


def fmt_bytes(n: float) -> str:
    """Bytes with a binary unit (KiB, MiB, GiB)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def shape(c: Cluster) -> str:
    """``4 nodes x 8 devices = 32 ranks``."""
    nodes = f"{c.num_nodes} node{'s' if c.num_nodes > 1 else ''}"
    return f"{nodes} x {c.devices_per_node} devices = {c.world_size} ranks"


def render_catalog(console: Console) -> None:
    """The catalog as a rich table."""
    table = Table(title="meshplan cluster catalog")
    for col in ("name", "device", "devices/node", "nodes", "description"):
        table.add_column(col)
    for r in catalog_rows():
        table.add_row(
            r["name"],
            r["device"],
            str(r["devices_per_node"]),
            str(r["num_nodes"]),
            r["description"],
        )
    console.print(table)


def render_topology(console: Console, c: Cluster) -> None:
    """Topology and device specs, each number with its provenance."""
    t = Table(title=f"{c.name}: {shape(c)} ({c.device.name})")
    t.add_column("field")
    t.add_column("value", justify="right")
    t.add_column("provenance")
    d, n = c.spec.device, c.spec.node
    for dtype, q in sorted(d.peak_flops.items()):
        t.add_row(f"peak {dtype}", f"{q.value / 1e12:g} TFLOP/s", q.provenance)
    t.add_row("memory", f"{d.memory_bytes.value / 1e9:g} GB", d.memory_bytes.provenance)
    t.add_row(
        "memory bandwidth",
        f"{d.memory_bandwidth.value / 1e9:g} GB/s",
        d.memory_bandwidth.provenance,
    )
    for key, q in d.efficiency:
        if q is None:
            continue
        t.add_row(f"efficiency {key}", f"{q.value:g}", q.provenance)
    t.add_row(
        "intra-node bandwidth",
        f"{n.intra_bandwidth.value / 1e9:g} GB/s",
        n.intra_bandwidth.provenance,
    )
    t.add_row("intra-node latency", fmt_time(n.intra_latency.value), n.intra_latency.provenance)
    t.add_row("NICs per node", str(n.nic_count.value), n.nic_count.provenance)
    t.add_row("NIC bandwidth", f"{n.nic_bandwidth.value / 1e9:g} GB/s", n.nic_bandwidth.provenance)
    lat = c.spec.cluster.inter_latency
    t.add_row("inter-node latency", fmt_time(lat.value), lat.provenance)
    console.print(t)


def render_collectives(console: Console, c: Cluster) -> None:
    """One table per group size: time and busbw of every kind for 1 KiB .. 1 GiB."""
    rows = collective_rows(c)
    for g in table_group_sizes(c):
        mine = [r for r in rows if r["group_size"] == g]
        topo = next(r["topology"] for r in mine if r["kind"] == "all_reduce")
        table = Table(
            title=f"{c.name} collectives on ranks 0..{g - 1} ({topo}); time / busbw GB/s; "
            f"send_recv is rank 0 -> {g - 1}"
        )
        table.add_column("size", justify="right")
        for kind in KINDS:
            table.add_column(kind, justify="right")
        for s in sorted({r["nbytes"] for r in mine}):
            cells = {r["kind"]: r for r in mine if r["nbytes"] == s}
            table.add_row(
                fmt_bytes(s),
                *(
                    f"{fmt_time(cells[k]['time_s'])} / {cells[k]['busbw_Bps'] / 1e9:.1f}"
                    for k in KINDS
                ),
            )
        console.print(table)


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


def parse_nbytes(text: str) -> float:
    """``"1GiB"``, ``"64MiB"``, ``"4096"``, ``"1e6"`` -> bytes (may be negative; the cost
    model rejects that with a message naming the value)."""
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        return float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ClusterError(
            f"invalid --nbytes {text!r}: expected bytes like 4096, 64MiB, 1GiB"
        ) from None


def parse_ranks(text: str) -> list[int]:
    """``"0-7"``, ``"0,1,8,9"``, ``"0-3,8-11"`` -> list of ranks (validated later)."""
    ranks: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, sep, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
            ranks.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise ClusterError(f"invalid --ranks {text!r}: expected e.g. 0-7 or 0,1,8,9") from None
    return ranks


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def load_with_nodes(name: str, nodes: int | None) -> Cluster:
    """``load_cluster(name, num_nodes=nodes)`` after checking the ``--nodes`` option.

    Raises ClusterError when ``nodes`` < 1 (naming ``--nodes``), or as ``load_cluster`` does
    for an unknown name, a bad YAML file or an oversized world."""
    if nodes is not None and nodes < 1:
        raise ClusterError(f"--nodes must be >= 1, got {nodes}")
    return load_cluster(name, num_nodes=nodes)


@clusters_app.command("list")
def list_cmd(as_json: bool = JSON_OPT) -> None:
    """List the built-in cluster catalog."""
    if as_json:
        _echo_json(catalog_rows())
    else:
        render_catalog(make_console())


@clusters_app.command("show")
def show_cmd(
    name: str = NAME_ARG,
    nodes: int = NODES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Topology, device specs and a collective time / busbw table (1 KiB .. 1 GiB)."""
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


@clusters_app.command("time")
def time_cmd(
    name: str = NAME_ARG,
    kind: str = typer.Argument(..., help=f"One of: {', '.join(KINDS)}."),
    nbytes: str = typer.Option("1GiB", "--nbytes", help="Buffer size (nccl-tests), e.g. 64MiB."),
    ranks: str = typer.Option(None, "--ranks", help="Group, e.g. 0-7 or 0,8 (default: all)."),
    nodes: int = NODES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Time and busbw of one collective on one group (every candidate algorithm shown)."""
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


@clusters_app.command("validate")
def validate_cmd(
    path: str = typer.Argument(..., help="Cluster YAML file."), as_json: bool = JSON_OPT
) -> None:
    """Validate a cluster YAML file; one-line error naming the bad field on failure."""
    spec = load_spec_file(path)
    c = Cluster(spec, spec.cluster.num_nodes.value)
    if as_json:
        _echo_json({"ok": True, "name": spec.name, "world_size": c.world_size})
    else:
        typer.echo(f"ok: {spec.name} ({shape(c)})")


def register(app: typer.Typer) -> None:
    """Attach the ``clusters`` command group to the root app."""
    app.add_typer(clusters_app, name="clusters")
