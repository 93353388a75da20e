"""Stream maps (issue 46) through Meltano's mapper: docs/stream-maps.md's recipe, run as written.

The target builds no stream maps; its docs send users to the Meltano Hub's
`meltano-map-transformer` (PyPI `meltano-map-transform` 0.12.3 on singer-sdk 0.54.9, in
.venv-map-transformer: scripts/map-transformer-venv) between the tap and the target. The
mapper plugin, with its mapping `mask-customers`, is read from the `meltano.yml` snippet of
docs/stream-maps.md, so the doc is what runs; only its `executable` is the pinned venv's and its
`pip_url` is dropped (nothing for `meltano run` to install).

The real tap of test_tap_postgres.py (meltanolabs-tap-postgres 0.10.0, its module fixture: a
private PostgreSQL) reads two tables made here, `public.customers` and `public.orders`, both
INCREMENTAL by `id`, and `meltano run tap-postgres mask-customers target-clickhouse-component`
(test_tap_postgres.py's project: our ClickHouse state backend, the wheel's target) loads them
into the test's fresh database. Read back from ClickHouse: the aliased table and not the
source's, the MD5 of each email computed in Python, no column for the dropped properties, the
overridden key as the table's ORDER BY, and the orders' hashes joined to the customers'.
Run without the mapping, it fails at the alias check."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
import test_tap_postgres
import yaml
from conftest import ROOT, cli_get, sql
from test_tap_postgres import Postgres, PostgresProject
from test_target import MELTANO

# test_tap_postgres.py's module fixture, a module fixture here too (pytest names a fixture after
# the module attribute): this module's private PostgreSQL and the tap's config.
postgres_tap = test_tap_postgres.tap

MAPPER = Path(
    os.environ.get(
        "MAP_TRANSFORMER", ROOT / ".venv-map-transformer" / "bin" / "meltano-map-transform"
    )
)
DOC = ROOT / "docs" / "stream-maps.md"
MAPPING = "mask-customers"
STREAMS = ("public-customers", "public-orders")
JOB = "dev:tap-postgres-to-target-clickhouse-component"
CUSTOMERS = 300
ORDERS = 900

# Emails with non-ASCII letters on every 10th customer (the MD5 is of the UTF-8 bytes), orders
# without an email on every 7th.
SOURCE_SQL = f"""
DROP TABLE IF EXISTS public.orders, public.customers;
CREATE TABLE public.customers (
    id bigint PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text,
    phone text,
    country text,
    signed_up_at timestamptz NOT NULL
);
INSERT INTO public.customers
SELECT i,
       CASE WHEN i % 10 = 0 THEN 'josé.müller' || i || '@exämple.org'
            ELSE 'user' || i || '@example.com' END,
       'Customer ' || i,
       '+1 555 ' || lpad(i::text, 4, '0'),
       (ARRAY['DE', 'FR', 'US', NULL])[1 + i % 4],
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 hour 1 second'
FROM generate_series(1, {CUSTOMERS}) AS i;
CREATE TABLE public.orders (
    id bigint PRIMARY KEY,
    customer_email text,
    amount numeric(12, 2) NOT NULL,
    note text
);
INSERT INTO public.orders
SELECT i,
       CASE WHEN i % 7 = 0 THEN NULL
            ELSE (SELECT email FROM public.customers WHERE id = i % {CUSTOMERS} + 1) END,
       round(i * 3.17, 2),
       'gift wrap for order ' || i
FROM generate_series(1, {ORDERS}) AS i;
"""


def doc_recipe() -> tuple[dict, str]:
    """The mapper plugin of docs/stream-maps.md's meltano.yml snippet, and its `meltano run`
    line."""
    text = DOC.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    recipes = [yaml.safe_load(b) for b in blocks if "mappers:" in b]
    assert len(recipes) == 1, "docs/stream-maps.md: one meltano.yml snippet with mappers"
    (mapper,) = recipes[0]["plugins"]["mappers"]
    runs = re.findall(r"^meltano run .*$", text, re.M)
    assert len(runs) == 1, "docs/stream-maps.md: one `meltano run` line"
    return mapper, runs[0]


class MappedProject(PostgresProject):
    """test_tap_postgres.py's project (tap-postgres, our state backend, the wheel's target) with
    the two tables selected, the doc's mapper, and every stream in the test's database
    (`default_target_schema`: the unmapped name would land in it too)."""

    def __init__(self, root: Path, database: str, pg: Postgres, mapper: dict) -> None:
        super().__init__(root, database, pg, default_target_schema=database)
        extractor = self.yml["plugins"]["extractors"][0]
        extractor["select"] = [f"{s}.*" for s in STREAMS]
        extractor["metadata"] = {
            s: {"replication-method": "INCREMENTAL", "replication-key": "id"} for s in STREAMS
        }
        self.yml["plugins"]["loaders"][0]["settings"].append({"name": "default_target_schema"})
        mapper = dict(mapper, executable=str(MAPPER))
        mapper.pop("pip_url", None)
        self.yml["plugins"]["mappers"] = [mapper]
        self.write()

    def args(self, force: bool) -> list[str]:
        return [str(MELTANO), "run", "tap-postgres", MAPPING, "target-clickhouse-component"]


def rows(query: str, **params: str) -> list[dict]:
    return [json.loads(line) for line in sql(query + " FORMAT JSONEachRow", **params).splitlines()]


def table_facts(database: str) -> dict[str, dict]:
    """system.tables' engine and keys of every table in the database, by name."""
    facts = rows(
        "SELECT name, engine, sorting_key, primary_key FROM system.tables"
        " WHERE database = {db:String}",
        db=database,
    )
    return {f.pop("name"): f for f in facts}


