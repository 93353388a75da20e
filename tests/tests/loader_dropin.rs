//! The Singer target as a drop-in for the Meltano Hub's target-clickhouse, through the
//! reference host against the real engine: the Hub plugin's config (its defaults and a
//! `sqlalchemy_url`) loads; streams go to the tables Singer SDK targets name; a table the Hub's
//! target created decides the types, and what it cannot hold is refused naming the record; the
//! records SDK taps send (dates with a midnight time, properties not in the SCHEMA) load.

use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::{cli, clickhouse, output_with_stdin, unique_name};
use serde_json::{json, Value};

/// A config file of the test's own, removed when dropped.
struct Config(std::path::PathBuf);

impl Drop for Config {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Config {
    fn new(config: &Value) -> Config {
        let dir = std::env::temp_dir().join(unique_name("loader-dropin"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        Config(dir)
    }

    /// Runs the target on `input`: (exit code, stdout, stderr).
    fn run(&self, input: &str) -> (Option<i32>, String, String) {
        let mut cmd = cli(clickhouse());
        cmd.args(["target", "--config"])
            .arg(self.0.join("config.json"));
        let out = output_with_stdin(&mut cmd, input.as_bytes());
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }
}

/// What Meltano passes for the Hub's target-clickhouse (shaped-ai) when only `pip_url` is
/// changed: every setting with a default, at its default (meltano/hub's shaped-ai.yml).
fn hub_defaults() -> Value {
    json!({"database": "default", "driver": "http", "hard_delete": false, "host": "localhost",
        "load_method": "append-only", "optimize_after": false, "port": 8123,
        "process_activate_version_messages": true, "secure": false, "username": "default",
        "validate_records": true, "verify": true})
}

/// The test server as a SQLAlchemy URL (`clickhouse+http://user:password@host:port/db`).
fn sqlalchemy_url(database: &str) -> String {
    let server = clickhouse();
    let authority = server
        .url
        .split_once("://")
        .unwrap()
        .1
        .trim_end_matches('/');
    format!(
        "clickhouse+http://{}:{}@{authority}/{database}",
        server.user, server.password
    )
}

fn lines(messages: &[Value]) -> String {
    messages.iter().map(|m| format!("{m}\n")).collect()
}

/// Drops the test's databases when it ends, passed or not.
struct Databases(Vec<String>);

impl Drop for Databases {
    fn drop(&mut self) {
        for db in &self.0 {
            sql().exec("DROP DATABASE IF EXISTS {db:Identifier}", &[("db", db)]);
        }
    }
}

/// The Hub plugin's config, changed in nothing but the connection: a stream `schema-Table`
/// lands in database `schema`, table `table` (names conformed as the SDK conforms them); a date
/// sent with a midnight time is stored as that date; a property not in the SCHEMA is dropped
/// with a warning; nothing is warned about the Hub's defaults.
#[test]
fn the_hubs_plugin_config_loads_into_the_tables_sdk_targets_name() {
    let schema_part = unique_name("hub");
    let _dbs = Databases(vec![schema_part.clone()]);
    let mut config = hub_defaults();
    config["sqlalchemy_url"] = sqlalchemy_url("default").into();
    let config = Config::new(&config);
    let stream = format!("{schema_part}-Order.Lines");
    let schema = json!({"properties": {
        "Id": {"type": "integer"},
        "firstName": {"type": ["null", "string"]},
        "Tags": {"type": ["null", "array"], "items": {"type": "string"}},
        "Born": {"type": ["null", "string"], "format": "date"},
        "Price": {"type": ["null", "number"], "multipleOf": 0.01},
        "1st place": {"type": ["null", "boolean"]}
    }});
    let record = |id: u64| {
        json!({"type": "RECORD", "stream": stream, "record": {"Id": id, "firstName": format!("n{id}"),
            "Tags": ["a", "b c"], "Born": "1999-12-31T00:00:00+00:00",
            "Price": format!("{id}.25").parse::<f64>().unwrap(), "1st place": id.is_multiple_of(2),
            "not_declared": {"x": id}}})
    };
    let mut messages = vec![json!({"type": "SCHEMA", "stream": stream, "schema": schema,
        "key_properties": ["Id"]})];
    messages.extend((1..=3).map(record));
    messages.push(json!({"type": "STATE", "value": {"bookmarks": {"o": 3}}}));
    messages.extend((4..=5).map(record));
    messages.push(json!({"type": "STATE", "value": {"bookmarks": {"o": 5}}}));
    let (code, out, err) = config.run(&lines(&messages));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), r#"{"bookmarks":{"o":5}}"#);
    assert!(
        !err.contains("warning: setting"),
        "the Hub's defaults are quiet: {err}"
    );
    assert_eq!(
        err.matches("property 'not_declared' is not in the stream's SCHEMA: it is not loaded")
            .count(),
        1,
        "one warning per stream and property: {err}"
    );
    let db = [("db", schema_part.as_str())];
    let columns = sql().rows(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 'order_lines' ORDER BY position",
        &db,
    );
    let columns: Vec<(String, String)> = columns
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().into(),
                c["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        ("id", "Int64"),
        ("firstname", "Nullable(String)"),
        ("tags", "Nullable(String)"),
        ("born", "Nullable(Date32)"),
        ("price", "Nullable(Decimal(38, 2))"),
        ("bst_place", "Nullable(Bool)"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(columns, want);
    let rows = sql().rows(
        "SELECT id, firstname, tags, toString(born) AS born, toString(price) AS price, bst_place \
         FROM {db:Identifier}.order_lines ORDER BY id",
        &db,
    );
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(
        rows[3],
        json!({"id": 4, "firstname": "n4", "tags": "[\"a\",\"b c\"]", "born": "1999-12-31",
            "price": "4.25", "bst_place": true})
    );
}

/// Two streams without a schema part go to `database`; with `default_target_schema` every
/// stream goes there; `conform_names: false` keeps the stream's and properties' names.
#[test]
fn default_target_schema_and_verbatim_names() {
    let target = unique_name("dts");
    let plain = unique_name("plain");
    let _dbs = Databases(vec![target.clone(), plain.clone()]);
    let schema = json!({"properties": {"Id": {"type": "integer"}}});
    let input = |stream: &str| {
        lines(&[
            json!({"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": []}),
            json!({"type": "RECORD", "stream": stream, "record": {"Id": 1}}),
        ])
    };
    let mut config = hub_defaults();
    config["sqlalchemy_url"] = sqlalchemy_url(&plain).into();
    config["default_target_schema"] = target.clone().into();
    let (code, _, err) = Config::new(&config).run(&input("public-Users"));
    assert_eq!(code, Some(0), "{err}");
    let count = |db: &str, table: &str| {
        sql().count(
            "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            &[("db", db), ("t", table)],
        )
    };
    assert_eq!(count(&target, "users"), 1);
    config["default_target_schema"] = Value::Null;
    config["conform_names"] = false.into();
    let (code, _, err) = Config::new(&config).run(&input("Raw.Users"));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(count(&plain, "Raw.Users"), 1);
    let id = sql().rows(
        "SELECT name FROM system.columns WHERE database = {db:String}",
        &[("db", &plain)],
    );
    assert_eq!(id, [json!({"name": "Id"})]);
}

/// A table the Hub's target created (its types: Float32, DateTime, String for JSON) is
/// loaded as it is: values parsed for its types, a value it cannot hold exactly refused
/// naming the record's line and property, nothing of the run written past the last STATE.
#[test]
fn a_table_the_hubs_target_created_decides_the_types() {
    let db = unique_name("hubtable");
    let _dbs = Databases(vec![db.clone()]);
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.events (id Int64, price Float32, at Nullable(DateTime), \
         day Nullable(Date), tags String) ENGINE = MergeTree ORDER BY id \
         SETTINGS non_replicated_deduplication_window = 100",
        &[("db", &db)],
    );
    let mut config = hub_defaults();
    config["sqlalchemy_url"] = sqlalchemy_url(&db).into();
    config["database"] = db.clone().into();
    let config = Config::new(&config);
    let schema = json!({"type": "SCHEMA", "stream": "events", "key_properties": ["id"],
        "schema": {"properties": {"id": {"type": "integer"}, "price": {"type": "number"},
            "at": {"type": ["null", "string"], "format": "date-time"},
            "day": {"type": ["null", "string"], "format": "date"},
            "tags": {"type": "array", "items": {"type": "string"}}}}});
    let record = |id: u64, price: f64, at: &str, day: &str| {
        json!({"type": "RECORD", "stream": "events", "record":
            {"id": id, "price": price, "at": at, "day": day, "tags": ["x"]}})
    };
    let good = lines(&[
        schema.clone(),
        record(1, 1.5, "2024-01-01T10:00:00Z", "2024-01-01T00:00:00Z"),
        record(2, 0.25, "2024-01-01T10:00:01+01:00", "2024-01-02"),
        json!({"type": "STATE", "value": {"n": 2}}),
    ]);
    let (code, out, err) = config.run(&good);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), r#"{"n":2}"#);
    let rows = sql.rows(
        "SELECT id, price, toString(at, 'UTC') AS at, toString(day) AS day, tags FROM {db:Identifier}.events ORDER BY id",
        &[("db", &db)],
    );
    assert_eq!(
        rows,
        [
            json!({"id": 1, "price": 1.5, "at": "2024-01-01 10:00:00", "day": "2024-01-01", "tags": "[\"x\"]"}),
            json!({"id": 2, "price": 0.25, "at": "2024-01-01 09:00:01", "day": "2024-01-02", "tags": "[\"x\"]"}),
        ]
    );
    // Microseconds a DateTime cannot hold; a date with a time of day: each refused by line
    // and property, and no STATE passes them.
    for (bad, says) in [
        (
            record(3, 2.0, "2024-01-01T10:00:00.123456Z", "2024-01-03"),
            "line 2 (stream 'events')",
        ),
        (
            record(3, 2.0, "2024-01-01T10:00:00Z", "2024-01-03T12:00:00Z"),
            "property 'day'",
        ),
    ] {
        let input = lines(&[
            schema.clone(),
            bad,
            json!({"type": "STATE", "value": {"n": 3}}),
        ]);
        let (code, out, err) = config.run(&input);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(out.is_empty(), "{out}");
    }
    assert_eq!(
        sql.count("SELECT count() FROM {db:Identifier}.events", &[("db", &db)]),
        2
    );
}

/// Settings the Hub's plugin or the SDK define but this target does not build are refused
/// when ignoring them would change what is stored, warned about when not; an unknown key is
/// warned about naming the nearest setting; a URL and a separate setting that disagree are
/// refused naming both. Nothing is sent in the refused cases.
#[test]
fn declined_settings_are_refused_or_warned_about() {
    let db = unique_name("declined");
    let _dbs = Databases(vec![db.clone()]);
    let input = lines(&[
        json!({"type": "SCHEMA", "stream": "s", "schema": {"properties": {"id": {"type": "integer"}}}, "key_properties": []}),
        json!({"type": "RECORD", "stream": "s", "record": {"id": 1}}),
    ]);
    let base = || {
        let mut c = hub_defaults();
        c["sqlalchemy_url"] = sqlalchemy_url(&db).into();
        c
    };
    for (name, value, says) in [
        (
            "flattening_enabled",
            json!(true),
            "setting flattening_enabled",
        ),
        (
            "port",
            json!(9000),
            "settings port and sqlalchemy_url disagree (9000 against",
        ),
    ] {
        let mut c = base();
        c[name] = value;
        let (code, out, err) = Config::new(&c).run(&input);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            !err.contains(&clickhouse().password) || clickhouse().password.is_empty(),
            "{err}"
        );
        assert!(out.is_empty());
    }
    assert_eq!(
        sql().count(
            "SELECT count() FROM system.databases WHERE name = {db:String}",
            &[("db", &db)]
        ),
        0,
        "nothing was created"
    );
    let mut c = base();
    c["driver"] = "native".into();
    c["optimize_after"] = true.into();
    c["batch_size_row"] = 5.into();
    let (code, _, err) = Config::new(&c).run(&input);
    assert_eq!(code, Some(0), "{err}");
    for says in [
        "warning: setting driver = 'native' has no effect: this target speaks ClickHouse's HTTP interface",
        "warning: setting optimize_after = 'true' has no effect",
        "warning: unknown setting 'batch_size_row' is ignored (did you mean batch_size_rows?)",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
    assert_eq!(
        sql().count("SELECT count() FROM {db:Identifier}.s", &[("db", &db)]),
        1
    );
}

/// A later SCHEMA that widens a property (nullable, more bits) alters its column where every
/// stored value stays exact; the key column keeps its type; a narrower declaration changes
/// nothing, and a value the column cannot hold is refused naming the record.
#[test]
fn a_widened_property_alters_its_column_without_loss() {
    let db = unique_name("widen");
    let _dbs = Databases(vec![db.clone()]);
    let mut config = hub_defaults();
    config["sqlalchemy_url"] = sqlalchemy_url(&db).into();
    let config = Config::new(&config);
    let schema = |n: Value| {
        json!({"type": "SCHEMA", "stream": "w", "key_properties": ["id"],
            "schema": {"properties": {"id": {"type": "integer"}, "n": n}}})
    };
    let record =
        |id: u64, n: Value| json!({"type": "RECORD", "stream": "w", "record": {"id": id, "n": n}});
    let first = lines(&[schema(json!({"type": "integer"})), record(1, json!(5))]);
    let (code, _, err) = config.run(&first);
    assert_eq!(code, Some(0), "{err}");
    let wide = json!({"type": ["null", "integer"], "maximum": 1e30});
    let big: Value = serde_json::from_str("10000000000000000000000000").unwrap();
    let second = lines(&[schema(wide), record(2, big), record(3, Value::Null)]);
    let (code, _, err) = config.run(&second);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("column 'n' of") && err.contains("widened from Int64 to Nullable(Int128)"),
        "{err}"
    );
    let types = sql().rows(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 'w' ORDER BY position",
        &[("db", &db)],
    );
    assert_eq!(
        types,
        [
            json!({"name": "id", "type": "Int64"}),
            json!({"name": "n", "type": "Nullable(Int128)"})
        ]
    );
    let rows = sql().rows(
        "SELECT id, toString(n) AS n FROM {db:Identifier}.w ORDER BY id",
        &[("db", &db)],
    );
    assert_eq!(
        rows,
        [
            json!({"id": 1, "n": "5"}),
            json!({"id": 2, "n": "10000000000000000000000000"}),
            json!({"id": 3, "n": null}),
        ]
    );
    // Declared narrower again: the column stays; a value past it is refused by line.
    let third = lines(&[schema(json!({"type": "number"})), record(4, json!(1.5))]);
    let (code, _, err) = config.run(&third);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 2 (stream 'w')"), "{err}");
}
