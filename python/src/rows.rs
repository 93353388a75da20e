//! Python rows as the component takes them: packed rows (`send-packed`) written straight from
//! the Python objects, no JSON text for a plain str, int, float, bool or None, and Python's
//! own values (`datetime`, `Decimal`, ...) as their text under a tag of their own.

use std::sync::Arc;

use crate::errors::*;
use clickhouse_component::host_api::rows::{self as encode, PackedWriter, Tag, Value as JsonValue};
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
        return Ok(std_json(value));
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

/// A value of a standard library type as the text that means exactly it under the
/// component's rules for its column's type (docs/python.md, "Values"), with its packed rows'
/// tag (which a `String` column refuses); the component reads it as it reads that text's JSON
/// ([`std_json`]: no second set of rules here):
/// - `datetime`: its text, `YYYY-MM-DD hh:mm:ss[.ffffff]`, read as a wall-clock time in the
///   column's zone; an aware one with its offset (`+hh:mm`), read as that instant (an offset
///   with seconds, which that text cannot hold, is given in UTC);
/// - `date` (`YYYY-MM-DD`), `time` (`hh:mm:ss[.ffffff]`), `UUID`, `IPv4Address` and
///   `IPv6Address`: their text;
/// - `Decimal`: its digits, a JSON number (never through a float); NaN and infinities are
///   refused.
///
/// `None`: not one of these types.
pub(crate) fn std_value(v: &Bound<'_, PyAny>) -> Result<Option<(Tag, String)>, String> {
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
                return Ok(Some((Tag::DateTime, text(&utc)?)));
            }
        }
        return Ok(Some((Tag::DateTime, text(v)?)));
    }
    if is(&types.decimal) {
        let finite = v
            .call_method0("is_finite")
            .and_then(|f| f.is_truthy())
            .map_err(|e| e.to_string())?;
        if !finite {
            return Err("a Decimal that is not a finite number (NaN or an infinity)".into());
        }
        return Ok(Some((Tag::Decimal, text(v)?)));
    }
    let tags = [
        (&types.date, Tag::Date),
        (&types.time, Tag::Time),
        (&types.uuid, Tag::Uuid),
        (&types.ipv4, Tag::Ip),
        (&types.ipv6, Tag::Ip),
    ];
    match tags.into_iter().find(|(t, _)| is(t)) {
        Some((_, tag)) => Ok(Some((tag, text(v)?))),
        None => Ok(None),
    }
}

/// A standard library value's JSON ([`std_value`]): a decimal's digits as a number, the
/// others' text as a string.
pub(crate) fn std_json((tag, text): (Tag, String)) -> JsonValue {
    match tag {
        Tag::Decimal => JsonValue::Json(text),
        _ => JsonValue::Text(text),
    }
}

/// The rows of `send`, iterated, and the `json.dumps` its values that only Python can write
/// go through.
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

/// One value of a row as a packed value: the exact built-in types (nearly every value)
/// straight from the Python object; a list, tuple or dict as its JSON text; Python's own
/// values as their text under their tag; anything else through [`to_value`].
pub(crate) fn write_packed_value(
    py: Python<'_>,
    w: &mut PackedWriter,
    v: &Bound<'_, PyAny>,
    dumps: &Bound<'_, PyAny>,
) -> Result<(), String> {
    if v.is_exact_instance_of::<PyString>() {
        let s = v.cast::<PyString>().map_err(|e| e.to_string())?;
        let text = s
            .to_str()
            .map_err(|_| "a str that is not valid UTF-8 (a lone surrogate)")?;
        w.bytes(Tag::Str, text.as_bytes());
        return Ok(());
    }
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            w.int(i);
            return Ok(());
        }
    }
    if v.is_none() {
        w.null();
        return Ok(());
    }
    if v.is_exact_instance_of::<PyList>()
        || v.is_exact_instance_of::<PyTuple>()
        || v.is_exact_instance_of::<PyDict>()
    {
        let (mark, json) = w.start_json();
        if write_json_nested(json, v, 0) {
            w.end_json(mark);
            return Ok(());
        }
        // Something `json.dumps` writes its own way (a big int, NaN, a key that is not a
        // str, a deep or circular value): it writes the whole value, or names the problem.
        w.cancel_json(mark);
    }
    if let Some((tag, text)) = std_value(v)? {
        w.bytes(tag, text.as_bytes());
        return Ok(());
    }
    match to_value(py, v, dumps)? {
        JsonValue::Null => w.null(),
        JsonValue::Bool(b) => w.bool(b),
        JsonValue::Int(i) => w.int(i),
        JsonValue::Uint(u) => w.uint(u),
        JsonValue::Float(f) => w.float(f),
        JsonValue::Text(t) => w.bytes(Tag::Str, t.as_bytes()),
        JsonValue::Json(j) => w.bytes(Tag::Json, j.as_bytes()),
        JsonValue::Bytes(b) => w.bytes(Tag::Bytes, &b),
    }
    Ok(())
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
        let written = each_item(dict, |n, key, value| {
            if n > 0 {
                json.push(b',');
            }
            if !key.is_exact_instance_of::<PyString>() || !write_json_nested(json, &key, depth) {
                return Err(String::new());
            }
            json.push(b':');
            if !write_json_nested(json, &value, depth + 1) {
                return Err(String::new());
            }
            Ok(())
        });
        if written.is_err() {
            return false;
        }
        json.push(b'}');
    } else {
        // A standard library value (a datetime in a list, say): its JSON, as a row's.
        match std_value(v) {
            Ok(Some(value)) => return encode::write_value(json, &std_json(value)).is_ok(),
            _ => return false,
        }
    }
    true
}

