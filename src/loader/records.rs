//! A RECORD made to fit its table, as Singer SDK targets load records: a property that is not
//! in the SCHEMA is dropped (with one warning per stream and property), a property left out is
//! null (refused when its column takes no null), names become their columns', a JSON value
//! bound for a column of strings becomes its JSON text, and a date written with a midnight
//! time (`2024-01-01T00:00:00+00:00`, as SDK taps write dates) becomes that date. Everything
//! else goes to the sink as written, which parses each value for its column's type.

use std::time::Duration;

use crate::client::{Error, Transport};
use crate::platform::Platform;
use crate::sink::json::{object_fields, Key};
use crate::sink::scalars::civil_from_days;
use crate::sink::types::Type;
use crate::text::escaped;

use super::schema::{Column, SDC_METADATA, UPSERT_VERSION};
use super::Target;

/// What a RECORD message says of its record besides it (`add_record_metadata`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FromMessage<'a> {
    /// `time_extracted`'s JSON text.
    pub time_extracted: Option<&'a [u8]>,
    /// `version`'s JSON text.
    pub version: Option<&'a [u8]>,
}

/// What a record's line holds besides the record, last: its `load_method: upsert` version
/// and its metadata (`add_record_metadata`), each when asked for. All of it changes when the
/// same record is read again.
#[derive(Default)]
struct Clocks<'a> {
    version: Option<u64>,
    metadata: Option<Metadata<'a>>,
}

/// The metadata values of one record (`add_record_metadata`): what its message says, and the
/// clocks, read as the Singer SDK reads them.
struct Metadata<'a> {
    message: FromMessage<'a>,
    /// Wall-clock time the record was read, and its batch (the stream's waiting records) began.
    received: Duration,
    batched: Duration,
    /// Wall-clock time the target started.
    sync_started: Duration,
    /// The message's `version` is part of the record as read (`process_activate_version_messages`):
    /// written before [`FIRST_CLOCK`], in the chunk's token. A rerun of a full-table sync sends
    /// a new version, and must not be taken for the run whose version it retires.
    version_in_token: bool,
}

impl<T: Transport + Clone, P: Platform + Clone> Target<'_, T, P> {
    /// A RECORD: checked against its stream's properties and put in its buffer.
    pub(super) fn record(
        &mut self,
        stream: &str,
        record: &[u8],
        properties: &[Key],
        message: FromMessage<'_>,
        line_no: u64,
    ) -> Result<(), Error> {
        let Some(index) = self.streams.iter().position(|s| s.name == stream) else {
            return Err(Error::invalid(format!(
                "line {line_no}: a RECORD of stream '{}' before its SCHEMA",
                escaped(stream)
            )));
        };
        let refused = |why: String| {
            Error::invalid(format!(
                "line {line_no} (stream '{}'): {why}",
                escaped(stream)
            ))
        };
        shape(record, properties).map_err(refused)?;
        let extra = self.drop_undeclared(index, properties);
        let clocks = self.clocks(index, message);
        let s = &mut self.streams[index];
        let missing: Vec<&Column> = s
            .columns
            .iter()
            .filter(|c| {
                !properties
                    .iter()
                    .any(|k| k.as_ref() == c.property.as_bytes())
            })
            .collect();
        let required = missing
            .iter()
            .find(|c| !c.nullable && !filled_by_target(c, &clocks));
        if let Some(required) = required {
            return Err(refused(format!(
                "property '{}' is missing, and its column takes no null",
                escaped(&required.property)
            )));
        }
        let before = s.pending.len();
        if missing.is_empty() && !extra && !s.rewrites {
            s.pending.extend_from_slice(record);
        } else {
            rewrite(record, &s.columns, &missing, &clocks, &mut s.pending).map_err(refused)?;
        }
        s.pending.push(b'\n');
        s.lines.push(super::RecordOrigin {
            line: line_no,
            file: self.reading_file,
        });
        self.summary.records += 1;
        self.pending_rows += 1;
        self.pending_bytes += (s.pending.len() - before) as u64;
        Ok(())
    }
}

