//! The state and lock tables: DDL (names as `Identifier` parameters) and the check that
//! existing tables have the layout this store needs.
//!
//! The state table is the layout of meltano-state-backend-clickhouse, so either
//! implementation reads what the other wrote. The lock table is ours (see [`super::lock`]).

use serde_json::Value;

use crate::client::error_codes::QUERY_IS_PROHIBITED;
use crate::client::response::json_rows;
use crate::client::sql::quote_identifier;
use crate::client::{Error, ErrorKind, Transport};
use crate::platform::Platform;

use super::lock::keeper_map;
use super::steps::{is_keeper_map_disabled, Session, Step};
use super::tables::{LockEngine, LockEngineChoice, Replication, Tables};

/// `CREATE DATABASE IF NOT EXISTS`.
pub const CREATE_DATABASE: &str = "CREATE DATABASE IF NOT EXISTS {db:Identifier}";

/// The state table (interoperable with meltano-state-backend-clickhouse).
pub const CREATE_STATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {db:Identifier}.{t:Identifier} (
    state_id String,
    partial_state Nullable(String),
    completed_state Nullable(String),
    updated_at DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY state_id";

/// The lock table: a plain MergeTree whose rows keep the block number they were committed
/// with (`enable_block_number_column`), so contenders are ordered by commit order. Old rows are
/// reaped by TTL a day after their lease ended.
pub const CREATE_LOCK_TABLE: &str = "CREATE TABLE IF NOT EXISTS {db:Identifier}.{t:Identifier} (
    state_id String,
    token String,
    kind Enum8('acquire' = 1, 'release' = 2),
    expires_at DateTime64(3),
    created_at DateTime64(3) DEFAULT now64(3)
) ENGINE = MergeTree
ORDER BY (state_id, token)
TTL toDateTime(expires_at) + INTERVAL 1 DAY
SETTINGS enable_block_number_column = 1";

const STATE_COLUMNS: &[(&str, &str)] = &[
    ("state_id", "String"),
    ("partial_state", "Nullable(String)"),
    ("completed_state", "Nullable(String)"),
    ("updated_at", "DateTime64(3)"),
];

const LOCK_COLUMNS: &[(&str, &str)] = &[
    ("state_id", "String"),
    ("token", "String"),
    ("kind", "Enum8('acquire' = 1, 'release' = 2)"),
    ("expires_at", "DateTime64(3)"),
];

/// A table as `system.tables` / `system.columns` describe it.
struct FoundTable {
    name: String,
    engine: String,
    columns: Vec<(String, String)>,
}

/// Whether an engine (as `system.tables.engine_full` prints it) is a plain, non-replicated
/// MergeTree: the only engine on which block numbers follow commit order.
pub fn is_plain_merge_tree(engine_full: &str) -> bool {
    engine_full.starts_with("MergeTree")
}

/// How to create the schema.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Create<'a> {
    /// `ON CLUSTER` this cluster, with a Replicated state table (see
    /// [`super::StoreOptions::cluster`]).
    pub cluster: Option<&'a str>,
}

impl Create<'_> {
    /// `statement` (whose head names `{name}`, the database or the table) as this creation
    /// sends it: `ON CLUSTER` after that name, and the state table Replicated, on a cluster.
    /// The cluster name is the one name in the store's DDL that cannot be a query parameter
    /// (ClickHouse's parser takes only an identifier or a string literal after `ON
    /// CLUSTER`): it is written through the function that escapes INSERT column lists.
    pub fn statement(&self, statement: &str, name: &str) -> String {
        let Some(cluster) = self.cluster else {
            return statement.to_string();
        };
        statement
            .replacen(
                name,
                &format!("{name} ON CLUSTER {}", quote_identifier(cluster)),
                1,
            )
            .replacen(
                "ENGINE = ReplacingMergeTree(updated_at)",
                "ENGINE = ReplicatedReplacingMergeTree(updated_at)",
                1,
            )
    }

    /// A refusal of `ON CLUSTER` said plainly (this server runs no distributed DDL, or has
    /// no such cluster).
    fn explain(&self, e: Error) -> Error {
        let Some(cluster) = self.cluster else {
            return e;
        };
        let refused = e
            .server
            .as_ref()
            .is_some_and(|s| s.code == QUERY_IS_PROHIBITED || s.code == CLUSTER_DOESNT_EXIST);
        if !refused {
            return e;
        }
        let message = format!(
            "the schema could not be created ON CLUSTER '{}': {} (the cluster must be in the servers' remote_servers, with distributed DDL configured; or create the tables yourself and open with create-schema off)",
            crate::text::escaped(cluster),
            e.message
        );
        e.reclassify(ErrorKind::Misconfigured, message)
    }
}

