"""The site policy: how ``gpushare`` requests become MIG slices, MPS shares or whole GPUs (TOML, strict).

The file is versioned (``version = 1`` is required) and strict: an unknown key anywhere, or a value
of the wrong type or out of range, is an error that names the key and the file, so a typo is
reported instead of silently ignored. Every key is optional; the defaults are those of
:class:`SitePolicy` and of ``slurm_gpushare/data/site/gpushare.toml.example``, which documents each key::

    version = 1
    mode_order = ["mig", "mps", "gpu"]
    model_preference = []
    max_count = 8
    police_direct = true
    shard_unit = "1G"
    headroom = 0.2

    [mig]
    enabled = true
    fit = "nominal"
    max_waste = 0.5

    [whole_gpu]
    fit = "nominal"
    threshold = 1.0

    [jobstats]
    notes = true
    low_sm = 15
    low_memory = 50
    footer = ""

    [partitions.debug]
    modes = ["mps"]

Parsing is pure (:func:`parse_policy`); :func:`load_policy` reads the file first.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gpushare.errors import ConfigError, InputError
from slurm_gpushare.memsize import parse_shard_unit_value

POLICY_VERSION = 1
#: The kinds of GPU share, as ``mode=`` names them.
KINDS = ("mig", "mps", "gpu")
#: Fit rules (see :class:`SitePolicy`).
FITS = ("nominal", "exact")
#: The most characters of ``[jobstats] footer``.
FOOTER_CHARS = 300


@dataclass(frozen=True)
class SitePolicy:
    """A site's rules for ``gpushare`` requests. The defaults are the shipped policy.

    Attributes:
        mode_order: the kinds ``mode=auto`` may use, most preferred first (default MIG, then an MPS
            share, then whole GPUs). A kind left out is never chosen by ``auto`` (an explicit
            ``mode=`` may still ask for it where the partition allows it).
        mig_enabled: use MIG slices at all.
        mig_fit: when a MIG profile holds a request. ``nominal`` (default): by the size in the
            profile's name, so ``1g.10gb`` holds up to ``mem=10G`` although the instance has
            9.75 GiB (9984 MiB) usable on an H100 80GB (NVML ``nvmlDeviceGetGpuInstanceProfileInfo``
            ``memorySizeMB``); the job gets what the slice has. ``exact``: the instance's memory
            (``memory_mib``) must be at least the request.
        mig_max_waste: with ``mode=auto``, a MIG slice is used only when the part of it the request
            leaves unused is at most this fraction of the slice (0-1; default 0.5): ``mem=3G`` would
            leave 70% of a ``1g.10gb`` unused, so it gets an MPS share instead. ``mode=mig`` ignores it.
        gpu_fit: when a whole GPU holds a request. ``nominal`` (default): its memory rounded to the
            nearest GiB, so an H100 80GB (81559 MiB = 79.6 GiB, ``nvmlDeviceGetMemoryInfo().total``)
            holds ``mem=80G`` and an RTX 4090 (24564 MiB) holds ``mem=24G``. ``exact``: its memory
            in MiB must be at least the request.
        whole_gpu_threshold: with ``mode=auto``, a request of at least this fraction of a GPU model's
            memory (per ``gpu_fit``) gets whole GPUs of that model, whatever ``mode_order`` says
            (0 < x <= 1; default 1.0: only requests of a whole GPU's size).
        model_preference: GPU models (GRES types: ``h100``, ``a100``) to prefer on heterogeneous
            clusters when two candidates of the same kind waste the same memory; earlier is
            preferred, unlisted models come after, then by name. Default: none.
        partitions: per-partition overrides: partition name -> the kinds allowed there. A job in
            several partitions may use only the kinds all of them allow. Partitions not listed
            allow all kinds.
        police_direct: check direct ``--gres=shard:N`` / ``--gres=mps:N`` requests too (default on;
            they would otherwise bypass the limits).
        max_count: the largest count (GPUs or slices on one node) one request may ask for.
        shard_unit_mib: GPU memory per shard in MiB (default 1024; must match the gres.conf
            generator's unit, which the filter service passes to the cluster inventory).
        headroom: what ``jobstats`` and ``report --waste`` add to a job's peak memory when they
            suggest a request for next time, as a fraction of the peak (0-4; default 0.2: peak x 1.2).
        notes: ``jobstats`` prints efficiency notes under a job's figures (``[jobstats] notes``).
        notes_low_sm: a note when the job's mean SM utilization is below this percent (0-100; default 15).
        notes_low_memory: a note when its peak GPU memory is below this percent of what it asked for (0-100;
            default 50, ``report --waste``'s line).
        notes_footer: a line the site adds under the notes (its documentation, a contact): printable text, at
            most :data:`FOOTER_CHARS` characters; default none.
        source: where the policy came from (a file name, or ``built-in defaults``).
    """

    mode_order: tuple[str, ...] = ("mig", "mps", "gpu")
    mig_enabled: bool = True
    mig_fit: str = "nominal"
    mig_max_waste: float = 0.5
    gpu_fit: str = "nominal"
    whole_gpu_threshold: float = 1.0
    model_preference: tuple[str, ...] = ()
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    police_direct: bool = True
    max_count: int = 8
    shard_unit_mib: int = 1024
    headroom: float = 0.2
    notes: bool = True
    notes_low_sm: float = 15.0
    notes_low_memory: float = 50.0
    notes_footer: str = ""
    source: str = "built-in defaults"

    def __post_init__(self):
        problems = _check(self)
        if problems:
            message, key = problems[0]
            raise ConfigError(message, hint=_hint(key), source=self.source)

    def allowed_kinds(self, partitions: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """The kinds a job in all of ``partitions`` may get, in :data:`KINDS` order.

        MIG is left out when ``mig_enabled`` is off; partitions without an override allow all kinds.
        """
        allowed = [k for k in KINDS if k != "mig" or self.mig_enabled]
        for p in partitions:
            if p in self.partitions:
                allowed = [k for k in allowed if k in self.partitions[p]]
        return tuple(allowed)


def _check(p: SitePolicy) -> list[tuple[str, str]]:
    """Each problem of ``p`` as (message, the key it is about)."""
    out = []
    if not p.mode_order or len(set(p.mode_order)) != len(p.mode_order) or any(k not in KINDS for k in p.mode_order):
        out.append((f"mode_order must list some of {', '.join(KINDS)}, each once, not {list(p.mode_order)}",
                    "mode_order"))
    if p.mig_fit not in FITS:
        out.append((f"mig.fit must be one of {', '.join(FITS)}, not {p.mig_fit!r}", "mig.fit"))
    if p.gpu_fit not in FITS:
        out.append((f"whole_gpu.fit must be one of {', '.join(FITS)}, not {p.gpu_fit!r}", "whole_gpu.fit"))
    if not 0 <= p.mig_max_waste <= 1:
        out.append((f"mig.max_waste must be between 0 and 1, not {p.mig_max_waste}", "mig.max_waste"))
    if not 0 < p.whole_gpu_threshold <= 1:
        out.append((f"whole_gpu.threshold must be more than 0 and at most 1, not {p.whole_gpu_threshold}",
                    "whole_gpu.threshold"))
    if p.max_count < 1:
        out.append((f"max_count must be at least 1, not {p.max_count}", "max_count"))
    if p.shard_unit_mib < 1:
        out.append((f"shard_unit must be at least 1 MiB, not {p.shard_unit_mib} MiB", "shard_unit"))
    if not 0 <= p.headroom <= 4:
        out.append((f"headroom must be between 0 and 4 (a fraction of the peak), not {p.headroom}", "headroom"))
    for key, value in (("jobstats.low_sm", p.notes_low_sm), ("jobstats.low_memory", p.notes_low_memory)):
        if not 0 <= value <= 100:
            out.append((f"{key} must be a percentage (0-100), not {value}", key))
    if len(p.notes_footer) > FOOTER_CHARS or not p.notes_footer.isprintable():
        out.append((f"jobstats.footer must be one line of printable text of at most {FOOTER_CHARS} characters "
                    f"(it has {len(p.notes_footer)})", "jobstats.footer"))
    for name, modes in p.partitions.items():
        if not modes or any(k not in KINDS for k in modes):
            out.append((f"partitions.{name}.modes must list some of {', '.join(KINDS)}, not {list(modes)}",
                        f"partitions.{name}.modes"))
    return out


#: What a valid line of each key looks like (the shipped defaults, or an example), for hints.
_EXAMPLES = {
    "version": f"version = {POLICY_VERSION}",
    "mode_order": 'mode_order = ["mig", "mps", "gpu"]',
    "model_preference": 'model_preference = ["h100", "a100"]',
    "max_count": "max_count = 8",
    "police_direct": "police_direct = true",
    "shard_unit": 'shard_unit = "1G"',
    "headroom": "headroom = 0.2",
    "mig": "[mig] with enabled = true, fit = \"nominal\", max_waste = 0.5",
    "mig.enabled": "enabled = true under [mig]",
    "mig.fit": 'fit = "nominal" (or "exact") under [mig]',
    "mig.max_waste": "max_waste = 0.5 under [mig]",
    "whole_gpu": "[whole_gpu] with fit = \"nominal\", threshold = 1.0",
    "whole_gpu.fit": 'fit = "nominal" (or "exact") under [whole_gpu]',
    "whole_gpu.threshold": "threshold = 1.0 under [whole_gpu]",
    "partitions": '[partitions.NAME] with modes = ["mps", "gpu"]',
    "jobstats": '[jobstats] with notes = true, low_sm = 15, low_memory = 50, footer = ""',
    "jobstats.notes": "notes = true under [jobstats]",
    "jobstats.low_sm": "low_sm = 15 under [jobstats]",
    "jobstats.low_memory": "low_memory = 50 under [jobstats]",
    "jobstats.footer": 'footer = "GPU efficiency: https://hpc.example.org/gpu" under [jobstats]',
}


def _hint(key: str) -> str:
    """What would work for ``key``: a valid line, and where every key is described."""
    if key.startswith("partitions."):
        name = key.split(".")[1]
        example = f'modes = ["mps", "gpu"] (some of {", ".join(KINDS)}) under [partitions.{name}]'
    else:
        example = _EXAMPLES.get(key, "")
    where = "gpushare.toml.example (shipped in slurm_gpushare/data/site/) describes every key"
    return f"write e.g. {example}; {where}" if example else where


# The keys each table may hold; anything else is an error.
_TOP = {"version", "mode_order", "model_preference", "max_count", "police_direct", "shard_unit", "headroom",
        "mig", "whole_gpu", "partitions", "jobstats"}
_MIG = {"enabled", "fit", "max_waste"}
_JOBSTATS = {"notes", "low_sm", "low_memory", "footer"}
_WHOLE = {"fit", "threshold"}
_PARTITION = {"modes"}


def parse_policy(text: str, *, source: str = "<policy>") -> SitePolicy:
    """Parse a policy file's text.

    Args:
        text: TOML text.
        source: the file name, for messages.

    Raises:
        ConfigError: not TOML, no or another ``version``, an unknown key, a value of the wrong type
            or out of range. The message names the key; ``source`` names the file.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", hint="fix the line named (strings are quoted, lists are in "
                          "[...], each key once); gpushare.toml.example shows every key", source=source) from None
    except (ValueError, RecursionError) as e:  # an integer past Python's digit limit; arrays nested too deep
        raise ConfigError(f"not a policy file tomllib can read: {type(e).__name__}: {str(e)[:200]}",
                          hint="no key takes numbers of thousands of digits or arrays nested thousands deep; "
                               "gpushare.toml.example shows every key", source=source) from None
    return policy_from_dict(data, source=source)


def policy_from_dict(data: dict[str, Any], *, source: str = "<policy>") -> SitePolicy:
    """Build a :class:`SitePolicy` from parsed TOML (see :func:`parse_policy`).

    Raises:
        ConfigError: as :func:`parse_policy`.
    """
    version = data.get("version")
    if version is None:
        raise ConfigError("the policy file has no version", hint=f"write version = {POLICY_VERSION} at the top",
                          source=source)
    if isinstance(version, bool) or version != POLICY_VERSION:
        raise ConfigError(f"unsupported policy version {version!r}",
                          hint=f"this slurm-gpushare reads version {POLICY_VERSION}", source=source)
    _unknown(data, _TOP, "", source)
    kw: dict[str, Any] = {"source": source}
    if "mode_order" in data:
        kw["mode_order"] = _strs(data["mode_order"], "mode_order", source)
    if "model_preference" in data:
        kw["model_preference"] = _strs(data["model_preference"], "model_preference", source)
    if "max_count" in data:
        kw["max_count"] = _int(data["max_count"], "max_count", source)
    if "police_direct" in data:
        kw["police_direct"] = _bool(data["police_direct"], "police_direct", source)
    if "shard_unit" in data:
        try:
            kw["shard_unit_mib"] = parse_shard_unit_value(data["shard_unit"])
        except InputError as e:
            raise ConfigError(e.message, hint=e.hint or _hint("shard_unit"), source=source) from None
    if "headroom" in data:
        kw["headroom"] = _number(data["headroom"], "headroom", source)
    mig = _table(data.get("mig", {}), "mig", source)
    _unknown(mig, _MIG, "mig.", source)
    if "enabled" in mig:
        kw["mig_enabled"] = _bool(mig["enabled"], "mig.enabled", source)
    if "fit" in mig:
        kw["mig_fit"] = _str(mig["fit"], "mig.fit", source)
    if "max_waste" in mig:
        kw["mig_max_waste"] = _number(mig["max_waste"], "mig.max_waste", source)
    whole = _table(data.get("whole_gpu", {}), "whole_gpu", source)
    _unknown(whole, _WHOLE, "whole_gpu.", source)
    if "fit" in whole:
        kw["gpu_fit"] = _str(whole["fit"], "whole_gpu.fit", source)
    if "threshold" in whole:
        kw["whole_gpu_threshold"] = _number(whole["threshold"], "whole_gpu.threshold", source)
    notes = _table(data.get("jobstats", {}), "jobstats", source)
    _unknown(notes, _JOBSTATS, "jobstats.", source)
    if "notes" in notes:
        kw["notes"] = _bool(notes["notes"], "jobstats.notes", source)
    for key, attr in (("low_sm", "notes_low_sm"), ("low_memory", "notes_low_memory")):
        if key in notes:
            kw[attr] = _number(notes[key], f"jobstats.{key}", source)
    if "footer" in notes:
        kw["notes_footer"] = _str(notes["footer"], "jobstats.footer", source)
    parts = _table(data.get("partitions", {}), "partitions", source)
    overrides: dict[str, tuple[str, ...]] = {}
    for name, table in parts.items():
        t = _table(table, f"partitions.{name}", source)
        _unknown(t, _PARTITION, f"partitions.{name}.", source)
        if "modes" not in t:
            raise ConfigError(f"partitions.{name} has no modes", hint='write modes = ["mig", "mps", "gpu"] '
                              "with the kinds allowed there", source=source)
        overrides[name] = _strs(t["modes"], f"partitions.{name}.modes", source)
    kw["partitions"] = overrides
    return SitePolicy(**kw)


def load_policy(path: str | Path) -> SitePolicy:
    """Read and parse a policy file.

    Raises:
        ConfigError: unreadable or invalid (the message names the file).
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read the policy file: {e.strerror}",
                          hint="give the path of a policy file; gpushare.toml.example is one to start from",
                          source=str(p)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"the policy file is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})",
                          hint="TOML files are UTF-8: save it as UTF-8", source=str(p)) from None
    return parse_policy(text, source=str(p))


def _unknown(table: dict[str, Any], known: set[str], where: str, source: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown key {where}{unknown[0]}",
                          hint=f"known keys{' in [' + where[:-1] + ']' if where else ''}: {', '.join(sorted(known))}",
                          source=source)


def _wrong(value: Any, key: str, expected: str, source: str) -> ConfigError:
    return ConfigError(f"{key} must be {expected}, not {type(value).__name__} {value!r}", hint=_hint(key),
                       source=source)


def _table(value: Any, key: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong(value, key, "a table", source)
    return value


def _bool(value: Any, key: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong(value, key, "true or false", source)
    return value


def _int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(value, key, "a whole number", source)
    return value


def _number(value: Any, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(value, key, "a number", source)
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise ConfigError(f"{key} is too large a number ({len(str(value))} digits)", hint=_hint(key),
                          source=source) from None


def _str(value: Any, key: str, source: str) -> str:
    if not isinstance(value, str):
        raise _wrong(value, key, "a string", source)
    return value


def _strs(value: Any, key: str, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _wrong(value, key, "a list of strings", source)
    return tuple(value)
