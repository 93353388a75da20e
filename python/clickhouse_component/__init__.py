"""ClickHouse state store and acknowledged table sink, through the clickhouse-component
WebAssembly component run by an embedded wasmtime host (the same host library as the CLI:
the allow-list, the keep-alive/TLS pool, the limits, the precompiled cache).

>>> import clickhouse_component as cc
>>> conn = cc.connect("http://127.0.0.1:8123", user="default", password="...")
>>> with cc.StateStore(conn) as store:
...     store.set("job", completed={"singer_state": {"bookmark": 1}})
...     with store.lock("job") as lock:          # writes through `lock` are fenced
...         lock.update(partial={"singer_state": {"bookmark": 2}})

Calls block the calling thread and release the GIL while they run; every object may be shared
by threads (the calls of one object run one at a time). One compiled runtime serves the whole
process. Failures raise the class of their WIT error kind (``clickhouse_component.errors``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from . import _native
from .errors import (
    ClickHouseError,
    DisconnectedError,
    InvalidInputError,
    LockedError,
    MisconfiguredError,
    NotFoundError,
    PermanentError,
    RunnerError,
    ServerError,
    ThrottledError,
    TransientError,
    UncertainError,
)

__all__ = [
    "ClickHouseError",
    "Connection",
    "DisconnectedError",
    "InvalidInputError",
    "Lock",
    "LockedError",
    "MisconfiguredError",
    "NotFoundError",
    "PermanentError",
    "PreparedRows",
    "Receipt",
    "RunnerError",
    "ServerError",
    "ServerInfo",
    "Sink",
    "State",
    "StateStore",
    "ThrottledError",
    "TransientError",
    "UncertainError",
    "connect",
    "prepare_rows",
    "warm_up",
]

WASMTIME_VERSION: str = _native.WASMTIME_VERSION

# A child forked after the runtime started cannot use it (its threads stay in the parent):
# its calls raise RunnerError instead of hanging.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_native._after_fork_in_child)


def _str(name: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _int(name: str, value: object, *, low: int = 0, high: int = 2**32 - 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInputError(f"{name} must be a whole number from {low} to {high}")
    return value


def _ms(name: str, seconds: object) -> int | None:
    """Seconds (int or float) as whole milliseconds for a WIT `u32` field."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidInputError(f"{name} must be a number of seconds")
    ms = round(seconds * 1000)
    if not 0 <= ms <= 2**32 - 1:
        raise InvalidInputError(f"{name} must be from 0 to 4294967 seconds")
    return ms


def _settings(name: str, settings: Mapping[str, object] | None) -> list[tuple[str, str]]:
    if settings is None:
        return []
    if not isinstance(settings, Mapping):
        raise InvalidInputError(f"{name} must be a mapping of setting names to values")
    out = []
    for key, value in settings.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"{name}: setting names must be str")
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            raise InvalidInputError(f"{name}: the value of '{key}' must be a str, int or bool")
        out.append((key, value))
    return out


def _part(name: str, value: object) -> str:
    """A state part as JSON object text for the component (which validates it)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{name} is not UTF-8 JSON text") from None
    if isinstance(value, Mapping):
        try:
            return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"{name} is not JSON: {e}") from None
    raise InvalidInputError(
        f"{name} must be a dict or JSON object text, not {type(value).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What `Connection.ping` learned (WIT ``server-info``)."""

    version: str
    timezone: str
    user: str
    database: str
    round_trip_us: int