/// ClickHouse's `CLUSTER_DOESNT_EXIST`.
const CLUSTER_DOESNT_EXIST: i32 = 701;

/// Creates what is missing (with `create`) and decides the lock engine: an existing lock
/// table's own engine (which must agree with an explicit choice); else, creating the lock
/// table, KeeperMap when chosen or (auto) when the server supports it, the commit-order
/// MergeTree otherwise (never on a cluster). Without `create` no DDL is sent.
pub fn prepare<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    create: Option<Create<'_>>,
    choice: LockEngineChoice,
) -> Result<LockEngine, Error> {
    let create_schema = create.is_some();
    let create = create.unwrap_or_default();
    if create_schema {
        s.execute(
            &Step::CreateSchema
                .query(create.statement(CREATE_DATABASE, "{db:Identifier}"))
                .param("db", &tables.database),
        )
        .map_err(|e| create.explain(e))?;
        s.execute(
            &Step::CreateSchema
                .query(create.statement(CREATE_STATE_TABLE, "{t:Identifier}"))
                .param("db", &tables.database)
                .param("t", &tables.state),
        )
        .map_err(|e| create.explain(e))?;
    }
    let existing = lock_table_engine(s, tables)?;
    let engine = match (existing, choice) {
        (Some(engine), _) => return existing_engine(tables, &engine, choice),
        (None, _) if !create_schema => match choice {
            // verify() names the missing table.
            LockEngineChoice::KeeperMap => return Ok(LockEngine::KeeperMap),
            _ => return Ok(LockEngine::MergeTree),
        },
        (None, LockEngineChoice::MergeTree) => LockEngine::MergeTree,
        (None, LockEngineChoice::KeeperMap) => {
            create_keeper_table(s, tables, &create).map_err(|e| keeper_unavailable(e, tables))?;
            return Ok(LockEngine::KeeperMap);
        }
        // On a cluster only the Keeper-backed lock is sound: no fallback.
        (None, LockEngineChoice::Auto) if create.cluster.is_some() => {
            create_keeper_table(s, tables, &create).map_err(|e| keeper_unavailable(e, tables))?;
            return Ok(LockEngine::KeeperMap);
        }
        (None, LockEngineChoice::Auto) => match create_keeper_table(s, tables, &create) {
            Ok(()) => return Ok(LockEngine::KeeperMap),
            Err(e) if is_keeper_map_disabled(&e) => LockEngine::MergeTree,
            Err(e) => return Err(e),
        },
    };
    s.execute(
        &Step::CreateSchema
            .query(CREATE_LOCK_TABLE)
            .param("db", &tables.database)
            .param("t", &tables.lock),
    )?;
    Ok(engine)
}

/// The engine of an existing lock table (`engine`, its `engine_full`), if it is the one
/// `choice` asks for.
fn existing_engine(
    tables: &Tables,
    engine: &str,
    choice: LockEngineChoice,
) -> Result<LockEngine, Error> {
    let found = if engine.starts_with("KeeperMap") {
        LockEngine::KeeperMap
    } else {
        LockEngine::MergeTree
    };
    let wanted = match choice {
        LockEngineChoice::Auto => found,
        LockEngineChoice::MergeTree => LockEngine::MergeTree,
        LockEngineChoice::KeeperMap => LockEngine::KeeperMap,
    };
    if wanted != found {
        return Err(Error::new(
            ErrorKind::Misconfigured,
            format!(
                "the lock table {}.{} exists with engine `{}`, not the {} lock asked for: choose another lock table, or the lock engine auto",
                tables.database,
                tables.lock,
                engine.chars().take(60).collect::<String>(),
                wanted.as_str()
            ),
        ));
    }
    Ok(found)
}

fn create_keeper_table<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    create: &Create<'_>,
) -> Result<(), Error> {
    // A server without KeeperMap says so at once: not worth repeating.
    s.send(
        &Step::CreateKeeperMapTable
            .query(create.statement(keeper_map::CREATE_TABLE, "{t:Identifier}"))
            .param("db", &tables.database)
            .param("t", &tables.lock)
            .param("path", keeper_map::keeper_path(tables)),
    )
    .map(|_| ())
    .map_err(|e| create.explain(e))
}

