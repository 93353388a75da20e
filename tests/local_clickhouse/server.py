#!/usr/bin/env python3
"""Local ClickHouse: the real ClickHouse engine (PyPI's chdb-core) behind a small HTTP front.

It speaks the subset of ClickHouse's HTTP interface (https://clickhouse.com/docs/interfaces/http)
that clickhouse-component uses, so the quick start and the integration tests run against a real
engine on a machine where no ClickHouse server can be installed:

* ``GET/POST /?query=...``: the query is the ``query`` URL parameter followed by a newline and the
  request body. ``INSERT ... FORMAT X`` in the URL with a body streams the body to the engine as
  data (``send_insert`` + ``append`` + ``finish``), like a real server, never as query text.
* ``database``, ``default_format``, ``query_id``, ``param_<name>`` (typed query parameters, TSV
  escaped as on a real server); every other URL parameter is a setting, applied with ``SET`` so an
  unknown setting or a bad value fails with the server's own error.
* Auth by ``X-ClickHouse-User``/``X-ClickHouse-Key``, HTTP Basic, or ``user``/``password`` URL
  parameters, checked against the one configured user.
* Errors: ``Code: N. DB::Exception: ... (NAME)`` body, ``X-ClickHouse-Exception-Code`` header and
  the HTTP status a real server maps that code to.
* ``GET /ping`` answers ``Ok.``; ``X-ClickHouse-Summary`` on every answer.

Server defaults are set explicitly on every session (chdb's own defaults differ from a server's),
every request gets a fresh session (settings never leak between requests), sockets use
TCP_NODELAY. Differences from a real server are listed in README.md ("Local ClickHouse").
"""

from __future__ import annotations

import argparse
import base64
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

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTPHandler.cpp), the codes we can meet.
STATUS_BY_CODE = {
    194: 401,  # REQUIRED_PASSWORD
    192: 403, 193: 403, 516: 403, 517: 403,  # UNKNOWN_USER, WRONG_PASSWORD, AUTHENTICATION_FAILED, ...
    36: 400, 427: 400, 6: 400, 25: 400, 26: 400, 38: 400, 41: 400, 72: 400, 441: 400, 27: 400,
    376: 400, 15: 400, 44: 400, 61: 400, 62: 400, 117: 400, 53: 400, 321: 400, 167: 400, 168: 400,
    169: 400, 456: 400, 457: 400,
    60: 404, 46: 404, 47: 404, 50: 404, 56: 404, 81: 404, 115: 404, 73: 404, 336: 404, 376: 400,
    159: 408,  # TIMEOUT_EXCEEDED
    209: 503,  # SOCKET_TIMEOUT
    48: 501,  # NOT_IMPLEMENTED
}
CODE_RE = re.compile(r"Code: (\d+)\. ")
NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)(?: \(version [^)]*\))?\s*$")
FORMAT_RE = re.compile(r"\s+FORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
INSERT_RE = re.compile(r"^\s*INSERT\b", re.IGNORECASE)
# An INSERT whose data follows its FORMAT clause in the body (as clickhouse-client and
# clickhouse-connect send it): the data starts after the format name and one whitespace.
BODY_INSERT_RE = re.compile(rb"^\s*(INSERT\b.*?\bFORMAT\s+([A-Za-z0-9_]+))[ \t]*(\r?\n|[ \t])", re.IGNORECASE | re.DOTALL)
SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
PLACEHOLDER_RE = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([^{}]+?)\s*\}")
VERSION = "unknown"


