"""onestep resources (entry point ``onestep.resources``), a replacement for
onestep-clickhouse 0.1.1: ``clickhouse`` (connector), ``clickhouse_table_sink`` (sink), with the
same YAML fields, defaults and validation, plus ``dedup``, ``retries`` and ``compression`` on the
sink; and ``clickhouse_state_store`` (onestep's ``state_store`` / ``cursor_store`` roles) backed
by our state store::

    resources:
      ch: {type: clickhouse, dsn: "clickhouse://user:pass@host:8123/db",
           client_options: {connect_timeout: 10, send_receive_timeout: 300}}
      events: {type: clickhouse_table_sink, connector: ch, table: events,
               columns: [id, name], batch_size: 1000, settings: {}, dedup: true, retries: 3}
      cursors: {type: clickhouse_state_store, connector: ch, database: onestep, table: state}

Sends are async: the blocking call runs in a worker thread, off the event loop, one send at a
time. Failures are onestep's ``ConnectorOperationError`` with the matching kind; ``uncertain``
stays uncertain (onestep does not retry it). A task cancelled during a send waits for the send
to finish (it is never left half-done), then is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from onestep import (
    ConnectorErrorKind,
    ConnectorOperation,
    ConnectorOperationError,
    Envelope,
    ResourceBuildContext,
    ResourceCatalogEntry,
    ResourceCatalogField,
    ResourceRegistry,
    ResourceSpecHandler,
    ResourceValidationContext,
    Sink,
)

from . import Connection, PreparedRows, StateStore, connect, prepare_rows
from . import Sink as _Sink
from .errors import ClickHouseError

__all__ = [
    "ClickHouseConnector",
    "ClickHousePayloadError",
    "ClickHouseStateStore",
    "ClickHouseTableSink",
    "register",
    "register_resources",
]

BACKEND = "clickhouse"
# `True == 1`: the set takes both, as onestep-clickhouse's {1, True, "1"} does.
_ASYNC_ON = {1, "1"}
# client_options of onestep-clickhouse that mean something here (clickhouse-connect's names),
# and ours.
_CLIENT_OPTIONS = frozenset(
    {
        "connect_timeout",
        "send_receive_timeout",
        "username",
        "user",
        "password",
        "database",
        "settings",
        "ca_file",
        "allow",
    }
)

_KINDS = {
    "invalid-input": ConnectorErrorKind.PERMANENT,
    "misconfigured": ConnectorErrorKind.MISCONFIGURED,
    "disconnected": ConnectorErrorKind.DISCONNECTED,
    "transient": ConnectorErrorKind.TRANSIENT,
    "throttled": ConnectorErrorKind.THROTTLED,
    "permanent": ConnectorErrorKind.PERMANENT,
    "uncertain": ConnectorErrorKind.UNCERTAIN,
    "locked": ConnectorErrorKind.TRANSIENT,
    "not-found": ConnectorErrorKind.MISCONFIGURED,
}


class ClickHousePayloadError(ValueError):
    """A payload that is not a mapping or a non-empty sequence of mappings."""


def _operation_error(
    e: ClickHouseError, operation: ConnectorOperation, name: str
) -> ConnectorOperationError:
    # A runner failure during a send leaves its outcome unknown.
    kind = _KINDS.get(e.kind, ConnectorErrorKind.UNCERTAIN)
    return ConnectorOperationError(
        backend=BACKEND,
        operation=operation,
        kind=kind,
        source_name=name,
        cause=e,
        message=f"{BACKEND} {operation.value} failed ({kind.value}) for {name}: {e}",
    )


async def _off_loop(fn: Any, *args: Any) -> Any:
    """Runs the blocking `fn` in a thread; a cancellation waits for it to finish first."""
    future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Never leave a send half-done behind the caller's back: let it end, then cancel.
        with contextlib.suppress(Exception):
            await future
        raise


def _seconds_ms(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"client_options.{name} must be a positive number of seconds")
    return max(1, round(value * 1000))


class ClickHouseConnector:
    """A ClickHouse connection for onestep (mirrors onestep-clickhouse's
    ``ClickHouseConnector(dsn, client_options=...)``)."""

    def __init__(self, dsn: str, *, client_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ValueError("dsn must not be empty")
        options = dict(client_options or {})
        unknown = sorted(str(k) for k in options if k not in _CLIENT_OPTIONS)
        if unknown:
            raise ValueError(
                f"unsupported client_options: {', '.join(unknown)} "
                f"(supported: {', '.join(sorted(_CLIENT_OPTIONS))})"
            )
        self.dsn = dsn
        self.client_options = options
        settings = options.get("settings")
        allow = options.get("allow")
        self.connection: Connection = connect(
            dsn,
            user=options.get("username") or options.get("user"),
            password=options.get("password"),
            database=options.get("database"),
            settings=settings,
            ca_file=options.get("ca_file"),
            allow=[allow] if isinstance(allow, str) else allow,
            connect_timeout_ms=_seconds_ms("connect_timeout", options.get("connect_timeout")),
            request_timeout_ms=_seconds_ms(
                "send_receive_timeout", options.get("send_receive_timeout")
            ),
        )
        self._closed = False

    def table_sink(self, *, table: str, **options: Any) -> ClickHouseTableSink:
        """A table sink on this connection."""
        return ClickHouseTableSink(connector=self, table=table, **options)

    def state_store(self, **options: Any) -> ClickHouseStateStore:
        """A state / cursor store on this connection."""
        return ClickHouseStateStore(connector=self, **options)

    async def close(self) -> None:
        self._closed = True


class ClickHouseTableSink(Sink):
    """Rows into an existing table through the component's acknowledged sink."""

    def __init__(
        self,
        *,
        connector: ClickHouseConnector,
        table: str,
        columns: Sequence[str] | None = None,
        batch_size: int = 1000,
        settings: Mapping[str, Any] | None = None,
        dedup: bool | None = None,
        retries: int | None = None,
        compression: str | None = None,
    ) -> None:
        super().__init__(f"clickhouse.table:{table}")
        if not isinstance(table, str) or not table.strip():
            raise ValueError("table must not be empty")
        if columns is not None and (
            isinstance(columns, (str, bytes, bytearray))
            or not columns
            or any(not isinstance(c, str) or not c.strip() for c in columns)
            or len(set(columns)) != len(columns)
        ):
            raise ValueError("columns must be a non-empty unique sequence")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError("batch_size must be an integer")
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if settings is not None and not isinstance(settings, Mapping):
            raise TypeError("settings must be a mapping")
        settings = dict(settings or {})
        if (
            settings.get("async_insert") in _ASYNC_ON
            and settings.get("wait_for_async_insert") not in _ASYNC_ON
        ):
            raise ValueError("async_insert requires wait_for_async_insert=1")
        if dedup is not None and not isinstance(dedup, bool):
            raise TypeError("dedup must be a boolean")
        if retries is not None and (
            isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
        ):
            raise ValueError("retries must be a non-negative integer")
        if retries and not dedup:
            raise ValueError(
                "retries need dedup: true (a resend without a token could be written twice)"
            )
        if compression is not None and compression not in ("none", "lz4", "zstd", "gzip"):
            raise ValueError("compression must be none, lz4, zstd or gzip")
        self.connector = connector
        self.table = table
        self.columns = tuple(columns) if columns is not None else None
        self.batch_size = batch_size
        self.settings = settings
        self.dedup = dedup
        self.retries = retries
        self.compression = compression
        self._sink: _Sink | None = None
        self._send_lock = asyncio.Lock()

    def _open_blocking(self) -> _Sink:
        if self._sink is None:
            self._sink = _Sink(
                self.connector.connection,
                self.table,
                columns=self.columns,
                batch_size=self.batch_size,
                settings=self.settings,
                dedup=self.dedup,
                retries=self.retries,
                compression=self.compression,
            )
        return self._sink

    async def open(self) -> None:
        try:
            await _off_loop(self._open_blocking)
        except ClickHouseError as e:
            raise _operation_error(e, ConnectorOperation.OPEN, self.name) from None

    def _documents(self, body: Any) -> list[Mapping[str, Any]]:
        if isinstance(body, Mapping):
            body = [body]
        if not isinstance(body, Sequence) or isinstance(body, (str, bytes, bytearray)):
            raise ClickHousePayloadError(
                "payload must be a mapping or non-empty sequence of mappings"
            )
        if not body:
            raise ClickHousePayloadError("payload sequence must not be empty")
        # The sink's conversion takes dicts (it copies nothing); another mapping is read
        # into one, as onestep-clickhouse reads each. One pass over the rows.
        rows = []
        for item in body:
            if type(item) is dict:
                rows.append(item)
            elif isinstance(item, Mapping):
                rows.append(dict(item))
            else:
                raise ClickHousePayloadError("every payload item must be a mapping")
        return rows

    def _send_blocking(self, rows: PreparedRows) -> Any:
        return self._open_blocking().send(rows)

    async def send(self, envelope: Envelope) -> None:
        try:
            # Converted now, before waiting for the send before it: what is sent is the rows
            # as they are at this call (nested lists and dicts too), whatever the caller does
            # with them meanwhile. (onestep-clickhouse copies each dict instead; a copy of 1M
            # dicts cost more than this conversion, mostly in Python's garbage collector.)
            rows = prepare_rows(self._documents(envelope.body))
        except ClickHousePayloadError as exc:
            raise ConnectorOperationError(
                backend=BACKEND,
                operation=ConnectorOperation.SEND,
                kind=ConnectorErrorKind.PERMANENT,
                source_name=self.name,
                cause=exc,
            ) from None
        except ClickHouseError as e:
            raise _operation_error(e, ConnectorOperation.SEND, self.name) from None
        async with self._send_lock:
            try:
                await _off_loop(self._send_blocking, rows)
            except ClickHouseError as e:
                raise _operation_error(e, ConnectorOperation.SEND, self.name) from None

    async def close(self) -> None:
        if self._sink is not None:
            await _off_loop(self._sink.close)