impl<T: Transport + Clone, P: Platform + Clone> Target<'_, T, P> {
    /// What stream `index`'s next record gets besides its properties: its upsert version and
    /// its metadata, each when asked for, read from the clocks once.
    fn clocks<'m>(&mut self, index: usize, message: FromMessage<'m>) -> Clocks<'m> {
        let s = &mut self.streams[index];
        let metadata = self.config.add_record_metadata;
        if !metadata && !s.upsert {
            return Clocks::default();
        }
        let received = self.platform.wall_clock();
        Clocks {
            // Read later, newer: strictly increasing within the run.
            version: s.upsert.then(|| {
                let nanos = u64::try_from(received.as_nanos()).unwrap_or(u64::MAX);
                self.last_version = nanos.max(self.last_version + 1);
                self.last_version
            }),
            metadata: metadata.then(|| Metadata {
                message,
                received,
                batched: *s.batch_started.get_or_insert(received),
                sync_started: self.started,
                version_in_token: self.config.activate_versions,
            }),
        }
    }

    /// Whether the record has properties its stream's SCHEMA does not declare; each is named
    /// in a warning the first time (they are dropped, as Singer SDK targets drop them).
    fn drop_undeclared(&mut self, index: usize, properties: &[Key]) -> bool {
        let s = &mut self.streams[index];
        let mut extra = false;
        for property in properties {
            if s.columns
                .iter()
                .any(|c| c.property.as_bytes() == property.as_ref())
            {
                continue;
            }
            extra = true;
            let metadata = SDC_METADATA
                .iter()
                .any(|m| m.as_bytes() == property.as_ref());
            if !metadata && !s.dropped.contains(&property.to_vec()) {
                s.dropped.push(property.to_vec());
                let _ = writeln!(
                    self.log,
                    "target: warning: stream '{}': property '{}' is not in the stream's SCHEMA: it is not loaded (Singer SDK targets drop it too)",
                    escaped(&s.name),
                    escaped(&String::from_utf8_lossy(property))
                );
            }
        }
        extra
    }
}

/// A record is an object, each property given once.
fn shape(record: &[u8], properties: &[Key]) -> Result<(), String> {
    if !record.starts_with(b"{") {
        return Err("the record is not a JSON object".into());
    }
    match properties
        .iter()
        .enumerate()
        .find(|(n, k)| properties[..*n].contains(k))
    {
        Some((_, twice)) => Err(format!(
            "property '{}' appears twice",
            escaped(&String::from_utf8_lossy(twice))
        )),
        None => Ok(()),
    }
}

/// Whether records of these columns need [`rewrite`] even when they hold every property and
/// nothing else.
pub(super) fn rewrites(columns: &[Column]) -> bool {
    columns.iter().any(|c| {
        c.property != c.name
            || c.as_json_text()
            || c.is_date()
            || SDC_METADATA.contains(&c.property.as_str())
            || c.property == UPSERT_VERSION
    })
}

/// The first of the metadata fields that change when the same record is read again (the
/// clocks: the tap's `time_extracted`, which SDK taps take from their clock, its `version`
/// unless ACTIVATE_VERSION is acted on, and the target's), which [`rewrite`] writes last: a chunk's deduplication token covers its
/// lines up to it only ([`stable_part`]). Not for upsert, whose tokens cover every byte (the
/// version, written before the metadata, included).
const FIRST_CLOCK: &[u8] = b",\"_sdc_extracted_at\":";

/// A line of the pending buffer without its clock fields, which begin at [`FIRST_CLOCK`]
/// (all of it without them). The field is the line's last of that name: the record's own
/// properties come before it, and a nested key of that name inside them is not the last.
pub(super) fn stable_part(line: &[u8]) -> &[u8] {
    match memchr::memmem::rfind(line, FIRST_CLOCK) {
        Some(at) => &line[..at],
        None => line,
    }
}

