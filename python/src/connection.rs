//! `Connection`: where ClickHouse is and what the component may reach; `ping`.

use std::sync::Arc;

use crate::errors::*;
use crate::runtime::*;
use clickhouse_component::host_api::{ConnectionOptions, Endpoint, Redactor};
use clickhouse_component_host::config::HostArgs;
use clickhouse_component_host::{default_allow_list, AllowList, Limits, Network, TlsOptions};
use pyo3::prelude::*;

/// How to reach one ClickHouse: the connection record, the allow-list, TLS trust.
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct Connection {
    pub(crate) options: ConnectionOptions,
    pub(crate) allow: AllowList,
    pub(crate) network: Network,
    pub(crate) limits: Limits,
    pub(crate) redactor: Arc<Redactor>,
}

#[pymethods]
impl Connection {
    #[new]
    #[pyo3(signature = (url, user=None, password=None, database=None, settings=Vec::new(), ca_file=None, allow=Vec::new(), connect_timeout_ms=None, request_timeout_ms=None, max_memory_mib=None, call_timeout_seconds=None, max_response_mib=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: String,
        user: Option<String>,
        password: Option<String>,
        database: Option<String>,
        settings: Vec<(String, String)>,
        ca_file: Option<std::path::PathBuf>,
        allow: Vec<String>,
        connect_timeout_ms: Option<u32>,
        request_timeout_ms: Option<u32>,
        max_memory_mib: Option<u64>,
        call_timeout_seconds: Option<f64>,
        max_response_mib: Option<u64>,
    ) -> PyResult<Connection> {
        // The CLI's own checks and defaults (--max-memory-mib, ...).
        let limits = HostArgs {
            max_memory_mib,
            call_timeout_seconds,
            max_response_mib,
            ..HostArgs::default()
        }
        .limits()
        .map_err(|e| Failure::from_error(e, None).into_py(py))?;
        let options = ConnectionOptions {
            url,
            user,
            password,
            database,
            settings,
            connect_timeout_ms,
            request_timeout_ms,
        };
        // Parsing checks the whole connection (nothing is sent) and names its secrets.
        let endpoint =
            Endpoint::parse(&options).map_err(|e| Failure::from_error(e, None).into_py(py))?;
        let redactor = Arc::new(Redactor::new(endpoint.secrets()));
        let mut list = default_allow_list(&options)
            .map_err(|e| Failure::from_error(e, Some(&redactor)).into_py(py))?;
        let extra = AllowList::parse(&allow).map_err(|e| invalid(py, e.to_string()))?;
        list.extend(extra);
        let network = Network::new(&TlsOptions { ca_file })
            .map_err(|e| invalid(py, redactor.redact(&e.to_string())))?;
        Ok(Connection {
            options,
            allow: list,
            network,
            limits,
            redactor,
        })
    }

    /// `server.ping`.
    fn ping(&self, py: Python<'_>) -> PyResult<NativeServerInfo> {
        let session = new_session(py, self)?;
        let options = self.options.clone();
        on_instance!(py, &session, &self.redactor, |i| {
            let info = i.ping(&options).await?;
            Ok(NativeServerInfo {
                version: info.version,
                timezone: info.timezone,
                user: info.user,
                database: info.database,
                round_trip_us: info.round_trip_us,
            })
        })
    }

    /// The allow-list, as text (no secrets: origins only).
    #[getter]
    fn allowed(&self) -> String {
        self.allow.to_string()
    }

    fn __repr__(&self) -> String {
        // Never the URL (it may carry the password or a secret setting).
        format!("<clickhouse_component.Connection allow={}>", self.allow)
    }
}

/// What `Connection.ping` learned, by name (`ServerInfo` in Python).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
pub(crate) struct NativeServerInfo {
    pub(crate) version: String,
    pub(crate) timezone: String,
    pub(crate) user: String,
    pub(crate) database: String,
    pub(crate) round_trip_us: u64,
}