class ClickHouseStateStore:
    """onestep's state / cursor store (load, save, delete) in our state store: each key one
    state, its value JSON in the completed part (``{"value": ...}``)."""

    def __init__(
        self,
        *,
        connector: ClickHouseConnector,
        database: str | None = None,
        table: str | None = None,
        lock_table: str | None = None,
        lock_engine: str | None = None,
        retries: int | None = None,
    ) -> None:
        self.connector = connector
        self.options = {
            "database": database or "onestep",
            "table": table or "state",
            "lock_table": lock_table,
            "lock_engine": lock_engine,
            "retries": retries,
        }
        self.name = f"clickhouse.state:{self.options['database']}.{self.options['table']}"
        self._store: StateStore | None = None

    def _opened(self) -> StateStore:
        if self._store is None:
            self._store = StateStore(self.connector.connection, **self.options)
        return self._store

    async def _call(self, operation: ConnectorOperation, fn: Any, *args: Any) -> Any:
        def run() -> Any:
            return fn(self._opened(), *args)

        try:
            return await _off_loop(run)
        except ClickHouseError as e:
            raise _operation_error(e, operation, self.name) from None

    async def load(self, key: str) -> Any | None:
        state = await self._call(ConnectorOperation.FETCH, StateStore.get, key)
        if state is None:
            return None
        return state.completed.get("value")

    async def save(self, key: str, value: Any) -> None:
        await self._call(
            ConnectorOperation.SEND,
            lambda store, k, v: store.set(k, completed={"value": v}),
            key,
            value,
        )

    async def delete(self, key: str) -> None:
        await self._call(ConnectorOperation.SEND, StateStore.delete, key)

    async def close(self) -> None:
        if self._store is not None:
            await _off_loop(self._store.close)


