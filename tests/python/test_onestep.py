"""onestep 1.15.0 with our wheel installed (and not onestep-clickhouse): the resource types
found by the `onestep.resources` entry point, `onestep check --strict` accepting and refusing
what onestep-clickhouse does, the Python API, and a worker moving rows into ClickHouse with
its cursor in our state store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import types
import urllib.parse
from pathlib import Path

import clickhouse_component as cc
import pytest
from clickhouse_component.onestep import ClickHouseConnector
from conftest import PASSWORD, URL, USER, FaultProxy, sql
from onestep import ConnectorErrorKind, ConnectorOperationError, Envelope

ONESTEP = Path(sys.executable).parent / "onestep"


def dsn() -> str:
    parsed = urllib.parse.urlsplit(URL)
    user = urllib.parse.quote(USER, safe="")
    password = urllib.parse.quote(PASSWORD, safe="")
    return f"clickhouse://{user}:{password}@{parsed.hostname}:{parsed.port}"


def worker_yaml(database: str, *, sink: dict | None = None, connector: dict | None = None) -> dict:
    return {
        "app": {"name": "chdemo", "state": "cursors"},
        "resources": {
            "ch": {
                "type": "clickhouse",
                "dsn": "${CH_DSN}",
                "client_options": {"connect_timeout": 5, "send_receive_timeout": 30},
                **(connector or {}),
            },
            "events": {
                "type": "clickhouse_table_sink",
                "connector": "ch",
                "table": f"{database}.events",
                "columns": ["id", "name"],
                "batch_size": 2,
                **(sink or {}),
            },
            "cursors": {"type": "clickhouse_state_store", "connector": "ch", "database": database},
            "tick": {"type": "interval", "seconds": 0.2, "immediate": True, "overlap": "skip"},
        },
        "tasks": [
            {
                "name": "copy",
                "source": "tick",
                "emit": ["events"],
                "handler": {"ref": "worker_tasks:copy"},
            }
        ],
    }


HANDLER = '''
async def copy(ctx, payload):
    """Moves the next rows of a fixed source (ids 1..7) two at a time; the cursor is the
    last id moved, kept in the state store."""
    last = await ctx.state.get("last", 0)
    if last >= 7:
        return None
    rows = [{"id": i, "name": f"row-{i}"} for i in range(last + 1, min(last + 2, 7) + 1)]
    await ctx.state.set("last", rows[-1]["id"])
    return rows
'''


def write_worker(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "worker_tasks.py").write_text(HANDLER)
    path = tmp_path / "worker.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def onestep(*args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CH_DSN"] = dsn()
    proc = subprocess.run(
        [str(ONESTEP), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"onestep {' '.join(args)} exited {proc.returncode}: {proc.stderr}{proc.stdout}"
        )
    return proc


def test_onestep_check_strict_accepts_ours(tmp_path, database):
    path = write_worker(
        tmp_path, worker_yaml(database, sink={"dedup": True, "retries": 2, "compression": "zstd"})
    )
    checked = onestep("check", "--strict", str(path), cwd=tmp_path, check=True)
    assert "copy" in checked.stdout
    catalog = onestep("catalog", cwd=tmp_path, check=True).stdout
    for resource_type in ("clickhouse_table_sink", "clickhouse_state_store"):
        assert resource_type in catalog


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sink": {"unknown_field": 1}}, "unsupported fields"),
        ({"sink": {"settings": {"async_insert": 1}}}, "wait_for_async_insert"),
        ({"sink": {"columns": []}}, "columns"),
        ({"sink": {"columns": "id"}}, "columns"),
        ({"sink": {"batch_size": 0}}, "batch_size"),
        ({"sink": {"retries": 2}}, "dedup"),
        ({"sink": {"compression": "brotli"}}, "compression"),
        ({"connector": {"dsn": "mysql://h/db"}}, "dsn"),
        ({"connector": {"client_options": {"compress_level": 3}}}, "client_options"),
    ],
)
def test_onestep_check_strict_refuses(tmp_path, database, change, message):
    path = write_worker(tmp_path, worker_yaml(database, **change))
    checked = onestep("check", "--strict", str(path), cwd=tmp_path)
    assert checked.returncode != 0
    assert message in (checked.stderr + checked.stdout)


def test_a_worker_moves_rows_and_keeps_its_cursor_in_clickhouse(tmp_path, database):
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.events (id UInt32, name String) ENGINE = MergeTree ORDER BY id")
    path = write_worker(tmp_path, worker_yaml(database))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CH_DSN"] = dsn()
    worker = subprocess.Popen(
        [str(ONESTEP), "run", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        count = 0
        while time.monotonic() < deadline:
            count = int(sql(f"SELECT count() FROM `{database}`.events FORMAT TSV").strip())
            if count >= 7:
                break
            time.sleep(0.2)
        time.sleep(0.6)  # a few more ticks: nothing more to move
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    rows = sql(f"SELECT id, name FROM `{database}`.events ORDER BY id FORMAT JSONEachRow")
    assert [json.loads(line) for line in rows.splitlines()] == [
        {"id": i, "name": f"row-{i}"} for i in range(1, 8)
    ], out[-3000:]
    # The cursor is in our state store (onestep scopes keys as app:task:key).
    store = cc.StateStore(cc.connect(URL, user=USER, password=PASSWORD), database=database)
    assert store.ids() == ["chdemo:copy:last"]
    assert store.get("chdemo:copy:last").completed == {"value": 7}


def test_python_api_mirrors_onestep_clickhouse(database):
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (id UInt32, v String) ENGINE = MergeTree ORDER BY id")

    async def main() -> None:
        connector = ClickHouseConnector(dsn=dsn(), client_options={"connect_timeout": 5})
        sink = connector.table_sink(table=f"{database}.t", columns=["id", "v"], batch_size=2)
        await sink.open()
        await sink.send(
            Envelope(body=[{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}])
        )
        await sink.publish({"id": 4, "v": "d"})
        # Mappings that are not dicts, alone and in a list, are read as dicts.
        await sink.send(Envelope(body=types.MappingProxyType({"id": 6, "v": "f"})))
        await sink.send(Envelope(body=[types.MappingProxyType({"id": 7, "v": "g"})]))
        # A payload onestep-clickhouse refuses, refused the same way (permanent).
        with pytest.raises(ConnectorOperationError) as info:
            await sink.send(Envelope(body=[{"id": 5}]))
        assert info.value.kind is ConnectorErrorKind.PERMANENT
        with pytest.raises(ConnectorOperationError) as info:
            await sink.send(Envelope(body="not rows"))
        assert info.value.kind is ConnectorErrorKind.PERMANENT
        missing = connector.table_sink(table=f"{database}.missing")
        with pytest.raises(ConnectorOperationError) as info:
            await missing.send(Envelope(body={"id": 1}))
        assert info.value.kind is ConnectorErrorKind.MISCONFIGURED
        assert PASSWORD not in str(info.value) or not PASSWORD
        await sink.close()

        state = connector.state_store(database=database)
        assert await state.load("k") is None
        await state.save("k", {"offset": 10, "ids": [1, 2]})
        assert await state.load("k") == {"offset": 10, "ids": [1, 2]}
        await state.delete("k")
        assert await state.load("k") is None
        await state.close()
        await connector.close()

    asyncio.run(main())
    assert sql(f"SELECT count(), sum(id) FROM `{database}`.t FORMAT TSV").split() == ["6", "23"]


def test_a_send_sends_its_rows_as_they_were_when_it_was_called(database):
    """A task's send waits for the send before it; the rows it was given are read at the
    call, so changing them meanwhile (a value, a nested list, the list of rows) changes
    nothing that is sent. Fails without the snapshot (no copy: every change lands) and with a
    copy of each dict only (the nested list's change lands)."""
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id UInt32, v String, tags Array(String)) "
        "ENGINE = MergeTree ORDER BY id"
    )

    async def main() -> None:
        connector = ClickHouseConnector(dsn=dsn())
        sink = connector.table_sink(table=f"{database}.t")
        first = asyncio.create_task(
            sink.send(Envelope(body=[{"id": i, "v": "x", "tags": []} for i in range(1, 1001)]))
        )
        rows = [{"id": 2000, "v": "before", "tags": ["a"]}]
        second = asyncio.create_task(sink.send(Envelope(body=rows)))
        await asyncio.sleep(0)  # both tasks run to their first wait
        assert not first.done() and not second.done()
        rows[0]["v"] = "after"
        rows[0]["tags"].append("b")
        rows.append({"id": 3000, "v": "late", "tags": []})
        await first
        await second
        await sink.close()
        await connector.close()

    asyncio.run(main())
    stored = sql(
        f"SELECT id, v, tags FROM `{database}`.t WHERE id >= 2000 FORMAT JSONCompactEachRow"
    )
    assert [json.loads(line) for line in stored.splitlines()] == [[2000, "before", ["a"]]]