def _by_name(cls: type, native: Any) -> Any:
    """The dataclass `cls` from a binding object with a field of each name (a name missing on
    either side fails loudly; none is taken by position)."""
    return cls(**{f.name: getattr(native, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class State:
    """One state: its id and its two parts, JSON objects (``{}`` when empty)."""

    id: str
    partial: dict[str, Any] = dataclasses.field(default_factory=dict)
    completed: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def _from_native(cls, n: Any) -> State:
        """From the binding's `NativeState` (fields read by name)."""
        return cls(
            n.id,
            json.loads(n.partial) if n.partial else {},
            json.loads(n.completed) if n.completed else {},
        )

    def merged(self) -> dict[str, Any]:
        """The completed part with the partial part deep-merged over it (Meltano's view)."""

        def merge(base: Any, over: Any) -> Any:
            if isinstance(base, dict) and isinstance(over, dict):
                out = dict(base)
                for k, v in over.items():
                    out[k] = merge(base.get(k), v) if k in base else v
                return out
            return over

        return merge(self.completed, self.partial)


@dataclasses.dataclass(frozen=True)
class Receipt:
    """What a successful send did (WIT ``receipt``)."""

    rows: int
    """Rows sent."""
    chunks: int
    """INSERTs sent and acknowledged."""
    written_rows: int
    """Rows the server reported written."""
    deduplicated_chunks: int
    """Chunks acknowledged without being written again (deduplicated)."""
    unverified_chunks: int
    """Chunks whose written rows could not be checked."""
    retries: int
    """Resends of failed chunks."""
    format: str
    """How the rows travelled: ``"Native"`` or ``"JSONEachRow"`` (a column of a type the sink
    does not encode)."""


class Connection:
    """How to reach one ClickHouse (WIT ``connection``) plus the host's allow-list and TLS
    trust. Validated when made; nothing is sent until a call. See `connect`."""

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        database: str | None = None,
        settings: Mapping[str, object] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        allow: Iterable[str] | None = None,
        connect_timeout_ms: int | None = None,
        request_timeout_ms: int | None = None,
        max_memory_mib: int | None = None,
        call_timeout_seconds: float | None = None,
        max_response_mib: int | None = None,
    ) -> None:
        if call_timeout_seconds is not None and (
            isinstance(call_timeout_seconds, bool)
            or not isinstance(call_timeout_seconds, (int, float))
        ):
            raise InvalidInputError("call_timeout_seconds must be a number of seconds")
        if allow is not None and isinstance(allow, str):
            allow = [allow]
        allow_list = [_str("allow entries", a) for a in (allow or [])]
        if ca_file is not None and not isinstance(ca_file, (str, os.PathLike)):
            raise InvalidInputError("ca_file must be a path")
        self._native = _native.Connection(
            _str("url", url),
            _str("user", user, optional=True),
            _str("password", password, optional=True),
            _str("database", database, optional=True),
            _settings("settings", settings),
            os.fspath(ca_file) if ca_file is not None else None,
            allow_list,
            _int("connect_timeout_ms", connect_timeout_ms, low=1),
            _int("request_timeout_ms", request_timeout_ms, low=1),
            _int("max_memory_mib", max_memory_mib, low=1, high=1 << 20),
            call_timeout_seconds,
            _int("max_response_mib", max_response_mib, low=1, high=1 << 20),
        )

    @property
    def allowed(self) -> str:
        """The destinations the component may reach (by default the URL's origin only)."""
        return self._native.allowed

    def ping(self) -> ServerInfo:
        """Connects, authenticates and asks the server who it is (one read-only request)."""
        return _by_name(ServerInfo, self._native.ping())

    def __repr__(self) -> str:
        return repr(self._native)


def connect(
    url: str,
    *,
    user: str | None = None,
    password: str | None = None,
    database: str | None = None,
    settings: Mapping[str, object] | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    allow: Iterable[str] | None = None,
    connect_timeout_ms: int | None = None,
    request_timeout_ms: int | None = None,
    max_memory_mib: int | None = None,
    call_timeout_seconds: float | None = None,
    max_response_mib: int | None = None,
) -> Connection:
    """A `Connection`.

    url: ``scheme://[user[:password]@]host[:port][/database][?setting=value&...]``, scheme
    ``clickhouse``/``http`` (plain, port 8123) or ``clickhouses``/``https`` (TLS, 8443).
    user, password, database override the URL's; settings are ClickHouse settings sent with
    every request; ca_file a PEM file trusted for HTTPS besides the system's trust store;
    allow extra destinations (``scheme://host:port``, ``*`` wildcards) beyond the URL's
    origin. connect_timeout_ms / request_timeout_ms: the connection's timeouts (defaults
    10 s / 300 s). The host's limits, per component instance, as the CLI's flags:
    max_memory_mib (default 1024), call_timeout_seconds (default none; past it the call
    raises `RunnerError` and that object is stopped), max_response_mib (default 256).
    Raises `InvalidInputError` for a malformed connection or limit.
    """
    return Connection(
        url,
        user=user,
        password=password,
        database=database,
        settings=settings,
        ca_file=ca_file,
        allow=allow,
        connect_timeout_ms=connect_timeout_ms,
        request_timeout_ms=request_timeout_ms,
        max_memory_mib=max_memory_mib,
        call_timeout_seconds=call_timeout_seconds,
        max_response_mib=max_response_mib,
    )


def _connection(connection: object) -> Any:
    if not isinstance(connection, Connection):
        raise InvalidInputError(
            f"connection must be a clickhouse_component.Connection, not {type(connection).__name__}"
        )
    return connection._native


def _state_args(state: State | str, partial: object, completed: object) -> tuple[str, str, str]:
    if isinstance(state, State):
        if partial is not None or completed is not None:
            raise InvalidInputError("give a State or an id with parts, not both")
        return state.id, _part("partial", state.partial), _part("completed", state.completed)
    return (
        _str("state id", state),
        _part("partial", partial),
        _part("completed", completed),
    )


class StateStore:
    """A state store (WIT ``store``): states in ``database.table`` (default
    ``meltano.state``, the layout of meltano-state-backend-clickhouse), locks in
    ``lock_table`` (default ``<table>_component_lock``). Opening creates the schema unless
    ``create_schema=False``; ``cluster`` creates it ``ON CLUSTER`` (Replicated state table,
    KeeperMap lock table). lock_engine: ``auto`` | ``keeper-map`` | ``merge-tree``.
    Times are in milliseconds, as in the WIT record."""

    def __init__(
        self,
        connection: Connection,
        *,
        database: str | None = None,
        table: str | None = None,
        lock_table: str | None = None,
        lock_engine: str | None = None,
        create_schema: bool | None = None,
        lock_timeout_ms: int | None = None,
        lock_retry_ms: int | None = None,
        stale_after_ms: int | None = None,
        retries: int | None = None,
        cluster: str | None = None,
    ) -> None:
        if create_schema is not None and not isinstance(create_schema, bool):
            raise InvalidInputError("create_schema must be a bool")
        self._native = _native.NativeStore(
            _connection(connection),
            _str("database", database, optional=True),
            _str("table", table, optional=True),
            _str("lock_table", lock_table, optional=True),
            create_schema,
            _int("lock_timeout_ms", lock_timeout_ms),
            _int("lock_retry_ms", lock_retry_ms),
            _int("stale_after_ms", stale_after_ms),
            _str("lock_engine", lock_engine, optional=True),
            _int("retries", retries),
            _str("cluster", cluster, optional=True),
        )

    def get(self, state_id: str) -> State | None:
        """The state of `state_id`, or None (read with ``FINAL``: the newest version)."""
        found = self._native.get(_str("state id", state_id))
        return State._from_native(found) if found is not None else None

    def set(
        self,
        state: State | str,
        partial: Mapping[str, Any] | str | None = None,
        completed: Mapping[str, Any] | str | None = None,
    ) -> None:
        """Overwrites both parts (Meltano ``set``), without the lock. Give a `State`, or an
        id with the parts (dicts or JSON object text; None means ``{}``)."""
        self._native.set(*_state_args(state, partial, completed))

    def update(
        self,
        state: State | str,
        partial: Mapping[str, Any] | str | None = None,
        completed: Mapping[str, Any] | str | None = None,
    ) -> State:
        """Meltano ``update`` under the lock on the id, fenced: a non-empty completed part
        replaces the state, else the partial part is deep-merged into the stored one (exactly:
        numbers keep their text). Returns the state as stored."""
        return State._from_native(self._native.update(*_state_args(state, partial, completed)))

    def delete(self, state_id: str) -> int:
        """Deletes the state under its lock; 1 if there was one, else 0."""
        return self._native.delete(_str("state id", state_id))

    def ids(self, pattern: str | None = None) -> list[str]:
        """Ids matching an exact fnmatch glob (``*``, ``?``, ``[seq]``, ``[!seq]``), sorted."""
        return self._native.ids(_str("pattern", pattern, optional=True))

    def get_all(self, pattern: str | None = None) -> list[State]:
        """Every state whose id matches the pattern (all without one), sorted, in one query."""
        return [
            State._from_native(t)
            for t in self._native.get_all(_str("pattern", pattern, optional=True))
        ]

    def set_all(self, states: Iterable[State]) -> None:
        """Overwrites many states in one INSERT (distinct ids; all or nothing on bad input)."""
        items = []
        for s in states:
            if not isinstance(s, State):
                raise InvalidInputError("set_all takes State objects")
            items.append(_state_args(s, None, None))
        self._native.set_all(items)

    def clear_all(self) -> int:
        """Deletes every state written before the call; returns how many."""
        return self._native.clear_all()

    def lock(self, state_id: str) -> Lock:
        """Acquires the advisory lock on `state_id`, waiting up to the lock timeout
        (`LockedError` after it). Use it as a context manager: it is released at the end."""
        return Lock(self._native.lock(_str("state id", state_id)))

    def close(self) -> None:
        """Closes the store; idempotent."""
        self._native.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lock:
    """A held lock (WIT ``lock``). Its `set`, `update` and `delete` are fenced: they commit
    only while this holder's lease still holds, else raise `LockedError` having written
    nothing."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The locked state id."""
        return self._native.id

    @property
    def token(self) -> str:
        """This holder's token (unique per acquisition)."""
        return self._native.token

    @property
    def released(self) -> bool:
        """Whether `release` was called."""
        return self._native.released

    def set(
        self,
        partial: Mapping[str, Any] | str | None = None,
        completed: Mapping[str, Any] | str | None = None,
    ) -> None:
        """Overwrites the locked id's state, fenced."""
        self._native.set(self.id, _part("partial", partial), _part("completed", completed))

    def update(
        self,
        partial: Mapping[str, Any] | str | None = None,
        completed: Mapping[str, Any] | str | None = None,
    ) -> State:
        """Meltano ``update`` of the locked id under this lock, fenced; returns the stored
        state."""
        return State._from_native(
            self._native.update(self.id, _part("partial", partial), _part("completed", completed))
        )

    def delete(self) -> int:
        """Deletes the locked id's state, fenced; 1 if there was one, else 0."""
        return self._native.delete()

    def renew(self) -> None:
        """Extends the lease (`LockedError` if it is lost or about to end)."""
        self._native.renew()

    def release(self) -> None:
        """Releases the lock; idempotent."""
        self._native.release()

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Sink:
    """An acknowledged table sink (WIT ``sink``) into an existing table: rows validated
    before any request, split into ``batch_size`` chunks, each one INSERT acknowledged in
    order. compression: ``none`` | ``lz4`` (default) | ``zstd`` | ``gzip``; ``retries``
    needs ``dedup``."""

    def __init__(
        self,
        connection: Connection,
        table: str,
        *,
        columns: Iterable[str] | None = None,
        batch_size: int | None = None,
        settings: Mapping[str, object] | None = None,
        dedup: bool | None = None,
        retries: int | None = None,
        compression: str | None = None,
    ) -> None:
        cols = None
        if columns is not None:
            if isinstance(columns, str):
                raise InvalidInputError("columns must be a list of names, not one str")
            cols = [_str("columns", c) for c in columns]
        if dedup is not None and not isinstance(dedup, bool):
            raise InvalidInputError("dedup must be a bool")
        self._native = _native.NativeSink(
            _connection(connection),
            _str("table", table),
            cols,
            _int("batch_size", batch_size),
            _settings("settings", settings),
            dedup,
            _int("retries", retries),
            _str("compression", compression, optional=True),
        )

    def resume(
        self,
        checkpoint: str,
        *,
        database: str | None = None,
        table: str | None = None,
        cluster: str | None = None,
    ) -> str | None:
        """Makes the sink resumable: its progress is kept in the state store (``database``,
        ``table``, ``cluster`` as for `StateStore`) under the state id ``checkpoint``.
        Returns the position of the last acknowledged send (None before the first): continue
        your source from there, and give every send the position its rows end at
        (``send(rows, position=...)``). If a send was in flight when a process stopped, the
        first send must be that one again (same rows, same order), or it is refused. Needs
        ``dedup=True``. See docs/sink.md, "Resumable sends"."""
        return self._native.resume(
            _str("checkpoint", checkpoint),
            _str("database", database, optional=True),
            _str("table", table, optional=True),
            _str("cluster", cluster, optional=True),
        )

    def send(
        self, rows: Iterable[Mapping[str, Any]] | PreparedRows, *, position: str | None = None
    ) -> Receipt:
        """Sends rows, each a dict of column name to value: None, bool, int, float, str,
        bytes, a dict/list (sent as JSON), or datetime, date, time, Decimal, UUID,
        IPv4Address, IPv6Address (which a String column refuses). Values are never coerced.
        Or rows that `prepare_rows` converted earlier. A resumable sink (`resume`) needs the
        ``position`` the rows end at."""
        if isinstance(rows, Mapping):
            raise InvalidInputError("send takes a list of rows (dicts), not one row")
        return _by_name(Receipt, self._native.send(rows, _str("position", position, optional=True)))

    def send_json(
        self, data: bytes | bytearray | memoryview, *, position: str | None = None
    ) -> Receipt:
        """Sends NDJSON (one object per line) or one JSON array of objects, as UTF-8 bytes;
        each value keeps its exact text. A resumable sink (`resume`) needs the ``position``
        the rows end at."""
        if isinstance(data, str):
            raise InvalidInputError("send_json takes bytes; encode the text as UTF-8")
        if isinstance(data, memoryview):
            data = data.tobytes()
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidInputError(f"send_json takes bytes, not {type(data).__name__}")
        return _by_name(
            Receipt, self._native.send_json(data, _str("position", position, optional=True))
        )

    def close(self) -> None:
        """Closes the sink (later sends raise `InvalidInputError`); idempotent."""
        self._native.close()

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PreparedRows = _native.PreparedRows


def prepare_rows(rows: Iterable[Mapping[str, Any]]) -> PreparedRows:
    """Converts rows (dicts, as `Sink.send` takes them) now, for a later `Sink.send`: what
    is sent is the rows as they are at this call, the lists and dicts inside them too, so
    they may be changed or reused meanwhile. A value `send` would refuse for its Python type
    is refused here (`InvalidInputError`); the columns' types are checked by the send.
    ``len()`` is the number of rows."""
    if isinstance(rows, Mapping):
        raise InvalidInputError("prepare_rows takes a list of rows (dicts), not one row")
    return _native.prepare_rows(rows)


def warm_up() -> tuple[str, float]:
    """Loads the component now rather than at the first call (compiles it, or loads the
    precompiled copy from the cache); returns how (``compiled``, ``compiled-and-cached``,
    ``cache-hit``) and the milliseconds it took."""
    return _native.warm_up()
