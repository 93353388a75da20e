// The component in Node (via jco) against the ClickHouse named by CLICKHOUSE_URL (the test
// command starts the local one): state store, lock, sink, and errors as JS exceptions.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connection, ping, StateStore, Sink, ClickHouseError } from '../index.js';

const url = process.env.CLICKHOUSE_URL;
if (!url) throw new Error('CLICKHOUSE_URL must name a ClickHouse server (run through `make test`)');
const user = process.env.CLICKHOUSE_USER ?? 'default';
const password = process.env.CLICKHOUSE_PASSWORD ?? '';
const conn = connection(url, { user, password });
const database = `js_${process.pid}_${Date.now()}`;

async function sql(query) {
  const response = await fetch(`${url.replace(/\/$/, '')}/`, {
    method: 'POST',
    headers: { 'X-ClickHouse-User': user, 'X-ClickHouse-Key': password },
    body: query,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${query}: ${text}`);
  return text;
}

test('ping reports the server', () => {
  const info = ping(conn);
  assert.match(info.version, /^\d/);
  assert.equal(info.user, user);
});

test('state set, get, update and lock', () => {
  const store = StateStore.open(conn, { database });
  assert.equal(store.get('missing'), undefined);
  store.set({ id: 'tap-a--target-b', completed: { bookmarks: { s: 1 } } });
  store.update({ id: 'tap-a--target-b', partial: { bookmarks: { p: 1 } } });
  const stored = store.update({ id: 'tap-a--target-b', partial: { bookmarks: { q: 2 } } });
  assert.deepEqual(stored.partial, { bookmarks: { p: 1, q: 2 } });
  assert.deepEqual(store.get('tap-a--target-b').completed, { bookmarks: { s: 1 } });
  assert.deepEqual(store.ids('tap-?--*'), ['tap-a--target-b']);
  const result = store.withLock('tap-a--target-b', () => 'locked work');
  assert.equal(result, 'locked work');
  // The lock is free again: a contender with no patience gets it.
  const quick = StateStore.open(conn, { database, lockTimeoutMs: 0 });
  const lock = quick.lock('tap-a--target-b');
  assert.match(lock.token, /^[0-9a-f-]{36}$/);
  // ... and while it is held, another contender fails with kind 'locked'.
  assert.throws(() => StateStore.open(conn, { database, lockTimeoutMs: 200 }).lock('tap-a--target-b'),
    (e) => e instanceof ClickHouseError && e.kind === 'locked');
  lock.release();
  assert.equal(store.delete('tap-a--target-b'), 1);
});

test('sink sends rows and they arrive exactly', async () => {
  await sql(`CREATE DATABASE IF NOT EXISTS ${database}`);
  await sql(`CREATE TABLE ${database}.events (id UInt64, name String) ENGINE = MergeTree ORDER BY id`);
  const sink = Sink.open(conn, { table: `${database}.events`, batchSize: 2 });
  const receipt = sink.send([
    { id: 18446744073709551615n, name: 'max u64' },
    { id: 1, name: 'ünïcødé' },
    { id: 2, name: '' },
  ]);
  assert.deepEqual([receipt.rows, receipt.chunks, receipt.writtenRows, receipt.format], [3, 2, 3, 'native']);
  const text = await sql(`SELECT toString(id), name FROM ${database}.events ORDER BY id FORMAT TSV`);
  assert.equal(text, '1\tünïcødé\n2\t\n18446744073709551615\tmax u64\n');
  sink.close();
});

test('a resumable sink continues where its checkpoint ends', async () => {
  await sql(`CREATE DATABASE IF NOT EXISTS ${database}`);
  await sql(`CREATE TABLE ${database}.resumed (id UInt64) ENGINE = MergeTree ORDER BY id
    SETTINGS non_replicated_deduplication_window = 100`);
  const options = { table: `${database}.resumed`, batchSize: 2, dedup: true };
  const store = { database: `${database}_state` };
  const first = Sink.open(conn, options);
  assert.equal(first.resume('job', store), undefined);
  assert.equal(first.send([{ id: 1 }, { id: 2 }, { id: 3 }], { position: 'after 3' }).rows, 3);
  assert.throws(() => first.send([{ id: 4 }]),
    (e) => e.kind === 'invalid-input' && /keeps a checkpoint/.test(e.message));
  first.close();
  const next = Sink.open(conn, options);
  assert.equal(next.resume('job', store), 'after 3');
  next.send([{ id: 4 }], { position: 'after 4' });
  next.close();
  assert.equal(await sql(`SELECT count() FROM ${database}.resumed`), '4\n');
  await sql(`DROP DATABASE IF EXISTS ${database}_state`);
});

test('sink compresses with the method asked for', async () => {
  await sql(`CREATE DATABASE IF NOT EXISTS ${database}`);
  await sql(`CREATE TABLE ${database}.packed (id UInt64, name String) ENGINE = MergeTree ORDER BY id`);
  const rows = Array.from({ length: 50 }, (_, id) => ({ id, name: `row ${id} ${'x'.repeat(id)}` }));
  for (const compression of [undefined, 'none', 'lz4', 'zstd', 'gzip']) {
    const sink = Sink.open(conn, { table: `${database}.packed`, batchSize: 20, compression });
    assert.deepEqual([sink.send(rows).writtenRows], [50], String(compression));
  }
  assert.equal(await sql(`SELECT count(), uniqExact(id, name) FROM ${database}.packed FORMAT TSV`), '250\t50\n');
  // jco refuses a name that is not one of the WIT enum's cases before the component runs.
  assert.throws(() => Sink.open(conn, { table: `${database}.packed`, compression: 'brotli' }));
});

test('errors arrive as exceptions with the error kind', async () => {
  assert.throws(() => ping(connection(url, { user, password: 'wrong-password' })),
    (e) => e instanceof ClickHouseError && e.kind === 'misconfigured' && e.server.code === 516
      && !e.message.includes('wrong-password'));
  assert.throws(() => connection(undefined),
    (e) => e instanceof ClickHouseError && e.kind === 'invalid-input');
  assert.throws(() => ping(connection('ftp://nowhere')),
    (e) => e instanceof ClickHouseError && e.kind === 'invalid-input');
  await sql(`CREATE DATABASE IF NOT EXISTS ${database}`);
  await sql(`CREATE TABLE IF NOT EXISTS ${database}.t (n UInt32) ENGINE = MergeTree ORDER BY n`);
  const sink = Sink.open(conn, { table: `${database}.t`, columns: ['n'] });
  assert.throws(() => sink.send([{ n: 1, extra: 2 }]),
    (e) => e instanceof ClickHouseError && e.kind === 'invalid-input' && /extra 'extra'/.test(e.message));
  // A value its column's type does not read: refused before any request, naming the column.
  assert.throws(() => sink.send([{ n: 'not a number' }]),
    (e) => e instanceof ClickHouseError && e.kind === 'invalid-input' && /column 'n'/.test(e.message)
      && /UInt32/.test(e.message));
  assert.throws(() => Sink.open(conn, { table: 't', settings: { async_insert: 1 } }),
    (e) => e.kind === 'invalid-input' && /fire-and-forget/.test(e.message));
});

test("the README's example runs", async () => {
  const { execFileSync } = await import('node:child_process');
  const exampleDb = `${database}_readme`;
  await sql(`CREATE DATABASE IF NOT EXISTS ${exampleDb}`);
  await sql(`CREATE TABLE IF NOT EXISTS ${exampleDb}.events (id UInt64, name String) ENGINE = MergeTree ORDER BY id`);
  const out = execFileSync(process.execPath, [new URL('../examples/readme.mjs', import.meta.url).pathname], {
    env: { ...process.env, EXAMPLE_DATABASE: exampleDb },
    encoding: 'utf8',
  });
  assert.match(out, /^ClickHouse \d/);
  assert.match(out, /"partial":\{"bookmarks":\{"issues":"2026-11-28"\}\}/);
  assert.match(out, /sent 1 rows in 1 chunk/);
  assert.equal(await sql(`SELECT toString(id) FROM ${exampleDb}.events FORMAT TSV`), '18446744073709551615\n');
});
