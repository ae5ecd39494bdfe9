"""``mig apply``: change one node's MIG layout without losing a job, and survive being killed at any step.

The steps (:data:`STEPS`), each recorded in a state file before it starts and once it is done:

1. ``drain``: ``scontrol update nodename=NODE state=drain reason="gpushare mig apply: ..."`` (the reason
   names the layout and the state file). A node already drained with another reason stays drained
   by its owner: apply never resumes it.
2. ``wait-jobs``: until no job holds GPU GRES (``gpu``, ``shard``) on the node as slurmctld allocated them
   (:meth:`~slurm_gpushare.mig.slurmops.CommandSlurm.gpu_jobs`: any request form, ``--gpus`` too), at most
   ``deadline`` seconds from the
   step's first start; past it the drain is undone (recorded, then resume when the reason is still ours,
   then the state file moved away: :meth:`Apply._undo`), the layout is left as it was and
   :class:`ApplyError` says which jobs still run.
3. ``stop-mps``: the node's MPS control daemons, per job (found by process) and shared, are stopped
   (:func:`slurm_gpushare.node.daemons.stop_all`, which knows where the node keeps them).
4. ``mig``: on each GPU of the layout, the GPU instances that are not in the target are destroyed
   (``nvmlGpuInstanceDestroy``) and the missing ones created at their placements
   (``nvmlDeviceCreateGpuInstanceWithPlacement``), through the NVML port. The target was checked with
   :func:`~slurm_gpushare.hardware.port.plan_gpu_instance` before the drain. When NVML refuses, the old
   layout is restored the same way and apply goes on with it (files, Slurm, resume), then fails.
5. ``files``: the node's machine description gets the instances NVML reports, gres.conf gets the
   node's lines rendered from it (:func:`~slurm_gpushare.gresconf.render.generate_node_gres`, the
   ``gres-conf`` generator), slurm.conf the node's ``Gres=``; each file replaced whole (through a symbolic
   link: the file it points to). What could stop this step is checked before the drain
   (:meth:`Apply.check_files`).
6. ``slurm``: the node's slurmd is stopped, slurmctld restarted (``scontrol reconfigure`` from 23.11 on, which
   restarts it; 22.05 needs a real restart: its reconfigure refuses a changed count of ``File=`` GRES, see
   :data:`~slurm_gpushare.slurm.release.RECONFIGURE_RESTARTS`), slurmd started, then apply waits until
   slurmctld shows the node's new ``Gres=`` from a slurmd started after the change. slurmd is stopped first
   so that no slurmd with the old GRES registers with a slurmctld holding the new slurm.conf (which drains
   the node with Slurm's own reason, replacing apply's).
7. ``resume``: ``scontrol update nodename=NODE state=resume`` only when the node's drain reason is still
   the one apply set.

A rerun with a state file continues at the recorded step (a step is written to be done twice: each
reads NVML and Slurm afresh), so a kill at any point ends in the target layout or, when that cannot be
made, the old one; the node is drained only while a state file says why. A rerun that continues past
``wait-jobs`` drains the node again when it was resumed meanwhile and waits for its GPU jobs before
touching the GPUs (:meth:`Apply._recheck`). One apply of a node runs at a time (:meth:`Apply.locked`). The state file is
``<run_dir>/mig-apply.json`` (node.toml ``run_dir``) unless given; once done it becomes
``mig-apply.last.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpushare.atomicfile import locked, read_own_file, write_atomic
from slurm_gpushare.errors import GpushareError, InputError, MigPlacementError, NvmlError, SlurmError
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.port import NvmlPort
from slurm_gpushare.mig.files import check_config_file, with_instances, write_keeping_mode
from slurm_gpushare.mig.layout import GpuTarget, Planned, changes, current_layout, label, resolve
from slurm_gpushare.mig.slurmops import STEADY_POLLS, SlurmOps
from slurm_gpushare.slurm.conf import replace_gres_lines, replace_slurm_gres
from slurm_gpushare.slurm.node import gres_matches, responding
from slurm_gpushare.slurm.nodegres import GresOptions

#: The steps in order (see the module docstring).
STEPS = ("drain", "wait-jobs", "stop-mps", "mig", "files", "slurm", "resume")
#: Every drain reason apply sets starts with this.
REASON_PREFIX = "gpushare mig apply:"
#: Test hook: ``STEP`` SIGKILLs apply once that step is recorded done, ``mig-change:N`` after the N-th
#: instance destroyed or created. For the kill tests only (tests/test_mig_apply_slurm.py).
KILL_ENV = "GPUSHARE_MIG_APPLY_KILL_AFTER"
STATE_VERSION = 1
STATE_NAME = "mig-apply.json"
LAST_NAME = "mig-apply.last.json"
#: The lock file beside the state file: ``flock(2)`` held by the apply that runs, its pid inside.
LOCK_NAME = "mig-apply.lock"


class ApplyError(GpushareError):
    """``mig apply`` stopped: jobs past the deadline, NVML refused (old layout restored), Slurm did not
    take the change, or the node was drained by someone else meanwhile."""

    exit_code = 5


# --- the state machine --------------------------------------------------------------------------


@dataclass
class Apply:
    """One ``mig apply`` of one node (see the module docstring).

    Attributes:
        node: Slurm node name.
        layout: the layout file (for messages and the drain reason).
        targets: the node's GPUs as the layout wants them (:func:`~slurm_gpushare.mig.layout.read_layout`).
        machine_path: the node's machine description (node.toml ``machine``).
        state_path: the state file.
        gres_conf, slurm_conf: the files to rewrite.
        gres_options: how gres.conf is rendered (device dir, shard unit, release).
        run_dir: the node's run directory (MPS daemons).
        slurm: the Slurm calls.
        mps_control: the site's MPS control program (node.toml ``mps_control``): the stop-mps step sends
            ``quit`` with it, never with a program a found process names.
        open_port: a new NVML port (not initialised).
        deadline_s: longest wait for the node's GPU jobs.
        slurm_timeout_s: longest wait for slurmctld to show the new GRES.
        poll_s: seconds between polls.
        out: progress lines.
        sleep, clock: waiting and the time (seconds), injected by tests.
        kill: what the test hook :data:`KILL_ENV` calls (SIGKILL of this process).
    """

    node: str
    layout: str
    targets: dict[int, GpuTarget]
    machine_path: Path
    state_path: Path
    gres_conf: Path
    slurm_conf: Path
    gres_options: GresOptions
    run_dir: Path
    slurm: SlurmOps
    open_port: Callable[[], NvmlPort]
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    deadline_s: float = 3600.0
    slurm_timeout_s: float = 120.0
    poll_s: float = 2.0
    out: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time
    kill: Callable[[], None] = field(default=lambda: os.kill(os.getpid(), signal.SIGKILL))
    _changes: int = field(default=0, init=False)

    # --- state file ---

    def read_state(self) -> dict | None:
        """The saved state, or None when no apply of the node is in progress.

        Raises:
            InputError: unreadable, or of another node.
        """
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise InputError(f"state file {self.state_path} cannot be read: {e}",
                             hint="look at it; it records an apply that was interrupted") from None
        if data.get("version") != STATE_VERSION or data.get("node") != self.node:
            raise InputError(f"state file {self.state_path} is not an apply of {self.node}",
                             hint="give --state-dir of this node's apply")
        return data

    def _save(self, state: dict) -> None:
        state["updated"] = self.clock()
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_path, json.dumps(state, indent=2) + "\n", mode=0o644)

    def _mark(self, state: dict, step: str, status: str) -> None:
        state["step"], state["status"] = step, status
        self._save(state)
        if status == "done" and os.environ.get(KILL_ENV) == step:
            self.kill()

    @contextlib.contextmanager
    def locked(self) -> Iterator[Path]:
        """Hold the node's apply lock while the block runs: ``flock(2)`` ``LOCK_EX`` on :data:`LOCK_NAME` beside
        the state file, which then holds this process's pid (a killed apply's lock goes with its process).

        Raises:
            InputError: another apply of the node holds it (its pid is named).
        """
        path = self.state_path.with_name(LOCK_NAME)
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path, wait=False, mode=0o644, nofollow=True) as fd:
            if fd is None:
                try:
                    holder = read_own_file(path, max_bytes=32).decode(errors="replace").strip() or "unknown"
                except OSError:
                    holder = "unknown"
                raise InputError(f"another mig apply of {self.node} is running (pid {holder}, lock {path})",
                                 hint="wait for it to end; if it was interrupted, rerun the same command")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield path

    def _changed(self) -> None:
        self._changes += 1
        if os.environ.get(KILL_ENV) == f"mig-change:{self._changes}":
            self.kill()

    # --- plan ---

    def _machine(self) -> Machine:
        return Machine.load(self.machine_path)

    def prepare(self) -> dict:
        """A new state (not saved): node checked, target resolved, old layout read.

        Raises:
            InputError: unknown node, layout for another model, invalid geometry, MIG mode change, a
                gres.conf or slurm.conf the files step could not rewrite (:meth:`check_files`).
        """
        node_state = self.slurm.node(self.node)
        machine = self._machine()
        with self.open_port() as port:
            self._check_host(port, machine)
            target = resolve(port, machine, self.targets, self.layout)
            old = current_layout(port, sorted(target))
            self.check_files(with_instances(machine, port))
        prior = node_state.reason if node_state.drained and not (node_state.reason or "").startswith(REASON_PREFIX) \
            else None
        return {
            "version": STATE_VERSION, "node": self.node, "layout": self.layout, "started": self.clock(),
            "reason": f"{REASON_PREFIX} to {Path(self.layout).name}, state {self.state_path}",
            "drained_by_other": prior,
            "old": {str(i): [p.to_dict() for p in v] for i, v in old.items()},
            "target": {str(i): [p.to_dict() for p in v] for i, v in target.items()},
            "step": None, "status": None, "goal": "target",
        }

    def check_files(self, machine: Machine) -> None:
        """Whether the files step can rewrite gres.conf and slurm.conf for the node, found before the drain:
        both files there, not slurmd's configless copies, writable, the node's lines its own (no hostlist
        line naming it with others, no ``Include`` that may hold them, no ``Name=gpu`` line for every node).
        The lines rendered from ``machine`` (today's layout) define the GRES names the new ones will.

        Raises:
            InputError: what is wrong, and what to do.
        """
        gres_text = check_config_file(self.gres_conf, "gres.conf", "--gres-conf")
        slurm_text = check_config_file(self.slurm_conf, "slurm.conf", "--slurm-conf")
        block, gres_value = self._gres_block(machine)
        replace_gres_lines(gres_text, self.node, block, source=str(self.gres_conf))
        replace_slurm_gres(slurm_text, self.node, gres_value, source=str(self.slurm_conf))

    def _gres_block(self, machine: Machine) -> tuple[list[str], str]:
        node = generate_node_gres(machine, self.node, self.gres_options)
        origin = machine.source or "machine description"
        block = [f"# {self.node}: {len(machine.gpus)} GPU(s), from {origin}; MIG layout by slurm-gpushare mig apply",
                 *[f"# {note}" for note in node.notes], *[r.render(self.node) for r in node.records]]
        return block, node.gres_value

    def _check_host(self, port: NvmlPort, machine: Machine) -> None:
        if port.device_count() != len(machine.gpus):
            raise InputError(f"NVML sees {port.device_count()} GPUs here, {self.machine_path} describes "
                             f"{len(machine.gpus)}", hint=f"run mig apply on {self.node} itself")
        for g in machine.gpus:
            if g.uuid and port.uuid(g.index) != g.uuid:
                raise InputError(f"GPU {g.index} here is {port.uuid(g.index)}, {self.machine_path} says {g.uuid}",
                                 hint=f"run mig apply on {self.node} itself, or refresh its description "
                                      "(slurm-gpushare inventory)")

    @staticmethod
    def _layout(state: dict, key: str) -> dict[int, list[Planned]]:
        return {int(i): [Planned.from_dict(d) for d in v] for i, v in state[key].items()}

    def describe(self, state: dict) -> list[str]:
        """The steps a run from ``state`` would take, in words (``--dry-run``)."""
        target, old = self._layout(state, "target"), self._layout(state, "old")
        lines = []
        if state.get("drained_by_other"):
            lines.append(f"drain: {self.node} is drained already ({state['drained_by_other']}): left to its owner")
        else:
            lines.append(f"drain: scontrol update nodename={self.node} state=drain reason=\"{state['reason']}\"")
        lines.append(f"wait-jobs: until no GPU job runs on {self.node} (at most {self.deadline_s:g} s; then resume, "
                     "layout unchanged)")
        lines.append(f"stop-mps: the MPS daemons under {self.run_dir}")
        for i in sorted(target):
            destroy, create = changes(old[i], target[i])
            lines.append(f"mig: GPU {i}: {label(old[i])} -> {label(target[i])} (destroy {label(destroy)}; "
                         f"create {label(create)})")
        lines.append(f"files: {self.machine_path}, {self.gres_conf} ({self.node}'s lines), {self.slurm_conf} "
                     f"(NodeName={self.node} Gres=)")
        lines.append(f"slurm: stop slurmd of {self.node}, restart slurmctld (or scontrol reconfigure), start slurmd, "
                     f"wait for its new Gres= (at most {self.slurm_timeout_s:g} s)")
        lines.append(f"resume: scontrol update nodename={self.node} state=resume (only while the reason is ours)")
        return lines

    # --- run ---

    def run(self, state: dict) -> dict:
        """Run from ``state`` (a new one from :meth:`prepare`, or the saved one) to the end.

        Returns:
            The final state (``goal`` ``target``, or ``old`` when the target could not be made).

        Raises:
            ApplyError: jobs past the deadline (drain undone), the target refused by NVML (old layout
                restored, node resumed), Slurm not taking the change (node left drained, state kept).
        """
        if state.get("goal") == "undone":  # killed while giving up at the deadline: finish that
            self._undo(state)
            raise ApplyError(f"the apply recorded in {self.state_path} had given up waiting for {self.node}'s GPU "
                             "jobs: drain undone, layout unchanged", hint="rerun mig apply to try again")
        start = 0 if state["step"] is None else STEPS.index(state["step"]) + (state["status"] == "done")
        if state["step"] is not None and STEPS.index("wait-jobs") < start < STEPS.index("resume"):
            self._recheck(state)
        for step in STEPS[start:]:
            self._mark(state, step, "doing")
            self.out(f"mig apply {self.node}: {step}")
            getattr(self, "_" + step.replace("-", "_"))(state)
            self._mark(state, step, "done")
        self._finish(state)
        if state.get("goal") == "old":
            raise ApplyError(f"{state.get('error')}: the old layout was restored and {self.node} resumed",
                             hint="plan a layout this GPU accepts (mig plan), then apply it")
        return state

    def _finish(self, state: dict) -> None:
        last = self.state_path.with_name(LAST_NAME)
        write_atomic(last, json.dumps(state, indent=2) + "\n", mode=0o644)
        self.state_path.unlink(missing_ok=True)

    def _drain(self, state: dict) -> None:
        if state.get("drained_by_other"):
            return
        now = self.slurm.node(self.node)
        if now.drained and now.reason == state["reason"]:
            return
        self.slurm.drain(self.node, state["reason"])

    def _wait_jobs(self, state: dict) -> None:
        since = state.setdefault("wait_since", self.clock())
        self._save(state)
        while True:
            jobs = self._gpu_jobs(state)
            if not jobs:
                return
            if self.clock() - since >= self.deadline_s:
                self._undo(state)
                raise ApplyError(
                    f"{self.node} still runs GPU job(s) {', '.join(jobs)} after {self.deadline_s:g} s: layout "
                    f"unchanged, {'drain undone' if not state.get('drained_by_other') else 'node left drained'}",
                    hint="rerun with a longer --deadline, or when those jobs have ended")
            self.sleep(self.poll_s)

    def _gpu_jobs(self, state: dict) -> list[str]:
        """The node's GPU jobs now; the state file records them (``waiting_for``) when they change."""
        jobs = self.slurm.gpu_jobs(self.node)
        if jobs != state.get("waiting_for", []):
            state["waiting_for"] = jobs
            self._save(state)
            if jobs:
                self.out(f"mig apply {self.node}: waiting for GPU job(s) {', '.join(jobs)}")
        return jobs

    def _undo(self, state: dict) -> None:
        """Deadline passed: the layout is untouched; resume the node when the drain is ours, forget the state.

        In this order, each step safe to be killed after: ``goal`` ``undone`` recorded (a rerun finishes the
        undo, never goes on to the GPUs), the resume, the state file moved to ``mig-apply.last.json``. The
        other order would leave a resumed node whose state file says apply is still waiting to change it.
        """
        state["goal"] = "undone"
        self._save(state)
        if os.environ.get(KILL_ENV) == "undo":
            self.kill()
        now = self.slurm.node(self.node)
        if not state.get("drained_by_other") and now.drained and now.reason == state["reason"]:
            self.slurm.resume(self.node)
        self._finish(state)

    def _recheck(self, state: dict) -> None:
        """A rerun that continues past ``wait-jobs``: before the GPUs are touched (again), the node is drained
        (again, with apply's reason, when someone resumed it meanwhile: apply then owns the drain) and no
        GPU job runs there (waited for at most ``deadline`` seconds from now).

        Raises:
            ApplyError: GPU jobs still run after the deadline (the node stays drained, the state kept).
        """
        now = self.slurm.node(self.node)
        if not now.drained:
            self.out(f"mig apply {self.node}: the node was resumed meanwhile ({now.state}): draining it again")
            state["drained_by_other"] = None
            self._save(state)
            self.slurm.drain(self.node, state["reason"])
        since = self.clock()
        while jobs := self._gpu_jobs(state):
            if self.clock() - since >= self.deadline_s:
                raise ApplyError(f"{self.node} runs GPU job(s) {', '.join(jobs)} again (it was resumed during the "
                                 f"apply): nothing more changed, the node stays drained",
                                 hint=f"rerun when they have ended; {self.state_path} records the apply")
            self.sleep(self.poll_s)

    def _stop_mps(self, state: dict) -> None:
        from slurm_gpushare.node.daemons import stop_all

        problems = stop_all(self.run_dir, control_binary=self.mps_control)
        if problems:
            raise ApplyError("; ".join(problems), hint="stop them by hand, then rerun mig apply (the node stays "
                                                       "drained, the state file says why)")

    def _mig(self, state: dict) -> None:
        goal = state.get("goal", "target")
        with self.open_port() as port:
            try:
                self._make(port, self._layout(state, "target" if goal == "target" else "old"))
                return
            except (MigPlacementError, NvmlError) as e:
                if goal != "target":
                    raise ApplyError(f"restoring the old layout failed too: {e.message}",
                                     hint="the node stays drained; fix the GPU, then rerun") from None
                state["goal"], state["error"] = "old", f"the target layout was refused: {e.message}"
                self._save(state)
                self.out(f"mig apply {self.node}: {state['error']}; restoring the old layout")
            try:
                self._make(port, self._layout(state, "old"))
            except (MigPlacementError, NvmlError) as e:
                raise ApplyError(f"{state['error']}, and restoring the old layout failed: {e.message}",
                                 hint="the node stays drained; fix the GPU, then rerun") from None

    def _make(self, port: NvmlPort, want: dict[int, list[Planned]]) -> None:
        for i in sorted(want):
            current = current_layout(port, [i])[i]
            destroy, create = changes(current, want[i])
            gis = {inst.start: inst.gi_id for inst in port.gpu_instances(i)}
            for p in destroy:
                port.destroy_gpu_instance(i, gis[p.start])
                self.out(f"  GPU {i}: destroyed {p.profile} at {p.start}")
                self._changed()
            for p in create:
                port.create_gpu_instance(i, p.profile_id, p.start)
                self.out(f"  GPU {i}: created {p.profile} at {p.start}")
                self._changed()

    def _files(self, state: dict) -> None:
        machine = self._machine()
        with self.open_port() as port:
            machine = with_instances(machine, port)
        block, gres_value = self._gres_block(machine)
        gres_text = replace_gres_lines(check_config_file(self.gres_conf, "gres.conf", "--gres-conf"), self.node,
                                       block, source=str(self.gres_conf))
        slurm_text = replace_slurm_gres(check_config_file(self.slurm_conf, "slurm.conf", "--slurm-conf"), self.node,
                                        gres_value, source=str(self.slurm_conf))
        write_keeping_mode(self.machine_path, machine.to_json())
        state["gres"] = gres_value
        self._save(state)
        for path, text in ((self.gres_conf, gres_text), (self.slurm_conf, slurm_text)):
            if write_keeping_mode(path, text):
                self.out(f"  wrote {path}")

    def _slurm(self, state: dict) -> None:
        before = state.setdefault("slurmd_start_before", self.slurm.node(self.node).slurmd_start)
        self._save(state)
        # slurmd stopped first: the old one cannot register its old GRES with a slurmctld that reads the new
        # slurm.conf (which drains the node with Slurm's reason, "gres/gpu count reported lower than configured")
        self.slurm.stop_slurmd(self.node)
        self.slurm.restart_slurmctld()
        self._wait(lambda: self.slurm.node(self.node), "slurmctld answering after its restart",
                   lambda: "scontrol show node fails")
        self.slurm.start_slurmd(self.node)

        def taken() -> bool:
            now = self.slurm.node(self.node)
            return gres_matches(now.gres, state["gres"]) and now.slurmd_start != before and responding(now.state)

        def seen() -> str:
            try:
                now = self.slurm.node(self.node)
            except GpushareError as e:
                return str(e)
            return f"it shows Gres={now.gres}, State={now.state}, Reason={now.reason}"

        self._wait(taken, f"slurmctld showing {self.node} with Gres={state['gres']} from a restarted slurmd", seen)
        self._wait_responding(seen)

    def _wait_responding(self, seen: Callable[[], str]) -> None:
        """Wait (``slurm_timeout_s``) until slurmctld shows the node responding on
        :data:`~slurm_gpushare.mig.slurmops.STEADY_POLLS` polls in a row: after a slurmctld restart a node that had
        registered may show ``NOT_RESPONDING`` for a few seconds."""
        steady = 0

        def steadily() -> bool:
            nonlocal steady
            steady = steady + 1 if responding(self.slurm.node(self.node).state) else 0
            return steady >= STEADY_POLLS

        self._wait(steadily, f"{self.node} responding on {STEADY_POLLS} polls in a row (State= without "
                   "NOT_RESPONDING)", seen)

    def _wait(self, cond: Callable[[], object], what: str, seen: Callable[[], str]) -> None:
        since = self.clock()
        while True:
            try:
                if cond():
                    return
            except SlurmError:
                pass  # slurmctld restarting
            if self.clock() - since >= self.slurm_timeout_s:
                raise ApplyError(f"no {what} after {self.slurm_timeout_s:g} s ({seen()})",
                                 hint=f"look at the slurmd and slurmctld logs; {self.node} stays drained and the "
                                      f"state file {self.state_path} says why; rerun mig apply to try again")
            self.sleep(self.poll_s)

    def _resume(self, state: dict) -> None:
        if state.get("drained_by_other"):
            self.out(f"mig apply {self.node}: drained by someone else before ({state['drained_by_other']}): "
                     "left drained")
            return
        now = self.slurm.node(self.node)
        if not now.drained:
            return
        if now.reason != state["reason"]:
            state["left_drained"] = now.reason
            self.out(f"mig apply {self.node}: the drain reason is now {now.reason!r}, not ours: left drained")
            return
        self.slurm.resume(self.node)
