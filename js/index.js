// clickhouse-component for JavaScript: the WebAssembly component transpiled by jco
// (dist/, built by `npm run build`), with a small idiomatic layer:
//   - errors are thrown as ClickHouseError with .kind (the WIT error-kind), .server and
//     .committedRows;
//   - state parts are plain objects (JSON text on the wire to the component);
//   - sink rows are plain objects, sent through the component's exact JSON path (BigInt values
//     are written as exact integers).
// Every call is synchronous (the component blocks on wasi:http; Node's shim runs the HTTP
// request in a worker).
import { server, stateStore, tableSink } from './dist/clickhouse_component.js';

/** A failure reported by the component; `kind` is one of the WIT error-kind names. */
export class ClickHouseError extends Error {
  constructor(payload) {
    super(`${payload.kind}: ${payload.message}`);
    this.name = 'ClickHouseError';
    this.kind = payload.kind;
    this.server = payload.server ?? null;
    this.committedRows = Number(payload.committedRows ?? 0n);
  }
}

function call(fn) {
  try {
    return fn();
  } catch (e) {
    if (e && e.payload && typeof e.payload.kind === 'string') throw new ClickHouseError(e.payload);
    throw e;
  }
}

/**
 * A connection record. `settings` is an object of ClickHouse settings.
 * @param {string} url clickhouse:// clickhouses:// http:// https:// connection string
 */
export function connection(url, { user, password, database, settings = {}, connectTimeoutMs, requestTimeoutMs } = {}) {
  if (typeof url !== 'string') {
    throw new ClickHouseError({ kind: 'invalid-input', message: 'connection(url): url must be a string' });
  }
  return {
    url,
    user,
    password,
    database,
    settings: Object.entries(settings).map(([k, v]) => [k, String(v)]),
    connectTimeoutMs,
    requestTimeoutMs,
  };
}

/** Connects and returns { version, timezone, user, database, roundTripUs }. */
export function ping(conn) {
  return call(() => server.ping(conn));
}

const parse = (text) => (text ? JSON.parse(text) : {});
const fromWit = (s) => ({ id: s.id, partial: parse(s.partial), completed: parse(s.completed) });
const toWit = ({ id, partial = {}, completed = {} }) => ({
  id,
  partial: JSON.stringify(partial),
  completed: JSON.stringify(completed),
});

/** The pipeline state store (Meltano StateStoreManager parity). */
export class StateStore {
  #store;
  constructor(store) {
    this.#store = store;
  }
  /** options: { database, table, lockTable, createSchema, lockTimeoutMs, lockRetryMs, staleAfterMs, lockEngine, retries } */
  static open(conn, options = {}) {
    return new StateStore(call(() => stateStore.Store.open(conn, options)));
  }
  /** { id, partial, completed } or undefined. */
  get(id) {
    const s = call(() => this.#store.get(id));
    return s && fromWit(s);
  }
  set(state) {
    call(() => this.#store.set(toWit(state)));
  }
  /** Meltano update(): merges a partial state, or replaces with a completed one; returns the stored state. */
  update(state) {
    return fromWit(call(() => this.#store.update(toWit(state))));
  }
  /** Returns 1 if a state was deleted, else 0. */
  delete(id) {
    return Number(call(() => this.#store.delete(id)));
  }
  ids(pattern) {
    return call(() => this.#store.ids(pattern));
  }
  getAll(pattern) {
    return call(() => this.#store.getAll(pattern)).map(fromWit);
  }
  setAll(states) {
    call(() => this.#store.setAll(states.map(toWit)));
  }
  clearAll() {
    return Number(call(() => this.#store.clearAll()));
  }
  /** Acquires the advisory lock; returns { token, renew(), release() }. */
  lock(id) {
    const lock = call(() => this.#store.lock(id));
    return {
      token: lock.token(),
      renew: () => call(() => lock.renew()),
      release: () => call(() => lock.release()),
    };
  }
  /** Runs fn while holding the lock on id, releasing it after (also when fn throws). */
  withLock(id, fn) {
    const lock = this.lock(id);
    try {
      return fn();
    } finally {
      lock.release();
    }
  }
}

// JSON text of a row with BigInt values written as exact integers.
const rowJson = (row) =>
  JSON.stringify(row, (_, v) => (typeof v === 'bigint' ? `__bigint__${v}__` : v)).replace(
    /"__bigint__(-?\d+)__"/g,
    '$1',
  );

/** The acknowledged table sink. */
export class Sink {
  #sink;
  constructor(sink) {
    this.#sink = sink;
  }
  /**
   * options: { table, columns, batchSize, settings: {name: value}, dedup, retries, compression }
   * (compression: 'none' | 'lz4' | 'zstd' | 'gzip', default 'lz4')
   */
  static open(conn, { table, columns, batchSize, settings = {}, dedup, retries, compression } = {}) {
    const options = {
      table,
      columns,
      batchSize,
      settings: Object.entries(settings).map(([k, v]) => [k, String(v)]),
      dedup,
      retries,
      compression,
    };
    return new Sink(call(() => tableSink.Sink.open(conn, options)));
  }
  /**
   * Makes the sink resumable (needs dedup): its progress is kept in the state store
   * (store: { database, table, cluster, ... } as for StateStore.open) under the state id
   * `checkpoint`. Returns the position of the last acknowledged send (undefined before the
   * first): continue the source from there and give every send the position its rows end at.
   * A send in flight when a process stopped must be sent again first (docs/sink.md).
   */
  resume(checkpoint, store = {}) {
    return call(() => this.#sink.resume(checkpoint, store));
  }
  /**
   * Sends plain objects; returns the receipt { rows, chunks, writtenRows, ... } (numbers).
   * A resumable sink needs { position }: where the rows end in the caller's source.
   */
  send(rows, { position } = {}) {
    return this.sendJson(rows.map(rowJson).join('\n'), { position });
  }
  /** Sends NDJSON or a JSON array (string or bytes); { position } as for send. */
  sendJson(data, { position } = {}) {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const r = call(() =>
      position == null ? this.#sink.sendJson(bytes) : this.#sink.sendJsonAt(bytes, position),
    );
    return {
      rows: Number(r.rows),
      chunks: r.chunks,
      writtenRows: Number(r.writtenRows),
      deduplicatedChunks: r.deduplicatedChunks,
      unverifiedChunks: r.unverifiedChunks,
      retries: r.retries,
      // 'native' or 'json-each-row' (a column of a type the sink does not encode).
      format: r.format,
    };
  }
  close() {
    this.#sink.close();
  }
}
