"""The filter service's wire protocol, spoken by filterd and the Lua shims (``gpushare_client.lua``).

Protocol 2: every message, both ways, is a header line ``GPS2 <id> <length>`` (``id`` decimal, at
most 20 digits, chosen by the client; ``length`` in bytes) and then exactly ``length`` bytes of one
JSON object. An answer carries the ``id`` of its request in its header and in its JSON, and the client
uses no answer whose id is not the one it sent. A request body over :data:`MAX_REQUEST` bytes is read
past and refused as one request; a malformed header is answered once (id ``0``) and the connection
closed. Request (strings and numbers; missing = empty)::

    {"v": 2, "op": "submit" | "modify" | "move" | "cli", "tres_per_node": "gres:gpushare:mem=10G",
     "tres_per_job": "", "tres_per_task": "", "tres_per_socket": "", "mem_per_tres": "",
     "cpus_per_tres": "", "ntasks_per_tres": 65534, "partition": "gpu", "admin_comment": "",
     "min_nodes": 2, "num_tasks": 8, "ntasks_per_node": 4, "cli_request": "", "uid": 1000, "job_id": "",
     "het_job_offset": -1}

``het_job_offset`` (job_desc's; -1 or NO_VAL: no heterogeneous job) refuses a share in a component
(:data:`~slurm_gpushare.submit.service.HET_JOB_REFUSAL`).

The counts (``min_nodes``, ``num_tasks``, ``ntasks_per_node``) are JSON numbers: whole, 0 to 4294967295 (Slurm's
NO_VAL and INFINITE, the top two, mean not set, as do a negative one down to -4294967295, 0 and a missing one:
22.05's srun gives cli_filter.lua -2 for an unset --ntasks-per-node); anything else is refused.

Answer::

    {"v": 2, "id": "17", "action": "pass" | "rewrite" | "reject", "tres_per_node": "gres:gpu:h100_1g.10gb:1",
     "admin_comment": "... [gpushare:v1 ...]", "message": "gpushare: ...", "errno": 2072}

No user-writable field is ever sent or trusted: ``cli`` answers cli_filter.lua (``srun
--gres=gpushare:...`` without an allocation) with the decided GRES without prefixes and a ``mark``
(``gpushare-request=<original>``) that cli_filter appends to the job comment; job_submit.lua sends
only that word back as ``cli_request``, and the service still decides the GRES it sees (a direct
``shard:N`` is policed as such); the mark only names the original request in the audit when deciding
it gives exactly that GRES, so a forged mark gains nothing. ``move`` is job_submit.lua's question when
an update leaves the GRES of a job that holds a GPU share alone but changes what its share was decided
for (partition, node count, per-task/socket/job TRES): the job's current GRES is decided again with the
new fields; the answer is ``pass`` when that gives the same GRES, else ``reject`` (the share would have
to change, which only a new submission may do). ``move`` also carries the job's ``admin_comment``: where
its audit shows a gpushare grant (also a MIG slice or whole GPUs: job_submit.lua asks about those jobs
too) or, without an audit, the job holds a share, the options refused beside gpushare at submit (GPUs
per task or socket, per-GPU counts) are refused beside it too.
"""

from __future__ import annotations

import json
import socket
import struct

PROTOCOL = 2
#: First word of every message header (``GPS2 <id> <length>``).
MAGIC = "GPS2"
#: Longest request body the service decides (bytes); job_submit.lua sends only short fields.
MAX_REQUEST = 65536
#: Longest message header line (bytes, without the newline).
MAX_HEADER = 64


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (``SO_PEERCRED``: pid, uid, gid as ``3i``).

    Returns -1 where the kernel gives no credentials.
    """
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    return struct.unpack("3i", creds)[1]


def frame(request_id: str, payload: dict) -> bytes:
    """One protocol message: ``GPS2 <id> <length>`` and a newline, then ``length`` bytes of JSON (with ``id`` in it)."""
    body = json.dumps({**payload, "id": request_id}).encode()
    return f"{MAGIC} {request_id} {len(body)}\n".encode() + body