CONNECTOR_FIELDS = frozenset({"type", "dsn", "client_options"})
SINK_FIELDS = frozenset(
    {
        "type",
        "connector",
        "table",
        "columns",
        "batch_size",
        "settings",
        "dedup",
        "retries",
        "compression",
    }
)
STATE_FIELDS = frozenset(
    {"type", "connector", "database", "table", "lock_table", "lock_engine", "retries"}
)
CONNECTOR_CATALOG = ResourceCatalogEntry(
    type="clickhouse",
    roles=("connector",),
    label="ClickHouse (clickhouse-component)",
    fields=(
        ResourceCatalogField("dsn", "string", required=True, secret=True),
        ResourceCatalogField("client_options", "mapping", secret=True),
    ),
)
SINK_CATALOG = ResourceCatalogEntry(
    type="clickhouse_table_sink",
    roles=("sink",),
    label="ClickHouse Table Sink (clickhouse-component)",
    connector_types=("clickhouse",),
    fields=(
        ResourceCatalogField("connector", "ref", required=True),
        ResourceCatalogField("table", "string", required=True),
        ResourceCatalogField("columns", "string_list"),
        ResourceCatalogField("batch_size", "integer", default=1000),
        ResourceCatalogField("settings", "mapping"),
        ResourceCatalogField("dedup", "boolean", default=False),
        ResourceCatalogField("retries", "integer", default=0),
        ResourceCatalogField("compression", "string", default="lz4"),
    ),
    topology_fields=("table", "columns", "batch_size"),
)
STATE_CATALOG = ResourceCatalogEntry(
    type="clickhouse_state_store",
    roles=("state_store", "cursor_store"),
    label="ClickHouse State Store (clickhouse-component)",
    connector_types=("clickhouse",),
    fields=(
        ResourceCatalogField("connector", "ref", required=True),
        ResourceCatalogField("database", "string", default="onestep"),
        ResourceCatalogField("table", "string", default="state"),
        ResourceCatalogField("lock_table", "string"),
        ResourceCatalogField("lock_engine", "string", default="auto"),
        ResourceCatalogField("retries", "integer", default=5),
    ),
)


