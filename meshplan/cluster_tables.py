"""Rich renderings of clusters: the catalog, a cluster's topology and device specs with
provenance, and its collective time / busbw tables. ``meshplan clusters`` and the demo
print them."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

from clusters import Cluster
from clusters.collectives import KINDS
from clusters.report import catalog_rows, collective_rows, table_group_sizes


def make_console() -> Console:
    """A console on the current stdout: ``$COLUMNS`` wide when set (rich wraps the long
    columns to fit), else the terminal's width, else 150 (output to a file or pipe keeps
    whole rows)."""
    cols = os.environ.get("COLUMNS", "")
    width = int(cols) if cols.isdigit() and int(cols) >= 20 else (None if sys.stdout.isatty() else 150)
    return Console(file=sys.stdout, width=width)


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
        table.add_column(col, no_wrap=col == "name")  # a name is copied whole into commands
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
    t.add_column("field", no_wrap=True)
    t.add_column("value", justify="right")
    t.add_column("provenance")
    d, n = c.spec.device, c.spec.node
    for dtype, q in sorted(d.peak_flops.items()):
        t.add_row(f"peak {dtype}", f"{q.value / 1e12:g} TFLOP/s", q.provenance)
    t.add_row("memory", f"{d.memory_bytes.value / 2**30:.2f} GiB", d.memory_bytes.provenance)
    r = d.memory_reserved_bytes
    t.add_row("driver reserve", f"{d.reserved_bytes / 2**20:.0f} MiB",
              r.provenance if r is not None else "not stated: 0")
    t.add_row("usable memory", f"{d.usable_bytes / 2**30:.2f} GiB", "memory - driver reserve")
    t.add_row(
        "memory bandwidth",
        f"{d.memory_bandwidth.value / 1e9:g} GB/s",
        d.memory_bandwidth.provenance,
    )
    for key, q in d.efficiency:
        if q is None:
            continue
        entries = sorted(q.items()) if isinstance(q, dict) else [("", q)]
        for sub, v in entries:
            label = f"efficiency {key}" + (f" {sub}" if sub else "")
            t.add_row(label, f"{v.value:g}", v.provenance)
    t.add_row(
        "intra-node bandwidth",
        f"{n.intra_bandwidth.value / 1e9:g} GB/s",
        n.intra_bandwidth.provenance,
    )
    t.add_row("intra-node latency", fmt_time(n.intra_latency.value), n.intra_latency.provenance)
    t.add_row("NICs per node", str(n.nic_count.value), n.nic_count.provenance)
    t.add_row("NIC bandwidth", f"{n.nic_bandwidth.value / 1e9:g} GB/s", n.nic_bandwidth.provenance)
    cm = n.collective_model
    t.add_row("collective model", cm.value if cm else "alpha-beta",
              cm.provenance if cm else "not stated: the plain alpha-beta model (clusters.nccl)")
    if n.nvls_algbw is not None:
        t.add_row("NVLS all_reduce algbw", f"{n.nvls_algbw.value / 1e9:g} GB/s", n.nvls_algbw.provenance)
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
