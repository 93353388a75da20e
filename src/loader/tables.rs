//! A SCHEMA made into a table ready to load: the stream routed to its database and table
//! ([`super::names`]), the table created or its new properties added (with `create_tables`),
//! and each column's type read back from the table, which decides how values are read.

use crate::client::retry::DEFAULT_RETRIES;
use crate::client::{Client, Error, ErrorKind, Query, Transport};
use crate::platform::Platform;
use crate::sink::types::Type;
use crate::sink::{Sink, SinkOptions};
use crate::text::escaped;

use super::schema::{self, Column};
use super::{Stream, Target};

/// A column the table has.
pub(super) struct Existing {
    name: String,
    ty: Type,
    /// In the sorting, primary or partition key (ClickHouse changes no such column's type).
    in_key: bool,
}

/// The type a column is altered to when the SCHEMA declares a wider one than it has: a
/// column becoming nullable, an integer becoming a wider integer or a Decimal with room for
/// all its digits, a Decimal becoming one with more places and as many whole digits. Every
/// value the column holds is then held exactly (ClickHouse converts them in place). Key
/// columns, and every other change, keep their type: each value is then read for it, and
/// one it cannot hold is refused, naming the record.
pub(super) fn widened(existing: &Type, declared: &Type, in_key: bool) -> Option<Type> {
    if in_key {
        return None;
    }
    let split = |t: &Type| match t {
        Type::Nullable(inner) => (true, (**inner).clone()),
        t => (false, t.clone()),
    };
    let ((had_null, had), (wants_null, wants)) = (split(existing), split(declared));
    // Only a scalar may become Nullable (not an Array, Map, Tuple, LowCardinality, JSON, ...).
    let scalar = matches!(
        had,
        Type::Int { .. }
            | Type::Float32
            | Type::Float64
            | Type::Bool
            | Type::Decimal { .. }
            | Type::String
            | Type::FixedString(_)
            | Type::Uuid
            | Type::Ipv4
            | Type::Ipv6
            | Type::Date
            | Type::Date32
            | Type::DateTime(_)
            | Type::DateTime64(..)
            | Type::Enum { .. }
    );
    if !scalar {
        return None;
    }
    let whole_digits = |bits: u16| match bits {
        8 => 3,
        16 => 5,
        32 => 10,
        64 => 19,
        _ => u8::MAX,
    };
    let base = match (&had, &wants) {
        (a, b) if a == b => had.clone(),
        (
            Type::Int {
                signed: true,
                bits: a,
            },
            Type::Int {
                signed: true,
                bits: b,
            },
        ) if b > a => wants.clone(),
        (Type::Int { signed: true, bits }, Type::Decimal { precision, scale })
            if precision - scale >= whole_digits(*bits) =>
        {
            wants.clone()
        }
        (
            Type::Decimal {
                precision: p1,
                scale: s1,
            },
            Type::Decimal {
                precision: p2,
                scale: s2,
            },
        ) if s2 >= s1 && p2 - s2 >= p1 - s1 => wants.clone(),
        _ => had.clone(),
    };
    let ty = if had_null || (wants_null && !existing.takes_null()) {
        Type::Nullable(Box::new(base))
    } else {
        base
    };
    (ty != *existing).then_some(ty)
}

/// The suffix of the table an overwrite loads (`TABLE__loading`).
pub(super) const LOADING: &str = "__loading";

/// A table an overwrite loads (`loading`), and the one it replaces at the end.
pub(super) struct Stage {
    database: String,
    table: String,
    loading: String,
}

/// Where a stream's table is, and what it holds.
pub(super) struct Table {
    pub database: String,
    pub table: String,
    pub columns: Vec<Column>,
}

