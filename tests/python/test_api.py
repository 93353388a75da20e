"""The Python API against the local ClickHouse: the state store round trip, fenced writes
through a lock, the sink, every error kind that can be produced here, threads sharing the
runtime, and the GIL released during a call."""

from __future__ import annotations

import itertools
import json
import math
import socket
import threading
import time

import clickhouse_component as cc
import pytest
from clickhouse_component import errors
from conftest import PASSWORD, URL, USER, FaultProxy, cli, cli_get, sql


def test_round_trip(conn, database):
    store = cc.StateStore(conn, database=database)
    assert store.get("job") is None
    assert store.ids() == []

    store.set("job", completed={"singer_state": {"n": 1}})
    assert store.get("job") == cc.State("job", {}, {"singer_state": {"n": 1}})

    # update: a partial is deep-merged into the stored partial, the completed part kept.
    merged = store.update("job", partial={"singer_state": {"m": 2}})
    assert merged == cc.State("job", {"singer_state": {"m": 2}}, {"singer_state": {"n": 1}})
    merged = store.update("job", partial='{"singer_state": {"k": 12345678901234567890.5}}')
    assert merged.partial["singer_state"] == {"m": 2, "k": 12345678901234567890.5}
    # a completed part replaces the state and clears the partial one.
    assert store.update("job", completed={"singer_state": {"n": 3}}) == cc.State(
        "job", {}, {"singer_state": {"n": 3}}
    )
    assert store.get("job").merged() == {"singer_state": {"n": 3}}

    # The CLI reads what Python wrote (same tables, same component).
    assert cli_get("job", database=database) == {
        "id": "job",
        "partial": {},
        "completed": {"singer_state": {"n": 3}},
    }

    store.set_all([cc.State("a_1", completed={"v": 1}), cc.State("a%2", partial={"v": 2})])
    assert store.ids() == ["a%2", "a_1", "job"]
    assert store.ids("a_*") == ["a_1"]  # exact glob: `_` is literal
    assert store.ids("a?*") == ["a%2", "a_1"]
    assert [s.id for s in store.get_all("a*")] == ["a%2", "a_1"]
    assert store.get_all("a%2")[0].partial == {"v": 2}

    assert store.delete("a_1") == 1
    assert store.delete("a_1") == 0
    assert store.ids() == ["a%2", "job"]
    assert store.clear_all() == 2
    assert store.ids() == []
    # The rows are the shared layout, read with SQL.
    sql(f"SELECT count() FROM `{database}`.state")
    store.close()
    store.close()  # idempotent


def test_state_written_by_cli_is_read_by_python(conn, database):
    cli("set", "--force", "from-cli", '{"singer_state": {"x": 7}}', database=database)
    store = cc.StateStore(conn, database=database)
    assert store.get("from-cli").completed == {"singer_state": {"x": 7}}


def test_lock_fences_writes(conn, database):
    store = cc.StateStore(conn, database=database, stale_after_ms=2000)
    store.set("fenced", completed={"v": 0})
    with store.lock("fenced") as lock:
        assert lock.id == "fenced" and len(lock.token) > 8
        lock.set(completed={"v": 1})
        assert lock.update(partial={"p": 1}) == cc.State("fenced", {"p": 1}, {"v": 1})
        lock.renew()
    assert lock.released
    assert store.get("fenced") == cc.State("fenced", {"p": 1}, {"v": 1})
    with pytest.raises(cc.LockedError):
        lock.set(completed={"v": 2})  # released: nothing written

    # A holder whose lease ended writes nothing and is told so.
    stale = store.lock("fenced")
    time.sleep(2.3)
    with pytest.raises(cc.LockedError) as info:
        stale.set(completed={"v": 99})
    assert info.value.kind == "locked"
    with pytest.raises(cc.LockedError):
        stale.delete()
    stale.release()
    assert store.get("fenced").completed == {"v": 1}

    with store.lock("fenced") as lock:
        assert lock.delete() == 1
    assert store.get("fenced") is None


