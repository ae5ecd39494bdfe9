"""The one error hierarchy of slurm-gpushare.

Every error carries the input that caused it and says what would work instead. Errors become exit
codes, Slurm return codes and user messages only at the entry points (CLI, filter service, hooks).
"""

from __future__ import annotations


class GpushareError(Exception):
    """Base of every error raised by slurm-gpushare.

    Args:
        message: what was wrong, in one line.
        hint: what would work instead (optional).
        source: where the bad input came from: a file and line, an NVML call, a Slurm command.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, source: str | None = None):
        self.message = message
        self.hint = hint
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"{self.source}: {self.message}" if self.source else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text

    def with_context(self, context: str) -> GpushareError:
        """Return a copy of this error whose source is prefixed by ``context``."""
        source = f"{context}: {self.source}" if self.source else context
        return type(self)(self.message, hint=self.hint, source=source)


class InputError(GpushareError):
    """A file, a command-line value or a request that cannot be understood."""

    exit_code = 2


class ParseError(InputError):
    """Text in a known format (nvidia-smi output, gres.conf, a machine description) that does not parse.

    ``source`` names the file and line, e.g. ``topo.txt:7``.
    """


class MachineDescriptionError(InputError):
    """A machine description (JSON) that is not valid for its schema version."""


class ConfigError(InputError):
    """A site configuration file (policy, gres.conf to check) that is wrong or does not match."""


class HardwareError(GpushareError):
    """The hardware (real or fake NVML) could not answer."""

    exit_code = 3


class NvmlError(HardwareError):
    """An NVML call failed. ``source`` names the NVML function, e.g. ``nvmlDeviceGetUUID(gpu 3)``.

    Attributes:
        code: the NVML return code (``NVML_ERROR_*`` value) when known.
    """

    def __init__(self, message: str, *, hint: str | None = None, source: str | None = None,
                 code: int | None = None):
        super().__init__(message, hint=hint, source=source)
        self.code = code

    def with_context(self, context: str) -> NvmlError:
        """The same error with ``context`` (the caller's step, e.g. ``GPU 3``) before its source."""
        source = f"{context}: {self.source}" if self.source else context
        return NvmlError(self.message, hint=self.hint, source=source, code=self.code)


class MigPlacementError(HardwareError):
    """A MIG GPU instance that the hardware's placement rules do not allow."""


class SlurmError(GpushareError):
    """A Slurm command failed or answered something that cannot be used."""

    exit_code = 4


class ClusterError(GpushareError):
    """The dev cluster could not be brought up, inspected or stopped."""

    exit_code = 5
