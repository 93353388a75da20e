//! Python rows as the component takes them: JSONEachRow written from the Python objects,
//! typed rows for bytes that are not UTF-8, and Python's own values (`datetime`, `Decimal`,
//! ...) as the JSON text that means them.

use std::sync::Arc;

use crate::errors::*;
use clickhouse_component::host_api::rows::{self as encode, Value as JsonValue};
use clickhouse_component_host::{CallError, Value};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};

/// One Python value as a sink value: exact types only, nothing coerced.
pub(crate) fn to_value(
    py: Python<'_>,
    v: &Bound<'_, PyAny>,
    dumps: &Bound<'_, PyAny>,
) -> Result<JsonValue, String> {
    if v.is_none() {
        return Ok(JsonValue::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(JsonValue::Bool(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(JsonValue::Int(i));
        }
        if let Ok(u) = v.extract::<u64>() {
            return Ok(JsonValue::Uint(u));
        }
        return Err("an integer outside the range of Int64 and UInt64".into());
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(JsonValue::Float(f.value()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(JsonValue::Text(
            s.to_str()
                .map_err(|_| "a str that is not valid UTF-8 (a lone surrogate)")?
                .to_string(),
        ));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(JsonValue::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(JsonValue::Bytes(b.to_vec()));
    }
    if v.is_instance_of::<PyDict>() || v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>()
    {
        let text = dumps
            .call1((v,))
            .and_then(|t| t.extract::<String>())
            .map_err(|e| format!("a value that is not JSON ({})", e.value(py)))?;
        return Ok(JsonValue::Json(text));
    }
    if let Some(value) = std_value(v)? {
        return Ok(value);
    }
    let type_name = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(format!(
        "a value of type {type_name} (give None, bool, int, float, str, bytes, datetime, date, time, Decimal, UUID, IPv4Address, IPv6Address, or a dict/list for JSON)"
    ))
}

/// The standard library's value types that clickhouse-connect takes, imported once.
pub(crate) struct StdTypes {
    pub(crate) datetime: Py<PyAny>,
    pub(crate) date: Py<PyAny>,
    pub(crate) time: Py<PyAny>,
    pub(crate) decimal: Py<PyAny>,
    pub(crate) uuid: Py<PyAny>,
    ipv4: Py<PyAny>,
    ipv6: Py<PyAny>,
    pub(crate) utc: Py<PyAny>,
}

pub(crate) static STD_TYPES: PyOnceLock<StdTypes> = PyOnceLock::new();

pub(crate) fn std_types(py: Python<'_>) -> PyResult<&StdTypes> {
    STD_TYPES.get_or_try_init(py, || {
        let attr = |module: &str, name: &str| -> PyResult<Py<PyAny>> {
            Ok(py.import(module)?.getattr(name)?.unbind())
        };
        Ok(StdTypes {
            datetime: attr("datetime", "datetime")?,
            date: attr("datetime", "date")?,
            time: attr("datetime", "time")?,
            decimal: attr("decimal", "Decimal")?,
            uuid: attr("uuid", "UUID")?,
            ipv4: attr("ipaddress", "IPv4Address")?,
            ipv6: attr("ipaddress", "IPv6Address")?,
            utc: py
                .import("datetime")?
                .getattr("timezone")?
                .getattr("utc")?
                .unbind(),
        })
    })
}

/// A value of a standard library type as the JSON value that means exactly it under the
/// component's rules for its column's type (docs/python.md, "Values"), which then reads it
/// as it reads any JSON (no second set of rules here):
/// - `datetime`: its text, `YYYY-MM-DD hh:mm:ss[.ffffff]`, read as a wall-clock time in the
///   column's zone; an aware one with its offset (`+hh:mm`), read as that instant (an offset
///   with seconds, which that text cannot hold, is given in UTC);
/// - `date` (`YYYY-MM-DD`), `time` (`hh:mm:ss[.ffffff]`), `UUID`, `IPv4Address` and
///   `IPv6Address`: their text;
/// - `Decimal`: its digits as a JSON number (never through a float); NaN and infinities are
///   refused.
///
/// `None`: not one of these types.
pub(crate) fn std_value(v: &Bound<'_, PyAny>) -> Result<Option<JsonValue>, String> {
    let py = v.py();
    let types = std_types(py).map_err(|e| e.to_string())?;
    let is = |t: &Py<PyAny>| v.is_instance(t.bind(py)).unwrap_or(false);
    let text = |v: &Bound<'_, PyAny>| -> Result<String, String> {
        v.str()
            .and_then(|s| s.to_str().map(str::to_string))
            .map_err(|e| e.to_string())
    };
    // (A datetime is a date too: asked first.)
    if is(&types.datetime) {
        let offset = v.call_method0("utcoffset").map_err(|e| e.to_string())?;
        if !offset.is_none() {
            let seconds: f64 = offset
                .call_method0("total_seconds")
                .and_then(|s| s.extract())
                .map_err(|e| e.to_string())?;
            if seconds % 60.0 != 0.0 {
                let utc = v
                    .call_method1("astimezone", (types.utc.bind(py),))
                    .map_err(|e| format!("a datetime that has no UTC time ({e})"))?;
                return Ok(Some(JsonValue::Text(text(&utc)?)));
            }
        }
        return Ok(Some(JsonValue::Text(text(v)?)));
    }
    if is(&types.decimal) {
        let finite = v
            .call_method0("is_finite")
            .and_then(|f| f.is_truthy())
            .map_err(|e| e.to_string())?;
        if !finite {
            return Err("a Decimal that is not a finite number (NaN or an infinity)".into());
        }
        return Ok(Some(JsonValue::Json(text(v)?)));
    }
    if [
        &types.date,
        &types.time,
        &types.uuid,
        &types.ipv4,
        &types.ipv6,
    ]
    .into_iter()
    .any(is)
    {
        return Ok(Some(JsonValue::Text(text(v)?)));
    }
    Ok(None)
}

/// The WIT value of a sink value.
pub(crate) fn typed(value: JsonValue) -> Value {
    match value {
        JsonValue::Null => Value::Null,
        JsonValue::Bool(b) => Value::Boolean(b),
        JsonValue::Int(i) => Value::Int(i),
        JsonValue::Uint(u) => Value::Uint(u),
        JsonValue::Float(f) => Value::Float(f),
        JsonValue::Text(t) => Value::Text(t),
        JsonValue::Json(j) => Value::Json(j),
        JsonValue::Bytes(b) => Value::Bytes(b),
    }
}

/// Rows as `send` gives them to the component.
pub(crate) enum Rows {
    /// JSONEachRow, one line per row, keys in each dict's order (`send-json`).
    Json(Vec<u8>),
    /// Typed rows (`send`): only for rows with a bytes value that is not UTF-8, which JSON
    /// text cannot carry.
    Typed(Vec<Vec<(String, Value)>>),
}

/// The rows of a `send`, as an iterator, and the `json.dumps` its values that only Python can
/// write go through.
pub(crate) fn rows_and_dumps<'py>(
    py: Python<'py>,
    rows: &Bound<'py, PyAny>,
) -> Result<(Bound<'py, PyAny>, Bound<'py, pyo3::types::PyIterator>), String> {
    let dumps = py
        .import("clickhouse_component.errors")
        .and_then(|m| m.getattr("_json_dumps"))
        .map_err(|e| e.to_string())?;
    let iter = rows
        .try_iter()
        .map_err(|_| "rows must be a list of dicts".to_string())?;
    Ok((dumps, iter))
}

/// Calls `each(index, key, value)` for every value of every row, in order.
pub(crate) fn each_value(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    mut each: impl FnMut(usize, Option<(String, JsonValue)>) -> Result<bool, String>,
) -> Result<bool, String> {
    let (dumps, iter) = rows_and_dumps(py, rows)?;
    for (index, row) in (1..).zip(iter) {
        let row = row.map_err(|e| e.to_string())?;
        let Ok(dict) = row.cast::<PyDict>() else {
            return Err(format!("row {index} is not a dict"));
        };
        for (k, v) in dict.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(format!("row {index} has a key that is not a str"));
            };
            let key = key
                .to_str()
                .map_err(|_| format!("row {index} has a key that is not valid UTF-8"))?
                .to_string();
            let value = to_value(py, &v, &dumps)
                .map_err(|m| format!("row {index}, column '{}': {m}", key.escape_debug()))?;
            if !each(index, Some((key, value)))? {
                return Ok(false);
            }
        }
        // The end of the row.
        if !each(index, None)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One value of a row into `json`: the exact built-in types (nearly every value) straight
/// from the Python object, anything else through [`to_value`]; the same JSON as
/// `encode::write_value` writes. `Ok(false)`: a bytes value that is not UTF-8, which JSON text
/// cannot carry.
pub(crate) fn write_json_value(
    py: Python<'_>,
    json: &mut Vec<u8>,
    v: &Bound<'_, PyAny>,
    dumps: &Bound<'_, PyAny>,
) -> Result<bool, String> {
    if v.is_exact_instance_of::<PyString>() {
        let s = v.cast::<PyString>().map_err(|e| e.to_string())?;
        let text = s
            .to_str()
            .map_err(|_| "a str that is not valid UTF-8 (a lone surrogate)")?;
        encode::write_json_string(json, text.as_bytes());
        return Ok(true);
    }
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            json.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            return Ok(true);
        }
    }
    if v.is_exact_instance_of::<PyList>()
        || v.is_exact_instance_of::<PyTuple>()
        || v.is_exact_instance_of::<PyDict>()
    {
        let start = json.len();
        if write_json_nested(json, v, 0) {
            return Ok(true);
        }
        // Something `json.dumps` writes its own way (a big int, NaN, a key that is not a
        // str, a deep or circular value): it writes the whole value, or names the problem.
        json.truncate(start);
    }
    let value = to_value(py, v, dumps)?;
    if matches!(&value, JsonValue::Bytes(b) if std::str::from_utf8(b).is_err()) {
        return Ok(false);
    }
    encode::write_value(json, &value)?;
    Ok(true)
}

/// A list, tuple or dict (a JSON column's value, an array's elements, a String column's JSON
/// text) as JSON, written from the exact built-in types byte for byte as `json.dumps` writes
/// them (the component's string escapes are the same but for backspace, form feed and DEL).
/// `false`: a value or key it leaves to `json.dumps` (floats, whose shortest forms differ,
/// strings with those three characters, big ints, other types); `json` then holds a partial
/// value the caller removes.
pub(crate) fn write_json_nested(json: &mut Vec<u8>, v: &Bound<'_, PyAny>, depth: usize) -> bool {
    if depth > 32 {
        return false;
    }
    if v.is_none() {
        json.extend_from_slice(b"null");
    } else if v.is_exact_instance_of::<PyBool>() {
        json.extend_from_slice(if v.is_truthy().unwrap_or(false) {
            b"true"
        } else {
            b"false"
        });
    } else if v.is_exact_instance_of::<PyString>() {
        let Some(text) = v.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) else {
            return false;
        };
        if text.bytes().any(|b| matches!(b, 0x08 | 0x0c | 0x7f)) {
            return false;
        }
        encode::write_json_string(json, text.as_bytes());
    } else if v.is_exact_instance_of::<PyInt>() {
        let Ok(i) = v.extract::<i64>() else {
            return false;
        };
        json.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
    } else if v.is_exact_instance_of::<PyList>() || v.is_exact_instance_of::<PyTuple>() {
        let Ok(items) = v.try_iter() else {
            return false;
        };
        json.push(b'[');
        for (n, item) in items.enumerate() {
            if n > 0 {
                json.push(b',');
            }
            let Ok(item) = item else {
                return false;
            };
            if !write_json_nested(json, &item, depth + 1) {
                return false;
            }
        }
        json.push(b']');
    } else if let Ok(dict) = v.cast_exact::<PyDict>() {
        json.push(b'{');
        for (n, (key, value)) in dict.iter().enumerate() {
            if n > 0 {
                json.push(b',');
            }
            if !key.is_exact_instance_of::<PyString>() || !write_json_nested(json, &key, depth) {
                return false;
            }
            json.push(b':');
            if !write_json_nested(json, &value, depth + 1) {
                return false;
            }
        }
        json.push(b'}');
    } else {
        // A standard library value (a datetime in a list, say): its JSON, as a row's.
        match std_value(v) {
            Ok(Some(value)) => return encode::write_value(json, &value).is_ok(),
            _ => return false,
        }
    }
    true
}

