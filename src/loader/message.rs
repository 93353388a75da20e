//! One Singer message, read from one input line at one entry point ([`Message::parse`]): the
//! kinds the loader acts on, each with what it needs, or an `invalid-input` naming the line.
//! Unknown fields are ignored, as Singer allows. A RECORD's value is not parsed here, only
//! delimited (with its property names): the sink reads it for its columns' types.

use std::borrow::Cow;

use crate::client::Error;
use crate::sink::encode::row_refusal;
use crate::sink::json::{object_fields, Key};
use crate::text::escaped;

/// A Singer message.
#[derive(Debug)]
pub enum Message<'a> {
    /// A stream's schema: its JSON Schema and key properties.
    Schema {
        /// The stream.
        stream: String,
        /// The JSON Schema of its records.
        schema: serde_json::Value,
        /// `key_properties` (none when absent or null).
        keys: Vec<String>,
    },
    /// One record of a stream: the object's text and its property names, in order.
    Record {
        /// The stream.
        stream: Cow<'a, str>,
        /// The record object's JSON text.
        record: &'a [u8],
        /// Its property names, as written.
        properties: Vec<Key<'a>>,
        /// The message's `time_extracted` and `version` (JSON texts), when given.
        time_extracted: Option<&'a [u8]>,
        /// See `time_extracted`.
        version: Option<&'a [u8]>,
    },
    /// A bookmark: the `value`'s JSON text, passed on as it is.
    State {
        /// The `value`'s text.
        value: &'a str,
    },
    /// Full-table replication's marker: the stream's rows of older versions are to be retired.
    ActivateVersion {
        /// The stream.
        stream: String,
        /// The version now current.
        version: i64,
    },
    /// A BATCH message: a stream's records in files (the Singer SDK's batch messages).
    Batch {
        /// The stream.
        stream: String,
        /// `encoding.format` (`jsonl` is read).
        format: String,
        /// `encoding.compression` (`gzip`, or none).
        compression: Option<String>,
        /// The files' URIs, in order.
        manifest: Vec<String>,
    },
}

impl<'a> Message<'a> {
    /// Reads `line` (input line `line_no`).
    pub fn parse(line: &'a [u8], line_no: u64) -> Result<Message<'a>, Error> {
        let mut properties = Vec::new();
        let fields = object_fields(line, Some((b"record".as_slice(), &mut properties)))
            .map_err(|r| row_refusal(&format!("line {line_no}"), r))?;
        let field = |name: &str| field_of(&fields, name);
        let bad = |what: String| Error::invalid(format!("line {line_no}: {what}"));
        let text = |name: &str| text_of(field(name), name, &bad);
        let kind = text("type")?.ok_or_else(|| bad("not a Singer message (no \"type\")".into()))?;
        let stream = text("stream")?;
        let needs_stream = || {
            stream
                .clone()
                .ok_or_else(|| bad(format!("a {} message without a \"stream\"", escaped(&kind))))
        };
        // The stream and a field it must have.
        let with = |what: &str| -> Result<(String, &'a [u8]), Error> {
            let stream = needs_stream()?;
            let value = field(what).ok_or_else(|| {
                bad(format!(
                    "a {kind} of stream '{}' without a \"{what}\"",
                    escaped(&stream)
                ))
            })?;
            Ok((stream, value))
        };
        Ok(match kind.as_str() {
            "RECORD" => {
                let (stream, record) = with("record")?;
                let stream = stream.into();
                Message::Record {
                    stream,
                    record,
                    properties,
                    time_extracted: field("time_extracted"),
                    version: field("version"),
                }
            }
            "SCHEMA" => {
                let (stream, schema) = with("schema")?;
                schema_message(stream, schema, field("key_properties"), &bad)?
            }
            "STATE" => {
                let value = field("value")
                    .ok_or_else(|| bad("a STATE message without a \"value\"".into()))?;
                let value = std::str::from_utf8(value)
                    .map_err(|_| bad("the STATE is not UTF-8".into()))?;
                Message::State { value }
            }
            "ACTIVATE_VERSION" => {
                let (stream, version) = with("version")?;
                let version = std::str::from_utf8(version)
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "the ACTIVATE_VERSION of stream '{}' has a \"version\" that is not a whole number",
                            escaped(&stream)
                        ))
                    })?;
                Message::ActivateVersion { stream, version }
            }
            "BATCH" => {
                let (stream, encoding) = with("encoding")?;
                batch_message(stream, encoding, field("manifest"), &bad)?
            }
            other => {
                return Err(bad(format!(
                    "unknown message type '{}' (SCHEMA, RECORD, STATE, ACTIVATE_VERSION and BATCH are read)",
                    escaped(other)
                )))
            }
        })
    }
}

/// The text of the field called `name`, if any.
fn field_of<'a>(fields: &[(Key<'a>, &'a [u8])], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k.as_ref() == name.as_bytes())
        .map(|(_, v)| *v)
}