/// Calls `each(place, key, value)` for each item of `dict`, in order. Python code a value
/// runs (a `__str__`, a `utcoffset`, `json.dumps`) may change the dict, or let another thread
/// change it: then `Err("")` once it has changed size, where pyo3's iterator would panic.
fn each_item<'py>(
    dict: &Bound<'py, PyDict>,
    mut each: impl FnMut(usize, Bound<'py, PyAny>, Bound<'py, PyAny>) -> Result<(), String>,
) -> Result<(), String> {
    let py = dict.py();
    let len = dict.len();
    let mut pos: pyo3::ffi::Py_ssize_t = 0;
    let mut key = std::ptr::null_mut();
    let mut value = std::ptr::null_mut();
    let mut place = 0;
    // SAFETY: the GIL is held (`py`); `PyDict_Next` lends its references, each taken as an
    // owned one (`from_borrowed_ptr` adds a reference) before any Python code can run.
    while unsafe { pyo3::ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
        let (k, v) = unsafe {
            (
                Bound::from_borrowed_ptr(py, key),
                Bound::from_borrowed_ptr(py, value),
            )
        };
        each(place, k, v)?;
        place += 1;
        if dict.len() != len {
            return Err(String::new());
        }
    }
    Ok(())
}

/// The packed rows of `send` (a list of dicts, or any iterable of them), one row per dict,
/// keys in each dict's order, written straight from the Python objects: no Rust string per
/// key or value, and a key that is the same object as the previous row's key in its place
/// (dicts built by the same code share their key strings) is not looked up again. With the
/// number of rows.
pub(crate) fn to_rows(py: Python<'_>, rows: &Bound<'_, PyAny>) -> Result<(Vec<u8>, usize), String> {
    let (dumps, iter) = rows_and_dumps(py, rows)?;
    let mut w = PackedWriter::new();
    // The previous row's keys, in order, held (so their addresses stay theirs), with their
    // index.
    let mut keys: Vec<(Bound<'_, PyAny>, usize)> = Vec::new();
    let mut count = 0;
    // Rows of a list: once the first few are written, room for the rest at once, from their
    // size (growing the buffer row by row copied it over and over: a tenth of the time).
    let total = rows.len().ok();
    for (index, row) in (1..).zip(iter) {
        let row = row.map_err(|e| e.to_string())?;
        let Ok(dict) = row.cast::<PyDict>() else {
            return Err(format!("row {index} is not a dict"));
        };
        if let Some(total) = total.filter(|&t| index == 257 && t > 256) {
            // (At most 1 GiB, the component's default memory: an estimate past it is no
            // use, and one from a few large first rows may be far too large.)
            let estimate = (w.written() / 256)
                .saturating_mul(total - 256)
                .saturating_mul(9)
                / 8;
            w.reserve(estimate.min(1 << 30));
        }
        w.row(dict.len());
        each_item(dict, |place, k, v| {
            let key = match keys.get(place) {
                Some((key, n)) if key.as_ptr() == k.as_ptr() => *n,
                _ => {
                    let Ok(key) = k.cast::<PyString>() else {
                        return Err(format!("row {index} has a key that is not a str"));
                    };
                    let key = key
                        .to_str()
                        .map_err(|_| format!("row {index} has a key that is not valid UTF-8"))?;
                    let n = w.key(key.as_bytes());
                    keys.truncate(place);
                    keys.push((k.clone(), n));
                    n
                }
            };
            w.key_index(key);
            write_packed_value(py, &mut w, &v, &dumps).map_err(|m| {
                let key = k
                    .cast::<PyString>()
                    .map(|k| k.to_string())
                    .unwrap_or_default();
                format!("row {index}, column '{}': {m}", key.escape_debug())
            })
        })
        .map_err(|m| match m.is_empty() {
            true => format!("row {index} changed size while it was read (a row's dict must not change during the call)"),
            false => m,
        })?;
        count = index;
    }
    Ok((w.finish(), count))
}

/// Rows converted for `send` at once and sent later (`prepare_rows`): what is sent is the
/// rows as they were when they were converted, the lists and dicts inside them too, so a
/// caller may change or reuse them meanwhile without a copy of its own. onestep's sink
/// converts each `send`'s rows before it waits for the send before it (a shallow copy of each
/// dict there cost more than the conversion, through Python's garbage collector).
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct PreparedRows {
    pub(crate) rows: Arc<Vec<u8>>,
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
