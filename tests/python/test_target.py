"""The wheel's Singer target, `target-clickhouse-component`, as Meltano runs it: settings and
--about, a plain `meltano run` of a deterministic tap (plugins/tap_rows.py) with our state
backend, SIGKILL of the target (or of Meltano) at points chosen by a proxy that holds one
INSERT, then a rerun that must leave every record exactly once; faults ridden out within one
run; bad input fed to the console script.

The proxy that holds a chosen INSERT is this file's `HoldProxy`: conftest's `FaultProxy` (the
tests crate's fault_proxy program) picks its faults by a seeded hash of the request's number
and cannot hold a request until told, so it serves the seeded-faults test only. Tables of
the crash and fault tests are plain MergeTree (`engine_type`): a background merge of a
ReplacingMergeTree could collapse a duplicate before `count()` sees it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from conftest import PASSWORD, URL, USER, FaultProxy, cli_get, sql

BIN = Path(sys.executable).parent
TARGET = BIN / "target-clickhouse-component"
MELTANO = BIN / "meltano"
PLUGINS = Path(__file__).resolve().parent / "plugins"
TAP = PLUGINS / "tap_rows.py"
JOB = "dev:tap-rows-to-target-clickhouse-component"
SECRET = "hunter2-Sup3rSecret"
MELTANO_ENV = {
    "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
    "MELTANO_DISABLE_TRACKING": "true",
    "MELTANO_CLI_LOG_LEVEL": "info",
    "NO_COLOR": "1",
}


def _load_tap():
    spec = importlib.util.spec_from_file_location("tap_rows", TAP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tap_rows = _load_tap()


def wait_for(what: str, predicate: Callable[[], object], timeout: float = 60) -> object:
    """Polls an observable condition (a stored bookmark, a process) until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


# The proxy.


@dataclass
class Request:
    """One request as the proxy saw it."""

    seq: int
    method: str
    target: str
    head: bytes
    body: bytes
    action: str = "pass"
    released: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def query(self) -> str:
        return urllib.parse.unquote_plus(self.target)

    @property
    def params(self) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.target).query))

    @property
    def token(self) -> str | None:
        return self.params.get("insert_deduplication_token")

    def inserts_into(self, database: str, table: str) -> bool:
        params = self.params
        sql_text = params.get("query", "") + self.body[:2048].decode("latin-1")
        return (
            "INSERT INTO" in sql_text
            and params.get("param_db") == database
            and params.get("param_t") == table
        )


@dataclass
class Rule:
    match: Callable[[Request], bool]
    action: str
    skip: int = 0
    times: int = 1
    matched: int = 0
    applied: int = 0