class ServerError(Exception):
    """An error answered in ClickHouse's format."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code, self.name, self.message = code, name, message

    def body(self) -> str:
        return f"Code: {self.code}. DB::Exception: {self.message}. ({self.name}) (version {VERSION})\n"


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
    return STATUS_BY_CODE.get(code, 500), body + "\n"


def sql_string(value: str) -> str:
    """A ClickHouse string literal (only used for SET values, which the engine parses itself)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Engine:
    """One chdb engine for the process; a fresh session per request."""

    def __init__(self, data_dir: str):
        self.path = f"file:{data_dir}"
        self._keepalive = chdb.connect(self.path)  # keeps the engine up between requests

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
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

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
        user = self.headers.get("X-ClickHouse-User")
        key = self.headers.get("X-ClickHouse-Key")
        auth = self.headers.get("Authorization", "")
        if user is None and auth.lower().startswith("basic "):
            try:
                user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
            except Exception:
                raise ServerError(516, "AUTHENTICATION_FAILED", "Malformed Basic authorization")
        if user is None:
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
        body = self._read_body() if self.command == "POST" else b""
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
            self._execute(params, body, query_id, readonly)
        except ServerError as e:
            self._error(STATUS_BY_CODE.get(e.code, 500), e.body(), query_id)
        except Exception as e:  # chdb's errors carry the engine's code
            status, text = engine_error(e)
            self._error(status, text, query_id)

    def _execute(self, params: dict[str, str], body: bytes, query_id: str, readonly: bool):
        settings = {}
        query_params = {}
        for name, value in params.items():
            if name.startswith("param_"):
                query_params[name[len("param_"):]] = value
            elif name not in RESERVED_PARAMS:
                settings[name] = value
        url_query = params.get("query", "")
        out_format = params.get("default_format") or "TabSeparated"
        started = time.monotonic()
        conn = self.engine.session(settings, params.get("database"), readonly)
        try:
            body_insert = None if url_query else BODY_INSERT_RE.match(body[:65536])
            if url_query and body and INSERT_RE.match(url_query):
                statement = substitute_identifiers(url_query, query_params)
                summary = self._insert(conn, statement, body)
                payload = b""
            elif body_insert:
                statement = substitute_identifiers(body_insert.group(1).decode(), query_params)
                summary = self._insert(conn, statement, body[body_insert.end():])
                payload = b""
            else:
                text = url_query + ("\n" if url_query and body else "") + body.decode("utf-8")
                if not text.strip():
                    raise ServerError(62, "SYNTAX_ERROR", "Empty query")
                result = conn.query(text, out_format, params=query_params)
                payload = result.bytes() if result is not None else b""
                summary = {
                    "read_rows": result.rows_read() if result is not None else 0,
                    "read_bytes": result.bytes_read() if result is not None else 0,
                    "written_rows": 0,
                    "written_bytes": 0,
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
        self._send(200, payload, headers)

    @staticmethod
    def _insert(conn, url_query: str, body: bytes) -> dict:
        """Stream the body to the engine as INSERT data (never as query text)."""
        match = FORMAT_RE.search(url_query)
        if match:
            fmt, statement = match.group(1), url_query[: match.start()]
        elif re.search(r"\bVALUES\s*$", url_query, re.IGNORECASE):
            fmt, statement = "Values", re.sub(r"\bVALUES\s*$", "", url_query, flags=re.IGNORECASE)
        else:
            fmt, statement = "TabSeparated", url_query
        inserter = conn.send_insert(statement, fmt)
        try:
            inserter.append(body)
            result = inserter.finish()
        except BaseException:
            inserter.cancel()
            raise
        return {
            "read_rows": 0,
            "read_bytes": 0,
            "written_rows": result.rows_written,
            "written_bytes": result.bytes_written,
        }


def unescape_param(value: str) -> str:
    """Undo the TSV escaping of a query parameter value, as the server does."""
    out, i = [], 0
    escapes = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "\\": "\\", "'": "'", "b": "\b", "f": "\f"}
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            out.append(escapes.get(value[i + 1], value[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def substitute_identifiers(statement: str, params: dict[str, str]) -> str:
    """Substitute {name:Identifier} in a streamed INSERT statement (chdb's send_insert takes no
    parameters); a real server does this itself. Other parameter types are not supported there."""

    def replace(match):
        name, kind = match.group(1), match.group(2)
        if kind != "Identifier":
            raise ServerError(457, "BAD_QUERY_PARAMETER",
                              f"local ClickHouse: only Identifier parameters are supported in INSERT ... FORMAT (got {kind})")
        if name not in params:
            raise ServerError(456, "UNKNOWN_QUERY_PARAMETER", f"Substitution `{name}` is not set")
        ident = unescape_param(params[name])
        return "`" + ident.replace("\\", "\\\\").replace("`", "\\`") + "`"

    return PLACEHOLDER_RE.sub(replace, statement)


def exit_with_parent(parent: int):
    """Stop when the process that started us is gone (tests never leak a server)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def main():
    global VERSION
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--data-dir", help="engine data directory (default: a new temporary one)")
    parser.add_argument("--user", default=os.environ.get("LOCAL_CLICKHOUSE_USER", "default"))
    parser.add_argument("--password", default=os.environ.get("LOCAL_CLICKHOUSE_PASSWORD", ""))
    parser.add_argument("--exit-with-parent", action="store_true")
    args = parser.parse_args()

    data_dir = args.data_dir or tempfile.mkdtemp(prefix="local-clickhouse-")
    engine = Engine(data_dir)
    VERSION = engine._keepalive.query("SELECT version()", "TabSeparated").bytes().decode().strip()
    Handler.engine, Handler.user, Handler.password = engine, args.user, args.password
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    host, port = server.server_address[:2]
    # First line of stdout: the URL (read by the tests and the Makefile).
    print(f"http://{host}:{port}", flush=True)
    print(f"local-clickhouse: ClickHouse {VERSION} (chdb) on http://{host}:{port}, data in {data_dir}",
          file=sys.stderr, flush=True)
    if args.exit_with_parent:
        threading.Thread(target=exit_with_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
