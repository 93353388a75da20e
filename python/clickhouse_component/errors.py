"""The exceptions of clickhouse_component: one class per WIT ``error-kind``, under one base.

Every failure of a call into the component is raised as the class of its kind. Each carries
``.kind`` (the WIT name, e.g. ``"invalid-input"``), ``.server`` (the server's own error, when
the server answered with one) and ``.committed_rows`` (rows known to be committed before the
failure; writes only). Messages never contain the password or a secret setting.
"""

from __future__ import annotations

import functools
import json
from typing import NamedTuple

__all__ = [
    "ClickHouseError",
    "DisconnectedError",
    "InvalidInputError",
    "LockedError",
    "MisconfiguredError",
    "NotFoundError",
    "PermanentError",
    "RunnerError",
    "ServerError",
    "ThrottledError",
    "TransientError",
    "UncertainError",
]


class ServerError(NamedTuple):
    """The server's description of an error (WIT ``server-error``)."""

    code: int
    """ClickHouse error code, e.g. 60."""
    name: str
    """ClickHouse error name, e.g. ``UNKNOWN_TABLE`` (empty when the server gave none)."""
    http_status: int
    """HTTP status of the answer."""


class ClickHouseError(Exception):
    """Base of every error of this package; ``kind`` decides whether retrying can help."""

    kind: str = "runner"

    def __init__(
        self, message: str, *, server: ServerError | None = None, committed_rows: int = 0
    ) -> None:
        super().__init__(message)
        self.message = message
        self.server = server
        self.committed_rows = committed_rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, kind={self.kind!r})"


class InvalidInputError(ClickHouseError, ValueError):
    """Rejected before any request was sent: bad connection string, id, JSON, row, option or
    argument type. Retrying the same call fails the same way."""

    kind = "invalid-input"


class MisconfiguredError(ClickHouseError):
    """The server rejected the configuration (unknown database/table/column/setting, bad
    credentials, access denied) or the allow-list denied the destination."""

    kind = "misconfigured"


class DisconnectedError(ClickHouseError):
    """No connection could be made; the request never reached the server. Safe to retry."""

    kind = "disconnected"


class TransientError(ClickHouseError):
    """A server error that is safe to retry, or a read that timed out or was cut off."""

    kind = "transient"


class ThrottledError(ClickHouseError):
    """The server is overloaded: retry later, with back-off."""

    kind = "throttled"


class PermanentError(ClickHouseError):
    """The server rejected the request itself (syntax, parse or type errors in data)."""

    kind = "permanent"


class UncertainError(ClickHouseError):
    """A write may or may not have been committed (see ``committed_rows``)."""

    kind = "uncertain"


class LockedError(ClickHouseError):
    """A lock could not be acquired within its timeout, or was lost before a fenced write
    (then nothing was written)."""

    kind = "locked"


class NotFoundError(ClickHouseError):
    """The named item does not exist, where that is an error."""

    kind = "not-found"


class RunnerError(ClickHouseError):
    """The embedded runtime failed (a trap, the memory limit); not a WIT kind. The object
    that raised it cannot be used again: open a new one."""

    kind = "runner"


_BY_KIND: dict[str, type[ClickHouseError]] = {
    cls.kind: cls
    for cls in (
        InvalidInputError,
        MisconfiguredError,
        DisconnectedError,
        TransientError,
        ThrottledError,
        PermanentError,
        UncertainError,
        LockedError,
        NotFoundError,
        RunnerError,
    )
}


def _from_native(
    kind: str, message: str, server: tuple[int, str, int] | None, committed_rows: int
) -> ClickHouseError:
    """Builds the exception the native module raises (called by it)."""
    cls = _BY_KIND.get(kind, RunnerError)
    return cls(
        message,
        server=ServerError(*server) if server is not None else None,
        committed_rows=committed_rows,
    )


# Values of type dict/list/tuple sent to a sink become JSON text (used by the native module).
_json_dumps = functools.partial(
    json.dumps, allow_nan=False, separators=(",", ":"), ensure_ascii=False
)
