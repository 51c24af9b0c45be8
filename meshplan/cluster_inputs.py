"""A cluster and its collectives as a user names them: a catalog name or YAML with a node
count (:func:`load_with_nodes`), a buffer size in bytes (:func:`parse_nbytes`: 64MiB, 1e6)
and a group of ranks (:func:`parse_ranks`: 0-7, 0,8). Bad input raises
``clusters.ClusterError`` (a ``MeshplanError``) naming the option. The commands:
``meshplan.commands.clusters``.
"""

from __future__ import annotations

import re
from typing import Any

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


def load_with_nodes(name: str, nodes: int | None) -> Any:
    """``load_cluster(name, num_nodes=nodes)`` after checking the ``--nodes`` option.

    Raises ClusterError when ``nodes`` < 1 (naming ``--nodes``), or as ``load_cluster`` does
    for an unknown name, a bad YAML file or an oversized world."""
    from clusters import ClusterError, load_cluster

    if nodes is not None and nodes < 1:
        raise ClusterError(f"--nodes must be >= 1, got {nodes}")
    return load_cluster(name, num_nodes=nodes)