/// Whether the target fills `column` with `clocks` rather than from the record: the upsert
/// version, and the metadata but `_sdc_deleted_at` (the record's own, as in the SDK).
fn filled_by_target(column: &Column, clocks: &Clocks) -> bool {
    (clocks.version.is_some() && column.property == UPSERT_VERSION)
        || (clocks.metadata.is_some()
            && column.property != "_sdc_deleted_at"
            && SDC_METADATA.contains(&column.property.as_str()))
}

/// A record written out to fit its columns, then its `clocks` (the record's own `_sdc_`
/// properties give way to the metadata, except `_sdc_deleted_at`, as in the SDK).
fn rewrite(
    record: &[u8],
    columns: &[Column],
    missing: &[&Column],
    clocks: &Clocks,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let filled = |c: &Column| filled_by_target(c, clocks);
    let fields = object_fields(record, None)
        .map_err(|_| "the record is not a JSON object of properties".to_string())?;
    out.push(b'{');
    let mut first = true;
    let mut name = |out: &mut Vec<u8>, name: &str| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name).expect("a string writes");
        out.push(b':');
    };
    for (key, value) in &fields {
        let Some(column) = columns
            .iter()
            .find(|c| c.property.as_bytes() == key.as_ref() && !filled(c))
        else {
            continue;
        };
        name(out, &column.name);
        if *value == b"null" {
            out.extend_from_slice(value);
        } else if column.as_json_text() {
            let text =
                std::str::from_utf8(value).map_err(|_| "the record is not UTF-8".to_string())?;
            serde_json::to_writer(&mut *out, text).expect("a string writes");
        } else if column.is_date() {
            let date = date_of(value)
                .map_err(|why| format!("property '{}': {why}", escaped(&column.property)))?;
            out.extend_from_slice(date);
            if date.len() < value.len() {
                out.push(b'"');
            }
        } else {
            out.extend_from_slice(value);
        }
    }
    for column in missing.iter().filter(|c| !filled(c)) {
        name(out, &column.name);
        out.extend_from_slice(b"null");
    }
    write_clocks(out, columns, clocks, &mut name);
    out.push(b'}');
    Ok(())
}

/// A record's `clocks`, after its properties (`name` writes a field's name).
fn write_clocks(
    out: &mut Vec<u8>,
    columns: &[Column],
    clocks: &Clocks,
    name: &mut dyn FnMut(&mut Vec<u8>, &str),
) {
    let column = |property: &str| {
        columns
            .iter()
            .find(|c| c.property == property)
            .expect("a table of a stream with these clocks has their columns")
    };
    // The upsert version first.
    if let Some(version) = clocks.version {
        name(out, &column(UPSERT_VERSION).name);
        out.extend_from_slice(version.to_string().as_bytes());
    }
    let Some(m) = &clocks.metadata else {
        return;
    };
    // The metadata: `_sdc_extracted_at` first (FIRST_CLOCK), the version before it when the
    // tokens cover it.
    let extracted = ("_sdc_extracted_at", m.message.time_extracted);
    let version = ("_sdc_table_version", m.message.version);
    let message = match m.version_in_token {
        true => [version, extracted],
        false => [extracted, version],
    };
    for (property, value) in message {
        name(out, &column(property).name);
        out.extend_from_slice(value.unwrap_or(b"null"));
    }
    // The target's clocks.
    for (property, at) in [
        ("_sdc_received_at", m.received),
        ("_sdc_batched_at", m.batched),
    ] {
        let column = column(property);
        name(out, &column.name);
        write_instant(out, at, fraction_digits(column));
    }
    let sequence = (m.received.as_nanos() + 500_000) / 1_000_000;
    let started = m.sync_started.as_millis();
    for (property, millis) in [
        ("_sdc_sequence", sequence),
        ("_sdc_sync_started_at", started),
    ] {
        name(out, &column(property).name);
        out.extend_from_slice(millis.to_string().as_bytes());
    }
}