fn keeper_unavailable(e: Error, tables: &Tables) -> Error {
    if is_keeper_map_disabled(&e) {
        Error {
            kind: ErrorKind::Misconfigured,
            message: format!(
                "the keeper-map lock needs KeeperMap tables, which this server does not allow (set keeper_map_path_prefix and a Keeper in its configuration; ClickHouse Cloud has both), so the lock table {}.{} was not created: {}",
                tables.database, tables.lock, e.message
            ),
            ..e
        }
    } else {
        e
    }
}

/// The lock table's `engine_full`, if it exists.
fn lock_table_engine<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
) -> Result<Option<String>, Error> {
    let response = s.execute(&Step::VerifySchema.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        )
        .param("db", &tables.database)
        .param("t", &tables.lock)
        .format("JSONEachRow"),
    )?;
    let rows = json_rows(&response.body, "the lock table query")?;
    rows.into_iter()
        .next()
        .map(|mut r| r.text("engine_full"))
        .transpose()
}

/// Which of the store's two tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    State,
    Lock,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::State => "state",
            Role::Lock => "lock",
        }
    }
}

/// Checks that both tables exist with the expected columns and engines; `misconfigured`
/// naming what is missing or different otherwise. Returns how the state table is replicated
/// (its engine). One query.
pub fn verify<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
) -> Result<Replication, Error> {
    let found = read_tables(s, tables)?;
    let lock_columns = match tables.lock_engine {
        LockEngine::MergeTree => LOCK_COLUMNS,
        LockEngine::KeeperMap => keeper_map::COLUMNS,
    };
    let mut replication = Replication::None;
    for (role, name, columns) in [
        (Role::State, &tables.state, STATE_COLUMNS),
        (Role::Lock, &tables.lock, lock_columns),
    ] {
        let describe = format!("{}.{name}", tables.database);
        let Some(table) = found.iter().find(|t| &t.name == name) else {
            return Err(misconfigured(format!(
                "the {} table {describe} does not exist (create-schema is off: create it, or open with create-schema on)",
                role.name()
            )));
        };
        check_columns(role, &describe, table, columns)?;
        check_engine(role, &describe, &table.engine, tables.lock_engine)?;
        if role == Role::State {
            replication = Replication::of_engine(&table.engine);
        }
    }
    Ok(replication)
}

fn misconfigured(message: String) -> Error {
    Error::new(ErrorKind::Misconfigured, message)
}