def test_locked_while_held_elsewhere(conn, database):
    holder = cc.StateStore(conn, database=database)
    waiter = cc.StateStore(conn, database=database, lock_timeout_ms=300, lock_retry_ms=50)
    with holder.lock("busy"):
        started = time.monotonic()
        with pytest.raises(cc.LockedError) as info:
            waiter.lock("busy")
        assert time.monotonic() - started >= 0.25
        assert isinstance(info.value, errors.ClickHouseError)
        with pytest.raises(cc.LockedError):
            waiter.update("busy", partial={"x": 1})
    # Released: the other store gets it at once.
    with waiter.lock("busy"):
        pass


@pytest.mark.parametrize(
    "call",
    [
        lambda c, db: cc.connect("ftp://example.com"),
        lambda c, db: cc.connect(URL, settings={"max_threads": object()}),
        lambda c, db: cc.connect(URL, allow=["not a host"]),
        lambda c, db: cc.connect(URL, max_memory_mib=0),
        lambda c, db: cc.StateStore(c, database=db).set("x", partial="not json"),
        lambda c, db: cc.StateStore(c, database=db).set("x", partial="[1, 2]"),
        lambda c, db: cc.StateStore(c, database=db).set("x", partial={"f": float("nan")}),
        lambda c, db: cc.StateStore(c, database=db).set("x", partial=5),
        lambda c, db: cc.StateStore(c, database=db).set(42),
        lambda c, db: cc.StateStore(c, database=db).set("", completed={}),
        lambda c, db: cc.StateStore(c, database=db).set("bad\nid", completed={"a": 1}),
        lambda c, db: cc.StateStore(c, database=db, lock_engine="zookeeper"),
        lambda c, db: cc.StateStore(c, database=db, table=""),
        lambda c, db: cc.StateStore("not a connection"),
        lambda c, db: cc.Sink(c, "t", batch_size=0),
        lambda c, db: cc.Sink(c, "t", retries=3),  # retries need dedup
        lambda c, db: cc.Sink(c, "t", settings={"async_insert": 1}),
        lambda c, db: cc.Sink(c, "t").send([{"a": 2**70}]),
        lambda c, db: cc.Sink(c, "t").send([{"a": object()}]),
        lambda c, db: cc.Sink(c, "t").send([]),
        lambda c, db: cc.Sink(c, "t").send_json("text, not bytes"),
        lambda c, db: cc.Sink(c, "t").send_json(b"[1, 2]"),
    ],
)
def test_invalid_input(conn, database, call):
    with pytest.raises(cc.InvalidInputError) as info:
        call(conn, database)
    assert info.value.kind == "invalid-input"
    assert info.value.server is None
    assert isinstance(info.value, ValueError)


def test_rows_and_settings_are_checked_by_the_components_own_rules(conn, database):
    # Rows whose keys differ are refused before any INSERT, named as the component names rows
    # (a row's keys are checked as the rows are read for the table's column types).
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (a Int64, b Int64) ENGINE = MergeTree ORDER BY tuple()")
    with cc.Sink(conn, f"{database}.t") as sink:
        with pytest.raises(cc.InvalidInputError) as info:
            sink.send([{"a": 1}, {"b": 1}])
        assert str(info.value).startswith(
            "row 2: missing 'a'; extra 'b' (every row must have the same keys as the first row)"
        ), info.value
        assert sql(f"SELECT count() FROM `{database}`.t").strip() == "0"
    # Enum settings are read by the component's own parsers (as the CLI reads them): the case
    # of a compression name does not matter, and a wrong name is named with the choices.
    with cc.Sink(conn, f"{database}.t", compression="LZ4") as sink:
        assert sink.send([{"a": 1, "b": 2}]).rows == 1
    with pytest.raises(cc.InvalidInputError) as info:
        cc.Sink(conn, f"{database}.t", compression="brotli")
    assert "compression 'brotli' is not one of none, lz4, zstd, gzip" in str(info.value)
    with pytest.raises(cc.InvalidInputError) as info:
        cc.StateStore(conn, database=database, lock_engine="zookeeper")
    assert "lock engine 'zookeeper' is not one of auto, keeper-map, merge-tree" in str(info.value)


