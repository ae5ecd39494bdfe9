"""JSON and YAML documents of administrators' files (machine descriptions, MIG layouts, demand files), read with
errors of one line: where the parser stopped (line and column) and what it found, never a parser's multi-line
message or a traceback. A document nested deeper than the parser's recursion goes (``[[[[...`` 100,000 deep)
is one such error too: Python's ``json`` and PyYAML's composer recurse once per level and raise
``RecursionError`` there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from slurm_gpushare.errors import InputError, ParseError

#: What a nesting too deep for the parser is called in messages.
TOO_DEEP = "nested too deeply (arrays or objects inside each other more than about a thousand levels)"


def kind(path: str | PurePath, text: str, *, json_starts: str = "{", other: str = "YAML") -> str:
    """``"JSON"`` or ``other``, the format a file is read as: from its name's extension (``.json``; ``.yaml``
    and ``.yml`` are YAML, ``.csv`` CSV), else ``"JSON"`` when its first non-blank character is one of
    ``json_starts``."""
    suffix = PurePath(path).suffix.lower()
    if suffix == ".json":
        return "JSON"
    if suffix in (".yaml", ".yml"):
        return "YAML"
    if suffix == ".csv":
        return "CSV"
    first = text.lstrip()[:1]
    return "JSON" if first and first in json_starts else other


def parse_json(text: str, *, source: str, error: Callable[..., InputError] = ParseError,
               object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads(text)``.

    Raises:
        ParseError (or ``error``, an :class:`~slurm_gpushare.errors.InputError` class), with ``source``: ``not
            valid JSON: line L column C (the parser's message)``, or nested too deeply (:data:`TOO_DEEP`). An
            error raised by ``object_pairs_hook`` passes through.
    """
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise error(f"not valid JSON: line {e.lineno} column {e.colno} ({e.msg})", source=source) from None
    except RecursionError:
        raise error(f"JSON {TOO_DEEP}", source=source) from None


def parse_yaml(text: str, *, source: str, error: Callable[..., InputError] = ParseError) -> Any:
    """``yaml.safe_load(text)`` (PyYAML).

    Raises:
        ParseError (or ``error``), with ``source``: ``not valid YAML: line L column C (the problem PyYAML
            names)``, or nested too deeply.
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1} " if mark is not None else ""
        problem = " ".join(str(e.problem or e.context or "unreadable").split())
        raise error(f"not valid YAML: {where}({problem})", source=source) from None
    except yaml.YAMLError as e:
        raise error(f"not valid YAML ({' '.join(str(e).split())[:300]})", source=source) from None
    except RecursionError:
        raise error(f"YAML {TOO_DEEP}", source=source) from None
