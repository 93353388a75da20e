"""Type stubs of the extension module (the engine of clickhouse_component; use the package)."""

WASMTIME_VERSION: str

class Connection:
    def __init__(
        self,
        url: str,
        user: str | None = None,
        password: str | None = None,
        database: str | None = None,
        settings: list[tuple[str, str]] = ...,
        ca_file: str | None = None,
        allow: list[str] = ...,
        connect_timeout_ms: int | None = None,
        request_timeout_ms: int | None = None,
        max_memory_mib: int | None = None,
        call_timeout_seconds: float | None = None,
        max_response_mib: int | None = None,
    ) -> None: ...
    @property
    def allowed(self) -> str: ...
    def ping(self) -> NativeServerInfo: ...

class NativeStore:
    def __init__(
        self,
        connection: Connection,
        database: str | None = None,
        table: str | None = None,
        lock_table: str | None = None,
        create_schema: bool | None = None,
        lock_timeout_ms: int | None = None,
        lock_retry_ms: int | None = None,
        stale_after_ms: int | None = None,
        lock_engine: str | None = None,
        retries: int | None = None,
        cluster: str | None = None,
    ) -> None: ...
    def get(self, id: str) -> NativeState | None: ...
    def set(self, id: str, partial: str, completed: str) -> None: ...
    def update(self, id: str, partial: str, completed: str) -> NativeState: ...
    def delete(self, id: str) -> int: ...
    def ids(self, pattern: str | None = None) -> list[str]: ...
    def get_all(self, pattern: str | None = None) -> list[NativeState]: ...
    def set_all(self, states: list[tuple[str, str, str]]) -> None: ...
    def clear_all(self) -> int: ...
    def lock(self, id: str) -> NativeLock: ...
    def close(self) -> None: ...

class NativeLock:
    @property
    def id(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def released(self) -> bool: ...
    def set(self, id: str, partial: str, completed: str) -> None: ...
    def update(self, id: str, partial: str, completed: str) -> NativeState: ...
    def delete(self) -> int: ...
    def renew(self) -> None: ...
    def release(self) -> None: ...

class PreparedRows:
    def __len__(self) -> int: ...

def prepare_rows(rows: object) -> PreparedRows: ...

class NativeSink:
    def __init__(
        self,
        connection: Connection,
        table: str,
        columns: list[str] | None = None,
        batch_size: int | None = None,
        settings: list[tuple[str, str]] = ...,
        dedup: bool | None = None,
        retries: int | None = None,
        compression: str | None = None,
    ) -> None: ...
    def resume(
        self,
        checkpoint: str,
        database: str | None = None,
        table: str | None = None,
        cluster: str | None = None,
    ) -> str | None: ...
    def send(self, rows: object, position: str | None = None) -> NativeReceipt: ...
    def send_json(self, data: bytes | bytearray, position: str | None = None) -> NativeReceipt: ...
    def close(self) -> None: ...

def warm_up() -> tuple[str, float]: ...
def _after_fork_in_child() -> None: ...
def run_target(args: list[str]) -> int: ...

class NativeState:
    id: str
    partial: str
    completed: str

class NativeServerInfo:
    version: str
    timezone: str
    user: str
    database: str
    round_trip_us: int

class NativeReceipt:
    rows: int
    chunks: int
    written_rows: int
    deduplicated_chunks: int
    unverified_chunks: int
    retries: int
    format: str