/// A field that must be a string when present.
fn text_of(
    value: Option<&[u8]>,
    name: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Option<String>, Error> {
    value
        .map(|v| {
            serde_json::from_slice::<String>(v)
                .map_err(|_| bad(format!("\"{name}\" is not a string")))
        })
        .transpose()
}

/// A BATCH's encoding and manifest, read.
fn batch_message<'a>(
    stream: String,
    encoding: &[u8],
    manifest: Option<&[u8]>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Message<'a>, Error> {
    #[derive(serde::Deserialize)]
    struct Encoding {
        format: String,
        #[serde(default)]
        compression: Option<String>,
    }
    let shown = escaped(&stream);
    let encoding: Encoding = serde_json::from_slice(encoding).map_err(|_| {
        bad(format!(
            "the BATCH of stream '{shown}' has an \"encoding\" that is not an object with a \"format\" (and a \"compression\")"
        ))
    })?;
    let manifest = manifest
        .and_then(|m| serde_json::from_slice::<Vec<String>>(m).ok())
        .ok_or_else(|| {
            bad(format!(
                "the BATCH of stream '{shown}' has no \"manifest\" list of file URIs"
            ))
        })?;
    Ok(Message::Batch {
        stream,
        format: encoding.format,
        compression: encoding.compression,
        manifest,
    })
}

/// A SCHEMA's schema and key properties, read.
fn schema_message<'a>(
    stream: String,
    schema: &[u8],
    key_properties: Option<&[u8]>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Message<'a>, Error> {
    let schema =
        serde_json::from_slice(schema).map_err(|_| bad("the schema is not JSON".into()))?;
    let keys = match key_properties.filter(|v| *v != b"null") {
        None => Vec::new(),
        Some(v) => serde_json::from_slice(v)
            .map_err(|_| bad("\"key_properties\" is not a list of names".into()))?,
    };
    Ok(Message::Schema {
        stream,
        schema,
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_read_with_what_it_needs() {
        let line =
            br#"{"type":"RECORD","stream":"s","record":{"a":1,"b":{"c":2}},"time_extracted":"x","version":17}"#;
        match Message::parse(line, 1).unwrap() {
            Message::Record {
                stream,
                record,
                properties,
                time_extracted,
                version,
            } => {
                assert_eq!(stream, "s");
                assert_eq!(time_extracted, Some(br#""x""#.as_slice()));
                assert_eq!(version, Some(b"17".as_slice()));
                assert_eq!(record, br#"{"a":1,"b":{"c":2}}"#);
                let names: Vec<&[u8]> = properties.iter().map(|k| k.as_ref()).collect();
                assert_eq!(names, [b"a".as_slice(), b"b"]);
            }
            other => panic!("{other:?}"),
        }
        let line =
            br#"{"type":"SCHEMA","stream":"s","schema":{"properties":{}},"key_properties":null}"#;
        assert!(
            matches!(Message::parse(line, 1).unwrap(), Message::Schema { keys, .. } if keys.is_empty())
        );
        let line = br#"{"type":"STATE","value":{"bookmarks":{}}}"#;
        assert!(matches!(
            Message::parse(line, 1).unwrap(),
            Message::State {
                value: r#"{"bookmarks":{}}"#
            }
        ));
        let line = br#"{"type":"ACTIVATE_VERSION","stream":"s","version":1}"#;
        assert!(matches!(
            Message::parse(line, 1).unwrap(),
            Message::ActivateVersion { stream, version: 1 } if stream == "s"
        ));
    }

    #[test]
    fn bad_messages_name_their_line() {
        for (line, says) in [
            (&br#"{"stream":"s"}"#[..], "line 7: not a Singer message"),
            (
                br#"{"type":"RECORD","record":{}}"#,
                "RECORD message without a \"stream\"",
            ),
            (br#"{"type":"RECORD","stream":"s"}"#, "without a \"record\""),
            (br#"{"type":"SCHEMA","stream":"s"}"#, "without a \"schema\""),
            (br#"{"type":"STATE"}"#, "without a \"value\""),
            (
                br#"{"type":"ACTIVATE_VERSION","stream":"s"}"#,
                "without a \"version\"",
            ),
            (
                br#"{"type":"ACTIVATE_VERSION","stream":"s","version":"1"}"#,
                "not a whole number",
            ),
            (
                br#"{"type":"SCHEMA","stream":"s","schema":{},"key_properties":"id"}"#,
                "not a list",
            ),
            (br#"{"type":"NOPE"}"#, "unknown message type 'NOPE'"),
            (br#"{"type":1}"#, "\"type\" is not a string"),
            (b"[1]", "line 7 is not a JSON object"),
        ] {
            let e = Message::parse(line, 7).unwrap_err();
            assert!(
                e.message.contains(says),
                "{}: {}",
                String::from_utf8_lossy(line),
                e.message
            );
        }
    }
}
