"""GPU memory sizes as users and administrators write them: ``10G``, ``81920M``, ``1.5T``.

Units are base 1024 (K, M, G, T; an optional trailing ``B``/``iB`` is accepted: ``10GiB``). A bare
number means the caller's default unit. Results are whole MiB, the unit NVML reports memory in.
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import InputError

_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_mib(text: str, *, default_unit: str = "M", what: str = "size") -> int:
    """Parse a memory size into MiB (rounded down to whole MiB).

    Args:
        text: e.g. ``10G``, ``81920M``, ``512K``, ``80``.
        default_unit: unit of a bare number (``M`` or ``G``...).
        what: name of the value in error messages (``--memory``, ``mem=``).

    Raises:
        InputError: not a positive size with a known unit.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{what}: {text!r} is not a memory size",
                         hint="write a number with a unit K, M, G or T (base 1024), e.g. 10G or 81920M")
    number, unit = float(m.group(1)), (m.group(2) or default_unit).upper()
    mib = int(number * _FACTOR_MIB[unit])
    if mib <= 0:
        raise InputError(f"{what}: {text!r} is less than 1 MiB", hint="give a positive size such as 10G")
    return mib


def format_mib(mib: int) -> str:
    """``10240`` -> ``10G``; ``81559`` -> ``81559M`` (exact, no rounding)."""
    for unit, factor in (("T", 1024 * 1024), ("G", 1024)):
        if mib % factor == 0:
            return f"{mib // factor}{unit}"
    return f"{mib}M"
