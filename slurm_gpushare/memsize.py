"""GPU memory sizes as users and administrators write them: ``10G``, ``81920M``, ``1.5T``.

Units are base 1024 (K, M, G, T; an optional trailing ``B``/``iB`` is accepted: ``10GiB``). A bare
number means the caller's default unit, or is refused where the caller has none (command-line GPU
sizes: ``80`` could mean GiB or MiB). Results are whole MiB, the unit NVML reports memory in.
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import InputError

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
    number, unit = float(m.group(1)), (m.group(2) or default_unit or "M").upper()
    mib = int(number * _FACTOR_MIB[unit])
    if mib <= 0:
        raise InputError(f"{what}: {text!r} is less than 1 MiB", hint="give a positive size such as 10G")
    if maximum is not None and mib > maximum:
        raise InputError(f"{what}: {text!r} is more than {format_mib(maximum)}",
                         hint=f"give a size from 1M to {format_mib(maximum)}, e.g. 80G")
    return mib


def format_mib(mib: int) -> str:
    """``10240`` -> ``10G``; ``81559`` -> ``81559M`` (exact, no rounding)."""
    for unit, factor in (("T", 1024 * 1024), ("G", 1024)):
        if mib % factor == 0:
            return f"{mib // factor}{unit}"
    return f"{mib}M"