def _validate_connector(ctx: ResourceValidationContext, spec: Mapping[str, Any]) -> None:
    from urllib.parse import urlparse

    dsn = ctx.require_string(spec, "dsn")
    parsed = urlparse(dsn)
    if parsed.scheme not in {"clickhouse", "clickhouses", "http", "https"} or not parsed.netloc:
        raise ValueError(f"'{ctx.field}.dsn' must be a ClickHouse or HTTP(S) DSN")
    if "client_options" in spec and not isinstance(spec.get("client_options"), Mapping):
        raise TypeError(f"'{ctx.field}.client_options' must be a mapping")
    unknown = sorted(str(k) for k in (spec.get("client_options") or {}) if k not in _CLIENT_OPTIONS)
    if unknown:
        raise ValueError(f"'{ctx.field}.client_options' has unsupported keys: {', '.join(unknown)}")


def _validate_sink(ctx: ResourceValidationContext, spec: Mapping[str, Any]) -> None:
    ctx.require_string(spec, "connector")
    ctx.require_string(spec, "table")
    if "columns" in spec:
        ctx.require_non_empty_string_list(spec, "columns", field=f"{ctx.field}.columns")
    ctx.validate_positive_integer(spec.get("batch_size"), field=f"{ctx.field}.batch_size")
    settings = spec.get("settings", {})
    if not isinstance(settings, Mapping):
        raise TypeError(f"'{ctx.field}.settings' must be a mapping")
    if (
        settings.get("async_insert") in _ASYNC_ON
        and settings.get("wait_for_async_insert") not in _ASYNC_ON
    ):
        raise ValueError(
            f"'{ctx.field}.settings.wait_for_async_insert' must be 1 when async_insert is enabled"
        )
    if "dedup" in spec and not isinstance(spec["dedup"], bool):
        raise TypeError(f"'{ctx.field}.dedup' must be a boolean")
    retries = spec.get("retries")
    if retries is not None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"'{ctx.field}.retries' must be a non-negative integer")
        if retries and not spec.get("dedup"):
            raise ValueError(f"'{ctx.field}.retries' needs '{ctx.field}.dedup: true'")
    if spec.get("compression") not in (None, "none", "lz4", "zstd", "gzip"):
        raise ValueError(f"'{ctx.field}.compression' must be none, lz4, zstd or gzip")


