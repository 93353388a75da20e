// The README's Node example (run by `npm test` with CLICKHOUSE_URL, CLICKHOUSE_USER,
// CLICKHOUSE_PASSWORD and EXAMPLE_DATABASE set; the table EXAMPLE_DATABASE.events exists).
import { connection, ping, StateStore, Sink, ClickHouseError } from '../index.js';

const conn = connection(process.env.CLICKHOUSE_URL, {
  user: process.env.CLICKHOUSE_USER,
  password: process.env.CLICKHOUSE_PASSWORD,
});
console.log('ClickHouse', ping(conn).version);

const database = process.env.EXAMPLE_DATABASE ?? 'meltano';
const store = StateStore.open(conn, { database });
store.update({ id: 'tap-a--target-b', partial: { bookmarks: { issues: '2026-11-28' } } });
console.log(JSON.stringify(store.get('tap-a--target-b')));
store.withLock('tap-a--target-b', () => { /* exclusive work */ });

const sink = Sink.open(conn, { table: `${database}.events`, batchSize: 1000 });
try {
  const receipt = sink.send([{ id: 18446744073709551615n, name: 'exact' }]);
  console.log('sent', receipt.rows, 'rows in', receipt.chunks, 'chunk');
} catch (e) {
  if (e instanceof ClickHouseError && e.kind === 'uncertain') console.log('committed', e.committedRows);
  throw e;
}
