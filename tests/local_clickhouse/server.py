#!/usr/bin/env python3
"""Local ClickHouse: the real ClickHouse engine (PyPI's chdb-core) behind a small HTTP front.

It speaks the subset of ClickHouse's HTTP interface (https://clickhouse.com/docs/interfaces/http)
that clickhouse-component uses, so the quick start and the integration tests run against a real
engine on a machine where no ClickHouse server can be installed:

* ``GET/POST /?query=...``: the query is the ``query`` URL parameter followed by a newline and the
  request body. ``INSERT ... FORMAT X`` in the URL with a body hands the body to the engine as
  data (``FROM INFILE`` a spool file), like a real server, never as query text.
* The front never parses or edits SQL: statements reach the engine byte for byte as a server
  receives them. It only splits ``INSERT ... FORMAT X`` from its data, as a server does, and
  hands the data to the engine from a spool file (``FROM INFILE``; chdb's streaming insert
  skips CHECK constraints).
* ``database``, ``default_format``, ``query_id``, ``param_<name>`` (typed query parameters, TSV
  escaped as on a real server, bound by the engine itself: chdb's ``params=`` for queries,
  ``SET param_<name>`` on the request's session for streamed inserts); every other URL parameter
  is a setting, applied with ``SET`` so an unknown setting or a bad value fails with the server's
  own error.
* ``Content-Encoding`` request bodies (gzip, deflate, br, xz, zstd, lz4, bz2, snappy) are decoded
  by the engine's own readers (the ``file()`` table function with that compression method, the
  same ``chooseCompressionMethod`` a server's HTTP handler uses).
* With ``enable_http_compression=1``, a successful answer is compressed by the engine's own writer
  in the method a server would choose from ``Accept-Encoding`` (``Content-Encoding`` set); error
  answers are sent uncompressed.
* Auth by ``X-ClickHouse-User``/``X-ClickHouse-Key``, HTTP Basic, or ``user``/``password`` URL
  parameters, checked against the one configured user.
* Errors: ``Code: N. DB::Exception: ... (NAME)`` body, ``X-ClickHouse-Exception-Code`` header and
  the HTTP status a real server maps that code to.
* ``multipart/form-data`` bodies: file parts are external data (a temporary table per part, named
  by its field, from ``name_structure`` or ``name_types`` and ``name_format``, as a server makes
  them), other fields are parameters like URL ones.
* ``GET /ping`` answers ``Ok.``; ``X-ClickHouse-Summary`` on every answer.
* ``--zookeeper start`` (or ``HOST:PORT``): the engine is opened with a ClickHouse config file
  whose ``<zookeeper>`` names a ZooKeeper (``start``: a private one from scripts/zookeeper on a
  free loopback port, owned by this process and stopped with it) and which sets
  ``<keeper_map_path_prefix>`` and ``<macros>``, so KeeperMap tables work (and Replicated tables
  can be created). Without it the engine has no Keeper, like a server without one.
* Clusters in the config, always: ``local_one`` and ``local_two`` (one and two shards, all of
  them this engine: a shard at localhost and the config's own ``tcp_port`` is local, so
  Distributed inserts land in the local table) and ``unreachable`` (a shard nothing serves).

Server defaults are set explicitly on every session (chdb's own defaults differ from a server's),
every request gets a fresh session (settings never leak between requests), sockets use
TCP_NODELAY. Differences from a real server are listed in README.md ("Local ClickHouse").
"""

from __future__ import annotations

import argparse
import atexit
import base64
import ctypes
import shutil
import subprocess
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import chdb

# Settings a real server uses by default but chdb does not; applied to every session first.
SERVER_DEFAULTS = {
    "async_insert": "0",
    "date_time_input_format": "basic",
}

