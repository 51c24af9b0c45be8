"""``extends:``: a profile stated as the fields it changes over another (``spec`` docstring).

Both functions walk the pydantic schema (:class:`simulator.profiles.spec.ProfileSpec`) beside
the YAML mapping, so what is a section and what is one value is the schema's word, not a
guess from the YAML's shape:

- a *section* (a field whose type is a model of fields, ``kernels``, ``overlap``...) merges key
  by key, at any depth;
- a *quantity* (a ``{value, provenance}`` model: ``Flag``, ``Positive``...) and a plain field
  (``name``, ``description``) is replaced whole: the child's pair replaces the parent's, so
  a changed value always comes with its own provenance.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from simulator.profiles.spec import ProfileError


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class of a field annotation (``X`` or ``X | None``), else None."""
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for m in map(_model_of, get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def section_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The model of ``model``'s field ``key`` if that field is a section (a model that is not
    a ``{value, provenance}`` quantity), else None (the field is replaced whole)."""
    field = model.model_fields.get(key)
    sub = _model_of(field.annotation) if field is not None else None
    if sub is None or {"value", "provenance"} <= set(sub.model_fields):
        return None
    return sub


def check_fields(child: dict[str, Any], model: type[BaseModel], source: str, parent: str,
                 prefix: str = "") -> None:
    """Raise ProfileError naming ``source``, the dotted field and ``parent`` for the first
    key of ``child`` (a mapping, sections descended into) that ``model`` has no field for."""
    for key, value in child.items():
        dotted = f"{prefix}{key}"
        if key not in model.model_fields:
            raise ProfileError(f"{source}: field {dotted!r} is not a field of the profile that it "
                               f"extends ({parent!r}); known here: {sorted(model.model_fields)}")
        sub = section_model(model, key)
        if sub is not None and isinstance(value, dict):
            check_fields(value, sub, source, parent, f"{dotted}.")


def merge(parent: dict[str, Any], child: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``parent`` with ``child``'s fields over it (new mappings; neither input is changed):
    sections of ``model`` merge key by key, every other field takes the child's value whole."""
    out = dict(parent)
    for key, value in child.items():
        sub = section_model(model, key)
        base = parent.get(key)
        if sub is not None and isinstance(value, dict) and isinstance(base, dict):
            out[key] = merge(base, value, sub)
        else:
            out[key] = value
    return out