class HoldProxy:
    """An HTTP/1.1 proxy in front of the test ClickHouse that does one thing to the requests
    its rules match. Each rule counts every request it matches and acts on `times` of them
    from the one after the first `skip`; the first rule that acts wins. Actions: `refuse`
    (the connection reset, nothing forwarded), `cut-request` (head and half the body
    forwarded, then both sides closed), `drop-reply` (executed, the reply replaced by a
    reset), `cut-reply` (half the reply delivered, or half its head if it has no body, then
    closed), `pause` (held before the server gets anything), `hold-partial` (head and half the
    body forwarded, then held: the server is mid-INSERT), `hold-reply` (executed, the reply
    held). A held request waits for `release` or `close`; after `close` it goes no further (a
    paused one is never forwarded, a partial one is cut, a held reply is lost). `wait_held`
    awaits one. Every request is in `log`."""

    def __init__(self, upstream: str = URL) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cond = threading.Condition()
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self.held: list[Request] = []
        self.sockets: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, match: Callable[[Request], bool], action: str, *, skip: int = 0) -> Rule:
        rule = Rule(match, action, skip)
        with self.cond:
            self.rules.append(rule)
        return rule

    def wait_held(self, timeout: float = 60) -> Request:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.held:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no request held; seen: {self.summary()}")
                self.cond.wait(left)
            return self.held[0]

    def requests(self, match: Callable[[Request], bool]) -> list[Request]:
        with self.cond:
            return [r for r in self.log if match(r)]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for r in self.held:
                r.released.set()
            sockets = list(self.sockets)
        with contextlib.suppress(OSError):
            self.listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def summary(self) -> list[tuple[int, str, str]]:
        with self.cond:
            return [(r.seq, r.action, r.query[:100]) for r in self.log]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, s: socket.socket) -> None:
        with self.cond:
            self.sockets.add(s)

    def _decide(self, request: Request) -> str:
        with self.cond:
            request.seq = len(self.log) + 1
            matching = [rule for rule in self.rules if rule.match(request)]
            for rule in matching:
                rule.matched += 1
            for rule in matching:
                if rule.matched > rule.skip and rule.applied < rule.times:
                    rule.applied += 1
                    request.action = rule.action
                    break
            self.log.append(request)
            self.cond.notify_all()
            return request.action

    def _hold(self, request: Request) -> bool:
        """Holds until released; whether the proxy is still open."""
        with self.cond:
            if self.closed:
                return False
            self.held.append(request)
            self.cond.notify_all()
        request.released.wait()
        with self.cond:
            self.held.remove(request)
            return not self.closed

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream = up_reader = None
        reset = True
        try:
            reader = client.makefile("rb")
            while True:
                head = _read_head(reader)
                if head is None:
                    reset = False
                    return
                raw_body, body = _read_body(reader, head, request=True)
                line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                request = Request(0, line[0], line[1] if len(line) > 1 else "", head, body)
                action = self._decide(request)
                if action == "refuse":
                    return
                if action == "pause" and not self._hold(request):
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=120)
                    self._track(upstream)
                    up_reader = upstream.makefile("rb")
                if action in ("cut-request", "hold-partial"):
                    upstream.sendall(head + raw_body[: len(raw_body) // 2])
                    if action == "hold-partial":
                        self._hold(request)
                    return
                upstream.sendall(head + raw_body)
                reply_head = _read_head(up_reader)
                if reply_head is None:
                    return
                reply_body, _ = _read_body(up_reader, reply_head, request=False)
                if action == "drop-reply":
                    return
                if action == "hold-reply" and not self._hold(request):
                    return
                if action == "cut-reply":
                    if reply_body:
                        client.sendall(reply_head + reply_body[: len(reply_body) // 2])
                    else:
                        client.sendall(reply_head[: len(reply_head) // 2])
                    reset = False
                    return
                client.sendall(reply_head + reply_body)
                if b"connection: close" in reply_head.lower():
                    reset = False
                    return
        except (OSError, ValueError):
            pass
        finally:
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.close()
            if reset:
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                client.close()
            with self.cond:
                self.sockets.discard(client)
                self.sockets.discard(upstream)


def _read_head(reader) -> bytes | None:
    head = b""
    while True:
        line = reader.readline(65536)
        if not line:
            if head:
                raise OSError("closed inside a head")
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            if head.startswith(b"HTTP/1.1 100"):
                head = b""  # an interim reply: the real one follows
                continue
            return head


def _header(head: bytes, name: str) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.encode():
            return value.strip().decode("latin-1")
    return None


def _read_body(reader, head: bytes, *, request: bool) -> tuple[bytes, bytes]:
    """The body as it was on the wire, and de-chunked."""
    if not request and int(head.split(b" ", 2)[1]) in (204, 304):
        return b"", b""
    if "chunked" in (_header(head, "transfer-encoding") or "").lower():
        raw, body = b"", b""
        while True:
            size_line = reader.readline(65536)
            raw += size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:
                    trailer = reader.readline(65536)
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return raw, body
            chunk = reader.read(size + 2)
            raw += chunk
            body += chunk[:size]
    length = _header(head, "content-length")
    if length is not None:
        data = reader.read(int(length))
        return data, data
    if request:
        return b"", b""
    data = reader.read()
    return data, data


@pytest.fixture
def proxy():
    p = HoldProxy()
    yield p
    p.close()


# ClickHouse.


def uri(database: str, *, port: int | None = None, password: str | None = None) -> str:
    """The target's uri: to the test ClickHouse (or a proxy's port), without the password
    unless given."""
    parsed = urllib.parse.urlsplit(URL)
    auth = urllib.parse.quote(USER)
    if password is not None:
        auth += ":" + urllib.parse.quote(password, safe="")
    return f"clickhouse://{auth}@{parsed.hostname}:{port or parsed.port}/{database}"


def counts(database: str, table: str = "rows") -> tuple[int, int]:
    """(count(), uniqExact(id)) of a table, without FINAL: a duplicate shows."""
    out = sql(f"SELECT count(), uniqExact(id) FROM `{database}`.`{table}`").split()
    return int(out[0]), int(out[1])


def ids(database: str, table: str = "rows") -> list[int]:
    return [int(x) for x in sql(f"SELECT id FROM `{database}`.`{table}` ORDER BY id").split()]


def table_exists(database: str, table: str = "rows") -> bool:
    query = "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}"
    return sql(query, db=database, t=table).strip() == "1"


def stored(database: str) -> dict:
    """The job's state as our CLI reads it (partial over completed)."""
    state = cli_get(JOB, database=database)
    return {**state["completed"], **state["partial"]}


def stored_bookmark(database: str) -> int | None:
    state = stored(database).get("singer_state", {})
    return state.get("bookmarks", {}).get("rows", {}).get("last")


# Meltano.


class Project:
    """A temporary Meltano project (state backend: ours, on `database`) running tap-rows into
    target-clickhouse-component, whose tables go to `database` too. The target's password
    comes from the environment (TARGET_CLICKHOUSE_COMPONENT_PASSWORD), not the uri."""

    def __init__(self, root: Path, database: str, **target: object) -> None:
        self.root = root
        self.database = database
        self.log = root / "tap.log"
        root.mkdir(parents=True, exist_ok=True)
        parsed = urllib.parse.urlsplit(URL)
        state_uri = (
            f"clickhouse://{urllib.parse.quote(USER)}@{parsed.hostname}:{parsed.port}/default"
        )
        self.yml = {
            "default_environment": "dev",
            "project_id": "clickhouse-component-target-test",
            "send_anonymous_usage_stats": False,
            "environments": [{"name": "dev"}],
            "state_backend": {
                "uri": state_uri,
                "lock_timeout_seconds": 20,
                "clickhouse": {"schema": database},
            },
            "plugins": {
                "extractors": [
                    {
                        "name": "tap-rows",
                        "namespace": "tap_rows",
                        "executable": str(TAP),
                        "capabilities": ["state"],
                        "settings": [
                            {"name": "count", "kind": "integer"},
                            {"name": "state_every", "kind": "integer"},
                            {"name": "fail_after", "kind": "integer"},
                            {"name": "sleep_every", "kind": "integer"},
                            {"name": "sleep_seconds"},
                            {"name": "events", "kind": "boolean"},
                            {"name": "log"},
                        ],
                        "config": {"count": 10, "log": str(self.log)},
                    }
                ],
                "loaders": [
                    {
                        "name": "target-clickhouse-component",
                        "namespace": "target_clickhouse_component",
                        "executable": str(TARGET),
                        "settings": [
                            {"name": "uri", "kind": "password"},
                            {"name": "password", "kind": "password"},
                            {"name": "database"},
                            {"name": "engine_type"},
                            {"name": "batch_size_rows", "kind": "integer"},
                            {"name": "batch_size_bytes", "kind": "integer"},
                            {"name": "compression"},
                            {"name": "dedup", "kind": "boolean"},
                            {"name": "create_tables", "kind": "boolean"},
                        ],
                        "config": {"uri": uri(database), **target},
                    }
                ],
            },
        }
        self.write()

    def write(self) -> None:
        (self.root / "meltano.yml").write_text(json.dumps(self.yml, indent=2))  # JSON is YAML

    def target_config(self, **changes: object) -> None:
        self.yml["plugins"]["loaders"][0]["config"].update(changes)
        self.write()

    def through(self, proxy: HoldProxy | None) -> None:
        """Points the target (not the state backend) at the proxy, or straight at ClickHouse."""
        self.target_config(uri=uri(self.database, port=proxy.port if proxy else None))

    def env(self, tap: dict[str, object]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_"))}
        env.update(MELTANO_ENV)
        env["MELTANO_PROJECT_ROOT"] = str(self.root)
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = PASSWORD
        env["TARGET_CLICKHOUSE_COMPONENT_PASSWORD"] = PASSWORD
        env.update({f"TAP_ROWS_{k.upper()}": str(v) for k, v in tap.items()})
        return env

    def args(self, force: bool) -> list[str]:
        return [
            str(MELTANO),
            "run",
            *(["--force"] if force else []),
            "tap-rows",
            "target-clickhouse-component",
        ]

    def run(self, *, check: bool = True, force: bool = False, **tap: object):
        proc = subprocess.run(
            self.args(force),
            cwd=self.root,
            env=self.env(tap),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"meltano run exited {proc.returncode}:\n{proc.stderr[-6000:]}")
        return proc

    def start(self, **tap: object) -> subprocess.Popen:
        """`meltano run` in its own session (process group), output to files."""
        with (self.root / "run.out").open("w") as out, (self.root / "run.err").open("w") as err:
            return subprocess.Popen(
                self.args(False),
                cwd=self.root,
                env=self.env(tap),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return (self.root / "run.err").read_text()

    def starts(self) -> list[int]:
        return [json.loads(line)["start"] for line in self.log.read_text().splitlines()]


def target_process(meltano: subprocess.Popen) -> psutil.Process:
    """The target, a descendant of the `meltano` process."""

    def find():
        try:
            children = psutil.Process(meltano.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        for child in children:
            with contextlib.suppress(psutil.Error):
                if any("target-clickhouse-component" in part for part in child.cmdline()):
                    return child
        return None

    return wait_for("the target's process", find, timeout=30)


def expected_rows(database: str, wanted: list[int], table: str = "rows") -> None:
    """All five columns of these ids are the tap's values."""
    listed = ",".join(str(i) for i in wanted)
    got = [
        json.loads(line)
        for line in sql(
            f"SELECT id, name, amount, toString(at) AS at, ok FROM `{database}`.`{table}` "
            f"WHERE id IN ({listed}) ORDER BY id "
            "FORMAT JSONEachRow SETTINGS output_format_json_quote_64bit_integers = 0"
        ).splitlines()
    ]
    want = []
    for i in wanted:
        r = tap_rows.row(i, table)
        want.append({**r, "at": r["at"].replace("T", " ").rstrip("Z")})
    assert got == want


# 1. --about and settings.


def test_about_lists_settings_and_capabilities():
    proc = subprocess.run(
        [str(TARGET), "--about", "--format", "json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    about = json.loads(proc.stdout)
    assert about["name"] == "target-clickhouse-component"
    assert "about" in about["capabilities"]
    assert set(about["messages"]) >= {"SCHEMA", "RECORD", "STATE", "ACTIVATE_VERSION"}
    assert about["capabilities"] == [
        "about",
        "activate-version",
        "batch",
        "hard-delete",
        "schema-flattening",
        "target-schema",
    ]
    settings = about["settings"]["properties"]
    hub = {
        "sqlalchemy_url",
        "driver",
        "username",
        "password",
        "host",
        "port",
        "database",
        "secure",
        "verify",
        "engine_type",
        "table_name",
        "table_path",
        "replica_name",
        "order_by_keys",
        "cluster_name",
        "default_target_schema",
        "optimize_after",
    }
    sdk = {
        "hard_delete",
        "add_record_metadata",
        "load_method",
        "batch_size_rows",
        "validate_records",
        "process_activate_version_messages",
        "stream_maps",
        "stream_map_config",
        "faker_config",
        "flattening_enabled",
        "flattening_max_depth",
        "flattening_max_key_length",
        "flattening_separator",
    }
    ours = {
        "uri",
        "conform_names",
        "number_type",
        "batch_size_bytes",
        "compression",
        "dedup",
        "create_tables",
        "ca_file",
        "allowed_hosts",
        "batch_dirs",
    }
    assert set(settings) >= hub | sdk | ours
    assert settings["password"]["secret"] is True
    assert settings["sqlalchemy_url"]["secret"] is True
    assert settings["batch_size_rows"]["type"] == ["integer", "null"]
    assert settings["batch_size_rows"]["default"] == 10000
    assert settings["port"]["default"] == 8123
    assert settings["dedup"]["default"] is True
    assert settings["driver"]["enum"] == ["http", "native", "asynch"]
    markdown = subprocess.run(
        [str(TARGET), "--about", "--format", "markdown"], capture_output=True, text=True, timeout=60
    )
    assert markdown.returncode == 0, markdown.stderr
    assert markdown.stdout.startswith("# `target-clickhouse-component`")
    assert "| sqlalchemy_url | False | None |" in markdown.stdout
    version = subprocess.run([str(TARGET), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("target-clickhouse-component v")
    text = subprocess.run([str(TARGET), "--about"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "batch_size_rows" in text.stdout


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"sqlalchemy_url": f"clickhouse+native://u:{SECRET}@h:9000/db"}, "native protocol"),
        ({"uri": "URI", "load_method": "upsert", "engine_type": "MergeTree"}, "load_method"),
        ({"uri": "URI", "sqlalchemy_url": "clickhouse+http://other.invalid:8123/x"}, "differ"),
        ({"uri": "URI", "batch_size_rows": 0}, "batch_size_rows"),
        ({"uri": "URI", "batch_size_rows": "many"}, "batch_size_rows"),
        ({"uri": "URI", "dedup": "yes"}, "dedup"),
        ({"uri": "URI", "engine_type": "Log"}, "engine_type"),
        ({"uri": "URI", "compression": "brotli"}, "compression"),
        ({"uri": "URI", "port": 9000}, "port"),
        ({"uri": "URI", "host": "other.invalid"}, "host"),
        ({"uri": "URI", "database": ""}, "database"),
        ({"uri": "URI", "table_name": "  "}, "table_name"),
        ({"uri": "URI", "allowed_hosts": 5}, "allowed_hosts"),
        ({"host": "clickhouse://h", "password": SECRET}, "host"),
    ],
)
def test_bad_settings_are_named_and_the_password_never_shown(tmp_path, database, config, says):
    config = {
        k: uri(database, password=SECRET) if v == "URI" else v
        for k, v in {"password": SECRET, **config}.items()
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    schema = {"type": "SCHEMA", "stream": "rows", "schema": tap_rows.SCHEMA, "key_properties": []}
    proc = subprocess.run(
        [str(TARGET), "--config", str(path)],
        input=json.dumps(schema) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr, proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
    assert urllib.parse.quote(SECRET, safe="") not in proc.stderr + proc.stdout
    assert proc.stdout == ""
    assert not table_exists(database)


def test_missing_config(tmp_path):
    none = subprocess.run([str(TARGET)], capture_output=True, text=True, timeout=60, input="")
    assert none.returncode == 2
    assert "--config" in none.stderr
    path = tmp_path / "absent.json"
    absent = subprocess.run(
        [str(TARGET), "--config", str(path)], capture_output=True, text=True, timeout=60, input=""
    )
    assert absent.returncode == 2
    assert str(path) in absent.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"uri": "x", "password": "' + SECRET + '",')
    proc = subprocess.run(
        [str(TARGET), "--config", str(broken)], capture_output=True, text=True, timeout=60, input=""
    )
    assert proc.returncode == 2
    assert "not JSON" in proc.stderr and SECRET not in proc.stderr


def test_input_files_are_checked_as_the_cli_checks_them(tmp_path):
    """The console script prepares the files as the reference CLI does (one host function): an
    --input named through '..' or that cannot be opened is refused before the component runs."""
    (tmp_path / "config.json").write_text(json.dumps({"uri": URL}))
    (tmp_path / "rows.jsonl").write_text("")
    sub = tmp_path / "sub"
    sub.mkdir()
    for name, want in [("../rows.jsonl", "named through '..'"), ("absent.jsonl", "cannot open")]:
        proc = subprocess.run(
            [str(TARGET), "--config", str(tmp_path / "config.json"), "--input", name],
            capture_output=True,
            text=True,
            timeout=60,
            input="",
            cwd=sub,
        )
        assert proc.returncode == 2, proc.stderr
        assert want in proc.stderr and name in proc.stderr, proc.stderr


def test_connection_errors_never_show_the_password(tmp_path, database):
    schema = {"type": "SCHEMA", "stream": "rows", "schema": tap_rows.SCHEMA, "key_properties": []}
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed_port = s.getsockname()[1]
    for config, code in [
        # Nothing listens: disconnected.
        ({"uri": uri(database, port=closed_port, password=SECRET)}, 4),
        # The server refuses the password: misconfigured (or permanent), never retried for ever.
        ({"uri": uri(database, password=SECRET)}, None),
        ({"uri": uri(database), "password": SECRET}, None),
    ]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        proc = subprocess.run(
            [str(TARGET), "--config", str(path)],
            input=json.dumps(schema) + "\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode != 0, proc.stderr
        if code is not None:
            assert proc.returncode == code, proc.stderr
        else:
            assert proc.returncode in (3, 7), proc.stderr
        assert SECRET not in proc.stderr + proc.stdout
        assert urllib.parse.quote(SECRET, safe="") not in proc.stderr
        assert "line 1" in proc.stderr, proc.stderr


# The Hub's plugin definition of target-clickhouse (variant shaped-ai, meltano/hub's
# shaped-ai.yml): its settings, with the defaults Meltano passes for them.
HUB_SETTINGS = [
    {"name": "add_record_metadata", "kind": "boolean"},
    {"name": "batch_size_rows", "kind": "integer"},
    {"name": "cluster_name"},
    {"name": "database", "value": "default"},
    {"name": "default_target_schema"},
    {
        "name": "driver",
        "kind": "options",
        "value": "http",
        "options": [
            {"label": "http", "value": "http"},
            {"label": "native", "value": "native"},
            {"label": "asynch", "value": "asynch"},
        ],
    },
    {
        "name": "engine_type",
        "kind": "options",
        "options": [
            {"label": "MergeTree", "value": "MergeTree"},
            {"label": "ReplacingMergeTree", "value": "ReplacingMergeTree"},
            {"label": "SummingMergeTree", "value": "SummingMergeTree"},
            {"label": "AggregatingMergeTree", "value": "AggregatingMergeTree"},
            {"label": "ReplicatedMergeTree", "value": "ReplicatedMergeTree"},
            {"label": "ReplicatedReplacingMergeTree", "value": "ReplicatedReplacingMergeTree"},
            {"label": "ReplicatedSummingMergeTree", "value": "ReplicatedSummingMergeTree"},
            {"label": "ReplicatedAggregatingMergeTree", "value": "ReplicatedAggregatingMergeTree"},
        ],
    },
    {"name": "faker_config.locale", "kind": "array"},
    {"name": "faker_config.seed"},
    {"name": "flattening_enabled", "kind": "boolean"},
    {"name": "flattening_max_depth", "kind": "integer"},
    {"name": "hard_delete", "kind": "boolean", "value": False},
    {"name": "host", "value": "localhost"},
    {
        "name": "load_method",
        "kind": "options",
        "value": "append-only",
        "options": [
            {"label": "append-only", "value": "append-only"},
            {"label": "upsert", "value": "upsert"},
            {"label": "overwrite", "value": "overwrite"},
        ],
    },
    {"name": "optimize_after", "kind": "boolean", "value": False},
    {"name": "order_by_keys", "kind": "array"},
    {"name": "password", "kind": "password", "sensitive": True},
    {"name": "port", "kind": "integer", "value": 8123},
    {"name": "process_activate_version_messages", "kind": "boolean", "value": True},
    {"name": "replica_name"},
    {"name": "secure", "kind": "boolean", "value": False},
    {"name": "sqlalchemy_url", "kind": "password", "sensitive": True},
    {"name": "stream_map_config", "kind": "object"},
    {"name": "stream_maps", "kind": "object"},
    {"name": "table_name"},
    {"name": "table_path"},
    {"name": "username", "value": "default"},
    {"name": "validate_records", "kind": "boolean", "value": True},
    {"name": "verify", "kind": "boolean", "value": True},
]


def test_the_hubs_plugin_definition_with_only_pip_url_changed_loads(tmp_path, database):
    """A project that loads with the Hub's target-clickhouse, its plugin definition kept and
    its executable (`target-clickhouse`, which the wheel installs too) run from this wheel:
    the defaults Meltano passes are accepted without a warning, the rows land in the table the
    stream names (in the URL's database), and the bookmark is stored."""
    project = Project(tmp_path / "project", database)
    parsed = urllib.parse.urlsplit(URL)
    alchemy = (
        f"clickhouse+http://{urllib.parse.quote(USER)}:{urllib.parse.quote(PASSWORD, safe='')}"
        f"@{parsed.hostname}:{parsed.port}/{database}"
    )
    project.yml["plugins"]["loaders"] = [
        {
            "name": "target-clickhouse",
            "variant": "shaped-ai",
            "namespace": "target_clickhouse",
            "executable": str(BIN / "target-clickhouse"),
            "capabilities": [
                "about",
                "activate-version",
                "hard-delete",
                "schema-flattening",
                "stream-maps",
                "validate-records",
            ],
            "settings_group_validation": [["sqlalchemy_url"]],
            "settings": HUB_SETTINGS,
            "config": {"sqlalchemy_url": alchemy},
        }
    ]
    project.write()
    env = project.env({"count": 12, "state_every": 5})
    proc = subprocess.run(
        [str(MELTANO), "run", "tap-rows", "target-clickhouse"],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "warning: setting" not in proc.stderr, proc.stderr[-6000:]
    assert "unknown setting" not in proc.stderr, proc.stderr[-6000:]
    assert counts(database) == (12, 12)
    assert ids(database) == list(range(1, 13))
    state = cli_get("dev:tap-rows-to-target-clickhouse", database=database)
    merged = {**state["completed"], **state["partial"]}
    assert merged["singer_state"] == {"bookmarks": {"rows": {"last": 12}}}


# 2. A plain `meltano run`.


def test_meltano_run_loads_every_record_and_keeps_the_bookmark(tmp_path, database):
    project = Project(tmp_path / "project", database, batch_size_rows=7)
    first = project.run(count=20, state_every=5, events="true")
    assert "ClickHouseStateStoreManager" in first.stderr
    assert "target: 40 records" in first.stderr  # 20 a stream
    if len(PASSWORD) >= 8:
        assert PASSWORD not in first.stderr + first.stdout
    assert counts(database) == (20, 20)
    assert counts(database, "events") == (20, 20)
    assert ids(database) == list(range(1, 21))
    expected_rows(database, [1, 7, 14, 20])
    expected_rows(database, [3, 20], table="events")
    engine = sql(
        "SELECT engine, sorting_key FROM system.tables WHERE database = {db:String} "
        "AND name = 'rows' FORMAT TSV",
        db=database,
    ).split()
    assert engine[0] == "ReplacingMergeTree" and engine[1].strip("()") == "id"
    types = sql(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 'rows' "
        "ORDER BY position FORMAT TSV",
        db=database,
    ).splitlines()
    assert types == [
        "id\tInt64",
        "name\tString",
        "amount\tFloat64",
        "at\tDateTime64(6, \\'UTC\\')",
        "ok\tBool",
    ]
    assert stored_bookmark(database) == 20
    # And Meltano's own command agrees.
    env = project.env({})
    theirs = subprocess.run(
        [str(MELTANO), "state", "get", JOB],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    assert json.loads(theirs.stdout)["singer_state"] == {"bookmarks": {"rows": {"last": 20}}}

    # A second run appends exactly the new records.
    project.run(count=13, state_every=4, events="true")
    assert project.starts() == [0, 20]
    assert counts(database) == (33, 33)
    assert counts(database, "events") == (33, 33)
    assert ids(database) == list(range(1, 34))
    expected_rows(database, [21, 28, 33])
    assert stored_bookmark(database) == 33


# 3. SIGKILL and rerun.

# Each run of the crash tests: COUNT records, a STATE after every STATE_EVERY, BATCH rows a
# chunk; so each STATE flushes two chunks (INSERTs 2k-1 and 2k of the run cover the records
# of its STATE k), and a flush's STATE is emitted once its last INSERT is acknowledged, as the
# next flush begins.
COUNT = 24
STATE_EVERY = 6
BATCH = 3


def crash_project(tmp_path: Path, database: str) -> Project:
    return Project(tmp_path / "project", database, batch_size_rows=BATCH, engine_type="MergeTree")


def is_insert(database: str) -> Callable[[Request], bool]:
    return lambda r: r.inserts_into(database, "rows")


def rerun_and_check(project: Project, resumed_from: int, *, force: bool = False) -> HoldProxy:
    """`meltano run` again, through a proxy with no faults (to see its INSERTs): it resumes
    from the stored bookmark, and the table holds every record exactly once."""
    proxy = HoldProxy()
    try:
        project.through(proxy)
        project.run(count=COUNT, state_every=STATE_EVERY, force=force)
    finally:
        proxy.close()
        project.through(None)
    assert project.starts()[-1] == resumed_from
    total = resumed_from + COUNT
    assert counts(project.database) == (total, total)
    assert ids(project.database) == list(range(1, total + 1))
    assert stored_bookmark(project.database) == total
    expected_rows(project.database, [1, resumed_from + 1, total])
    return proxy


@pytest.mark.parametrize(
    ("case", "insert", "action", "bookmark", "landed"),
    [
        # (a) mid-INSERT: half the 4th INSERT's body reached the server.
        ("mid-insert", 4, "hold-partial", 6, 9),
        # (a') the 4th INSERT executed, its reply not yet delivered.
        ("executed-unacknowledged", 4, "hold-reply", 6, 12),
        # (b) the 3rd INSERT (first chunk of STATE 12's flush) acknowledged, the 4th held before
        # the server: no STATE for the 3rd's records.
        ("acknowledged-before-its-state", 4, "pause", 6, 9),
        # (c) right after STATE 12 was emitted: the first INSERT of the next flush held.
        ("right-after-a-state", 5, "pause", 12, 12),
        ("right-after-a-state-executed", 5, "hold-reply", 12, 15),
    ],
)
def test_target_killed_then_rerun_loads_exactly_once(
    tmp_path, database, proxy, case, insert, action, bookmark, landed
):
    project = crash_project(tmp_path, database)
    project.through(proxy)
    proxy.add(is_insert(database), action, skip=insert - 1)
    meltano = project.start(count=COUNT, state_every=STATE_EVERY)
    try:
        held = proxy.wait_held()
        assert held.inserts_into(database, "rows")
        # The STATE emitted before the held INSERT reached Meltano's state (and no later one:
        # its records are not all acknowledged).
        wait_for(f"bookmark {bookmark} stored", lambda: stored_bookmark(database) == bookmark)
        target = target_process(meltano)
        target.send_signal(signal.SIGKILL)
        target.wait(30)
    finally:
        proxy.close()
        code = meltano.wait(120)
    assert code != 0
    assert stored_bookmark(database) == bookmark, project.stderr()[-4000:]
    # What the server holds: the acknowledged chunks (and the executed unacknowledged one).
    wait_for(f"{landed} rows", lambda: counts(database) == (landed, landed), timeout=30)

    first = [r.token for r in proxy.requests(is_insert(database))]
    assert len(first) == insert and all(first)
    again = rerun_and_check(project, bookmark)
    # The rerun from the bookmark sent the chunks after it with the same tokens as the first
    # run (those landed were dropped by the server).
    tokens = [r.token for r in again.requests(is_insert(database))]
    sent_after_bookmark = first[2 * (bookmark // STATE_EVERY) :]
    assert tokens[: len(sent_after_bookmark)] == sent_after_bookmark


def test_meltano_killed_mid_run_then_rerun_loads_exactly_once(tmp_path, database, proxy):
    """(d) SIGKILL of Meltano's whole process group (Meltano, the tap, the target) while the
    target's 4th INSERT is on the wire (executed, unacknowledged); the rerun needs --force (the
    killed job still looks running to Meltano)."""
    project = crash_project(tmp_path, database)
    project.through(proxy)
    proxy.add(is_insert(database), "hold-reply", skip=3)
    meltano = project.start(count=COUNT, state_every=STATE_EVERY)
    try:
        proxy.wait_held()
        wait_for("bookmark 6 stored", lambda: stored_bookmark(database) == 6)
        target = target_process(meltano)
        os.killpg(meltano.pid, signal.SIGKILL)
        assert meltano.wait(30) == -signal.SIGKILL
        target.wait(30)
    finally:
        proxy.close()
    assert stored_bookmark(database) == 6
    assert counts(database) == (12, 12)
    rerun_and_check(project, 6, force=True)


def test_killed_twice_in_a_row_then_rerun(tmp_path, database):
    """Two crashes before a clean run: the second run (from bookmark 6) is killed while its
    own second INSERT, executed, waits for its reply; the third run completes."""
    project = crash_project(tmp_path, database)
    for n, skip in ((1, 3), (2, 1)):
        proxy = HoldProxy()
        try:
            project.through(proxy)
            proxy.add(is_insert(database), "hold-reply", skip=skip)
            meltano = project.start(count=COUNT, state_every=STATE_EVERY)
            proxy.wait_held()
            wait_for("bookmark 6 stored", lambda: stored_bookmark(database) == 6)
            target_process(meltano).send_signal(signal.SIGKILL)
        finally:
            proxy.close()
            assert meltano.wait(120) != 0
        assert stored_bookmark(database) == 6, n
        assert counts(database) == (12, 12), n
    assert project.starts() == [0, 6]
    rerun_and_check(project, 6)


# 4. Faults ridden out within one run.


def test_faults_within_one_run_are_ridden_out(tmp_path, database, proxy):
    """Through one `meltano run`: one INSERT executed with its reply lost, one whose
    connection is cut mid-request, one whose reply is cut, one refused: the target repeats
    each with its token, the run succeeds, each record is stored once and the bookmark is
    the last. (Faults on the target's other statements: the test after this one.)"""
    project = crash_project(tmp_path, database)
    project.through(proxy)
    insert = is_insert(database)
    rules = [
        proxy.add(insert, "drop-reply", skip=1),
        proxy.add(insert, "cut-request", skip=3),
        proxy.add(insert, "cut-reply", skip=5),
        proxy.add(insert, "refuse", skip=7),
    ]
    run = project.run(count=COUNT, state_every=STATE_EVERY)
    assert [r.applied for r in rules] == [1, 1, 1, 1], proxy.summary()
    assert counts(database) == (COUNT, COUNT)
    assert ids(database) == list(range(1, COUNT + 1))
    expected_rows(database, [1, 12, COUNT])
    assert stored_bookmark(database) == COUNT
    # Every retry of a chunk carried its first attempt's token.
    tokens = [r.token for r in proxy.requests(insert)]
    assert len(set(tokens)) == COUNT // BATCH
    assert len(tokens) == COUNT // BATCH + 4
    assert "Incremental state has been updated" in run.stderr


@pytest.mark.parametrize("action", ["refuse", "drop-reply"])
@pytest.mark.parametrize(
    "operation", ["target-columns", "target-create-database", "target-create-table"]
)
def test_a_fault_on_the_targets_own_statements_is_ridden_out(tmp_path, database, operation, action):
    """The statements a SCHEMA makes (the table's columns read from system.columns, CREATE
    DATABASE / TABLE IF NOT EXISTS: all safe to repeat) meet one refused connection (nothing
    reached the server) or one lost reply: retried like the INSERTs, the run succeeds."""
    proxy = HoldProxy()
    try:
        header = f"x-component-operation: {operation}\r\n".encode()
        rule = proxy.add(lambda r: header in r.head.lower(), action)
        config = direct_config(tmp_path, database, proxy.port, batch_size_rows=5)
        proc = subprocess.run(
            [str(TARGET), "--config", str(config)],
            input=tap_output(tmp_path, 12, 4),
            capture_output=True,
            timeout=120,
        )
    finally:
        proxy.close()
    assert rule.applied == 1, proxy.summary()
    assert proc.returncode == 0, proc.stderr.decode()
    # batch_size_rows 5: STATE 4 waits (4 records), STATE 8 flushes, STATE 12 waits for the
    # end of the input (STATEs are coalesced, docs/meltano.md).
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"bookmarks": {"rows": {"last": n}}} for n in (8, 12)
    ]
    assert counts(database) == (12, 12)


def direct_config(tmp_path: Path, database: str, url_port: int | None = None, **more) -> Path:
    path = tmp_path / "config.json"
    config = {
        "uri": uri(database, port=url_port),
        "password": PASSWORD,
        "engine_type": "MergeTree",
        **more,
    }
    path.write_text(json.dumps(config))
    return path


def tap_output(tmp_path: Path, count: int, state_every: int, after: int = 0) -> bytes:
    config = tmp_path / "tap.json"
    config.write_text(json.dumps({"count": count, "state_every": state_every}))
    args = [sys.executable, str(TAP), "--config", str(config)]
    if after:
        state = config.with_suffix(".state.json")
        state.write_text(json.dumps({"bookmarks": {"rows": {"last": after}}}))
        args += ["--state", str(state)]
    return subprocess.run(args, capture_output=True, check=True, timeout=60).stdout


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeded_faults_of_the_fault_proxy(tmp_path, database, seed):
    """The target fed the tap's output directly, through conftest's FaultProxy with a seeded
    share of refused, cut and lost requests: it finishes, prints every STATE, and the table
    holds each record once."""
    fault_proxy = FaultProxy("refuse,cut-request,drop-reply,cut-reply", in_20=3, seed=seed)
    try:
        port = urllib.parse.urlsplit(fault_proxy.url).port
        config = direct_config(tmp_path, database, port, batch_size_rows=5)
        proc = subprocess.run(
            [str(TARGET), "--config", str(config)],
            input=tap_output(tmp_path, 60, 10),
            capture_output=True,
            timeout=300,
        )
    finally:
        summary = fault_proxy.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    assert sum(summary["faults"].values()) >= 1, summary  # the faults did happen
    states = [json.loads(line)["bookmarks"]["rows"]["last"] for line in proc.stdout.splitlines()]
    assert states == [10, 20, 30, 40, 50, 60]
    assert counts(database) == (60, 60)


def test_ca_file_trusts_a_servers_own_ca(tmp_path, database, tls_front):
    """`ca_file` is the CA the host trusts besides the system's: through an HTTPS front whose
    certificate only that CA signs, the target loads with it, and is refused without it
    (a certificate error, nothing written); a missing file is named by the setting."""
    tls_uri = f"clickhouses://{urllib.parse.quote(USER)}@localhost:{tls_front.port}/{database}"

    def run(**more: object) -> subprocess.CompletedProcess:
        config = tmp_path / "tls.json"
        config.write_text(json.dumps({"uri": tls_uri, "password": PASSWORD, **more}))
        return subprocess.run(
            [str(TARGET), "--config", str(config)],
            input=tap_output(tmp_path, 12, 4),
            capture_output=True,
            timeout=120,
        )

    refused = run()
    assert refused.returncode != 0 and refused.stdout == b"", refused.stderr.decode()
    assert "certificate" in refused.stderr.decode().lower(), refused.stderr.decode()
    assert not table_exists(database)
    missing = run(ca_file=str(tmp_path / "no-such-ca.pem"))
    assert missing.returncode == 2, missing.stderr.decode()
    assert "ca_file" in missing.stderr.decode(), missing.stderr.decode()
    loaded = run(ca_file=tls_front.ca_file)
    assert loaded.returncode == 0, loaded.stderr.decode()
    states = [json.loads(line)["bookmarks"]["rows"]["last"] for line in loaded.stdout.splitlines()]
    assert states == [12]  # coalesced: 12 records are under one batch
    assert counts(database) == (12, 12)


# 5. Bad input.


def message(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def schema_line(stream: str = "rows") -> str:
    return message("SCHEMA", stream=stream, schema=tap_rows.SCHEMA, key_properties=["id"])


def record_line(i: int, **changes: object) -> str:
    return message("RECORD", stream="rows", record={**tap_rows.row(i), **changes})


def state_line(last: int) -> str:
    return message("STATE", value={"bookmarks": {"rows": {"last": last}}})


def error_line(stderr: str) -> str:
    """The target's error message (its notes, such as the tables it made, aside)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, stderr
    return errors[0]


DEEP = "[" * 2000 + "]" * 2000
BAD_LINES = {
    "malformed-json": ('{"type": "RECORD", "stream": "rows", "record": {"id": 9,', None),
    "record-before-schema": (
        message("RECORD", stream="other", record=tap_rows.row(9)),
        "other",
    ),
    "property-twice": (
        '{"type": "RECORD", "stream": "rows", "record": {"id": 9, "id": 10}}',
        "rows",
    ),
    "value-does-not-fit": (record_line(9, id="abc"), "rows"),
    "amount-not-a-number": (record_line(9, amount="lots"), "rows"),
    "bad-date-time": (record_line(9, at="yesterday"), "rows"),
    "unknown-type": (message("HELLO", value={"a": 1}), None),
    "batch": (
        message(
            "BATCH",
            stream="rows",
            encoding={"format": "jsonl", "compression": "gzip"},
            manifest=["file:///tmp/rows-1.jsonl.gz"],
        ),
        "rows",
    ),
    # Too deep to be read at all: its stream is not known (the line is named).
    "over-deep-record": (record_line(9, name="DEEP").replace('"DEEP"', DEEP), None),
    "over-deep-line": (DEEP, None),
}


@pytest.mark.parametrize("batch_size_rows", [10000, 4])
@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_input_names_its_line_and_commits_only_what_states_cover(
    tmp_path, database, case, batch_size_rows
):
    """SCHEMA (line 1), records 1-4 (lines 2-5), STATE 4 (6), record 5 (7), STATE 5 (8), the
    bad line (9), record 6 (10), STATE 6 (11). With batch_size_rows 10000 no STATE flushes:
    nothing is committed and no STATE printed. With 4, STATE 4 flushes records 1-4, and it is
    printed (after their INSERT is acknowledged), no other."""
    bad, stream = BAD_LINES[case]
    lines = [
        schema_line(),
        *(record_line(i) for i in range(1, 5)),
        state_line(4),
        record_line(5),
        state_line(5),
        bad,
        record_line(6),
        state_line(6),
    ]
    config = direct_config(tmp_path, database, batch_size_rows=batch_size_rows)
    proc = subprocess.run(
        [str(TARGET), "--config", str(config)],
        input=("\n".join(lines) + "\n").encode(),
        capture_output=True,
        timeout=120,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    error = error_line(stderr)
    assert re.search(r"\bline 9\b", error), stderr
    if stream:
        assert f"'{stream}'" in error, stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    if batch_size_rows == 4:
        assert printed == [{"bookmarks": {"rows": {"last": 4}}}]
        covered = 4
    else:
        assert printed == []
        covered = 0
    assert table_exists(database)
    assert ids(database) == list(range(1, covered + 1))


def test_a_state_waits_for_its_records_across_a_bad_line(tmp_path, database):
    """batch_size_rows 3: STATE 3 flushes records 1-3 (one INSERT); the bad record after it
    fails the next flush's encoding. STATE 3 is printed only because its INSERT was
    acknowledged: held by the proxy until after the bad line is read, it is still printed
    once acknowledged, before the exit."""
    proxy = HoldProxy()
    try:
        config = direct_config(tmp_path, database, proxy.port, batch_size_rows=3)
        insert = proxy.add(is_insert(database), "pause")
        lines = [
            schema_line(),
            *(record_line(i) for i in range(1, 4)),
            state_line(3),
            record_line(4, id="abc"),
            state_line(4),
        ]
        messages = tmp_path / "messages.jsonl"
        messages.write_text("\n".join(lines) + "\n")
        with messages.open("rb") as stdin:
            target = subprocess.Popen(
                [str(TARGET), "--config", str(config)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        held = proxy.wait_held()
        # Nothing printed while its INSERT is held (the target cannot exit meanwhile, so a
        # readable stdout would be a STATE line).
        readable, _, _ = select.select([target.stdout], [], [], 0.5)
        assert not readable
        held.released.set()
        out, err = target.communicate(timeout=60)
    finally:
        proxy.close()
    assert insert.applied == 1
    assert target.returncode == 2, err.decode()
    assert "line 6" in err.decode() and "'rows'" in err.decode(), err.decode()
    assert [json.loads(line) for line in out.splitlines()] == [{"bookmarks": {"rows": {"last": 3}}}]
    assert ids(database) == [1, 2, 3]


def test_a_value_out_of_range_stops_the_load_and_a_fixed_rerun_loads_once(tmp_path, database):
    """batch_size_rows 1: STATE 2 (line 4) flushes record 1 and record 2, whose date-time is
    beyond DateTime64's range (line 3): exit 2 naming line 3, the stream and the column, no
    STATE printed. Record 1's chunk may have landed (it went first); the input fixed and sent
    again from the start leaves each record once (the same chunk, the same token)."""
    lines = [
        schema_line(),
        record_line(1),
        record_line(2, at="2500-01-01T00:00:00.000000Z"),
        state_line(2),
    ]
    config = direct_config(tmp_path, database, batch_size_rows=1)
    proc = subprocess.run(
        [str(TARGET), "--config", str(config)],
        input=("\n".join(lines) + "\n").encode(),
        capture_output=True,
        timeout=120,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    error = error_line(stderr)
    assert "line 3" in error and "'rows'" in error and "'at'" in error, stderr
    assert proc.stdout == b""
    assert ids(database) in ([], [1])
    lines[2] = record_line(2)
    fixed = subprocess.run(
        [str(TARGET), "--config", str(config)],
        input=("\n".join(lines) + "\n").encode(),
        capture_output=True,
        timeout=120,
    )
    assert fixed.returncode == 0, fixed.stderr.decode()
    assert [json.loads(x) for x in fixed.stdout.splitlines()] == [
        {"bookmarks": {"rows": {"last": 2}}}
    ]
    assert counts(database) == (2, 2)
    expected_rows(database, [1, 2])


def test_meltano_run_with_a_failing_tap_then_rerun_loads_exactly_once(tmp_path, database):
    """The tap fails after 14 records (a STATE after every 4, batch_size_rows 2): Meltano
    keeps the last STATE the target confirmed (12); the target loads records 13 and 14 (after
    that STATE) in a chunk of their own, which the next run, resuming at 12, sends again with
    the same token; the table ends with each record once."""
    project = Project(tmp_path / "project", database, batch_size_rows=2, engine_type="MergeTree")
    failed = project.run(count=20, state_every=4, fail_after=14, check=False)
    assert failed.returncode != 0
    assert "tap_rows: failing as configured" in failed.stderr
    assert "2 records after the input's last STATE are loaded" in failed.stderr
    assert stored_bookmark(database) == 12, failed.stderr[-3000:]
    assert counts(database) == (14, 14)
    project.run(count=6, state_every=4)
    assert project.starts() == [0, 12]
    assert stored_bookmark(database) == 18
    assert ids(database) == list(range(1, 19))
    assert counts(database) == (18, 18)


def test_input_ending_after_a_state_then_rerun_from_it_loads_exactly_once(tmp_path, database):
    """The same without Meltano, batch_size_rows 4: the input ends (the tap died) after STATE
    12 and records 13 and 14, which fill no whole chunk: they are not loaded (the run does
    not fail), and the rerun from bookmark 12 (records 13-18, STATE 16, STATE 18) loads them
    with the rest. Each record is stored once."""
    config = direct_config(tmp_path, database, batch_size_rows=4)
    full = tap_output(tmp_path, 20, 4).decode().splitlines(keepends=True)
    # SCHEMA, then records 1-14 with STATEs 4, 8, 12: the tap died after record 14.
    cut = full[: 1 + 14 + 3]
    assert json.loads(cut[-1])["record"]["id"] == 14
    first = subprocess.run(
        [str(TARGET), "--config", str(config)],
        input="".join(cut).encode(),
        capture_output=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr.decode()
    assert "not loaded (2 of stream 'rows')" in first.stderr.decode()
    printed = [json.loads(line)["bookmarks"]["rows"]["last"] for line in first.stdout.splitlines()]
    assert printed == [4, 8, 12]
    assert counts(database) == (12, 12)
    again = subprocess.run(
        [str(TARGET), "--config", str(config)],
        input=tap_output(tmp_path, 6, 4, after=12),
        capture_output=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr.decode()
    assert ids(database) == list(range(1, 19))
    assert counts(database) == (18, 18)