/// The fractional digits of an instant written into `column`: its `DateTime64`'s precision
/// (up to 9), none for a `DateTime`, else microseconds (as the SDK's `isoformat()`).
fn fraction_digits(column: &Column) -> usize {
    let ty = match column.ty.values() {
        Type::Nullable(inner) => inner.values(),
        ty => ty,
    };
    match ty {
        Type::DateTime64(p, _) => usize::from(*p).min(9),
        Type::DateTime(_) => 0,
        _ => 6,
    }
}

/// `at` (since 1970) as a quoted ISO 8601 UTC instant, `2026-12-05T12:00:00.123456+00:00`,
/// with `digits` fractional digits (cut, not rounded: a clock's reading).
pub(super) fn write_instant(out: &mut Vec<u8>, at: Duration, digits: usize) {
    let seconds = at.as_secs() as i64;
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    let mut text = format!(
        "\"{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    );
    if digits > 0 {
        let nanos = format!("{:09}", at.subsec_nanos());
        text.push('.');
        text.push_str(&nanos[..digits]);
    }
    text.push_str("+00:00\"");
    out.extend_from_slice(text.as_bytes());
}

/// A date value as the sink reads it (without its closing quote when it is cut short): a
/// quoted `YYYY-MM-DD` as it is; one followed by a time
/// of midnight (`T` or a space, `00:00`, `:00`, zeros after a point) and no offset, `Z`, or an
/// offset at or behind UTC, whose instant falls on that date in UTC too, as the date alone.
/// Any other time part is refused: that value is not a date. Anything else goes on as it is
/// (the sink says what is wrong with it).
fn date_of(value: &[u8]) -> Result<&[u8], String> {
    let quoted = value.len() >= 12 && value[0] == b'"' && value[value.len() - 1] == b'"';
    if !quoted || value[5] != b'-' || value[8] != b'-' || !matches!(value[11], b'T' | b't' | b' ') {
        return Ok(value);
    }
    let shown = || String::from_utf8_lossy(value).into_owned();
    let time = &value[12..value.len() - 1];
    let (clock, offset) = match time
        .iter()
        .position(|b| matches!(b, b'Z' | b'z' | b'+' | b'-'))
    {
        Some(i) => time.split_at(i),
        None => (time, &b""[..]),
    };
    let midnight = clock.starts_with(b"00:00")
        && match &clock[5..] {
            [] => true,
            [b':', b'0', b'0', rest @ ..] => {
                rest.is_empty()
                    || (rest[0] == b'.' && rest.len() > 1 && rest[1..].iter().all(|b| *b == b'0'))
            }
            _ => false,
        };
    if !midnight {
        return Err(format!(
            "{} is a date with a time of day, which a date column cannot hold (only midnight is read as the date)",
            shown()
        ));
    }
    let behind_utc = match offset {
        [] | [b'Z' | b'z'] => true,
        [b'+' | b'-', digits @ ..] => {
            let zero = digits.iter().all(|b| matches!(b, b'0' | b':'));
            let shape = matches!(digits.len(), 2 | 4 | 5)
                && digits.iter().filter(|b| b.is_ascii_digit()).count() >= 2;
            shape && (zero || offset[0] == b'-')
        }
        _ => false,
    };
    if !behind_utc {
        return Err(format!(
            "{} is midnight at an offset ahead of UTC, an instant of the day before in UTC: send the date alone",
            shown()
        ));
    }
    Ok(&value[..11])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::types::Type;

    fn column(property: &str, name: &str, ty: &str, json: bool) -> Column {
        let ty = Type::parse(ty).unwrap();
        Column {
            property: property.into(),
            name: name.into(),
            nullable: ty.takes_null(),
            ty,
            json,
        }
    }

    #[test]
    fn dates_with_a_midnight_time_are_dates_and_other_times_are_refused() {
        for (value, want) in [
            ("\"2024-01-01\"", "\"2024-01-01\""),
            ("\"2024-01-01T00:00:00+00:00\"", "\"2024-01-01"),
            ("\"2024-01-01T00:00:00Z\"", "\"2024-01-01"),
            ("\"2024-01-01 00:00\"", "\"2024-01-01"),
            ("\"2024-01-01T00:00:00.000000-05:00\"", "\"2024-01-01"),
            ("\"2024-01-01T00:00:00-0300\"", "\"2024-01-01"),
            ("\"2024-01-01T00:00:00\"", "\"2024-01-01"),
            // Not a date with a time: the sink judges it.
            ("\"not a date at all\"", "\"not a date at all\""),
            ("20240101", "20240101"),
        ] {
            assert_eq!(
                date_of(value.as_bytes()).unwrap(),
                want.as_bytes(),
                "{value}"
            );
        }
        for (value, says) in [
            ("\"2024-01-01T00:00:01+00:00\"", "time of day"),
            ("\"2024-01-01T12:00:00Z\"", "time of day"),
            ("\"2024-01-01T00:00:00.5Z\"", "time of day"),
            ("\"2024-01-01T00:00:00+05:30\"", "ahead of UTC"),
            ("\"2024-01-01T00:00:00+01\"", "ahead of UTC"),
            ("\"2024-01-01T00:00:00+0\"", "ahead of UTC"),
        ] {
            let why = date_of(value.as_bytes()).unwrap_err();
            assert!(why.contains(says), "{value}: {why}");
        }
    }

    #[test]
    fn metadata_is_filled_as_the_sdk_fills_it_and_the_clocks_come_last() {
        use crate::loader::names::Naming;
        let schema = serde_json::json!({"properties": {
            "id": {"type": "integer"},
            "at": {"type": ["null", "string"], "format": "date-time"},
            "_sdc_deleted_at": {"type": ["null", "string"], "format": "date-time"},
        }});
        let mut columns = crate::loader::schema::columns(
            "s",
            &schema,
            &["id".into()],
            Naming::Conformed,
            &Type::Float64,
            true,
        )
        .unwrap();
        let names: Vec<(&str, String)> = columns
            .iter()
            .map(|c| (c.name.as_str(), c.ty.to_string()))
            .collect();
        assert_eq!(
            names,
            [
                ("id", "Int64".to_string()),
                ("at", "Nullable(DateTime64(6, 'UTC'))".into()),
                ("_sdc_extracted_at", "Nullable(DateTime64(6, 'UTC'))".into()),
                ("_sdc_received_at", "Nullable(DateTime64(6, 'UTC'))".into()),
                ("_sdc_batched_at", "Nullable(DateTime64(6, 'UTC'))".into()),
                ("_sdc_deleted_at", "Nullable(DateTime64(6, 'UTC'))".into()),
                ("_sdc_sequence", "Nullable(Int64)".into()),
                ("_sdc_table_version", "Nullable(Int64)".into()),
                ("_sdc_sync_started_at", "Nullable(Int64)".into()),
            ]
        );
        assert!(rewrites(&columns));
        let metadata = Metadata {
            message: FromMessage {
                time_extracted: Some(br#""2026-12-05T10:00:00.5+00:00""#),
                version: None,
            },
            // 2026-12-05T12:34:56.123456789Z and a second before; started at 12:00.
            received: Duration::new(1_796_474_096, 123_456_789),
            batched: Duration::new(1_796_474_095, 0),
            sync_started: Duration::from_millis(1_796_472_000_999),
            version_in_token: false,
        };
        let mut clocks = Clocks {
            version: None,
            metadata: Some(metadata),
        };
        let written = |record: &[u8], columns: &[Column]| {
            let missing: Vec<&Column> = columns
                .iter()
                .filter(|c| {
                    !record
                        .windows(c.property.len() + 2)
                        .any(|w| w == format!("\"{}\"", c.property).as_bytes())
                })
                .collect();
            let mut out = Vec::new();
            rewrite(record, columns, &missing, &clocks, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        // The record's own _sdc_deleted_at is kept, its _sdc_sequence gives way.
        let line = written(
            br#"{"id":1,"at":null,"_sdc_sequence":5,"_sdc_deleted_at":"2026-01-01T00:00:00Z"}"#,
            &columns,
        );
        assert_eq!(
            line,
            concat!(
                r#"{"id":1,"at":null,"_sdc_deleted_at":"2026-01-01T00:00:00Z","#,
                r#""_sdc_extracted_at":"2026-12-05T10:00:00.5+00:00","_sdc_table_version":null,"#,
                r#""_sdc_received_at":"2026-12-05T12:34:56.123456+00:00","#,
                r#""_sdc_batched_at":"2026-12-05T12:34:55.000000+00:00","#,
                r#""_sdc_sequence":1796474096123,"_sdc_sync_started_at":1796472000999}"#
            )
        );
        // The token covers the line up to the clocks.
        assert_eq!(
            stable_part(line.as_bytes()),
            &line.as_bytes()[..line.find(r#","_sdc_extracted_at""#).unwrap()]
        );
        // A nested key of that name is not the clocks' field.
        let nested = br#"{"o":{"a":1,"_sdc_extracted_at":2},"_sdc_extracted_at":null,"x":1}"#;
        assert_eq!(
            stable_part(nested),
            br#"{"o":{"a":1,"_sdc_extracted_at":2}"#
        );
        // An existing table's DateTime keeps whole seconds, its DateTime64(3) milliseconds.
        for (ty, want) in [
            ("DateTime('UTC')", "12:34:56+00:00"),
            ("DateTime64(3)", "12:34:56.123+00:00"),
        ] {
            let c = columns
                .iter_mut()
                .find(|c| c.property == "_sdc_received_at")
                .unwrap();
            c.ty = Type::parse(ty).unwrap();
            let line = written(br#"{"id":3,"at":null}"#, &columns);
            assert!(
                line.contains(&format!(r#""_sdc_received_at":"2026-12-05T{want}""#)),
                "{line}"
            );
        }
        // Acting on ACTIVATE_VERSION: the version is written before the clocks, in the token.
        let m = clocks.metadata.as_mut().unwrap();
        m.version_in_token = true;
        m.message.version = Some(b"1796472000000");
        let mut out = Vec::new();
        rewrite(br#"{"id":4,"at":null}"#, &columns, &[], &clocks, &mut out).unwrap();
        assert_eq!(
            std::str::from_utf8(stable_part(&out)).unwrap(),
            r#"{"id":4,"at":null,"_sdc_table_version":1796472000000"#
        );
    }

    #[test]
    fn records_are_rewritten_to_their_columns() {
        let columns = [
            column("Id", "id", "Int64", false),
            column("tags", "tags", "String", true),
            column("arr", "arr", "Array(String)", true),
            column("on", "on", "Nullable(Date32)", false),
            column("gone", "gone", "Nullable(String)", false),
        ];
        assert!(rewrites(&columns));
        assert!(!rewrites(&[column("a", "a", "Array(Int64)", true)]));
        let missing: Vec<&Column> = vec![&columns[4]];
        let rewritten = |record: &[u8]| {
            let mut out = Vec::new();
            rewrite(record, &columns, &missing, &Clocks::default(), &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            rewritten(br#"{"extra":{"x":1},"Id":7,"tags":["a", "b"],"arr":["c"],"on":"2024-02-29T00:00:00Z"}"#),
            r#"{"id":7,"tags":"[\"a\", \"b\"]","arr":["c"],"on":"2024-02-29","gone":null}"#
        );
        // A string into a JSON-text column: its JSON text, quoted.
        assert_eq!(
            rewritten(br#"{"Id":8,"tags":"a\"b","arr":[],"on":null}"#),
            r#"{"id":8,"tags":"\"a\\\"b\"","arr":[],"on":null,"gone":null}"#
        );
        let mut out = Vec::new();
        let e = rewrite(
            br#"{"on":"2024-02-29T10:00:00Z","Id":1,"tags":null,"arr":[]}"#,
            &columns,
            &[],
            &Clocks::default(),
            &mut out,
        )
        .unwrap_err();
        assert!(
            e.contains("property 'on'") && e.contains("time of day"),
            "{e}"
        );
    }
}