impl<T: Transport + Clone, P: Platform + Clone> Target<'_, T, P> {
    /// A SCHEMA: the stream's table made ready and its sink opened. A stream whose columns are
    /// unchanged keeps its sink; one whose columns changed sends what waits first.
    pub(super) fn schema(
        &mut self,
        stream: &str,
        json_schema: &serde_json::Value,
        keys: &[String],
    ) -> Result<(), Error> {
        let (columns, upsert) = self.declared_columns(stream, json_schema, keys)?;
        if let Some(known) = self.streams.iter().find(|s| s.name == stream) {
            if known.declared == columns {
                return Ok(());
            }
            // The waiting records were read for the old columns: send them first.
            self.flush(None)?;
            self.complete()?;
        }
        let key_columns = schema::key_columns(&columns, keys);
        let table = self.prepare(stream, columns.clone(), &key_columns)?;
        let options = SinkOptions {
            table: format!("{}.{}", table.database, table.table),
            columns: Some(table.columns.iter().map(|c| c.name.clone()).collect()),
            batch_size: Some(self.config.batch_size_rows),
            settings: vec![],
            dedup: self.config.dedup,
            retries: if self.config.dedup {
                DEFAULT_RETRIES
            } else {
                0
            },
            compression: self.config.compression,
        };
        let sink = Sink::open(self.client()?, self.platform.clone(), &options).map_err(|e| {
            let message = format!("stream '{}': {}", escaped(stream), e.message);
            e.clone().reclassify(e.kind, message)
        })?;
        let mut fresh = Stream::new(stream, table, columns, sink);
        fresh.upsert = upsert;

        match self.streams.iter_mut().find(|s| s.name == stream) {
            Some(known) => {
                let carried = (known.chunks_since_state, known.rows, known.activated);
                *known = fresh;
                (known.chunks_since_state, known.rows, known.activated) = carried;
            }
            None => self.streams.push(fresh),
        }
        Ok(())
    }

    /// The columns a SCHEMA declares (flattened first, with `flattening_enabled`), the upsert
    /// version's among them when the stream is upserted (the second value).
    fn declared_columns(
        &mut self,
        stream: &str,
        json_schema: &serde_json::Value,
        keys: &[String],
    ) -> Result<(Vec<Column>, bool), Error> {
        let c = &self.config;
        let flat;
        let json_schema = match &c.flattening {
            Some(f) => {
                flat = super::flatten::flatten_schema(json_schema, stream, f)?;
                &flat
            }
            None => json_schema,
        };
        let mut columns = schema::columns(
            stream,
            json_schema,
            keys,
            c.naming,
            &c.number_type,
            c.add_record_metadata,
        )?;
        let upsert = c.upsert && !keys.is_empty();
        if upsert {
            columns.push(Column {
                property: schema::UPSERT_VERSION.into(),
                name: schema::UPSERT_VERSION.into(),
                ty: Type::Int {
                    signed: false,
                    bits: 64,
                },
                json: false,
                nullable: false,
            });
        } else if c.upsert && self.streams.iter().all(|s| s.name != stream) {
            let _ = writeln!(
                self.log,
                "target: warning: stream '{}' has no key_properties: load_method upsert appends its records (as Singer SDK targets do)",
                escaped(stream)
            );
        }
        Ok((columns, upsert))
    }

    /// The stream's table: created if missing, new properties added, each column with the
    /// type the table has.
    fn prepare(
        &mut self,
        stream: &str,
        mut columns: Vec<Column>,
        keys: &[String],
    ) -> Result<Table, Error> {
        let (database, table) = self
            .config
            .naming
            .route(stream, self.config.default_target_schema.as_deref())?;
        // `table_name` (the Hub's): every stream into that table of `database`, or of the
        // database it names (`db.table`), whatever the stream's schema part.
        let (database, table) = match &self.config.table_name {
            Some(name) => match name.split_once('.') {
                Some((db, t)) => (db.to_string(), t.to_string()),
                None => (self.config.database.clone(), name.clone()),
            },
            None => (
                database.unwrap_or_else(|| self.config.database.clone()),
                table,
            ),
        };
        let client = self.client()?;
        let table = match self.config.overwrite {
            true => self.stage(&client, &database, table)?,
            false => table,
        };
        let shown = format!("{}.{}", escaped(&database), escaped(&table));
        let mut existing = self.existing_columns(&client, &database, &table)?;
        let upsert = columns.iter().any(|c| c.property == schema::UPSERT_VERSION);
        if upsert && !existing.is_empty() {
            self.refuse_unless_replacing(&client, (&database, &table), stream)?;
        }
        if existing.is_empty() {
            self.refuse_unless_creating(&format!(
                "table {shown} (stream '{}') does not exist",
                escaped(stream)
            ))?;
            if !self.databases_ready.contains(&database) {
                self.execute(&client, &schema::create_database(&self.config, &database))?;
                self.databases_ready.push(database.clone());
            }
            let uuid = self.platform.random_uuid();
            let create = schema::create_table(
                &self.config,
                (&database, &table),
                (&columns, keys),
                Some(&uuid),
            )?;
            self.execute(&client, &create)?;
            self.summary.tables_created += 1;
            let _ = writeln!(
                self.log,
                "target: created table {shown} for stream '{}'",
                escaped(stream)
            );
            existing = self.existing_columns(&client, &database, &table)?;
        }
        self.reconcile_columns(
            &client,
            (&database, &table),
            stream,
            &existing,
            &mut columns,
        )?;
        Ok(Table {
            database,
            table,
            columns,
        })
    }

    /// Each column takes the table's type, widened first where the SCHEMA asks for a wider one
    /// that holds every value the column holds (see [`widened`]); a property without a column
    /// gets one (nullable: the rows already stored hold nothing for it).
    fn reconcile_columns(
        &mut self,
        client: &Client<T>,
        (database, table): (&str, &str),
        stream: &str,
        existing: &[Existing],
        columns: &mut [Column],
    ) -> Result<(), Error> {
        let shown = format!("{}.{}", escaped(database), escaped(table));
        for column in columns.iter_mut() {
            if let Some(found) = existing.iter().find(|e| e.name == column.name) {
                let declared = std::mem::replace(&mut column.ty, found.ty.clone());
                let wider = widened(&found.ty, &declared, found.in_key)
                    .filter(|_| self.config.create_tables);
                if let Some(wider) = wider {
                    let query =
                        schema::modify_column(&self.config, database, table, &column.name, &wider);
                    self.execute(client, &query)?;
                    let _ = writeln!(
                        self.log,
                        "target: column '{}' of {shown} widened from {} to {wider}",
                        escaped(&column.name),
                        found.ty
                    );
                    column.ty = wider;
                }
                column.nullable = column.ty.takes_null();
                continue;
            }
            self.refuse_unless_creating(&format!(
                "stream '{}': property '{}' has no column in {shown}",
                escaped(stream),
                escaped(&column.property)
            ))?;
            self.execute(
                client,
                &schema::add_column(&self.config, database, table, column),
            )?;
            let _ = writeln!(
                self.log,
                "target: added column '{}' to {shown}",
                escaped(&column.name)
            );
            if !matches!(column.ty, Type::Nullable(_)) {
                column.ty = Type::Nullable(Box::new(column.ty.clone()));
            }
            column.nullable = true;
        }
        Ok(())
    }

    /// `load_method: overwrite`: the table the stream's records are loaded into,
    /// `TABLE__loading`, dropped the first time in a run (left by a run that did not finish:
    /// this run loads its records again), swapped in at the end ([`Target::swap_in`]).
    fn stage(
        &mut self,
        client: &Client<T>,
        database: &str,
        table: String,
    ) -> Result<String, Error> {
        let loading = format!("{table}{LOADING}");
        let known = self
            .stages
            .iter()
            .any(|s| s.database == database && s.loading == loading);
        if !known {
            let drop = schema::drop_table(&self.config, database, &loading);
            self.execute(client, &drop)?;
            self.stages.push(Stage {
                database: database.to_string(),
                table,
                loading: loading.clone(),
            });
        }
        Ok(loading)
    }

    /// `load_method: overwrite`, at the end of the input: each loaded table takes its table's
    /// place in one atomic `EXCHANGE TABLES` (or a `RENAME` when there was none), and the old
    /// one is dropped. The swap is not repeated blindly (a second one would swap back): after
    /// a failure the tables' UUIDs say whether it happened.
    pub(super) fn swap_in(&mut self) -> Result<(), Error> {
        let client = self.client()?;
        for stage in std::mem::take(&mut self.stages) {
            let (db, loading, table) = (&stage.database, &stage.loading, &stage.table);
            let loaded = self.uuid_of(&client, db, loading)?;
            let exists = self.uuid_of(&client, db, table)?.is_some();
            let swap = schema::swap_in(&self.config, db, (loading, table), exists);
            if let Err(e) = client.execute(&swap) {
                // Only a table's own UUID says the swap happened: not the nil UUID of every
                // table of an Ordinary database (which refuses EXCHANGE), nor one node's view
                // of a swap ON CLUSTER.
                let nil = loaded
                    .as_deref()
                    .is_none_or(|u| u.bytes().all(|b| b == b'0' || b == b'-'));
                if nil
                    || self.config.cluster.is_some()
                    || self.uuid_of(&client, db, table)? != loaded
                {
                    let message = format!(
                        "replacing {}.{} by the loaded table: {}",
                        escaped(db),
                        escaped(table),
                        e.message
                    );
                    return Err(e.clone().reclassify(e.kind, message));
                }
            }
            if exists {
                self.execute(&client, &schema::drop_table(&self.config, db, loading))?;
            }
            let _ = writeln!(
                self.log,
                "target: table {}.{} replaced by the records of this run (load_method: overwrite)",
                escaped(db),
                escaped(table)
            );
        }
        Ok(())
    }

    /// ACTIVATE_VERSION's end, once every record is acknowledged: each stream that sent one
    /// has its rows of older versions deleted (`hard_delete`) or marked in `_sdc_deleted_at`.
    /// Not a stream whose last records wait for the tap's next run (they are this version's
    /// too: its older rows stay until a run loads all of it), nor one without a STATE after
    /// its last record (a tap that failed mid-stream: its rows so far are not the source's).
    pub(super) fn retire_versions(&mut self) -> Result<(), Error> {
        if !self.streams.iter().any(|s| s.activated.is_some()) {
            return Ok(());
        }
        let client = self.client()?;
        let mut now = Vec::new();
        super::records::write_instant(&mut now, self.platform.wall_clock(), 6);
        // `"2026-12-05T12:00:00.123456+00:00"` as a DateTime64 parameter's text.
        let now = String::from_utf8_lossy(&now)
            .trim_matches('"')
            .trim_end_matches("+00:00")
            .replace('T', " ");
        for s in &self.streams {
            let Some(version) = s.activated else { continue };
            let column = |property: &str| {
                s.columns
                    .iter()
                    .find(|c| c.property == property)
                    .map(|c| c.name.as_str())
            };
            let (Some(versions), Some(deleted)) =
                (column("_sdc_table_version"), column("_sdc_deleted_at"))
            else {
                continue;
            };
            let (db, table) = (&s.place.0, &s.place.1);
            let what = match self.config.hard_delete {
                true => "deleted",
                false => "marked deleted in _sdc_deleted_at",
            };
            let kept = match (s.held, s.settled) {
                (true, _) => Some("records of this version wait for the tap's next run"),
                (false, false) => Some(
                    "no STATE came after the stream's last record (the tap may have stopped early)",
                ),
                _ => None,
            };
            if let Some(why) = kept {
                let _ = writeln!(
                    self.log,
                    "target: warning: stream '{}': rows of versions before {version} are kept in {}.{}: {why}",
                    escaped(&s.name), escaped(db), escaped(table)
                );
                continue;
            }
            let marked_at = (!self.config.hard_delete).then_some(now.as_str());
            let retire = schema::retire_versions(
                &self.config,
                (db, table),
                (versions, deleted),
                version,
                marked_at,
            );
            self.execute(&client, &retire).map_err(|e| {
                let message = format!(
                    "stream '{}': retiring the rows of versions before {version} (ACTIVATE_VERSION) in {}.{}: {}",
                    escaped(&s.name), escaped(db), escaped(table), e.message
                );
                e.clone().reclassify(e.kind, message)
            })?;
            let _ = writeln!(
                self.log,
                "target: stream '{}': rows of versions before {version} {what} (ACTIVATE_VERSION)",
                escaped(&s.name)
            );
        }
        Ok(())
    }

    /// A table's UUID (none: it does not exist).
    fn uuid_of(
        &self,
        client: &Client<T>,
        database: &str,
        table: &str,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .table_facts(client, database, table)?
            .map(|(uuid, _)| uuid))
    }

    /// A table's UUID and engine (none: it does not exist).
    fn table_facts(
        &self,
        client: &Client<T>,
        database: &str,
        table: &str,
    ) -> Result<Option<(String, String)>, Error> {
        let query = Query::read(
            "target-table-facts",
            "SELECT toString(uuid), engine FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        )
        .param("db", database)
        .param("t", table)
        .format("TSV");
        let response = self.execute(client, &query)?;
        let text = String::from_utf8_lossy(&response.body);
        Ok(text
            .trim_end_matches('\n')
            .split_once('\t')
            .map(|(uuid, engine)| (uuid.to_string(), engine.to_string())))
    }

    /// `load_method: upsert` into an existing table: only a ReplacingMergeTree keeps one row
    /// per key (one without the version keeps the last row inserted).
    fn refuse_unless_replacing(
        &self,
        client: &Client<T>,
        (database, table): (&str, &str),
        stream: &str,
    ) -> Result<(), Error> {
        let engine = self
            .table_facts(client, database, table)?
            .map(|(_, engine)| engine)
            .unwrap_or_default();
        if engine.contains("ReplacingMergeTree") {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Misconfigured,
            format!(
                "stream '{}': load_method upsert needs a ReplacingMergeTree, and table {}.{} is a {}, which keeps every row: load it with append-only, or replace the table",
                escaped(stream),
                escaped(database),
                escaped(table),
                escaped(&engine)
            ),
        ))
    }

    fn refuse_unless_creating(&self, what: &str) -> Result<(), Error> {
        if self.config.create_tables {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Misconfigured,
                format!("{what}, and create_tables is off"),
            ))
        }
    }

    /// One of the target's own statements (the columns read, `CREATE ... IF NOT EXISTS`,
    /// `ADD COLUMN IF NOT EXISTS`: each safe to repeat, even after a lost answer), repeated
    /// as the sink's requests are when it fails in a way that may pass.
    fn execute(&self, client: &Client<T>, query: &Query) -> Result<crate::client::Response, Error> {
        crate::client::retry::run(
            &crate::client::retry::RetryPolicy::new(DEFAULT_RETRIES),
            &self.platform,
            None,
            || client.execute(query),
            |e| crate::client::retry::is_worth_retrying(e.kind),
        )
        .map(|retried| retried.value)
    }

    /// The columns of a table (none: it does not exist).
    fn existing_columns(
        &self,
        client: &Client<T>,
        database: &str,
        table: &str,
    ) -> Result<Vec<Existing>, Error> {
        let query = Query::read(
            "target-columns",
            "SELECT name, type, is_in_sorting_key OR is_in_primary_key OR is_in_partition_key OR is_in_sampling_key FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        )
        .param("db", database)
        .param("t", table)
        .format("JSONCompactEachRow");
        let response = self.execute(client, &query)?;
        let unreadable = || {
            Error::new(
                ErrorKind::Permanent,
                format!(
                    "the columns of {}.{} came back unreadable",
                    escaped(database),
                    escaped(table)
                ),
            )
        };
        response
            .body
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                let (name, ty, in_key): (String, String, u8) =
                    serde_json::from_slice(line).map_err(|_| unreadable())?;
                let ty = Type::parse(&ty).unwrap_or(Type::Other(ty));
                Ok(Existing {
                    name,
                    ty,
                    in_key: in_key != 0,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widen(existing: &str, declared: &str, in_key: bool) -> Option<String> {
        let t = |s: &str| Type::parse(s).unwrap();
        widened(&t(existing), &t(declared), in_key).map(|t| t.to_string())
    }

    #[test]
    fn only_lossless_widenings_are_applied() {
        for (existing, declared, want) in [
            ("Int64", "Nullable(Int64)", Some("Nullable(Int64)")),
            ("Int64", "Int128", Some("Int128")),
            ("Int64", "Nullable(Int256)", Some("Nullable(Int256)")),
            ("Int64", "Decimal(38, 2)", Some("Decimal(38, 2)")),
            (
                "Nullable(Int32)",
                "Decimal(12, 2)",
                Some("Nullable(Decimal(12, 2))"),
            ),
            ("Decimal(18, 2)", "Decimal(38, 4)", Some("Decimal(38, 4)")),
            // Narrower, lossy or unrelated: kept (values decide).
            ("Int64", "Decimal(18, 0)", None),
            ("Int128", "Int64", None),
            ("Decimal(18, 2)", "Decimal(18, 4)", None),
            ("Decimal(18, 4)", "Decimal(38, 2)", None),
            ("Float32", "Float64", None),
            ("Float64", "Decimal(38, 9)", None),
            ("String", "Int64", None),
            ("Nullable(Int64)", "Int64", None),
            ("Int64", "Int64", None),
        ] {
            assert_eq!(
                widen(existing, declared, false).as_deref(),
                want,
                "{existing} to {declared}"
            );
        }
        assert_eq!(
            widen("Int64", "Nullable(Int128)", true),
            None,
            "a key column keeps its type"
        );
    }
}
