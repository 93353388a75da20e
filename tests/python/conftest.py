"""Fixtures of the wheel's tests: the local ClickHouse (`scripts/with-clickhouse` exports
CLICKHOUSE_URL, CLICKHOUSE_USER, CLICKHOUSE_PASSWORD), SQL against it, a fresh database per
test, and the reference CLI (target/debug/clickhouse-component) to compare with."""

from __future__ import annotations

import base64
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