def test_an_unanswered_send_stays_uncertain(database):
    """An INSERT whose answer is lost (the real server behind the fault proxy, every reply
    dropped once a first send has read the table's columns and landed) may have committed:
    uncertain, which onestep does not retry."""
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (a UInt8) ENGINE = MergeTree ORDER BY a")
    proxy = FaultProxy("drop-reply", in_20=20, seed=1)
    host = urllib.parse.urlsplit(proxy.url)

    async def main() -> ConnectorOperationError:
        connector = ClickHouseConnector(
            dsn=f"clickhouse://{host.hostname}:{host.port}",
            client_options={"user": USER, "password": PASSWORD, "send_receive_timeout": 2},
        )
        sink = connector.table_sink(table=f"{database}.t")
        await sink.send(Envelope(body=[{"a": 1}]))
        proxy.command("faults")
        try:
            await sink.send(Envelope(body=[{"a": 2}]))
        except ConnectorOperationError as e:
            return e
        raise AssertionError("the send did not fail")

    try:
        proxy.command("pass")
        error = asyncio.run(main())
    finally:
        summary = proxy.stop()
    assert error.kind is ConnectorErrorKind.UNCERTAIN
    assert summary["faults"].get("DropReply", 0) >= 1, summary


def test_a_task_cancelled_mid_send_waits_for_the_send_to_end():
    """asyncio cancellation does not cut a send short behind the caller's back: the cancelled
    task ends only once the blocking send has ended (here: transient, its first read timing
    out)."""
    import select
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    async def main() -> float:
        connector = ClickHouseConnector(
            dsn=f"clickhouse://127.0.0.1:{port}", client_options={"send_receive_timeout": 0.5}
        )
        sink = connector.table_sink(table="t")
        task = asyncio.create_task(sink.send(Envelope(body=[{"a": 1}])))
        # The send has a request in flight once its connection is waiting to be accepted.
        loop = asyncio.get_running_loop()
        ready, _, _ = await loop.run_in_executor(None, select.select, [listener], [], [], 30)
        assert ready, "the send never connected"
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    try:
        waited = asyncio.run(main())
    finally:
        listener.close()
    assert waited >= 0.3, waited
