"""Reading framework profile YAML: ``extends:`` resolved (``inherit``), then the pydantic
validation of :class:`simulator.profiles.spec.ProfileSpec`. Every error is a ProfileError
naming the file and the field or parent at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clusters import strict_yaml
from simulator.profiles.inherit import check_fields, merge
from simulator.profiles.spec import ProfileError, ProfileSpec

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
#: file suffixes that make an ``extends:`` value a path rather than a catalog name
YAML_SUFFIXES = (".yaml", ".yml")


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<root>"
    if first["type"] == "missing":
        return f"{source}: missing field {field!r}"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown field {field!r}"
    msg = first["msg"].replace("\n", " ").removeprefix("Value error, ")
    return f"{source}: field {field!r}: {msg} (got {first.get('input')!r})"


def _read(path: Path) -> Any:
    if not path.is_file():
        raise ProfileError(f"framework profile file not found: {path}")
    try:
        return strict_yaml.load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None


def _parent_path(ref: Any, source: str, base_dir: Path) -> Path:
    """The file an ``extends:`` value names: a path (``.yaml``/``.yml``, relative to
    ``base_dir``) or a catalog name."""
    if not isinstance(ref, str) or not ref.strip():
        raise ProfileError(f"{source}: field 'extends' must be a catalog profile name or a YAML "
                           f"file, got {ref!r}")
    if ref.endswith(YAML_SUFFIXES):
        path = Path(ref) if Path(ref).is_absolute() else base_dir / ref
        if not path.is_file():
            raise ProfileError(f"{source}: field 'extends': parent profile file {ref!r} not found "
                               f"({path})")
        return path.resolve()
    path = CATALOG_DIR / f"{ref}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CATALOG_DIR.glob("*.yaml")))
        raise ProfileError(f"{source}: field 'extends': unknown parent profile {ref!r} (not in the "
                           f"catalog: {known}; a file must end in .yaml or .yml)")
    return path.resolve()


def resolve_extends(data: Any, source: str, base_dir: Path,
                    chain: tuple[Path, ...] = ()) -> Any:
    """``data`` with its ``extends:`` chain merged in (``data`` itself when it has none).

    ``chain``: the files being read, outermost first (``data`` is the last one's, if any);
    a parent already on it is a cycle. Raises ProfileError naming ``source`` for a bad or
    unknown parent, a profile that extends itself or a cycle, a child field the schema does
    not have, and a child without its own ``name``."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    ref = data["extends"]
    child = {k: v for k, v in data.items() if k != "extends"}
    parent_path = _parent_path(ref, source, base_dir)
    if chain and parent_path == chain[-1]:
        raise ProfileError(f"{source}: field 'extends': the profile extends itself ({ref!r})")
    if parent_path in chain:
        loop = " -> ".join(p.name for p in (*chain[chain.index(parent_path):], parent_path))
        raise ProfileError(f"{source}: field 'extends': {ref!r} makes a cycle ({loop})")
    parent = resolve_extends(_read(parent_path), str(parent_path), parent_path.parent,
                             (*chain, parent_path))
    _validate(parent, str(parent_path))
    check_fields(child, ProfileSpec, source, ref)
    if "name" not in child:
        raise ProfileError(f"{source}: a profile that extends {ref!r} states its own 'name' "
                           f"(missing field 'name')")
    return merge(parent, child, ProfileSpec)


def _validate(data: Any, source: str) -> ProfileSpec:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a mapping, got {type(data).__name__}")
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as e:
        raise ProfileError(_one_line(e, source)) from None


def parse_profile(data: Any, source: str = "<profile>", base_dir: str | Path | None = None) -> ProfileSpec:
    """Validate a mapping as a :class:`ProfileSpec`, its ``extends:`` resolved (a relative
    parent path against ``base_dir``, default the working directory). Raises ProfileError
    naming ``source`` and the first bad field (or the parent at fault)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a mapping, got {type(data).__name__}")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    return _validate(resolve_extends(data, source, base), source)


def load_profile_file(path: str | Path) -> ProfileSpec:
    """Read and validate one profile YAML (its ``extends:`` chain resolved, relative parent
    paths against the file's directory). Raises ProfileError for a missing file, bad YAML,
    a bad parent or a bad field (naming the file)."""
    p = Path(path)
    data = _read(p)
    if not isinstance(data, dict):
        raise ProfileError(f"{p}: a profile must be a mapping, got {type(data).__name__}")
    return _validate(resolve_extends(data, str(p), p.parent, (p.resolve(),)), str(p))
