"""Every error graphmode raises on purpose derives from :class:`GraphmodeError`.

::

    GraphmodeError
    ├── ConfigError              bad settings, CLI options or grid file (names the field)
    │   └── GridError
    ├── DatasetError             a dataset that cannot be read or written
    ├── ModelError               a model artifact or card that is missing, corrupt or untrusted
    │   └── StaleModelError      the model's fingerprint does not match the target
    ├── EngineError              the vLLM process
    │   ├── EngineStartError     it exited or missed its startup deadline (carries the log tail)
    │   └── EngineDiedError      it died while serving (carries exit status and log tail)
    ├── ScrapeError              /metrics could not be fetched or parsed
    └── ObjectiveError           an objective or constraint that cannot be evaluated
"""

from __future__ import annotations


class GraphmodeError(Exception):
    """Base of every error graphmode raises on purpose."""


class ConfigError(GraphmodeError):
    pass


class GridError(ConfigError):
    pass


class DatasetError(GraphmodeError):
    pass


class ModelError(GraphmodeError):
    pass


class StaleModelError(ModelError):
    pass


class EngineError(GraphmodeError):
    def __init__(self, message: str, *, log_tail: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.returncode = returncode

    def reason(self) -> str:
        """One string for a dataset row: the message and the last log lines."""
        return f"{self}\n--- last log lines ---\n{self.log_tail}" if self.log_tail else str(self)


class EngineStartError(EngineError):
    pass


class EngineDiedError(EngineError):
    pass


class ScrapeError(GraphmodeError):
    pass


class ObjectiveError(GraphmodeError):
    pass
