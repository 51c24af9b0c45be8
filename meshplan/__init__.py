"""meshplan: how should this model be split on this cluster, and how fast and how big will
each training step be? See DESIGN.md for the architecture."""

__version__ = "0.1.0"

__all__ = ["__version__"]
