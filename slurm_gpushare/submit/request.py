"""GPU-share requests as Slurm hands them to job_submit: TRES strings and the ``gpushare`` knobs (pure).

What the filter sees (Slurm 22.05, ``job_desc.tres_per_node``) is a comma-separated list of GRES
items, each ``<prefix><name>[:<type>][:<count>]`` with the prefix ``gres:`` (22.05) or ``gres/``
(newer Slurm), e.g. ``gres:gpushare:mem=10G+sm=25:2,gres:nic:1``. Slurm's clients accept at most
``name:type:count``, so the ``gpushare`` knobs travel inside the *type* field, joined by ``+``:

* ``mem=SIZE``: GPU memory per GPU or slice; units K, M, G, T (base 1024), decimals allowed
  (``mem=10.5G``). A unit is required: a bare ``mem=10`` is refused rather than guessed.
  Required unless ``mode=gpu``.
* ``sm=PERCENT``: compute share, the MPS active thread percentage, 1-100. It asks for an MPS share.
* ``mode=auto|mig|mps|gpu``: which kind of GPU share; ``auto`` (default) lets the site policy choose.
* the count (``gpushare:mem=10G:2``): that many GPUs or MIG slices on one node (default 1).

Repeated ``gpushare`` items are merged (``gpushare:mem=10G,gpushare:sm=25``); a knob given twice is
an error. The grammar, examples and every message are in ``docs/request-syntax.md``.

Every error is an :class:`~slurm_gpushare.errors.InputError` whose message says what was wrong and
whose hint says what would work; the templates are in :data:`MESSAGES` (the documentation's list of
messages is checked against it by the tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpushare.errors import InputError
from slurm_gpushare.memsize import format_mib, parse_mib
from slurm_gpushare.slurm.gres import GresItem, GresSyntaxError, item_name, parse_item, prefix_of, split_items

#: GRES names whose requests the policy handles: our own, and the two it polices.
SHARE_NAMES = ("gpushare", "shard", "mps")
#: The knobs of a gpushare request, in the order they are written back.
KNOBS = ("mem", "sm", "mode")
MODES = ("auto", "mig", "mps", "gpu")

#: Every refusal of this module: id -> (message template, hint template). ``str.format`` fields.
MESSAGES: dict[str, tuple[str, str]] = {
    "item": ("cannot read the GRES item '{item}'",
             "write name[:type][:count], e.g. gpushare:mem=10G or gpu:h100:1"),
    "count": ("the count '{count}' in '{item}' is not a whole number",
              "write a count of 1 or more at the end, e.g. gpushare:mem=10G:2"),
    "count-zero": ("the count in '{item}' is 0",
                   "ask for at least 1 GPU or slice, e.g. gpushare:mem=10G:1"),
    "count-twice": ("the count is given twice ({first} and {second})",
                    "give the count once, e.g. gpushare:mem=10G,gpushare:sm=25:2"),
    "knob-form": ("'{knob}' is not a knob",
                  "write key=value knobs joined by '+', e.g. gpushare:mem=10G+sm=25"),
    "knob-unknown": ("unknown knob '{key}' in '{knob}'", "known knobs: mem, sm, mode"),
    "knob-twice": ("{key}= is given twice ({first} and {second})", "give each knob once"),
    "mem-unit": ("mem={value}: '{value}' has no unit",
                 "write the unit, e.g. mem=10G (K, M, G or T; base 1024)"),
    "mem-size": ("mem={value}: '{value}' is not a memory size",
                 "write mem=10G (K, M, G or T; base 1024; decimals allowed: mem=10.5G)"),
    "mem-small": ("mem={value}: less than 1 MiB of GPU memory", "write mem=10G"),
    "sm": ("sm={value}: '{value}' is not a percentage from 1 to 100",
           "write sm=25 for a quarter of a GPU's compute"),
    "mode": ("mode={value}: unknown mode", "use mode=auto, mode=mig, mode=mps or mode=gpu"),
    "mem-missing": ("gpushare:{text} asks for no GPU memory",
                    "write gpushare:mem=10G, or gpushare:mode=gpu:N for N whole GPUs"),
}

_TYPE = re.compile(r"[A-Za-z0-9_.-]+")
_COUNT = re.compile(r"[0-9]+")
_MEM = re.compile(r"([0-9]{1,12})(\.[0-9]{1,9})?([KMGT])(?:I?B)?", re.IGNORECASE)
_BARE = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_MAX_SHOWN = 60


def make_error(message_id: str, catalog: dict[str, tuple[str, str]] = MESSAGES, /,
               **fields: object) -> InputError:
    """Build the :class:`InputError` for message ``message_id`` of ``catalog`` (user text made one short line).

    Args:
        message_id: the message's id in the catalog.
        catalog: ``{id: (message template, hint template)}``.
        **fields: the template's fields; strings are shortened and control characters replaced.
    """
    shown = {k: _shown(v) if isinstance(v, str) else v for k, v in fields.items()}
    message, hint = catalog[message_id]
    return InputError(message.format(**shown), hint=hint.format(**shown) or None)


def _shown(text: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


@dataclass(frozen=True)
class GpushareRequest:
    """A parsed ``gpushare`` request (all ``gpushare`` items of one job, merged).

    Attributes:
        mem_mib: GPU memory per GPU or slice in MiB, or None (only with ``mode=gpu``).
        mem_text: the ``mem=`` value as written (``10G``), or None.
        sm_percent: MPS active thread percentage (1-100), or None.
        mode: ``auto``, ``mig``, ``mps`` or ``gpu``.
        count: GPUs or slices on one node (>= 1).
        text: the request as written, without name and prefix (``mem=10G+sm=25:2``).
    """

    mem_mib: int | None = None
    mem_text: str | None = None
    sm_percent: int | None = None
    mode: str = "auto"
    count: int = 1
    text: str = ""

    def spec(self, *, mem_mib: int | None = None, mode: str | None = None, count: int | None = None,
             sm: bool = True) -> str:
        """A ``gpushare:...`` request like this one with some parts replaced (for hints).

        Args:
            mem_mib: memory in MiB to write instead (written exactly: ``80G``, ``81559M``).
            mode: mode to write instead (``auto`` is left out).
            count: count to write instead (1 is left out).
            sm: keep the ``sm=`` knob.
        """
        knobs = []
        mem = self.mem_mib if mem_mib is None else mem_mib
        if mem is not None:
            knobs.append(f"mem={format_mib(mem)}")
        if sm and self.sm_percent is not None:
            knobs.append(f"sm={self.sm_percent}")
        m = mode or self.mode
        if m != "auto":
            knobs.append(f"mode={m}")
        n = self.count if count is None else count
        return GresItem("gpushare", "+".join(knobs), None if n == 1 else n).body


#: How cli_filter.lua writes ``=`` inside a ``gpushare`` item on clients of Slurm 23.11 and later, whose TRES
#: parser (``slurm_get_next_tres``, src/common/slurm_protocol_defs.c, run by sbatch, salloc and srun before
#: they submit) refuses a GRES type holding ``=`` unless a number follows its last ``=``
#: (``gpushare:mem=abc``, ``gpushare:mode=mig``, ``gpushare:mem=10G:2``: "Invalid Trackable RESource
#: (TRES) specification", measured on 24.11.5 and 26.05.5; the 22.05 clients accept it; the parser has this
#: "=" rule at slurm-23-11-1-1, not at slurm-23-02-1-1). ``%3D`` is the percent-encoding of ``=``; a user may
#: write it so where no cli_filter.lua is installed.
KNOB_EQUALS = "%3D"


def unescape_knobs(tres: str | None) -> str | None:
    """The TRES string with :data:`KNOB_EQUALS` (any case) read as ``=`` in its ``gpushare`` items only:
    ``gres/gpushare:mem%3D10G+mode%3Dmig,gres/nic:1`` -> ``gres/gpushare:mem=10G+mode=mig,gres/nic:1``.
    Never raises; None stays None."""
    if not tres or "%" not in tres:
        return tres
    return ",".join(re.sub(re.escape(KNOB_EQUALS), "=", t, flags=re.IGNORECASE) if item_name(t) == "gpushare" else t
                    for t in tres.split(","))


def mentions_share(tres: str | None) -> bool:
    """Does a TRES string hold a ``gpushare``, ``shard`` or ``mps`` item? (Never raises.)

    Jobs for which this is false are none of the policy's business and pass untouched.
    """
    return bool(tres) and any(item_name(t) in SHARE_NAMES for t in (tres or "").split(","))


def parse_tres(text: str) -> tuple[GresItem, ...]:
    """Split a TRES string into items (:func:`slurm_gpushare.slurm.gres.parse_item`, prefix kept).

    ``gres:gpushare:mem=10G+sm=25:2,gres:nic:1`` -> ``(GresItem("gpushare", "mem=10G+sm=25", 2,
    prefix="gres:"), GresItem("nic", "", 1, prefix="gres:"))``. Empty items (``a,,b``) are skipped. A
    two-part item is ``name:count`` when the second part is digits, else ``name:type``. Only the
    ``gpushare`` type (its knobs) may hold more than letters, digits and ``_.-``.

    Raises:
        InputError: an item that is not ``[prefix]name[:type][:count]``, or a count that is not a
            whole number (``gpushare:mem=10G:x``).
    """
    try:
        pieces = split_items(text)
    except GresSyntaxError:
        raise make_error("item", item=text) from None
    items = []
    for raw in pieces:
        if raw == prefix_of(raw):  # "" or a bare "gres:": an empty item (Slurm skips it too)
            continue
        try:
            it = parse_item(raw)
        except GresSyntaxError as e:
            if e.part == "count":
                raise make_error("count", count=e.value, item=raw[len(prefix_of(raw)):]) from None
            raise make_error("item", item=raw) from None
        if it.detail or (it.type and it.name != "gpushare" and not _TYPE.fullmatch(it.type)):
            raise make_error("item", item=raw)
        items.append(it)
    return tuple(items)


def parse_gpushare(items: tuple[GresItem, ...] | list[GresItem]) -> GpushareRequest:
    """Merge and validate the ``gpushare`` items of one job.

    Args:
        items: TRES items; those not named ``gpushare`` are ignored.

    Returns:
        The request. ``mem_mib`` is None only with ``mode=gpu``.

    Raises:
        InputError: an unknown or repeated knob, a bad value (memory size, percentage, mode), a
            count of 0 or given twice, or no ``mem=`` outside ``mode=gpu``.
    """
    values: dict[str, str] = {}
    count: int | None = None
    texts = []
    for it in items:
        if it.name != "gpushare":
            continue
        texts.append(it.body[len("gpushare:"):])
        if it.count is not None:
            if it.count == 0:
                raise make_error("count-zero", item=it.body)
            if count is not None and count != it.count:
                raise make_error("count-twice", first=str(count), second=str(it.count))
            count = it.count
        if not it.type:
            continue
        for knob in it.type.split("+"):
            key, eq, value = knob.partition("=")
            if not eq or not key:
                raise make_error("knob-form", knob=knob)
            key = key.lower()
            if key not in KNOBS:
                raise make_error("knob-unknown", key=key, knob=knob)
            if key in values:
                raise make_error("knob-twice", key=key, first=f"{key}={values[key]}", second=knob)
            values[key] = value
    text = ",".join(t for t in texts if t)
    mode = _mode(values["mode"]) if "mode" in values else "auto"
    mem = _mem(values["mem"]) if "mem" in values else None
    sm = _sm(values["sm"]) if "sm" in values else None
    if mem is None and mode != "gpu":
        raise make_error("mem-missing", text=text)
    return GpushareRequest(mem_mib=mem, mem_text=values.get("mem"), sm_percent=sm, mode=mode,
                           count=1 if count is None else count, text=text)


def _mem(value: str) -> int:
    """``mem=`` value -> MiB (whole MiB, rounded down), via :func:`slurm_gpushare.memsize.parse_mib`."""
    if _BARE.fullmatch(value):
        if float(value) == 0:
            raise make_error("mem-small", value=value)
        raise make_error("mem-unit", value=value)
    if not _MEM.fullmatch(value):
        raise make_error("mem-size", value=value)
    try:
        return parse_mib(value, what=f"mem={value}")
    except InputError:
        raise make_error("mem-small", value=value) from None


def _sm(value: str) -> int:
    """``sm=`` value -> percent (1-100)."""
    if not _COUNT.fullmatch(value) or not 1 <= int(value) <= 100:
        raise make_error("sm", value=value)
    return int(value)


def _mode(value: str) -> str:
    mode = value.lower()
    if mode not in MODES:
        raise make_error("mode", value=value)
    return mode
