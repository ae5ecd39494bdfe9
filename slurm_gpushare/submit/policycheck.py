"""``slurm-gpushare policy check``: validate a site policy file and show what it would change, before a reload.

The new file is read exactly as the filter service reads it on SIGHUP
(:func:`~slurm_gpushare.submit.policyfile.load_policy`). A set of sample requests is then decided under
the new file and under the running one, each with the cluster inventory built for it from the same
source the service uses (the machine descriptions directory joined with ``sinfo --json`` and
``scontrol -o show partition``, :func:`~slurm_gpushare.submit.cache.load_inventory`), and the two
answers are put side by side. Deciding is the service's pure
:func:`~slurm_gpushare.submit.policy.decide`, so what is shown is what the service would answer.

The built-in sample set (:func:`sample_requests`): for every partition of the inventory,
``mem=10G``, ``mem=40G``, ``mem=3G``, ``mem=10G+sm=25``, ``mode=gpu:2`` (two whole GPUs), one request of
each MIG profile's nominal size configured there as a GRES type (``mem=10G`` for ``1g.10gb``,
``mem=40G`` for ``4g.40gb`` ...) and a direct ``shard:10``. A requests file (:func:`parse_requests`) has one request per
line, as the ``sbatch`` options would write it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path

from slurm_gpushare.errors import InputError
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurm.gres import parse, prefix_of
from slurm_gpushare.slurm.nodegres import GresOptions, mig_type, node_gres
from slurm_gpushare.submit.cache import load_inventory
from slurm_gpushare.submit.inventory import ClusterInventory
from slurm_gpushare.submit.policy import Decision, decide, nominal_profile_mib
from slurm_gpushare.submit.policyfile import SitePolicy

#: The requests every partition is asked for (``--gres=`` values), besides one per MIG profile size.
BASE_REQUESTS = ("gpushare:mem=10G", "gpushare:mem=40G", "gpushare:mem=3G", "gpushare:mem=10G+sm=25",
                 "gpushare:mode=gpu:2", "shard:10")

#: SitePolicy attribute -> the key the policy file writes it with.
_KEYS = {"mode_order": "mode_order", "model_preference": "model_preference", "max_count": "max_count",
         "police_direct": "police_direct", "shard_unit_mib": "shard_unit", "mig_enabled": "mig.enabled",
         "mig_fit": "mig.fit", "mig_max_waste": "mig.max_waste", "gpu_fit": "whole_gpu.fit",
         "whole_gpu_threshold": "whole_gpu.threshold", "partitions": "partitions", "notes": "jobstats.notes",
         "notes_low_sm": "jobstats.low_sm", "notes_low_memory": "jobstats.low_memory",
         "notes_footer": "jobstats.footer"}


@dataclass(frozen=True)
class SampleRequest:
    """One request to decide: the ``--gres`` value, the partition (None: the default one) and the nodes."""

    gres: str
    partition: str | None = None
    nodes: int = 1

    @property
    def label(self) -> str:
        """``--gres=gpushare:mem=10G -p gpu`` (``-N`` when more than one node)."""
        out = f"--gres={self.gres}"
        if self.partition:
            out += f" -p {self.partition}"
        if self.nodes > 1:
            out += f" -N {self.nodes}"
        return out

    @property
    def tres_per_node(self) -> str:
        """What job_submit.lua would see in ``tres_per_node`` (the 22.05 prefix ``gres:`` on each item)."""
        return ",".join(t if prefix_of(t) else "gres:" + t for t in self.gres.split(",") if t)


def sample_requests(inventory: ClusterInventory) -> list[SampleRequest]:
    """The built-in sample set for ``inventory`` (see the module docstring), partition by partition."""
    out = []
    for part in sorted(inventory.partitions):
        sizes: set[int] = set()
        for node in inventory.nodes_in((part,)):
            if node.machine is None:
                continue
            for g in node.machine.gpus:
                if g.mig_enabled:
                    sizes.update(nominal_profile_mib(p) for p in g.mig_profiles
                                 if node.gres.get(("gpu", mig_type(g, p.name)), 0) > 0)
        requests = list(BASE_REQUESTS) + [f"gpushare:mem={format_mib(s)}" for s in sorted(sizes)]
        out += [SampleRequest(r, part) for r in dict.fromkeys(requests)]
    return out


def parse_requests(text: str, *, source: str = "<requests>") -> list[SampleRequest]:
    """Read a requests file: one request per line, ``#`` comments and blank lines skipped.

    A line holds the GRES (``gpushare:mem=10G``, ``--gres=gpushare:mem=10G`` or ``shard:10``) and
    optionally ``-p PARTITION`` / ``--partition=PARTITION`` and ``-N NODES`` / ``--nodes=NODES``.

    Raises:
        InputError: a line without a GRES, with two, with another option or a bad node count
            (``source`` names the file and line).
    """
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{n}"
        hint = "write one request per line, e.g. --gres=gpushare:mem=10G -p gpu -N 2"
        try:
            tokens = shlex.split(line)
        except ValueError as e:
            raise InputError(f"cannot read {line!r}: {e}", hint=hint, source=where) from None
        gres, part, nodes = None, None, "1"
        i = 0
        while i < len(tokens):
            t = tokens[i]
            value = None
            for short, long in (("-p", "--partition"), ("-N", "--nodes"), (None, "--gres")):
                if t == long or (short and t == short):
                    if i + 1 >= len(tokens):
                        raise InputError(f"{t} has no value", hint=hint, source=where)
                    value, i = tokens[i + 1], i + 1
                elif t.startswith(long + "="):
                    value = t[len(long) + 1:]
                elif short and t.startswith(short) and len(t) > 2:
                    value = t[2:]
                if value is not None:
                    key = long
                    break
            if value is None:
                if t.startswith("-"):
                    raise InputError(f"option {t} is not read here", hint="only --gres, -p/--partition and "
                                     "-N/--nodes shape a decision; " + hint, source=where)
                key, value = "--gres", t
            if key == "--gres":
                if gres is not None:
                    raise InputError(f"two GRES on one line ({gres} and {value})",
                                     hint="join them with ',' as --gres does, or write two lines", source=where)
                gres = value
            elif key == "--partition":
                part = value
            else:
                nodes = value
            i += 1
        if not gres:
            raise InputError(f"no GRES in {line!r}", hint=hint, source=where)
        if not nodes.isdigit() or not 1 <= int(nodes) <= 100_000:
            raise InputError(f"-N {nodes} is not a node count", hint="write -N 1 or more", source=where)
        out.append(SampleRequest(gres, part, int(nodes)))
    if not out:
        raise InputError("the requests file holds no request", hint="write one request per line, "
                         "e.g. --gres=gpushare:mem=10G -p gpu", source=source)
    return out


def outcome(d: Decision) -> str:
    """One decision as a short line: ``gpu:h100_1g.10gb:1 (mig)``, ``refused: ...``, ``passed untouched``."""
    if d.action == "pass":
        return "passed untouched"
    if d.action == "reject":
        return "refused: " + d.message.removeprefix("gpushare: ")
    grant = ",".join(it.body for it in parse(d.tres_per_node or ""))
    kind = d.audit.get("kind")
    return f"{grant} ({kind})" if kind else grant


@dataclass
class CheckReport:
    """The new policy beside the running one: settings that differ and each request's two answers.

    Attributes:
        new, old: the two policies (``source`` names their files).
        new_inventory, old_inventory: the inventory built for each (its shard unit).
        rows: (request, answer under the old policy, answer under the new one), in request order.
    """

    new: SitePolicy
    old: SitePolicy
    new_inventory: ClusterInventory
    old_inventory: ClusterInventory
    rows: list[tuple[SampleRequest, str, str]] = field(default_factory=list)

    @property
    def changed(self) -> list[tuple[SampleRequest, str, str]]:
        """The rows whose answer differs."""
        return [r for r in self.rows if r[1] != r[2]]

    def settings(self) -> list[tuple[str, str, str]]:
        """(key, running value, new value) of each setting that differs, in the file's words."""
        out = []
        for f in fields(SitePolicy):
            if f.name == "source":
                continue
            a, b = getattr(self.old, f.name), getattr(self.new, f.name)
            if a != b:
                out.append((_KEYS.get(f.name, f.name), _show(f.name, a), _show(f.name, b)))
        return out

    def render(self) -> str:
        """The report an administrator reads before a reload (plain text, ends with a newline)."""
        inv = self.new_inventory
        lines = [f"{self.new.source}: valid site policy",
                 f"compared with the running policy ({self.old.source}) on {len(inv.nodes)} node(s), "
                 f"{sum(1 for n in inv.nodes.values() if n.usable)} usable, partitions "
                 f"{', '.join(sorted(inv.partitions)) or 'none'}", ""]
        settings = self.settings()
        if settings:
            lines.append("settings that change:")
            width = max(len(k) for k, _a, _b in settings)
            lines += [f"  {k:<{width}}  {a} -> {b}" for k, a, b in settings]
        else:
            lines.append("no setting changes")
        new_problems = [p for p in self.new_inventory.problems if p not in self.old_inventory.problems]
        if new_problems:
            lines += ["", "nodes the new policy cannot use:"]
            lines += [f"  {p}" for p in new_problems]
        known = ", ".join(sorted(inv.partitions)) or "none"
        for name in sorted(set(self.new.partitions) - set(inv.partitions)):
            lines += ["", f"[partitions.{name}] names a partition Slurm does not have (partitions: {known}): its "
                          "modes apply to no job"]
        old_shards = shard_mismatches(self.old_inventory)
        shards = [p for p in shard_mismatches(self.new_inventory) if p not in old_shards]
        if shards:
            unit = format_mib(self.new.shard_unit_mib)
            lines += ["", f"shard_unit {unit} does not match the shards Slurm has configured (regenerate gres.conf "
                          f"with gres-conf --shard-unit {unit} and restart slurmd and slurmctld before the reload):"]
            lines += [f"  {p}" for p in shards]
        changed = self.changed
        lines.append("")
        if changed:
            lines.append(f"{len(changed)} of {len(self.rows)} request(s) get something else "
                         "(- running policy, + new policy):")
            for req, a, b in changed:
                lines += [f"  {req.label}", f"    - {a}", f"    + {b}"]
        else:
            lines.append(f"none of the {len(self.rows)} request(s) gets anything else")
        same = [r for r in self.rows if r[1] == r[2]]
        if same:
            lines += ["", f"{len(same)} request(s) get the same:"]
            width = max(len(r[0].label) for r in same)
            lines += [f"  {req.label:<{width}}  {a}" for req, a, _b in same]
        return "\n".join(lines) + "\n"