# URL parameters the HTTP handler consumes itself (not settings).
RESERVED_PARAMS = {
    "query", "database", "default_format", "query_id", "user", "password", "quota_key",
    "session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "stacktrace", "role", "enable_http_compression",
}

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by
# error name (the engine's messages end in "(NAME)"); every other error is 500.
_STATUS_NAMES = {
    401: "REQUIRED_PASSWORD",
    403: "UNKNOWN_USER WRONG_PASSWORD AUTHENTICATION_FAILED SET_NON_GRANTED_ROLE ACCESS_DENIED",
    400: "BAD_ARGUMENTS CANNOT_COMPILE_REGEXP CANNOT_PARSE_TEXT CANNOT_PARSE_ESCAPE_SEQUENCE "
         "CANNOT_PARSE_QUOTED_STRING CANNOT_PARSE_DATE CANNOT_PARSE_DATETIME CANNOT_PARSE_NUMBER "
         "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING CANNOT_PARSE_IPV4 CANNOT_PARSE_IPV6 "
         "CANNOT_PARSE_INPUT_ASSERTION_FAILED CANNOT_PARSE_UUID DUPLICATE_COLUMN ILLEGAL_COLUMN "
         "UNKNOWN_ELEMENT_IN_AST UNKNOWN_TYPE_OF_AST_NODE THERE_IS_NO_COLUMN TOO_DEEP_AST TOO_BIG_AST "
         "UNEXPECTED_AST_STRUCTURE SYNTAX_ERROR INCORRECT_DATA TYPE_MISMATCH "
         "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    404: "UNKNOWN_TABLE UNKNOWN_FUNCTION UNKNOWN_IDENTIFIER UNKNOWN_TYPE UNKNOWN_STORAGE "
         "UNKNOWN_DATABASE UNKNOWN_SETTING UNKNOWN_DIRECTION_OF_SORTING UNKNOWN_AGGREGATE_FUNCTION "
         "UNKNOWN_FORMAT UNKNOWN_DATABASE_ENGINE UNKNOWN_TYPE_OF_QUERY UNKNOWN_ROLE",
    413: "QUERY_IS_TOO_LARGE",
    501: "NOT_IMPLEMENTED",
    503: "SOCKET_TIMEOUT CANNOT_OPEN_FILE CANNOT_SCHEDULE_TASK",
    411: "HTTP_LENGTH_REQUIRED",
    408: "TIMEOUT_EXCEEDED",
    415: "UNSUPPORTED_MEDIA_TYPE",
}
STATUS_BY_NAME = {name: status for status, names in _STATUS_NAMES.items() for name in names.split()}
# The answer's compression, in the order a server prefers them when Accept-Encoding names several
# (src/IO/CompressionMethod.cpp, chooseHTTPCompressionMethod).
HTTP_COMPRESSION_PREFERENCE = ["zstd", "br", "lz4", "snappy", "gzip", "deflate", "xz", "bz2"]
# The compression methods ClickHouse's chooseCompressionMethod knows (src/IO/CompressionMethod.cpp).
COMPRESSION_METHODS = {"auto", "none", "gzip", "deflate", "br", "xz", "zstd", "lz4", "bz2", "snappy"}
CODE_RE = re.compile(r"Code: (\d+)\. ")
NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)(?: \(version [^)]*\))?\s*$")
FORMAT_RE = re.compile(r"\s+FORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
INSERT_RE = re.compile(r"^\s*INSERT\b", re.IGNORECASE)
# An INSERT whose data follows its FORMAT clause in the body (as clickhouse-client and
# clickhouse-connect send it): the data starts after the format name and one whitespace.
BODY_INSERT_RE = re.compile(rb"^\s*(INSERT\b.*?\bFORMAT\s+([A-Za-z0-9_]+))[ \t]*(\r?\n|[ \t])", re.IGNORECASE | re.DOTALL)
SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
VERSION = "unknown"


class ServerError(Exception):
    """An error answered in ClickHouse's format."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code, self.name, self.message = code, name, message

    def body(self) -> str:
        return f"Code: {self.code}. DB::Exception: {self.message}. ({self.name}) (version {VERSION})\n"


def status_for(name: str | None) -> int:
    return STATUS_BY_NAME.get(name or "", 500)


def engine_error(exc: Exception) -> tuple[int, str]:
    """Turn a chdb exception into (status, body) as a real server would answer it."""
    text = str(exc)
    for prefix in ("Streaming insert finish failed: ", "Streaming insert append failed: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    match = CODE_RE.search(text)
    if not match:
        return 500, f"Code: 1001. DB::Exception: {text}. (STD_EXCEPTION) (version {VERSION})\n"
    code = int(match.group(1))
    body = text[match.start():].rstrip()
    if "(version " not in body:
        body += f" (version {VERSION})"
    name = NAME_RE.search(body)
    return status_for(name.group(1) if name else None), body + "\n"


def sql_string(value: str) -> str:
    """A ClickHouse string literal (only used for SET values, which the engine parses itself)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def backquote(name: str) -> str:
    """A backquoted identifier (only used for SET names, which the engine parses itself)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ZooKeeper:
    """A private ZooKeeper (scripts/zookeeper run) on a free loopback port, data in ``dir``.

    It gets SIGKILL from the kernel when this process dies however it dies (PR_SET_PDEATHSIG),
    so it never outlives the local ClickHouse; an orderly exit also removes its data."""

    def __init__(self, dir: str, timeout: float = 30.0):
        self.dir, self.proc, self.port = dir, None, 0
        deadline = time.monotonic() + timeout
        for _ in range(5):  # another process may take the free port before ZooKeeper binds it
            shutil.rmtree(dir, ignore_errors=True)
            os.makedirs(dir)
            self.port = free_port()
            parent = os.getpid()
            with open(os.path.join(dir, "zookeeper.log"), "wb") as log:
                self.proc = subprocess.Popen(
                    [os.path.join(REPO_ROOT, "scripts", "zookeeper"), "run", str(self.port), dir],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=lambda: die_with_parent(parent),
                )
            while self.proc.poll() is None and time.monotonic() < deadline:
                if four_letter("127.0.0.1", self.port, b"ruok") == b"imok":
                    return
                time.sleep(0.02)
            if self.proc.poll() is None:  # alive but not answering: give up
                break
        log = self.tail_log()
        self.stop()
        raise RuntimeError(f"ZooKeeper did not start:\n{log}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail_log(self) -> str:
        try:
            with open(os.path.join(self.dir, "zookeeper.log"), "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int):
    """In a child between fork and exec: SIGKILL it when the parent dies (Linux; the flag
    survives exec)."""
    PR_SET_PDEATHSIG = 1
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter(host: str, port: int, command: bytes) -> bytes:
    """A ZooKeeper four-letter command's answer (b"" when it does not answer)."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(command)
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return b""


# Clusters of the engine's config (every start): `local_one`, one shard on this engine (a
# shard at localhost and the config's own tcp_port is local: its inserts land here, no network);
# `local_two`, two shards that are both this engine (localhost, 127.0.0.1); `unreachable`, one
# shard at an address nothing serves. Distributed tables over them run for real.
CLUSTERS = (
    "    <tcp_port>9000</tcp_port>\n"
    "    <remote_servers>\n"
    "        <local_one><shard><replica><host>localhost</host><port>9000</port></replica></shard></local_one>\n"
    "        <local_two>\n"
    "            <shard><replica><host>localhost</host><port>9000</port></replica></shard>\n"
    "            <shard><replica><host>127.0.0.1</host><port>9000</port></replica></shard>\n"
    "        </local_two>\n"
    "        <unreachable><shard><replica><host>127.0.0.9</host><port>9000</port></replica></shard></unreachable>\n"
    "    </remote_servers>\n"
)


def engine_config(path: str, zookeeper: str | None, prefix: str) -> str:
    """Writes the engine's config file: the clusters (CLUSTERS) and, with a ZooKeeper, that
    ZooKeeper, the KeeperMap path prefix, and the macros and default replica path Replicated
    tables need."""
    esc = lambda v: v.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    keeper = ""
    if zookeeper is not None:
        # HOST:PORT, or several of them comma-separated (an ensemble: the engine's client picks
        # one and fails over to the others).
        nodes = ""
        for node in zookeeper.split(","):
            host, _, port = node.strip().rpartition(":")
            nodes += f"        <node><host>{esc(host)}</host><port>{int(port)}</port></node>\n"
        keeper = (
            "    <zookeeper>\n"
            + nodes +
            "        <session_timeout_ms>30000</session_timeout_ms>\n"
            "    </zookeeper>\n"
            f"    <keeper_map_path_prefix>{esc(prefix)}</keeper_map_path_prefix>\n"
            "    <macros><shard>1</shard><replica>local</replica></macros>\n"
            # ENGINE = ReplicatedMergeTree without arguments, in any database engine.
            "    <default_replica_path>/clickhouse/tables/{database}/{table}</default_replica_path>\n"
            "    <default_replica_name>{replica}</default_replica_name>\n"
        )
    with open(path, "w") as f:
        f.write("<clickhouse>\n" + CLUSTERS + keeper + "</clickhouse>\n")
    return path


class Engine:
    """One chdb engine for the process; a fresh session per request."""

    def __init__(self, data_dir: str, config_file: str | None = None):
        # chdb passes the URL parameters to the engine as its startup arguments (--config-file).
        self.path = f"file:{data_dir}" + (f"?config-file={config_file}" if config_file else "")
        self._keepalive = chdb.connect(self.path)  # keeps the engine up between requests
        # Compressed request bodies are staged here for the engine's own decompressing reader.
        self.spool_dir = os.path.join(data_dir, "http_spool")
        os.makedirs(self.spool_dir, exist_ok=True)

    def decode(self, body: bytes, encoding: str) -> bytes:
        """Decode a ``Content-Encoding`` body with the engine's own reader (the compression
        method name goes to the engine unchanged, so unknown names fail as on a server)."""
        fd, path = tempfile.mkstemp(dir=self.spool_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            conn = chdb.connect(self.path)
            try:
                result = conn.query(
                    "SELECT raw FROM file({path:String}, 'RawBLOB', 'raw String', {method:String})",
                    "RawBLOB",
                    params={"path": path, "method": encoding},
                )
                return result.bytes() if result is not None else b""
            finally:
                conn.close()
        finally:
            os.unlink(path)

    def encode(self, body: bytes, method: str) -> bytes:
        """Compress an answer with the engine's own writer for ``method`` (a server compresses
        with the same writers, ``wrapWriteBufferWithCompressionMethod``)."""
        fd, raw = tempfile.mkstemp(dir=self.spool_dir)
        out = raw + ".out"
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            conn = chdb.connect(self.path)
            try:
                conn.query(
                    "INSERT INTO FUNCTION file({out:String}, 'RawBLOB', 'raw String', {method:String}) "
                    "SELECT raw FROM file({raw:String}, 'RawBLOB', 'raw String')",
                    params={"out": out, "raw": raw, "method": method},
                )
            finally:
                conn.close()
            with open(out, "rb") as f:
                return f.read()
        finally:
            for path in (raw, out):
                if os.path.exists(path):
                    os.unlink(path)

    def session(self, settings: dict[str, str], database: str | None, readonly: bool):
        conn = chdb.connect(self.path)
        try:
            for name, value in {**SERVER_DEFAULTS, **settings}.items():
                if not SETTING_NAME_RE.match(name):
                    raise ServerError(115, "UNKNOWN_SETTING", f"Unknown setting '{name}'")
                conn.query(f"SET {name} = {sql_string(value)}")
            if readonly:
                conn.query("SET readonly = 2")
            if database:
                exists = conn.query(
                    "SELECT count() FROM system.databases WHERE name = {d:String}",
                    "TabSeparated",
                    params={"d": database},
                ).bytes().strip()
                if exists == b"0":
                    raise ServerError(81, "UNKNOWN_DATABASE", f"Database {database} does not exist")
                conn.query(f"USE `{database.replace('`', '``')}`")
        except BaseException:
            conn.close()
            raise
        return conn


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """A ``multipart/form-data`` body as a server reads it: fields (parameters, like URL ones)
    and file parts (external tables, named by their field name)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        raise ServerError(1000, "POCO_EXCEPTION", "Multipart form data without a boundary")
    delimiter = b"--" + match.group(1).encode()
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise ServerError(1000, "POCO_EXCEPTION", "Malformed multipart form data: no closing boundary")
    for piece in pieces[1:-1]:
        if not piece.startswith(b"\r\n") or not piece.endswith(b"\r\n"):
            raise ServerError(1000, "POCO_EXCEPTION", "Malformed multipart form data")
        head, sep, data = piece[2:-2].partition(b"\r\n\r\n")
        if not sep:
            raise ServerError(1000, "POCO_EXCEPTION", "Malformed multipart part: no header end")
        disposition = next((line.split(b":", 1)[1].decode() for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-disposition:")), "")
        name = re.search(r'(?:^|;)\s*name="([^"]*)"', disposition)
        if not name:
            raise ServerError(1000, "POCO_EXCEPTION", "Multipart part without a name")
        if re.search(r';\s*filename=', disposition):
            files[name.group(1)] = data
        else:
            fields[name.group(1)] = data.decode("utf-8")
    return fields, files


def external_tables(params: dict[str, str], files: dict[str, bytes]) -> dict[str, tuple[str, str, bytes]]:
    """The external tables of a request: name -> (structure, format, rows); their
    ``name_structure`` / ``name_types`` / ``name_format`` parameters are taken out of `params`
    (they are not settings), as a server's HTTP handler does."""
    tables = {}
    for name, data in files.items():
        structure = params.pop(f"{name}_structure", None)
        types = params.pop(f"{name}_types", None)
        fmt = params.pop(f"{name}_format", None) or "TabSeparated"
        if structure is None and types is not None:
            structure = ", ".join(f"_{i + 1} {t.strip()}" for i, t in enumerate(types.split(",")))
        if structure is None:
            raise ServerError(36, "BAD_ARGUMENTS",
                              f"Neither structure nor types have not been provided for external table "
                              f"{name}. Use fields {name}_structure or {name}_types to do so.")
        tables[name] = (structure, fmt, data)
    return tables


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalClickHouse"
    engine: Engine
    user: str
    password: str

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # quiet unless asked
        if os.environ.get("LOCAL_CLICKHOUSE_LOG"):
            sys.stderr.write("local-clickhouse: " + (fmt % args) + "\n")

    # -- plumbing -------------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        """The whole body, or ``ClientGone`` when the connection ends before it is complete:
        a server never runs a request it did not receive whole."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline()
                if not line:
                    raise ClientGone()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunk = self.rfile.read(size)
                if len(chunk) < size:
                    raise ClientGone()
                chunks.append(chunk)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            raise ClientGone()
        return body

    def _send(self, status: int, body: bytes, headers: dict[str, str]):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, body: str, query_id: str):
        code = CODE_RE.search(body)
        headers = {
            "Content-Type": "text/plain; charset=UTF-8",
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Exception-Code": code.group(1) if code else "1001",
        }
        self._send(status, body.encode(), headers)

    def _authenticate(self, params: dict[str, str]) -> None:
        """One source of credentials, as authenticateUserByHTTP checks: the X-ClickHouse-User /
        X-ClickHouse-Key headers, or Basic auth, or the user / password URL parameters; mixing
        them is refused."""
        user = self.headers.get("X-ClickHouse-User")
        key = self.headers.get("X-ClickHouse-Key")
        auth = self.headers.get("Authorization")
        in_params = "user" in params or "password" in params
        mixed = ServerError(
            516,
            "AUTHENTICATION_FAILED",
            "Invalid authentication: it is not allowed to use several authentication methods "
            "(X-ClickHouse-User/Key headers, Authorization header, user/password parameters) simultaneously",
        )
        if user or key:
            if auth is not None or in_params:
                raise mixed
        elif auth is not None:
            if in_params:
                raise mixed
            if not auth.lower().startswith("basic "):
                raise ServerError(516, "AUTHENTICATION_FAILED", "Unsupported Authorization scheme")
            try:
                user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
            except Exception:
                raise ServerError(516, "AUTHENTICATION_FAILED", "Malformed Basic authorization")
        else:
            user, key = params.get("user"), params.get("password")
        user = user or "default"
        key = key or ""
        if user != self.user or key != self.password:
            raise ServerError(
                516,
                "AUTHENTICATION_FAILED",
                f"{user}: Authentication failed: password is incorrect, or there is no user with such name",
            )

    # -- verbs ----------------------------------------------------------------------------------
    def do_GET(self):
        self._handle(readonly=True)

    def do_POST(self):
        self._handle(readonly=False)

    def _handle(self, readonly: bool):
        url = urlsplit(self.path)
        try:
            body = self._read_body() if self.command == "POST" else b""
        except ClientGone:
            self.close_connection = True
            return
        encoding = self.headers.get("Content-Encoding", "").strip()
        if url.path in ("/ping", "/") and "query=" not in (url.query or "") and not body:
            self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        if url.path not in ("/", "/query"):
            self._send(404, b"There is no handle " + url.path.encode() + b"\n", {})
            return
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        try:
            self._authenticate(params)
            if encoding:
                if encoding not in COMPRESSION_METHODS:
                    raise ServerError(
                        48,
                        "NOT_IMPLEMENTED",
                        f"Unknown compression method '{encoding}'. Only "
                        + ", ".join(f"'{m}'" for m in sorted(COMPRESSION_METHODS))
                        + " are supported as compression methods",
                    )
                if body:
                    body = self.engine.decode(body, encoding)
            external = {}
            if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
                fields, external = parse_multipart(self.headers["Content-Type"], body)
                params.update(fields)  # form fields are parameters, as URL ones
                body = b""
            self._execute(params, body, query_id, readonly, external)
        except ServerError as e:
            self._error(status_for(e.name), e.body(), query_id)
        except Exception as e:  # chdb's errors carry the engine's code
            status, text = engine_error(e)
            self._error(status, text, query_id)

    def _execute(self, params: dict[str, str], body: bytes, query_id: str, readonly: bool,
                 external: dict[str, bytes]):
        settings = {}
        query_params = {}
        tables = external_tables(params, external)
        for name, value in params.items():
            if name.startswith("param_"):
                query_params[name[len("param_"):]] = value
            elif name not in RESERVED_PARAMS:
                settings[name] = value
        url_query = params.get("query", "")
        # URL parameters first, then the X-ClickHouse-Database / X-ClickHouse-Format headers.
        database = params.get("database") or self.headers.get("X-ClickHouse-Database")
        out_format = (
            params.get("default_format") or self.headers.get("X-ClickHouse-Format") or "TabSeparated"
        )
        started = time.monotonic()
        conn = self.engine.session(settings, database, readonly)
        try:
            for name, (structure, fmt, data) in tables.items():
                self._load_external(conn, name, structure, fmt, data)
            body_insert = None if url_query else BODY_INSERT_RE.match(body[:65536])
            if url_query and body and INSERT_RE.match(url_query):
                result = self._insert(conn, url_query, query_params, body)
            elif body_insert:
                statement = body_insert.group(1).decode()
                result = self._insert(conn, statement, query_params, body[body_insert.end():])
            else:
                text = url_query + ("\n" if url_query and body else "") + body.decode("utf-8")
                if not text.strip():
                    raise ServerError(62, "SYNTAX_ERROR", "Empty query")
                result = conn.query(text, out_format, params=query_params)
            payload = result.bytes() if result is not None else b""
            written_rows = result.rows_written() if result is not None else 0
            summary = {
                "read_rows": result.rows_read() if result is not None else 0,
                "read_bytes": result.bytes_read() if result is not None else 0,
                "written_rows": written_rows,
                "written_bytes": result.bytes_written() if result is not None else 0,
                "total_rows_to_read": result.rows_read() if result is not None else 0,
                # chdb does not count result rows; an INSERT's are its written rows.
                "result_rows": written_rows,
                "result_bytes": len(payload),
            }
        finally:
            conn.close()
        summary = {k: str(v) for k, v in summary.items()}
        summary["elapsed_ns"] = str(int((time.monotonic() - started) * 1e9))
        headers = {
            "Content-Type": "text/tab-separated-values; charset=UTF-8"
            if out_format.startswith("TabSeparated")
            else "application/octet-stream",
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Format": out_format,
            "X-ClickHouse-Timezone": "UTC",
            "X-ClickHouse-Server-Display-Name": "local-clickhouse",
            "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
        }
        # enable_http_compression=1: the answer in the first method of the server's preference
        # order that Accept-Encoding names (chooseHTTPCompressionMethod: a substring match).
        if params.get("enable_http_compression", "0").lower() in ("1", "true"):
            accepted = self.headers.get("Accept-Encoding", "")
            method = next((m for m in HTTP_COMPRESSION_PREFERENCE if m in accepted), None)
            if method:
                payload = self.engine.encode(payload, method)
                headers["Content-Encoding"] = method
        self._send(200, payload, headers)

    def _load_external(self, conn, name: str, structure: str, fmt: str, data: bytes):
        """External data: what a server makes of a file part of a multipart body, a temporary
        table of the request's own (``name_structure`` / ``name_types``, ``name_format``)."""
        conn.query(f"CREATE TEMPORARY TABLE {backquote(name)} ({structure}) ENGINE = Memory")
        fd, path = tempfile.mkstemp(dir=self.engine.spool_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            conn.query(f"INSERT INTO {backquote(name)} FROM INFILE {sql_string(path)} FORMAT {fmt}")
        finally:
            os.unlink(path)

    def _insert(self, conn, url_query: str, query_params: dict[str, str], body: bytes):
        """Hand the body to the engine as INSERT data, never as query text.

        The statement is passed on unchanged up to its ``FORMAT`` clause (the split a server
        makes); the data goes to the engine from a spool file (``FROM INFILE``), which runs the
        same insert pipeline as a server's HTTP insert. (chdb's streaming ``send_insert`` skips
        CHECK constraints: it answers success and writes nothing.) Query parameters are bound
        on the session with ``SET param_<name>``, which the engine treats exactly like a
        server's ``param_<name>`` URL parameters."""
        for name, value in query_params.items():
            conn.query(f"SET {backquote('param_' + name)} = {sql_string(value)}")
        match = FORMAT_RE.search(url_query)
        if match:
            fmt, statement = match.group(1), url_query[: match.start()]
        elif re.search(r"\bVALUES\s*$", url_query, re.IGNORECASE):
            fmt, statement = "Values", re.sub(r"\bVALUES\s*$", "", url_query, flags=re.IGNORECASE)
        else:
            fmt, statement = "TabSeparated", url_query
        fd, path = tempfile.mkstemp(dir=self.engine.spool_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            return conn.query(f"{statement} FROM INFILE {sql_string(path)} FORMAT {fmt}")
        finally:
            os.unlink(path)


ZOOKEEPER: ZooKeeper | None = None


def shutdown():
    """Exit now (the engine needs no orderly shutdown), stopping our ZooKeeper first."""
    if ZOOKEEPER is not None:
        ZOOKEEPER.stop()
    os._exit(0)


def exit_with_parent(parent: int):
    """Stop when the process that started us is gone (tests never leak a server)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            shutdown()


def main():
    global VERSION
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--data-dir", help="engine data directory (default: a new temporary one)")
    parser.add_argument("--user", default=os.environ.get("LOCAL_CLICKHOUSE_USER", "default"))
    parser.add_argument("--password", default=os.environ.get("LOCAL_CLICKHOUSE_PASSWORD", ""))
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument(
        "--zookeeper",
        default=os.environ.get("LOCAL_CLICKHOUSE_ZOOKEEPER", "none"),
        metavar="start|HOST:PORT[,HOST:PORT...]|none",
        help="the Keeper for KeeperMap/Replicated tables: 'start' runs a private ZooKeeper "
        "(scripts/zookeeper), HOST:PORT uses one (comma-separated: an ensemble), 'none' (default) "
        "configures none",
    )
    parser.add_argument("--keeper-map-path-prefix", default="/keeper_map_tables")
    args = parser.parse_args()

    global ZOOKEEPER
    parent = os.getppid()
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="local-clickhouse-")
    os.makedirs(data_dir, exist_ok=True)
    # Before the engine's threads exist: signals stop our ZooKeeper with us.
    signal.signal(signal.SIGTERM, lambda *_: shutdown())
    signal.signal(signal.SIGHUP, lambda *_: shutdown())
    zookeeper = None
    if args.zookeeper == "start":
        ZOOKEEPER = ZooKeeper(os.path.join(data_dir, "zookeeper"))
        atexit.register(ZOOKEEPER.stop)
        zookeeper = ZOOKEEPER.address
    elif args.zookeeper != "none":
        zookeeper = args.zookeeper
    config_file = engine_config(
        os.path.join(data_dir, "local-clickhouse-config.xml"), zookeeper,
        args.keeper_map_path_prefix,
    )
    engine = Engine(data_dir, config_file)
    VERSION = engine._keepalive.query("SELECT version()", "TabSeparated").bytes().decode().strip()
    Handler.engine, Handler.user, Handler.password = engine, args.user, args.password
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    host, port = server.server_address[:2]
    # First line of stdout: the URL (read by the tests and the Makefile).
    print(f"http://{host}:{port}", flush=True)
    keeper = f", ZooKeeper {zookeeper}" if zookeeper else ""
    print(f"local-clickhouse: ClickHouse {VERSION} (chdb) on http://{host}:{port}, data in {data_dir}{keeper}",
          file=sys.stderr, flush=True)
    if args.exit_with_parent:
        threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    shutdown()


if __name__ == "__main__":
    main()
