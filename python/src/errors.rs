//! Failures as the Python exceptions of their WIT error kinds, redacted of secrets.

use clickhouse_component::host_api::{Error, Redactor};
use clickhouse_component_host::{runner_message, CallError};
use pyo3::prelude::*;

/// A failure on its way to Python (built without the GIL, raised with it).
pub(crate) struct Failure {
    /// The WIT error kind, or `runner`.
    pub(crate) kind: &'static str,
    pub(crate) message: String,
    pub(crate) server: Option<(i32, String, u16)>,
    pub(crate) committed_rows: u64,
}

impl Failure {
    pub(crate) fn runner(message: impl Into<String>) -> Failure {
        Failure {
            kind: "runner",
            message: message.into(),
            server: None,
            committed_rows: 0,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::from_error(Error::invalid(message.into()), None)
    }

    pub(crate) fn from_error(e: Error, redactor: Option<&Redactor>) -> Failure {
        Failure {
            kind: e.kind.as_str(),
            message: match redactor {
                Some(r) => r.redact(&e.message),
                None => e.message,
            },
            server: e.server.map(|s| (s.code, s.name, s.http_status)),
            committed_rows: e.committed_rows,
        }
    }

    pub(crate) fn from_call(e: CallError, redactor: &Redactor) -> Failure {
        match e {
            CallError::Component(e) => Failure::from_error(e, Some(redactor)),
            CallError::Runner(e) => Failure::runner(redactor.redact(&runner_message(&e))),
        }
    }

    /// The Python exception: `clickhouse_component.errors._from_native(kind, message, server,
    /// committed_rows)`.
    pub(crate) fn into_py(self, py: Python<'_>) -> PyErr {
        let made = (|| -> PyResult<PyErr> {
            let errors = py.import("clickhouse_component.errors")?;
            let exc = errors.getattr("_from_native")?.call1((
                self.kind,
                &self.message,
                self.server,
                self.committed_rows,
            ))?;
            Ok(PyErr::from_value(exc))
        })();
        made.unwrap_or_else(|e| e)
    }
}

pub(crate) fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    Failure::invalid(message).into_py(py)
}
