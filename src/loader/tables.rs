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
        let c = &self.config;
        let columns = schema::columns(stream, json_schema, keys, c.naming, &c.number_type)?;
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
        let fresh = Stream::new(stream, table, columns, sink);

        match self.streams.iter_mut().find(|s| s.name == stream) {
            Some(known) => {
                let carried = (known.chunks_since_state, known.rows);
                *known = fresh;
                (known.chunks_since_state, known.rows) = carried;
            }
            None => self.streams.push(fresh),
        }
        Ok(())
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
        let database = database.unwrap_or_else(|| self.config.database.clone());
        let table = self.config.table_name.clone().unwrap_or(table);
        let client = self.client()?;
        let shown = format!("{}.{}", escaped(&database), escaped(&table));
        let mut existing = self.existing_columns(&client, &database, &table)?;
        if existing.is_empty() {
            self.refuse_unless_creating(&format!(
                "table {shown} (stream '{}') does not exist",
                escaped(stream)
            ))?;
            if !self.databases_ready.contains(&database) {
                self.execute(&client, &schema::create_database(&self.config, &database))?;
                self.databases_ready.push(database.clone());
            }
            self.execute(
                &client,
                &schema::create_table(&self.config, &database, &table, &columns, keys)?,
            )?;
            self.summary.tables_created += 1;
            let _ = writeln!(
                self.log,
                "target: created table {shown} for stream '{}'",
                escaped(stream)
            );
            existing = self.existing_columns(&client, &database, &table)?;
        }
        self.add_missing_columns(
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

    /// Each column takes the table's type; a property without a column gets one (nullable:
    /// the rows already stored hold nothing for it).
    fn add_missing_columns(
        &mut self,
        client: &Client<T>,
        (database, table): (&str, &str),
        stream: &str,
        existing: &[(String, Type)],
        columns: &mut [Column],
    ) -> Result<(), Error> {
        let shown = format!("{}.{}", escaped(database), escaped(table));
        for column in columns.iter_mut() {
            if let Some((_, ty)) = existing.iter().find(|(name, _)| *name == column.name) {
                column.ty = ty.clone();
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

    /// The columns of a table and their types (none: it does not exist).
    fn existing_columns(
        &self,
        client: &Client<T>,
        database: &str,
        table: &str,
    ) -> Result<Vec<(String, Type)>, Error> {
        let query = Query::read(
            "target-columns",
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
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
                let (name, ty): (String, String) =
                    serde_json::from_slice(line).map_err(|_| unreadable())?;
                let ty = Type::parse(&ty).unwrap_or(Type::Other(ty));
                Ok((name, ty))
            })
            .collect()
    }
}