def test_misconfigured_unknown_table(conn, database):
    with pytest.raises(cc.MisconfiguredError) as info:
        cc.StateStore(conn, database=database, create_schema=False)
    assert info.value.kind == "misconfigured"

    sink = cc.Sink(conn, f"{database}.missing")
    sql(f"CREATE DATABASE `{database}`")
    with pytest.raises(cc.MisconfiguredError) as info:
        sink.send([{"a": 1}])
    assert info.value.server is not None and info.value.server.name == "UNKNOWN_TABLE"
    assert info.value.committed_rows == 0


def test_misconfigured_bad_password_is_not_in_the_message(database):
    secret = "Wr0ng-S3cret-Pa55"
    bad = cc.connect(URL, user=USER, password=secret)
    with pytest.raises(cc.MisconfiguredError) as info:
        cc.StateStore(bad, database=database)
    assert info.value.server.name == "AUTHENTICATION_FAILED"
    assert info.value.server.http_status in (401, 403)
    assert secret not in str(info.value) and secret not in repr(info.value)
    # Nor in the URL form, nor in the connection's repr.
    url_form = URL.replace("://", f"://{USER}:{secret}@")
    bad = cc.connect(url_form)
    assert secret not in repr(bad)
    with pytest.raises(cc.MisconfiguredError) as info:
        bad.ping()
    assert secret not in str(info.value)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_disconnected_closed_port():
    c = cc.connect(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(cc.DisconnectedError) as info:
        c.ping()
    assert info.value.kind == "disconnected"
    with pytest.raises(cc.DisconnectedError):
        cc.StateStore(c, retries=0)


def test_allow_list_denies_other_destinations(conn):
    c = cc.connect(f"http://127.0.0.1:{_closed_port()}")
    assert c.allowed.startswith("http://127.0.0.1:")
    assert cc.connect(URL, allow=["http://example.com:80"]).allowed.count("example.com") == 1
    # A real call to a destination the wheel's host never lets through: the cloud metadata
    # address spelt as a number (`0xa9fea9fe`, which the system resolver reads as
    # 169.254.169.254). The URL's host passes the check by name, its address does not, whatever
    # `allow=` adds short of the address itself: denied with the allow-list's own error before
    # any connection (without the check it is a connect failure, or an answer from whatever
    # listens there).
    for allow in (None, ["*://*:*"], ["http://*:80"]):
        metadata = cc.connect("http://0xa9fea9fe:80", allow=allow, connect_timeout_ms=3000)
        with pytest.raises(errors.MisconfiguredError, match="allow-list does not permit"):
            metadata.ping()


class SilentServer:
    """A TCP server that accepts, reads and never answers (a server hung mid-request)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.received = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._drain, args=(c,), daemon=True).start()

    def _drain(self, c: socket.socket) -> None:
        while True:
            try:
                data = c.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.received += len(data)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_transient_read_timeout_and_uncertain_write(database):
    server = SilentServer()
    try:
        c = cc.connect(f"http://127.0.0.1:{server.port}", request_timeout_ms=300)
        with pytest.raises(cc.TransientError):
            c.ping()  # a read with no answer: safe to retry
        sink = cc.Sink(c, "t")  # opening sends nothing
        with pytest.raises(cc.TransientError):
            sink.send([{"a": 1}])  # its first request reads the table's columns
        assert server.received > 0
    finally:
        server.close()
    # A write whose answer is lost (the real server behind the fault proxy, every reply
    # dropped once the sink has read its columns and sent one chunk): it may have committed.
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (a UInt8) ENGINE = MergeTree ORDER BY a")
    proxy = FaultProxy("drop-reply", in_20=20, seed=1)
    try:
        proxy.command("pass")
        c = cc.connect(proxy.url, user=USER, password=PASSWORD, request_timeout_ms=2000)
        sink = cc.Sink(c, f"{database}.t")
        assert sink.send([{"a": 1}]).rows == 1
        proxy.command("faults")
        with pytest.raises(cc.UncertainError) as info:
            sink.send([{"a": 2}])
        assert info.value.kind == "uncertain"
    finally:
        summary = proxy.stop()
    assert summary["faults"].get("DropReply", 0) >= 1, summary


def test_runner_error_stops_the_object():
    server = SilentServer()
    try:
        c = cc.connect(f"http://127.0.0.1:{server.port}", call_timeout_seconds=0.3)
        sink = cc.Sink(c, "t")
        with pytest.raises(cc.RunnerError) as info:
            sink.send([{"a": 1}])
        assert "deadline" in str(info.value)
        with pytest.raises(cc.RunnerError) as info:
            sink.send([{"a": 1}])
        assert "stopped" in str(info.value)
    finally:
        server.close()


def test_sink_and_a_value_refused_before_any_request(conn, database):
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id UInt32, name String, tags Array(String), "
        "blob String, ok Bool, score Nullable(Float64)) ENGINE = MergeTree ORDER BY id"
    )
    with cc.Sink(conn, f"{database}.t", batch_size=2, compression="zstd") as sink:
        receipt = sink.send(
            [
                {
                    "id": 1,
                    "name": "a",
                    "tags": ["x"],
                    "blob": b"\x00\x01",
                    "ok": True,
                    "score": None,
                },
                {"id": 2, "name": "b", "tags": [], "blob": b"", "ok": False, "score": 1.5},
                {"id": 3, "name": "c", "tags": ["y", "z"], "blob": b"q", "ok": True, "score": 2.0},
            ]
        )
        assert receipt == cc.Receipt(3, 2, 3, 0, 0, 0, "Native")
        lines = b"\n".join(
            json.dumps(
                {"id": i, "name": "n", "tags": [], "blob": "", "ok": True, "score": 0.1}
            ).encode()
            for i in range(10, 15)
        )
        assert sink.send_json(lines).rows == 5
        assert (
            sink.send_json(
                bytearray(
                    b'[{"id": 20, "name": "", "tags": [], "blob": "", "ok": true, "score": null}]'
                )
            ).rows
            == 1
        )
        # A value its column's type does not read: refused before any request, naming it.
        with pytest.raises(cc.InvalidInputError) as info:
            sink.send(
                [
                    {
                        "id": "not a number",
                        "name": "",
                        "tags": [],
                        "blob": "",
                        "ok": True,
                        "score": None,
                    }
                ]
            )
        assert info.value.server is None
        assert "column 'id'" in str(info.value) and "UInt32" in str(info.value)
    assert sql(f"SELECT count(), sum(id) FROM `{database}`.t FORMAT TSV").split() == ["9", "86"]
    assert sql(f"SELECT hex(blob) FROM `{database}`.t WHERE id = 1 FORMAT TSV").strip() == "0001"
    with pytest.raises(cc.InvalidInputError):
        sink.send([{"id": 4}])  # closed


def test_rows_go_as_json_and_bytes_that_are_not_utf8_as_typed_rows(conn, database):
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id UInt64, s String, f Float64, j JSON) "
        "ENGINE = MergeTree ORDER BY id"
    )
    with cc.Sink(conn, f"{database}.t") as sink:
        # JSON text: escapes, keys in another order per row, a float's shortest form.
        text = 'quote " backslash \\ tab \t ü \u0001'
        assert sink.send(
            [
                {"id": 1, "s": text, "f": 0.1, "j": {"k": [1, "x"]}},
                {"j": {}, "f": 1e300, "s": "", "id": 18446744073709551615},
            ]
        ) == cc.Receipt(2, 1, 2, 0, 0, 0, "JSONEachRow")  # a JSON column: JSONEachRow
        # A bytes value that is not UTF-8 cannot be JSON text: the whole send goes typed.
        assert sink.send([{"id": 2, "s": b"\xff\xfe\x00", "f": 2.5, "j": {}}]).rows == 1
        with pytest.raises(cc.InvalidInputError, match=r"row 2, column 'f'.*NaN"):
            sink.send(
                [{"id": 3, "s": "", "f": 1.0, "j": {}}, {"id": 4, "s": "", "f": math.nan, "j": {}}]
            )
    rows = sql(f"SELECT id, hex(s), f FROM `{database}`.t ORDER BY id FORMAT TSV")
    assert [line.split("\t") for line in rows.splitlines()] == [
        ["1", text.encode().hex().upper(), "0.1"],
        ["2", "FFFE00", "2.5"],
        ["18446744073709551615", "", "1e300"],
    ]


def test_rows_written_from_python_objects_keep_each_rows_own_keys_and_values(conn, database):
    # The binding writes a key from the previous row's bytes only when it is the same object
    # in the same place; built keys equal to the previous ones, keys in another order, and
    # subclasses of str, int and dict (read through the general path) all keep their values.
    import enum

    class Text(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 7

    class Row(dict):
        pass

    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (id Int64, s String) ENGINE = MergeTree ORDER BY id")
    key = "".join(["i", "d"])  # equal to "id", another object
    rows = [
        {"id": 1, "s": "one"},
        {key: 2, "".join(["s"]): "two"},
        {"s": Text("three"), "id": 3},
        Row(id=Level.HIGH, s="seven"),
        {"id": -(2**63), "s": ""},
    ]
    with cc.Sink(conn, f"{database}.t") as sink:
        assert sink.send(rows).rows == 5
    stored = sql(f"SELECT id, s FROM `{database}`.t ORDER BY id FORMAT TSV")
    assert [line.split("\t") for line in stored.splitlines()] == [
        [str(-(2**63)), ""],
        ["1", "one"],
        ["2", "two"],
        ["3", "three"],
        ["7", "seven"],
    ]


def test_prepared_rows_are_sent_as_they_were_when_prepared(conn, database):
    # JSON text (most rows) and typed rows (a bytes value that is not UTF-8) alike; the typed
    # rows' count and content failed when they came from an iterator, whose first row the
    # JSON walk had consumed.
    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (id Int64, s String) ENGINE = MergeTree ORDER BY id")
    rows = [{"id": 1, "s": "one"}, {"id": 2, "s": "two"}, {"id": 3, "s": "three"}]
    typed = [{"id": 4, "s": b"\xff"}, {"id": 5, "s": b"\xfe"}]
    prepared, prepared_typed = cc.prepare_rows(rows), cc.prepare_rows(iter(typed))
    assert (len(prepared), len(prepared_typed), len(cc.prepare_rows([]))) == (3, 2, 0)
    rows[0]["s"] = "changed"
    rows.append({"id": 9, "s": "late"})
    typed[0]["s"] = b"\x00"
    with cc.Sink(conn, f"{database}.t") as sink:
        assert sink.send(prepared).rows == 3
        assert sink.send(prepared_typed).rows == 2
        # A generator is read once, though typed rows are walked twice.
        assert sink.send(r for r in [{"id": 6, "s": b"\xfd"}, {"id": 7, "s": b"\xfc"}]).rows == 2
    stored = sql(f"SELECT id, hex(s) FROM `{database}`.t ORDER BY id FORMAT TSV")
    assert [line.split("\t") for line in stored.splitlines()] == [
        ["1", "6F6E65"],
        ["2", "74776F"],
        ["3", "7468726565"],
        ["4", "FF"],
        ["5", "FE"],
        ["6", "FD"],
        ["7", "FC"],
    ]
    with pytest.raises(cc.InvalidInputError, match="row 2 is not a dict"):
        cc.prepare_rows([{"id": 1}, 2])
    with pytest.raises(cc.InvalidInputError, match="not one row"):
        cc.prepare_rows({"id": 1})


def test_nested_values_are_written_as_json_dumps_would_write_them(conn, database):
    # Lists, tuples and dicts of plain values are written by the binding itself; a value only
    # json.dumps writes (an int past 64 bits) goes through it, and one it refuses (NaN) is
    # named by row and column, nothing sent.
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id Int64, tags Array(String), m Map(String, Int64), "
        "n Array(Array(Int64)), big Array(UInt128)) ENGINE = MergeTree ORDER BY id"
    )
    rows = [
        {"id": 1, "tags": ["a", 'q"\\'], "m": {"x": 1, "y": -2}, "n": [[1, 2], [3]], "big": []},
        {"id": 2, "tags": ("c",), "m": {}, "n": [], "big": [2**70, 1]},
        {"id": 3, "tags": [], "m": {"z": 2**62}, "n": [[]], "big": [0]},
    ]
    sql(f"CREATE TABLE `{database}`.docs (id Int64, doc String) ENGINE = MergeTree ORDER BY id")
    # A String column stores a dict's JSON text: exactly as json.dumps writes it (floats,
    # backspace, form feed and DEL are left to json.dumps itself).
    docs = [
        {"id": 1, "doc": {"f": [1e-05, 1e16, 0.1]}},
        {"id": 2, "doc": {"s": "a\bb"}},
        {"id": 3, "doc": ["c\fd", "\x7f"]},
        {"id": 4, "doc": [{"k": None, "t": True}, ["x", -3, ' d\u00e9\n"\\']]},
    ]
    with cc.Sink(conn, f"{database}.docs") as sink:
        assert sink.send(docs).rows == 4
    stored = sql(f"SELECT doc FROM `{database}`.docs ORDER BY id FORMAT JSONCompactEachRow")
    assert [json.loads(line)[0] for line in stored.splitlines()] == [
        json.dumps(d["doc"], separators=(",", ":"), ensure_ascii=False) for d in docs
    ]
    with cc.Sink(conn, f"{database}.t") as sink:
        assert sink.send(rows).rows == 3
        with pytest.raises(cc.InvalidInputError, match=r"row 2, column 'n'"):
            sink.send([rows[0], {**rows[1], "n": [[math.nan]]}])
    stored = sql(
        f"SELECT id, tags, m, n, big FROM `{database}`.t ORDER BY id "
        "FORMAT JSONCompactEachRow SETTINGS output_format_json_quote_64bit_integers = 0"
    )
    assert [json.loads(line) for line in stored.splitlines()] == [
        [row["id"], list(row["tags"]), row["m"], row["n"], row["big"]] for row in rows
    ]


def test_a_million_rows_in_one_send(conn, database):
    # As typed rows, 1,000,000 rows of five columns took more than the component's 1 GiB.
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id UInt64, seq UInt64, at DateTime64(3), kind String, "
        "payload String) ENGINE = MergeTree ORDER BY id"
    )
    rows = [
        {
            "id": n,
            "seq": 10**12 + n,
            "at": "2026-11-29 10:00:00.000",
            "kind": f"k{n % 7}",
            "payload": "p" * 64,
        }
        for n in range(1_000_000)
    ]
    with cc.Sink(conn, f"{database}.t", batch_size=100_000) as sink:
        receipt = sink.send(rows)
    assert (receipt.rows, receipt.chunks, receipt.written_rows) == (1_000_000, 10, 1_000_000)
    assert sql(f"SELECT count(), sum(id) FROM `{database}`.t FORMAT TSV").split() == [
        "1000000",
        str(sum(range(1_000_000))),
    ]


def test_threads_share_the_runtime(conn, database):
    cc.StateStore(conn, database=database).close()  # schema first
    failures: list[BaseException] = []
    shared = cc.StateStore(conn, database=database)

    def work(n: int) -> None:
        try:
            own = cc.StateStore(conn, database=database)
            for i in range(5):
                own.set(f"own-{n}", completed={"i": i})
                shared.update(f"shared-{n}", partial={str(i): n})
            assert own.get(f"own-{n}").completed == {"i": 4}
            assert shared.get(f"shared-{n}").partial == {str(i): n for i in range(5)}
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert len(shared.ids()) == 12


def test_gil_released_during_a_slow_call(conn, database):
    holder = cc.StateStore(conn, database=database)
    waiter = cc.StateStore(conn, database=database, lock_timeout_ms=1500, lock_retry_ms=100)
    ticks: list[float] = []
    done = threading.Event()
    outcome: list[object] = []

    def slow() -> None:
        try:
            waiter.lock("slow")
        except cc.LockedError as e:
            outcome.append(e)
        finally:
            done.set()

    with holder.lock("slow"):
        t = threading.Thread(target=slow)
        started = time.monotonic()
        t.start()
        while not done.is_set():
            ticks.append(time.monotonic())
            sum(range(200))  # pure Python: needs the GIL
        elapsed = time.monotonic() - started
        t.join()
    assert isinstance(outcome[0], cc.LockedError)
    assert elapsed >= 1.4
    # This thread ran throughout the call: many iterations, no long gap.
    assert len(ticks) > 1000
    gaps = max(b - a for a, b in itertools.pairwise(ticks))
    assert gaps < 0.5, gaps


def test_ping(conn):
    info = conn.ping()
    assert info.user == USER
    assert info.version[0].isdigit()
    assert PASSWORD not in repr(conn) or not PASSWORD


def test_a_child_forked_after_the_runtime_started_is_told_not_stuck(conn):
    import os

    conn.ping()  # the runtime has started
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            try:
                conn.ping()
            except cc.RunnerError as e:
                code = 0 if "forked" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    conn.ping()  # the parent is unaffected


def test_a_resumable_sink_continues_from_its_checkpoint_and_refuses_another_send_first(
    conn, database
):
    # A table that refuses n >= 1000 on the server: a send whose second chunk holds such a
    # row commits its first chunk and fails (uncertain), leaving that send in flight.
    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (n UInt32, CONSTRAINT small CHECK n < 1000) "
        "ENGINE = MergeTree ORDER BY n SETTINGS non_replicated_deduplication_window = 100"
    )

    def rows(ns):
        return [{"n": n} for n in ns]

    def count():
        return int(sql(f"SELECT count() FROM `{database}`.t"))

    state = f"{database}_state"
    with cc.Sink(conn, f"{database}.t", batch_size=2, dedup=True) as sink:
        with pytest.raises(errors.InvalidInputError, match="needs a checkpoint"):
            sink.send(rows([1]), position="p")
        assert sink.resume("job", database=state) is None
        assert sink.send(rows([1, 2, 3]), position="after 3").rows == 3
        with pytest.raises(errors.InvalidInputError, match="keeps a checkpoint"):
            sink.send(rows([4]))
        with pytest.raises(errors.UncertainError):
            sink.send(rows([4, 5, 1000]), position="after 5")
    assert count() == 5  # 1, 2, 3 and the committed chunk [4, 5]

    # The next process: continues after 3, and the send in flight must come first.
    with cc.Sink(conn, f"{database}.t", batch_size=2, dedup=True) as sink:
        assert sink.resume("job", database=state) == "after 3"
        with pytest.raises(errors.InvalidInputError, match="was in flight"):
            sink.send(rows([4, 5]), position="after 5")
        assert count() == 5
    # Without dedup there is no checkpoint.
    with (
        cc.Sink(conn, f"{database}.t") as plain,
        pytest.raises(errors.InvalidInputError, match="needs dedup"),
    ):
        plain.resume("job", database=state)
    sql(f"DROP DATABASE IF EXISTS `{state}`")


def test_rows_of_an_iterable_that_overstates_its_length_are_sent(conn, database):
    # The binding sizes its buffer from the rows' len() after the first 256: an estimate far
    # too large (here from sys.maxsize) is no error and takes no memory it does not use.
    import sys

    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (id UInt32, s String) ENGINE = MergeTree ORDER BY id")

    class Rows:
        def __len__(self):
            return sys.maxsize

        def __iter__(self):
            return iter([{"id": n, "s": "x" * 100} for n in range(300)])

    with cc.Sink(conn, f"{database}.t") as sink:
        assert sink.send(Rows()).rows == 300
    assert sql(f"SELECT count(), sum(id) FROM `{database}`.t FORMAT TSV").split() == [
        "300",
        str(sum(range(300))),
    ]


def test_a_row_changed_while_it_is_sent_is_refused_not_a_panic(conn, database):
    # A value's own Python code (here a UUID's __str__) may change the row's dict while the
    # binding reads it: refused with a message, where iterating on would panic.
    import uuid

    sql(f"CREATE DATABASE `{database}`")
    sql(f"CREATE TABLE `{database}`.t (u UUID, x String, y String) ENGINE = Memory")
    row: dict = {}

    class Meddling(uuid.UUID):
        def __str__(self):
            row.pop("y", None)
            return super().__str__()

    row.update(u=Meddling("6f1c8a52-0e4b-4a55-9d1e-2b7c3f4a5d6e"), x="a", y="b")
    with (
        cc.Sink(conn, f"{database}.t") as sink,
        pytest.raises(cc.InvalidInputError, match="row 1 changed size while it was read"),
    ):
        sink.send([row])
    assert sql(f"SELECT count() FROM `{database}`.t FORMAT TSV").strip() == "0"


def test_values_of_pythons_standard_library_are_read_exactly_or_refused(conn, database):
    import datetime as dt
    import decimal
    import ipaddress
    import uuid

    sql(f"CREATE DATABASE `{database}`")
    sql(
        f"CREATE TABLE `{database}`.t (id UInt32, naive DateTime64(6, 'UTC'), "
        "aware DateTime64(3, 'UTC'), tokyo DateTime('Asia/Tokyo'), odd DateTime('UTC'), "
        "d Date, d32 Date32, dec Decimal(18, 4), nd Nullable(Decimal(9, 2)), u UUID, "
        "ip4 IPv4, ip6 IPv6, mapped IPv6, days Array(Date), t String) "
        "ENGINE = MergeTree ORDER BY id"
    )
    plus2 = dt.timezone(dt.timedelta(hours=2))
    odd = dt.timezone(dt.timedelta(hours=1, seconds=30))
    u = uuid.UUID("6f1c8a52-0e4b-4a55-9d1e-2b7c3f4a5d6e")
    row = {
        "id": 1,
        "naive": dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
        "aware": dt.datetime(2024, 5, 6, 9, 8, 9, 123000, tzinfo=plus2),
        "tokyo": dt.datetime(2024, 5, 6, 7, 8, 9),
        "odd": dt.datetime(2024, 5, 6, 1, 0, 30, tzinfo=odd),
        "d": dt.date(2024, 2, 29),
        "d32": dt.date(1950, 1, 2),
        "dec": decimal.Decimal("12.3400"),
        "nd": decimal.Decimal("-0.50"),
        "u": u,
        "ip4": ipaddress.IPv4Address("10.1.2.3"),
        "ip6": ipaddress.IPv6Address("2001:db8::1"),
        "mapped": ipaddress.IPv4Address("10.1.2.3"),
        "days": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)],
        "t": "01:02:03",
    }
    with cc.Sink(conn, f"{database}.t") as sink:
        assert sink.send([row, dict(row, id=2, nd=None)]).rows == 2
        # Each refused before any request, naming its row and column; nothing written.
        refused = [
            (
                "aware",
                dt.datetime(2024, 5, 6, 9, 8, 9, 123456, tzinfo=dt.timezone.utc),
                "sub-second",
            ),
            ("odd", dt.datetime(2024, 5, 6, 9, 8, 9, 5), "fraction of a second"),
            ("dec", decimal.Decimal("1.23456"), "Decimal(18, 4)"),
            ("dec", decimal.Decimal("NaN"), "not a finite number"),
            ("d", dt.datetime(2024, 5, 6), "column 'd'"),
            ("u", "not a uuid", "column 'u'"),
            # A String column takes a str (or bytes), as clickhouse-connect's does: Python's own
            # values are refused there, not stored as their text.
            ("t", dt.time(1, 2, 3), "a time, for a column of strings"),
            ("t", dt.datetime(2024, 5, 6), "a datetime, for a column of strings"),
            ("t", dt.date(2024, 5, 6), "a date, for a column of strings"),
            ("t", decimal.Decimal("1.5"), "a Decimal, for a column of strings"),
            ("t", u, "a UUID, for a column of strings"),
            ("t", ipaddress.IPv4Address("10.1.2.3"), "an IP address, for a column of strings"),
        ]
        for column, value, words in refused:
            with pytest.raises(cc.InvalidInputError) as info:
                sink.send([dict(row, id=3), dict(row, id=4, **{column: value})])
            assert "row 2" in str(info.value) and words in str(info.value), str(info.value)
    got = sql(
        f"SELECT id, naive, aware, tokyo, toUnixTimestamp(tokyo), odd, d, d32, dec, nd, u, ip4, "
        f"ip6, mapped, days, t FROM `{database}`.t ORDER BY id FORMAT TSV"
    ).splitlines()
    assert got == [
        f"{n}\t2024-05-06 07:08:09.123456\t2024-05-06 07:08:09.123\t2024-05-06 07:08:09\t"
        f"{int(dt.datetime(2024, 5, 5, 22, 8, 9, tzinfo=dt.timezone.utc).timestamp())}\t"
        f"2024-05-06 00:00:00\t2024-02-29\t1950-01-02\t12.34\t{nd}\t{u}\t10.1.2.3\t2001:db8::1\t"
        "::ffff:10.1.2.3\t['2024-01-01','2024-01-02']\t01:02:03"
        for n, nd in ((1, "-0.5"), (2, "\\N"))
    ]