def _validate_state(ctx: ResourceValidationContext, spec: Mapping[str, Any]) -> None:
    ctx.require_string(spec, "connector")
    for key in ("database", "table", "lock_table"):
        if key in spec:
            ctx.string_value(spec[key], field=f"{ctx.field}.{key}")
    if spec.get("lock_engine") not in (None, "auto", "keeper-map", "merge-tree"):
        raise ValueError(f"'{ctx.field}.lock_engine' must be auto, keeper-map or merge-tree")
    retries = spec.get("retries")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
    ):
        raise ValueError(f"'{ctx.field}.retries' must be a non-negative integer")


def _build_connector(ctx: ResourceBuildContext, spec: Mapping[str, Any]) -> ClickHouseConnector:
    return ClickHouseConnector(
        ctx.require_string(spec, "dsn"),
        client_options=ctx.mapping_value(
            spec.get("client_options"), field=f"{ctx.field}.client_options"
        ),
    )


def _connector_of(ctx: ResourceBuildContext, spec: Mapping[str, Any]) -> ClickHouseConnector:
    connector = ctx.resolve_dependency(spec, "connector")
    if not isinstance(connector, ClickHouseConnector):
        raise TypeError(f"resource {spec['connector']!r} is not a ClickHouseConnector")
    return connector


def _build_sink(ctx: ResourceBuildContext, spec: Mapping[str, Any]) -> ClickHouseTableSink:
    connector = _connector_of(ctx, spec)
    columns = (
        tuple(ctx.string_list(spec.get("columns"), field=f"{ctx.field}.columns"))
        if spec.get("columns") is not None
        else None
    )
    return connector.table_sink(
        table=ctx.require_string(spec, "table"),
        columns=columns,
        batch_size=spec.get("batch_size", 1000),
        settings=ctx.mapping_value(spec.get("settings"), field=f"{ctx.field}.settings"),
        dedup=spec.get("dedup"),
        retries=spec.get("retries"),
        compression=spec.get("compression"),
    )


def _build_state(ctx: ResourceBuildContext, spec: Mapping[str, Any]) -> ClickHouseStateStore:
    return _connector_of(ctx, spec).state_store(
        database=spec.get("database"),
        table=spec.get("table"),
        lock_table=spec.get("lock_table"),
        lock_engine=spec.get("lock_engine"),
        retries=spec.get("retries"),
    )


def register_resources(registry: ResourceRegistry) -> None:
    """Registers the three resource types (onestep's `onestep.resources` entry point)."""
    registry.register_resource_type(
        ResourceSpecHandler(
            type="clickhouse",
            catalog=CONNECTOR_CATALOG,
            allowed_fields=CONNECTOR_FIELDS,
            build=_build_connector,
            validate=_validate_connector,
        )
    )
    registry.register_resource_type(
        ResourceSpecHandler(
            type="clickhouse_table_sink",
            catalog=SINK_CATALOG,
            allowed_fields=SINK_FIELDS,
            build=_build_sink,
            validate=_validate_sink,
        )
    )
    registry.register_resource_type(
        ResourceSpecHandler(
            type="clickhouse_state_store",
            catalog=STATE_CATALOG,
            allowed_fields=STATE_FIELDS,
            build=_build_state,
            validate=_validate_state,
        )
    )


register = register_resources
