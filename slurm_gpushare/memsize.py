"""GPU memory sizes as users and administrators write them: ``10G``, ``81920M``, ``1.5T``.

Units are base 1024 (K, M, G, T; an optional trailing ``B``/``iB`` is accepted: ``10GiB``). A bare
number means the caller's default unit, or is refused where the caller has none (command-line GPU
sizes: ``80`` could mean GiB or MiB). Results are whole MiB, the unit NVML reports memory in.

The shard unit (GPU memory per ``shard`` GRES) has one parser, :func:`parse_shard_unit`, for the three
places that must agree on it: the site policy, node.toml and ``gres-conf --shard-unit``.
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import InputError

#: Most memory one GPU (or MIG device) may be described with: 16 TiB, in MiB. Far above any GPU made
#: (the largest have a few hundred GiB); a larger value is a unit slip.
MAX_MEMORY_MIB = 16 * 1024 * 1024

_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_mib(text: str, *, default_unit: str | None = "M", what: str = "size",
              maximum: int | None = None) -> int:
    """Parse a memory size into MiB (rounded down to whole MiB).

    Args:
        text: e.g. ``10G``, ``81920M``, ``512K``, ``80``.
        default_unit: unit of a bare number (``M`` or ``G``...); None: a bare number is refused,
            for values where either unit is plausible (``--memory 80`` could be 80 GiB or 80 MiB).
        what: name of the value in error messages (``--memory``, ``mem=``).
        maximum: the largest size allowed, in MiB (None: no limit).

    Raises:
        InputError: not a positive size with a known unit, a bare number where a unit is required,
            or more than ``maximum``.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{what}: {text!r} is not a memory size",
                         hint="write a number with a unit K, M, G or T (base 1024), e.g. 10G or 81920M")
    if default_unit is None and not m.group(2):
        raise InputError(f"{what}: {text!r} has no unit",
                         hint="write 80G or 81920M; K, M, G and T are base 1024")
    mib = int(_exact_mib(m, default_unit))
    if mib <= 0:
        raise InputError(f"{what}: {text!r} is less than 1 MiB", hint="give a positive size such as 10G")
    if maximum is not None and mib > maximum:
        raise InputError(f"{what}: {text!r} is more than {format_mib(maximum)}",
                         hint=f"give a size from 1M to {format_mib(maximum)}, e.g. 80G")
    return mib


def format_mib(mib: int) -> str:
    """``10240`` -> ``10G``; ``81559`` -> ``81559M`` (exact, no rounding); ``0`` -> ``0G``."""
    if mib == 0:
        return "0G"  # not "0T": 0 is a multiple of every unit
    for unit, factor in (("T", 1024 * 1024), ("G", 1024)):
        if mib % factor == 0:
            return f"{mib // factor}{unit}"
    return f"{mib}M"


def parse_shard_unit_value(value: object, *, what: str = "shard_unit") -> int:
    """The shard unit as a TOML file gives it (site policy, node.toml): :func:`parse_shard_unit` of a
    string; an unquoted number (``shard_unit = 1``, a TOML integer) is refused saying what to write.

    Raises:
        InputError: not a string, or what :func:`parse_shard_unit` refuses.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise InputError(f"{what} = {value} has no unit",
                         hint=f'write {what} = "1G" or "1024M" (a quoted size; K, M, G and T are base 1024)')
    if not isinstance(value, str):
        raise InputError(f"{what} must be a quoted size such as \"1G\", not {type(value).__name__}")
    return parse_shard_unit(value, what=what)


def parse_shard_unit(text: str, *, what: str = "shard_unit") -> int:
    """Parse the shard unit (GPU memory per ``shard`` GRES) into MiB.

    The one parser of ``shard_unit`` in the site policy (gpushare.toml), ``shard_unit`` in node.toml
    and ``slurm-gpushare gres-conf --shard-unit``: the three must agree, since gres.conf gives each
    GPU ``Count=<memory in units>``, the policy turns ``mem=`` into ``shard:N`` and the Prolog turns
    N shards into an MPS memory limit. A unit is required (a bare ``1`` once meant 1 MiB in the policy
    and 1 GiB in node.toml), and the size must be a whole number of MiB (NVML counts memory in MiB).

    Args:
        text: e.g. ``1G``, ``1024M``, ``512M``, ``0.5G``, ``1GiB`` (K, M, G, T base 1024).
        what: name of the value in error messages (``shard_unit``, ``--shard-unit``).

    Returns:
        The unit in MiB, from 1 to :data:`MAX_MEMORY_MIB`.

    Raises:
        InputError: not a size, no unit, less than 1 MiB, not a whole number of MiB, or more than 16 TiB.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{what}: {text!r} is not a memory size",
                         hint="write a number with a unit K, M, G or T (base 1024), e.g. 1G or 512M")
    if not m.group(2):
        raise InputError(f"{what}: {text!r} has no unit",
                         hint="write 1G or 1024M; K, M, G and T are base 1024")
    exact = _exact_mib(m, None)
    if exact < 1:
        raise InputError(f"{what}: {text!r} is less than 1 MiB", hint="give a size such as 1G or 512M")
    if exact != int(exact):
        raise InputError(f"{what}: {text!r} is not a whole number of MiB",
                         hint=f"give {int(exact)}M or {int(exact) + 1}M")
    if exact > MAX_MEMORY_MIB:
        raise InputError(f"{what}: {text!r} is more than {format_mib(MAX_MEMORY_MIB)}",
                         hint="give a size such as 1G; it must not exceed any GPU's memory")
    return int(exact)


def _exact_mib(m: re.Match, default_unit: str | None) -> float:
    """The size matched by :data:`_SIZE` in MiB, not rounded."""
    return float(m.group(1)) * _FACTOR_MIB[(m.group(2) or default_unit or "M").upper()]
