"""YAML read with one meaning: PyYAML's safe loader implements YAML 1.1, whose implicit
types read plain scalars that YAML 1.2 (and most other tools) read as text: ``1:30`` is
the integer 90 (base 60), ``yes`` / ``no`` / ``on`` / ``off`` / ``y`` / ``n`` are booleans,
``010`` is 8 (octal), ``1_000`` is 1000, ``0b101`` is 5, ``2024-01-02`` is a date. A cluster
spec with ``num_nodes: 1:30`` became 90 nodes without a word.

:class:`StrictLoader` refuses every plain scalar that YAML 1.1 resolves to a type through
one of these forms, naming its line and what to write; the forms YAML 1.1 and 1.2 agree on
(``8``, ``-3``, ``0x1F``, ``2.5``, ``1.0e+9``, ``true``, ``false``, ``null``, ``~``) load as
before (the YAML 1.2 core schema, https://yaml.org/spec/1.2.2/#1032-tag-resolution). It
also refuses a mapping that names one key twice (PyYAML keeps the last in silence)."""

from __future__ import annotations

import re
from typing import Any

import yaml

#: plain integers both YAML versions read alike: decimal without a leading zero, hex
_INT_OK = re.compile(r"[-+]?(0|[1-9][0-9]*)|0x[0-9a-fA-F]+")
#: plain floats both read alike (a dot and, with an exponent, a signed one), and .inf / .nan
_FLOAT_OK = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+][0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
_BOOL_OK = ("true", "True", "TRUE", "false", "False", "FALSE")


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's implicit-type surprises (module docstring):
    each refused scalar raises ``yaml.constructor.ConstructorError`` with its position."""

    def _refuse(self, node: Any, read: str, write: str) -> None:
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} reads as {read} in YAML 1.1 (PyYAML) but otherwise in "
                        f"YAML 1.2; {write}", node.start_mark)

    def construct_yaml_int(self, node: Any) -> Any:
        """An integer of a form both YAML versions read alike; else refused."""
        value = super().construct_yaml_int(node)
        if node.style is None and not _INT_OK.fullmatch(node.value):
            self._refuse(node, repr(value), "write the number in decimal, or quote it for text")
        return value

    def construct_yaml_float(self, node: Any) -> Any:
        """A float of a form both YAML versions read alike; else refused."""
        value = super().construct_yaml_float(node)
        if node.style is None and not _FLOAT_OK.fullmatch(node.value):
            self._refuse(node, repr(value), "write it as 1.5 or 1.5e+3, or quote it for text")
        return value

    def construct_yaml_bool(self, node: Any) -> Any:
        """``true`` / ``false`` only (not ``yes``, ``on``, ``y`` ...)."""
        value = super().construct_yaml_bool(node)
        if node.style is None and node.value not in _BOOL_OK:
            self._refuse(node, repr(value), "write true or false, or quote it for text")
        return value

    def construct_yaml_timestamp(self, node: Any, values: Any = None) -> Any:
        """Refused: a date or time is text here (quote it)."""
        self._refuse(node, "a date", "quote it")

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        """A mapping; one key given twice is refused (PyYAML keeps the last)."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


for _tag, _fn in (("int", StrictLoader.construct_yaml_int),
                  ("float", StrictLoader.construct_yaml_float),
                  ("bool", StrictLoader.construct_yaml_bool),
                  ("timestamp", StrictLoader.construct_yaml_timestamp)):
    StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _fn)


def load(text: str) -> Any:
    """``text`` parsed by :class:`StrictLoader`. Raises yaml.YAMLError (a refused scalar is
    a ConstructorError with its line)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