/// The store's tables as the server has them: name, engine, columns.
fn read_tables<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
) -> Result<Vec<FoundTable>, Error> {
    let response = s.execute(
        &Step::VerifySchema
            .query(
                "SELECT t.name AS table, t.engine_full AS engine,
                    groupArray((c.name, c.type)) AS columns
             FROM system.tables AS t
             LEFT JOIN system.columns AS c ON c.database = t.database AND c.table = t.name
             WHERE t.database = {db:String} AND t.name IN ({state:String}, {lock:String})
             GROUP BY t.name, t.engine_full",
            )
            .param("db", &tables.database)
            .param("state", &tables.state)
            .param("lock", &tables.lock)
            .format("JSONEachRow"),
    )?;
    let text = String::from_utf8_lossy(&response.body);
    let mut found: Vec<FoundTable> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).map_err(|e| {
            Error::new(
                ErrorKind::Transient,
                format!("unexpected schema answer: {e}"),
            )
        })?;
        let columns = row["columns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .filter_map(|c| {
                        Some((
                            c.get(0)?.as_str()?.to_string(),
                            c.get(1)?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.push(FoundTable {
            name: row["table"].as_str().unwrap_or_default().to_string(),
            engine: row["engine"].as_str().unwrap_or_default().to_string(),
            columns,
        });
    }
    Ok(found)
}

/// Every expected column is there with its type.
fn check_columns(
    role: Role,
    describe: &str,
    table: &FoundTable,
    columns: &[(&str, &str)],
) -> Result<(), Error> {
    for (name, ty) in columns {
        if !table.columns.iter().any(|(n, t)| n == name && t == ty) {
            let hint = match role {
                Role::Lock => " (it may be meltano-state-backend-clickhouse's lock table, `<table>_lock`, which has another layout: choose another lock table, such as the default `<table>_component_lock`)",
                Role::State => "",
            };
            return Err(misconfigured(format!(
                "the {} table {describe} has no column `{name} {ty}`; it was not created by this store{hint}",
                role.name()
            )));
        }
    }
    Ok(())
}

/// The engine suits the role: a ReplacingMergeTree (any flavour) for states; for the lock,
/// KeeperMap, or a plain MergeTree with block numbers (the commit-order lock is unsound on
/// Replicated and Shared MergeTree).
fn check_engine(
    role: Role,
    describe: &str,
    engine: &str,
    lock_engine: LockEngine,
) -> Result<(), Error> {
    let shown = |n: usize| engine.chars().take(n).collect::<String>();
    match (role, lock_engine) {
        (Role::State, _) => {
            let ok = engine.starts_with("ReplacingMergeTree(updated_at)")
                || engine.starts_with("ReplicatedReplacingMergeTree(")
                || engine.starts_with("SharedReplacingMergeTree(");
            if !ok {
                return Err(misconfigured(format!(
                    "the state table {describe} has engine `{}`, expected ReplacingMergeTree(updated_at)",
                    shown(120)
                )));
            }
        }
        (Role::Lock, LockEngine::KeeperMap) => {
            if !engine.starts_with("KeeperMap") {
                return Err(misconfigured(format!(
                    "the lock table {describe} has engine `{}`, expected KeeperMap",
                    shown(60)
                )));
            }
        }
        (Role::Lock, LockEngine::MergeTree) => {
            if !is_plain_merge_tree(engine) {
                return Err(misconfigured(format!(
                    "the lock table {describe} has engine `{}`: the commit-order lock is only sound on a plain MergeTree on one server (on Replicated and Shared MergeTree, as on ClickHouse Cloud or in a Replicated database, block numbers are taken from Keeper before the commit, so two contenders can both see themselves first); use a single server with a plain MergeTree lock table, or the Keeper-backed lock (KeeperMap)",
                    shown(60)
                )));
            }
            if !engine.contains("enable_block_number_column = 1") {
                return Err(misconfigured(format!(
                    "the lock table {describe} has engine `{}`, expected a MergeTree with enable_block_number_column = 1",
                    shown(120)
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::testing::Scripted;
    use crate::client::{ConnectionOptions, HttpResponse};

    fn answer(engine: &str) -> Scripted {
        let lock_columns = r#"[["state_id","String"],["token","String"],["kind","Enum8('acquire' = 1, 'release' = 2)"],["expires_at","DateTime64(3)"]]"#;
        let state_columns = r#"[["state_id","String"],["partial_state","Nullable(String)"],["completed_state","Nullable(String)"],["updated_at","DateTime64(3)"]]"#;
        let body = format!(
            "{{\"table\":\"state\",\"engine\":\"ReplacingMergeTree(updated_at) ORDER BY state_id\",\"columns\":{state_columns}}}\n{{\"table\":\"state_lock\",\"engine\":\"{engine}\",\"columns\":{lock_columns}}}\n"
        );
        Scripted::new(vec![Ok(HttpResponse {
            status: 200,
            headers: vec![],
            body: body.into_bytes(),
            elapsed_us: 1,
        })])
    }

    fn verify_with(engine: &str) -> Result<(), Error> {
        let t = answer(engine);
        let client =
            crate::client::Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = crate::platform::std_platform::StdPlatform::default();
        verify(
            &Session {
                client: &client,
                platform: &platform,
                retry: crate::client::retry::RetryPolicy::new(0),
                lease: std::time::Duration::from_secs(1),
                replication: Replication::None,
            },
            &Tables {
                database: "meltano".into(),
                state: "state".into(),
                lock: "state_lock".into(),
                lock_engine: LockEngine::MergeTree,
                replication: Replication::None,
            },
        )
        .map(|_| ())
    }

    #[test]
    fn replicated_and_shared_lock_tables_are_refused() {
        assert!(verify_with(
            "MergeTree ORDER BY (state_id, token) TTL toDateTime(expires_at) + toIntervalDay(1) SETTINGS enable_block_number_column = 1, index_granularity = 8192"
        )
        .is_ok());
        for engine in [
            "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY (state_id, token) SETTINGS enable_block_number_column = 1",
            "SharedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY (state_id, token) SETTINGS enable_block_number_column = 1",
        ] {
            let e = verify_with(engine).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Misconfigured);
            assert!(e.message.contains("only sound on a plain MergeTree"), "{}", e.message);
            assert!(e.message.contains("KeeperMap"), "{}", e.message);
        }
    }
}
