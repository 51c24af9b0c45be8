"""Prices of GPU time: dollars per GPU-hour by device, from a user-editable YAML with a date
and a source per entry (``clusters/defaults/prices.yaml``; ``--prices FILE`` replaces it,
``--price X`` gives one price for every device).

File format::

    devices:
      H100-SXM-80GB: {usd_per_gpu_hour: 3.00, date: "2026-05", provenance: "..."}

keyed by the cluster YAML's ``device.name``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clusters.errors import ClusterSpecError

#: the default price table
PRICES_FILE = Path(__file__).parent / "defaults" / "prices.yaml"
#: the largest price file read (bytes)
MAX_PRICES_BYTES = 2**20


class Price(BaseModel):
    """One device's price: dollars per GPU-hour, the date it was read and its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_gpu_hour: float = Field(ge=0, allow_inf_nan=False)
    date: str = Field(min_length=1)
    provenance: str = Field(min_length=1)


class PriceTable(BaseModel):
    """Device name -> :class:`Price`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    devices: dict[str, Price] = Field(min_length=1)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The price table of ``path`` (None: :data:`PRICES_FILE`). Raises ClusterSpecError naming
    the file and the field at fault (a missing file, bad YAML, a negative price, no date)."""
    p = Path(path) if path is not None else PRICES_FILE
    if not p.is_file():
        raise ClusterSpecError(f"price file not found: {p}")
    if p.stat().st_size > MAX_PRICES_BYTES:
        raise ClusterSpecError(f"{p}: larger than a price file can be ({MAX_PRICES_BYTES} bytes)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ClusterSpecError(f"{p}: not a YAML price table ({e})") from None
    try:
        return PriceTable.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"])) or "<root>"
        raise ClusterSpecError(f"{p}: field {where!r}: {first['msg']}") from None


def price_of(cluster: Any, table: PriceTable | None = None) -> Price:
    """The price of a GPU of ``cluster`` (a ``clusters.Cluster`` or spec) in ``table`` (None:
    the defaults). Raises ClusterSpecError naming the device and the devices the table
    prices."""
    table = table or load_prices()
    spec = getattr(cluster, "spec", cluster)
    name = spec.device.name
    hit = table.devices.get(name)
    if hit is None:
        raise ClusterSpecError(f"no price for device {name!r} (cluster {spec.name!r}); the price table "
                               f"has {', '.join(sorted(table.devices))}: add it to a --prices file or give "
                               f"--price")
    return hit


__all__ = ["MAX_PRICES_BYTES", "PRICES_FILE", "Price", "PriceTable", "load_prices", "price_of"]