/// The JSONEachRow text of `rows` (a list of dicts), one line per row, keys in each dict's
/// order, written straight from the Python objects: no Rust string per key or value, and a
/// key that is the same object as the previous row's key in its place (dicts built by the
/// same code share their key strings) is written from the previous row's escaped bytes.
/// `Ok(None)`: a bytes value is not UTF-8.
pub(crate) fn write_json_rows(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
) -> Result<Option<(Vec<u8>, usize)>, String> {
    let (dumps, iter) = rows_and_dumps(py, rows)?;
    let mut json = Vec::new();
    // The previous row's keys, in order, held (so their addresses stay theirs), with their
    // JSON (`"key":`).
    let mut keys: Vec<(Bound<'_, PyAny>, Vec<u8>)> = Vec::new();
    let mut count = 0;
    for (index, row) in (1..).zip(iter) {
        let row = row.map_err(|e| e.to_string())?;
        let Ok(dict) = row.cast::<PyDict>() else {
            return Err(format!("row {index} is not a dict"));
        };
        json.push(b'{');
        for (place, (k, v)) in dict.iter().enumerate() {
            if place > 0 {
                json.push(b',');
            }
            match keys.get(place) {
                Some((key, text)) if key.as_ptr() == k.as_ptr() => json.extend_from_slice(text),
                _ => {
                    let Ok(key) = k.cast::<PyString>() else {
                        return Err(format!("row {index} has a key that is not a str"));
                    };
                    let key = key
                        .to_str()
                        .map_err(|_| format!("row {index} has a key that is not valid UTF-8"))?;
                    let mut text = Vec::with_capacity(key.len() + 3);
                    encode::write_json_string(&mut text, key.as_bytes());
                    text.push(b':');
                    json.extend_from_slice(&text);
                    keys.truncate(place);
                    keys.push((k.clone(), text));
                }
            }
            let written = write_json_value(py, &mut json, &v, &dumps).map_err(|m| {
                let key = k
                    .cast::<PyString>()
                    .map(|k| k.to_string())
                    .unwrap_or_default();
                format!("row {index}, column '{}': {m}", key.escape_debug())
            })?;
            if !written {
                return Ok(None);
            }
        }
        json.extend_from_slice(b"}\n");
        count = index;
    }
    Ok(Some((json, count)))
}

/// The rows of a `send`: JSONEachRow built here ([`write_json_rows`]; the component's typed
/// path lowers every string into guest memory at once: 1,000,000 five-column rows needed more
/// than its 1 GiB, and took 3x the time of the same rows as JSON), with the same JSON per value
/// as the typed path writes (`encode::write_value`); typed rows when a bytes value is not
/// UTF-8. With the number of rows.
pub(crate) fn to_rows(py: Python<'_>, rows: &Bound<'_, PyAny>) -> Result<(Rows, usize), String> {
    // Rows sent typed are walked a second time: an iterator is read once, into a list (of the
    // same dicts), so the second walk sees the rows the first consumed.
    let listed;
    let rows = if rows.is_instance_of::<PyList>() || rows.is_instance_of::<PyTuple>() {
        rows
    } else {
        let not_rows = |_| "rows must be a list of dicts".to_string();
        let items = rows
            .try_iter()
            .map_err(not_rows)?
            .collect::<PyResult<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        listed = PyList::new(py, items)
            .map_err(|e| e.to_string())?
            .into_any();
        &listed
    };
    if let Some((json, count)) = write_json_rows(py, rows)? {
        return Ok((Rows::Json(json), count));
    }
    let mut out: Vec<Vec<(String, Value)>> = Vec::new();
    let mut row = Vec::new();
    each_value(py, rows, |_, value| {
        match value {
            Some((key, value)) => row.push((key, typed(value))),
            None => out.push(std::mem::take(&mut row)),
        }
        Ok(true)
    })?;
    let count = out.len();
    Ok((Rows::Typed(out), count))
}

/// Rows converted for `send` at once and sent later (`prepare_rows`): what is sent is the
/// rows as they were when they were converted, the lists and dicts inside them too, so a
/// caller may change or reuse them meanwhile without a copy of its own. onestep's sink
/// converts each `send`'s rows before it waits for the send before it (a shallow copy of each
/// dict there cost more than the conversion, through Python's garbage collector).
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct PreparedRows {
    pub(crate) rows: Arc<Rows>,
    pub(crate) count: usize,
}

#[pymethods]
impl PreparedRows {
    /// The number of rows.
    fn __len__(&self) -> usize {
        self.count
    }
}

/// Converts rows (a list of dicts) as `send` does, to send later (`PreparedRows`).
#[pyfunction]
pub(crate) fn prepare_rows(py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<PreparedRows> {
    let (rows, count) = to_rows(py, rows).map_err(|m| invalid(py, m))?;
    Ok(PreparedRows {
        rows: Arc::new(rows),
        count,
    })
}

/// A refused row of a `send` as the caller gave it: the component names a `send-json` line
/// `line N` (from 1); the rows of a list are `row N`, as the typed path names them.
pub(crate) fn as_rows(e: CallError) -> CallError {
    match e {
        CallError::Component(mut e) => {
            if let Some(rest) = e.message.strip_prefix("line ") {
                e.message = format!("row {rest}");
            }
            CallError::Component(e)
        }
        other => other,
    }
}
