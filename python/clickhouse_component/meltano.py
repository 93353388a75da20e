"""Meltano's ``clickhouse`` state backend (entry point ``meltano.state_backends``), a drop-in
replacement for meltano-state-backend-clickhouse.

Configure it as that package is configured::

    state_backend:
      uri: clickhouse://user:password@host:8123/database     # clickhouses:// or ?secure=true: TLS
      clickhouse:            # all optional; override the URI's parts
        host: ...  port: ...  database: ...  user: ...  password: ...  secure: false
        schema: meltano      # database of the state table
        table: state         # state table (shared with meltano-state-backend-clickhouse)
        # ours:
        lock_table: state_component_lock   lock_engine: auto   stale_after_seconds: 300
        retries: 5   ca_file: /path/ca.pem   allow_hosts: "https://proxy:8443"
        cluster: main        # create the schema ON CLUSTER (Replicated state table, KeeperMap lock)

``state_backend.lock_timeout_seconds`` is how long a lock is waited for; the ``retry_seconds``
that Meltano passes to `acquire_lock` is the pause between attempts. Meltano's ``update`` and
``clear`` run ``get``/``set``/``delete`` inside `acquire_lock`: those writes go through the
held lock, fenced (a holder whose lease ended writes nothing and gets `LockedError`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import typing as t
from contextlib import contextmanager
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from meltano.core.setting_definition import SettingDefinition, SettingKind
from meltano.core.state_store.base import (
    MeltanoState,
    StateIDLockedError,
    StateStoreManager,
)

from . import Connection, Lock, State, StateStore
from .errors import InvalidInputError, LockedError, UncertainError

if t.TYPE_CHECKING:
    from collections.abc import Generator, Iterable

__all__ = ["ClickHouseStateStoreManager", "connection_from_uri"]

logger = logging.getLogger(__name__)

DEFAULT_SCHEMA = "meltano"
DEFAULT_TABLE = "state"


# (name, label, description, kind, extra): the settings of meltano-state-backend-clickhouse
# (same names, meanings and defaults), then ours.
_SETTINGS: list[tuple[str, str, str, SettingKind, dict[str, t.Any]]] = [
    ("host", "ClickHouse Host", "ClickHouse server hostname", SettingKind.STRING, {}),
    ("port", "ClickHouse Port", "ClickHouse HTTP interface port", SettingKind.INTEGER, {}),
    (
        "database",
        "ClickHouse Database",
        "ClickHouse database name (the connection's database)",
        SettingKind.STRING,
        {},
    ),
    ("user", "ClickHouse User", "ClickHouse username", SettingKind.STRING, {}),
    (
        "password",
        "ClickHouse Password",
        "ClickHouse password",
        SettingKind.STRING,
        {"sensitive": True},
    ),
    (
        "secure",
        "ClickHouse Secure (TLS)",
        "Connect to ClickHouse over HTTPS/TLS",
        SettingKind.BOOLEAN,
        {},
    ),
    (
        "schema",
        "ClickHouse Database/Schema",
        "ClickHouse database used for state storage (default: meltano)",
        SettingKind.STRING,
        {},
    ),
    (
        "table",
        "ClickHouse Table",
        "ClickHouse table name for state storage (default: state)",
        SettingKind.STRING,
        {},
    ),
    (
        "lock_table",
        "Lock table",
        "Lock table of clickhouse-component (default: <table>_component_lock)",
        SettingKind.STRING,
        {},
    ),
    (
        "lock_engine",
        "Lock engine",
        "auto, keeper-map or merge-tree (default: auto)",
        SettingKind.STRING,
        {},
    ),
    (
        "stale_after_seconds",
        "Lock lease",
        "Seconds after which a crashed holder's lock frees itself (default: 300)",
        SettingKind.INTEGER,
        {},
    ),
    (
        "retries",
        "Retries",
        "How many times a request that may pass is repeated (default: 5)",
        SettingKind.INTEGER,
        {},
    ),
    (
        "ca_file",
        "CA file",
        "PEM file of CA certificates trusted for HTTPS besides the system's",
        SettingKind.STRING,
        {},
    ),
    (
        "cluster",
        "Cluster",
        "Create the schema ON CLUSTER this cluster: a Replicated state table, a KeeperMap lock",
        SettingKind.STRING,
        {},
    ),
    (
        "allow_hosts",
        "Allowed hosts",
        "Extra destinations the component may reach (scheme://host:port, comma-separated)",
        SettingKind.STRING,
        {},
    ),
]


def _definitions(namespace: str) -> dict[str, SettingDefinition]:
    return {
        name: SettingDefinition(
            name=f"state_backend.{namespace}.{name}",
            label=label,
            description=description,
            kind=kind,
            env_specific=True,
            **extra,
        )
        for name, label, description, kind, extra in _SETTINGS
    }


# `state_backend.clickhouse.*` (entry points `meltano.settings`: HOST, PORT, ...), and the same
# settings as `state_backend.clickhouses.*` for `clickhouses://` URIs (Meltano picks the
# backend, and the settings' namespace, by the URI's scheme): TLS_HOST, TLS_PORT, ...
for _name, _definition in _definitions("clickhouse").items():
    globals()[_name.upper()] = _definition
for _name, _definition in _definitions("clickhouses").items():
    globals()[f"TLS_{_name.upper()}"] = _definition

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _flag(name: str, value: t.Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidInputError(f"{name} must be true or false")


def connection_from_uri(
    uri: str,
    *,
    host: str | None = None,
    port: int | str | None = None,
    database: str | None = None,
    user: str | None = None,
    password: str | None = None,
    secure: bool | str | None = None,
    ca_file: str | None = None,
    allow_hosts: str | list[str] | None = None,
) -> Connection:
    """The connection a state backend URI and the ``state_backend.clickhouse.*`` overrides
    describe: ``clickhouse://user:pass@host:port/database``; TLS with ``clickhouses://``, with
    ``?secure=true`` or with ``secure``. Other query parameters are ClickHouse settings."""
    parts = urlsplit(uri)
    if parts.scheme not in ("clickhouse", "clickhouses"):
        raise InvalidInputError("the state backend URI must start with clickhouse://")
    query = parse_qsl(parts.query, keep_blank_values=True)
    tls = parts.scheme == "clickhouses"
    rest = []
    for key, value in query:
        if key == "secure":
            tls = bool(_flag("secure", value))
        else:
            rest.append((key, value))
    if secure is not None:
        tls = bool(_flag("secure", secure))
    try:
        uri_port = parts.port
    except ValueError:
        raise InvalidInputError("the state backend URI has an invalid port") from None
    hostname = host or parts.hostname or "localhost"
    if ":" in hostname and not hostname.startswith("["):
        hostname = f"[{hostname}]"
    the_port = port if port not in (None, "") else uri_port
    netloc = hostname if the_port is None else f"{hostname}:{int(the_port)}"
    db = database or (unquote(parts.path.lstrip("/")) or None)
    url = f"{'https' if tls else 'http'}://{netloc}"
    if rest:
        url += "?" + urlencode(rest)
    if isinstance(allow_hosts, str):
        allow_hosts = [a.strip() for a in allow_hosts.split(",") if a.strip()]
    return Connection(
        url,
        user=user or (unquote(parts.username) if parts.username else None),
        password=password or (unquote(parts.password) if parts.password else None),
        database=db,
        ca_file=ca_file or None,
        allow=allow_hosts or None,
    )


def _seconds_ms(name: str, value: t.Any) -> int | None:
    if value in (None, ""):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number of seconds") from None
    if not 0 <= seconds <= 4_294_967:
        raise InvalidInputError(f"{name} must be from 0 to 4294967 seconds")
    return round(seconds * 1000)


def _to_meltano(state: State) -> MeltanoState:
    return MeltanoState(
        state_id=state.id,
        partial_state=state.partial,
        completed_state=state.completed,
    )


def _from_meltano(state: MeltanoState) -> State:
    return State(state.state_id, state.partial_state or {}, state.completed_state or {})


class ClickHouseStateStoreManager(StateStoreManager):
    """Meltano state in ClickHouse through clickhouse-component (Meltano 4.4's
    ``StateStoreManager``)."""

    def __init__(
        self,
        uri: str,
        *,
        host: str | None = None,
        port: int | None = None,
        database: str | None = None,
        user: str | None = None,
        password: str | None = None,
        secure: bool | None = None,
        schema: str | None = None,
        table: str | None = None,
        lock_table: str | None = None,
        lock_engine: str | None = None,
        stale_after_seconds: float | None = None,
        retries: int | None = None,
        ca_file: str | None = None,
        allow_hosts: str | None = None,
        cluster: str | None = None,
        lock_timeout_seconds: float | None = None,
        lock_retry_seconds: float | None = None,
        **kwargs: t.Any,
    ) -> None:
        super().__init__(**kwargs)
        self.uri = uri
        self.connection = connection_from_uri(
            uri,
            host=host,
            port=port,
            database=database,
            user=user,
            password=password,
            secure=secure,
            ca_file=ca_file,
            allow_hosts=allow_hosts,
        )
        self.schema = schema or DEFAULT_SCHEMA
        self.table = table or DEFAULT_TABLE
        self._options: dict[str, t.Any] = {
            "database": self.schema,
            "table": self.table,
            "lock_table": lock_table or None,
            "lock_engine": lock_engine or None,
            "lock_timeout_ms": _seconds_ms("lock_timeout_seconds", lock_timeout_seconds),
            "stale_after_ms": _seconds_ms("stale_after_seconds", stale_after_seconds),
            "retries": int(retries) if retries not in (None, "") else None,
            "cluster": cluster or None,
        }
        self._default_retry_ms = _seconds_ms("lock_retry_seconds", lock_retry_seconds)
        self._write_retries = int(retries) if retries not in (None, "") else 5
        # One store per lock retry interval (Meltano passes the interval to each
        # acquire_lock; a store's is fixed when it opens). Opening creates the schema.
        self._stores: dict[int | None, StateStore] = {}
        self._stores_guard = threading.Lock()
        # The locks held by acquire_lock, per thread and state id: writes inside it use them.
        self._held = threading.local()
        self._store(self._default_retry_ms)

    @property
    def label(self) -> str:
        """Label for the StateStoreManager."""
        return "ClickHouse (clickhouse-component)"

    def _store(self, retry_ms: int | None) -> StateStore:
        with self._stores_guard:
            store = self._stores.get(retry_ms)
            if store is None:
                store = StateStore(self.connection, lock_retry_ms=retry_ms, **self._options)
                self._stores[retry_ms] = store
            return store

    @property
    def store(self) -> StateStore:
        """The store (opened with the configured lock retry interval)."""
        return self._store(self._default_retry_ms)

    def _held_lock(self, state_id: str) -> Lock | None:
        held: dict[str, Lock] | None = getattr(self._held, "locks", None)
        return held.get(state_id) if held else None

    def _fenced(self, write: t.Callable[[], t.Any]) -> t.Any:
        """A write through the lock `acquire_lock` holds, repeated while its outcome is
        unknown. The component does not repeat a write through a lock held across calls (a
        late first attempt could land after a later write under the same lock and undo it);
        here it is the only write of this acquisition, and once the lock is released a late
        attempt is refused by the fence: repeating the same write is safe, and what Meltano
        is told is what is stored."""
        for attempt in range(self._write_retries + 1):
            try:
                return write()
            except UncertainError:
                if attempt == self._write_retries:
                    raise
                time.sleep(min(2.0, 0.1 * 2**attempt) * (1 + random.random() / 2))
        raise AssertionError("unreachable")

    def set(self, state: MeltanoState) -> None:
        """Overwrites the state; inside `acquire_lock` on its id, fenced by that lock."""
        ours = _from_meltano(state)
        lock = self._held_lock(state.state_id)
        if lock is not None:
            self._fenced(lambda: lock.set(partial=ours.partial, completed=ours.completed))
        else:
            self.store.set(ours)

    def get(self, state_id: str) -> MeltanoState | None:
        """The state of `state_id`, or None."""
        found = self.store.get(state_id)
        return _to_meltano(found) if found is not None else None

    def delete(self, state_id: str) -> None:
        """Deletes the state; inside `acquire_lock` on its id, fenced by that lock."""
        lock = self._held_lock(state_id)
        if lock is not None:
            self._fenced(lock.delete)
        else:
            self.store.delete(state_id)

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        """Ids matching an exact glob (``*``, ``?``, ``[seq]``; ``_`` and ``%`` are literal)."""
        return self.store.ids(pattern or None)

    def get_all(self, pattern: str | None = None) -> Iterable[MeltanoState]:
        """Every state whose id matches the pattern, in one query."""
        return [_to_meltano(s) for s in self.store.get_all(pattern or None)]

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        """Overwrites many states in one INSERT; returns how many."""
        ours = [_from_meltano(s) for s in states]
        if ours:
            self.store.set_all(ours)
        return len(ours)

    def clear_all(self) -> int:
        """Deletes every state; returns how many there were."""
        return self.store.clear_all()

    def migrate(self) -> None:
        """Creates the database and tables if missing (opening the store does it)."""
        self._store(self._default_retry_ms)

    def close(self) -> None:
        """Closes the stores."""
        with self._stores_guard:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float = 1) -> Generator[None]:
        """Holds our lock on `state_id` (waiting up to ``lock_timeout_seconds``, trying
        again every `retry_seconds`); `set`/`delete` of that id inside it are fenced by it.
        Raises `StateIDLockedError` on timeout."""
        store = self._store(_seconds_ms("retry_seconds", retry_seconds))
        try:
            lock = store.lock(state_id)
        except LockedError as e:
            raise StateIDLockedError(f"Could not acquire lock for state_id: {state_id}") from e
        held = getattr(self._held, "locks", None)
        if held is None:
            held = self._held.locks = {}
        outer = held.get(state_id)
        held[state_id] = lock
        try:
            yield
        finally:
            if outer is None:
                held.pop(state_id, None)
            else:
                held[state_id] = outer
            try:
                lock.release()
            except Exception as e:
                # The release was repeated until it landed or the lease ended: the lock is
                # free either way, and a completed write stays completed (nor does it hide
                # the error of a failed one).
                logger.warning("releasing the lock on %r failed: %s", state_id, e)
