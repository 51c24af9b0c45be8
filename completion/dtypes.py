"""Element sizes of the dtypes programs use: the one table every package reads."""

from __future__ import annotations

from completion.errors import CompletionError

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a name of :data:`DTYPE_BYTES`).

    Raises CompletionError (a ValueError) naming the dtype and the known ones when it is
    unknown."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise CompletionError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None