def shard_mismatches(inventory: ClusterInventory) -> list[str]:
    """Nodes whose shard count in Slurm is not what the gres.conf generator gives for the inventory's shard unit.

    The generator gives each whole GPU ``floor(memory / unit)`` shards
    (:func:`~slurm_gpushare.slurm.nodegres.node_gres`); a policy whose unit differs would turn
    ``mem=`` into a shard count that means other memory on the node.
    """
    out = []
    opts = GresOptions(shard_unit_mib=inventory.shard_unit_mib)
    for name, node in sorted(inventory.nodes.items()):
        if node.machine is None or node.shards == 0:
            continue
        want = sum(c for (n, _t), c in node_gres(node.machine, name, opts).counts.items() if n == "shard")
        if want != node.shards:
            out.append(f"node {name}: Slurm has {node.shards} shards, {format_mib(inventory.shard_unit_mib)} "
                       f"shards would be {want}")
    return out


def _show(name: str, value: object) -> str:
    if name == "shard_unit_mib":
        return format_mib(int(value))  # type: ignore[call-overload]
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show('', v)}" for k, v in sorted(value.items())) + "}" if value else "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def compare(new: SitePolicy, old: SitePolicy, machines_dir: Path, sinfo: str, partitions: str,
            requests: list[SampleRequest] | None = None) -> CheckReport:
    """Decide ``requests`` (default: :func:`sample_requests`) under both policies.

    Args:
        new, old: the policy to check and the running one.
        machines_dir: the machine descriptions the filter service reads (``--machines``).
        sinfo, partitions: ``sinfo --json`` and ``scontrol -o show partition`` text, read once for both.
        requests: the requests to decide.

    Raises:
        GpushareError: Slurm's text cannot be read.
    """
    new_inv = load_inventory(machines_dir, sinfo, partitions, shard_unit_mib=new.shard_unit_mib)
    old_inv = (new_inv if old.shard_unit_mib == new.shard_unit_mib
               else load_inventory(machines_dir, sinfo, partitions, shard_unit_mib=old.shard_unit_mib))
    report = CheckReport(new, old, new_inv, old_inv)
    for req in requests if requests is not None else sample_requests(new_inv):
        parts = (req.partition,) if req.partition else None
        answers = [outcome(decide(req.tres_per_node, None, partitions=parts, inventory=inv, policy=pol,
                                  nodes=req.nodes)) for pol, inv in ((old, old_inv), (new, new_inv))]
        report.rows.append((req, answers[0], answers[1]))
    return report