def key(expression: str) -> str:
    """A one-column key as system.tables shows it, `(email_hash)` or `email_hash`."""
    return expression.removeprefix("(").removesuffix(")")


def columns(database: str, table: str) -> dict[str, str]:
    found = rows(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}",
        db=database,
        t=table,
    )
    return {c["name"]: c["type"] for c in found}


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def test_stream_maps_through_meltano_map_transformer(postgres_tap, database, tmp_path, capsys):
    if not os.access(MAPPER, os.X_OK):
        pytest.fail(f"no meltano-map-transform at {MAPPER} (scripts/map-transformer-venv)")
    pg = postgres_tap.pg
    pg.psql(SOURCE_SQL)
    try:
        mapper, run_line = doc_recipe()
        assert [m["name"] for m in mapper["mappings"]] == [MAPPING]
        project = MappedProject(tmp_path / "project", database, pg, mapper)
        assert run_line.split() == ["meltano", *project.args(False)[1:]]
        started = time.monotonic()
        run = project.run()
        seconds = time.monotonic() - started
        # The alias: the mapped table, and none of the stream's own name.
        tables = table_facts(database)
        assert "customers_masked" in tables and "customers" not in tables, sorted(tables)
        assert "orders" in tables, sorted(tables)

        # The key override: a ReplacingMergeTree ordered by the hash, not by `id`.
        masked = tables["customers_masked"]
        assert masked["engine"] == "ReplacingMergeTree", masked
        assert key(masked["sorting_key"]) == key(masked["primary_key"]) == "email_hash", masked
        assert key(tables["orders"]["sorting_key"]) == "id", tables["orders"]

        # Dropped properties have no column. Key columns are not Nullable, whatever the SCHEMA
        # says (the mapper declares the hash, and the orders' listed `id`, nullable).
        assert columns(database, "customers_masked") == {
            "id": "Int64",
            "email_hash": "String",
            "name": "Nullable(String)",
            "country": "Nullable(String)",
            "signed_up_at": "Nullable(DateTime64(6, 'UTC'))",
        }
        order_columns = columns(database, "orders")
        assert order_columns == {
            "id": "Int64",
            "amount": "Nullable(Float64)",
            "customer_email_hash": "Nullable(String)",
        }

        # Every row: the hash is the MD5 of PostgreSQL's email, computed here.
        source = {
            int(i): (email, name, country)
            for i, email, name, country in (
                line.split("|")
                for line in pg.psql(
                    "SELECT id, email, name, country FROM public.customers;"
                ).splitlines()
            )
        }
        loaded = rows(
            "SELECT id, email_hash, name, country FROM {db:Identifier}.customers_masked FINAL",
            db=database,
        )
        assert len(loaded) == CUSTOMERS == len(source)
        for row in loaded:
            email, name, country = source[int(row["id"])]
            assert row["email_hash"] == md5(email), (row, email)
            assert (row["name"], row["country"] or "") == (name, country), row
        assert any(not email.isascii() for email, _, _ in source.values())

        # The orders: their hashes join the customers', null without an email; the amounts.
        orders = rows(
            "SELECT o.id AS id, toString(o.amount) AS amount, ifNull(c.id, 0) AS customer"
            " FROM {db:Identifier}.orders AS o FINAL"
            " LEFT JOIN {db:Identifier}.customers_masked AS c FINAL"
            " ON o.customer_email_hash = c.email_hash"
            " ORDER BY o.id",
            db=database,
        )
        assert len(orders) == ORDERS
        nulls = sql(
            "SELECT countIf(customer_email_hash IS NULL) FROM {db:Identifier}.orders",
            db=database,
        )
        assert int(nulls) == ORDERS // 7
        for order in orders:
            i = int(order["id"])
            assert int(order["customer"]) == (0 if i % 7 == 0 else i % CUSTOMERS + 1), order
            assert Decimal(order["amount"]) == round(Decimal(i) * Decimal("3.17"), 2), order

        # STATE passed through the mapper: both streams' bookmarks, under the tap's names.
        state = cli_get(JOB, database=database)
        bookmarks = {**state["completed"], **state["partial"]}["singer_state"]["bookmarks"]
        assert {s: bookmarks[s]["replication_key_value"] for s in STREAMS} == {
            "public-customers": CUSTOMERS,
            "public-orders": ORDERS,
        }, bookmarks
        # The mapper read every message (its log line, relayed by Meltano).
        read = re.search(r"meltano-map-transformer .*\((\d+) schemas, (\d+) records", run.stderr)
        assert read and read.groups() == ("2", str(CUSTOMERS + ORDERS)), run.stderr[-4000:]
        with capsys.disabled():
            print(
                f"\nmeltano run tap-postgres {MAPPING} target-clickhouse-component: "
                f"{CUSTOMERS} customers and {ORDERS} orders in {seconds:.1f} s"
            )
    finally:
        pg.psql("DROP TABLE IF EXISTS public.orders, public.customers;")
