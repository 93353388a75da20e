"""Fixtures of the wheel's tests: the local ClickHouse (`scripts/with-clickhouse` exports
CLICKHOUSE_URL, CLICKHOUSE_USER, CLICKHOUSE_PASSWORD), SQL against it, a fresh database per
test, and the reference CLI (target/debug/clickhouse-component) to compare with."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(
    os.environ.get("CLICKHOUSE_COMPONENT_CLI", ROOT / "target" / "debug" / "clickhouse-component")
)
URL = os.environ.get("CLICKHOUSE_URL", "").rstrip("/")
USER = os.environ.get("CLICKHOUSE_USER") or "default"
PASSWORD = os.environ.get("CLICKHOUSE_PASSWORD", "")


def pytest_configure(config: pytest.Config) -> None:
    if not URL:
        raise pytest.UsageError("no ClickHouse: run under scripts/with-clickhouse (CLICKHOUSE_URL)")


def sql(query: str, **params: str) -> str:
    """Runs `query` on the test ClickHouse over HTTP; returns the body."""
    args = {"query": query, **{f"param_{k}": v for k, v in params.items()}}
    req = urllib.request.Request(f"{URL}/?{urllib.parse.urlencode(args)}", method="POST", data=b"")
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


def cli(*args: str, database: str, stdin: str | None = None, check: bool = True):
    """Runs the reference CLI's `state` command on `database`."""
    if not os.access(CLI, os.X_OK):
        pytest.fail(f"no CLI at {CLI} (cargo build -p clickhouse-component-host)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MELTANO_")}
    env.update(CLICKHOUSE_URL=URL, CLICKHOUSE_USER=USER, CLICKHOUSE_PASSWORD=PASSWORD)
    proc = subprocess.run(
        [str(CLI), "state", "--state-database", database, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"CLI state {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def cli_get(state_id: str, *, database: str) -> dict:
    """Both parts of a state as our CLI reads them (`state get --json`)."""
    return json.loads(cli("get", state_id, "--json", database=database).stdout)


@pytest.fixture
def database():
    """A database name of the test's own, dropped after it."""
    name = f"pyt_{uuid.uuid4().hex[:12]}"
    yield name
    sql(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def conn():
    import clickhouse_component as cc

    return cc.connect(URL, user=USER, password=PASSWORD)


class FaultProxy:
    """The tests crate's fault proxy (target/debug/fault_proxy) in front of the local
    ClickHouse: a seeded share of the requests refused, cut, or with their reply lost."""

    def __init__(self, faults: str, in_20: int, seed: int) -> None:
        binary = ROOT / "target" / "debug" / "fault_proxy"
        if not os.access(binary, os.X_OK):
            pytest.fail(f"no {binary} (cargo build -p clickhouse-component-tests --bins)")
        self.proc = subprocess.Popen(
            [str(binary), URL, "--seed", str(seed), "--in-20", str(in_20), "--faults", faults],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:")

    def command(self, line: str) -> None:
        """`pass` (every request passes from now) or `faults` (the seeded faults again);
        returns once the proxy says it is in force."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def stop(self) -> dict:
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])


class TlsFront:
    """HTTPS in front of the test ClickHouse: a CA and a certificate for `localhost` made with
    the openssl CLI, and a thread per connection copying bytes to and from the plain HTTP
    server. `port` is where it listens (on 127.0.0.1); `ca_file` trusts its certificate."""

    def __init__(self, root: Path) -> None:
        import socket
        import ssl
        import threading

        root.mkdir(parents=True, exist_ok=True)
        self.ca_file = str(root / "ca.pem")

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

        new_key = ["-newkey", "rsa:2048", "-nodes"]
        ca_subject = "/CN=clickhouse-component test CA"
        openssl(
            "req", "-x509", *new_key, "-keyout", "ca.key", "-out", "ca.pem", "-subj", ca_subject
        )
        openssl(
            "req", *new_key, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost"
        )
        (root / "leaf.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        sign = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2"]
        openssl(
            "x509", "-req", "-in", "leaf.csr", *sign, "-out", "leaf.pem", "-extfile", "leaf.ext"
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(root / "leaf.pem", root / "leaf.key")
        upstream = urllib.parse.urlsplit(URL)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        def serve(raw: socket.socket) -> None:
            try:
                tls = context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                raw.close()
                return
            plain = socket.create_connection((upstream.hostname, upstream.port))
            threading.Thread(target=pump, args=(plain, tls), daemon=True).start()
            pump(tls, plain)

        def accept() -> None:
            while True:
                try:
                    raw, _ = self.listener.accept()
                except OSError:
                    return
                threading.Thread(target=serve, args=(raw,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def tls_front(tmp_path):
    front = TlsFront(tmp_path / "tls")
    yield front
    front.close()
