//! WIT glue (wasm32 only): converts WIT records to core types and core errors to the WIT
//! `error` record. No logic lives here.

use crate::client::wasi_http::WasiHttpTransport;
use crate::client::{Client, ConnectionOptions, Error, ErrorKind};

mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "connector",
        with: {
            "wasi:http/types@0.2.12": wasip2::http::types,
            "wasi:http/outgoing-handler@0.2.12": wasip2::http::outgoing_handler,
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
        },
    });
}

use bindings::exports::clickhouse::connector::server::{Guest as ServerGuest, ServerInfo};
use bindings::exports::clickhouse::connector::types::{
    Connection, Error as WitError, ErrorKind as WitErrorKind, ServerError as WitServerError,
};

struct Component;

impl ServerGuest for Component {
    fn ping(connection: Connection) -> Result<ServerInfo, WitError> {
        let client = client(connection)?;
        let info = crate::server::ping(&client).map_err(to_wit)?;
        Ok(ServerInfo {
            version: info.version,
            timezone: info.timezone,
            user: info.user,
            database: info.database,
            round_trip_us: info.round_trip_us,
        })
    }
}

/// A client over wasi:http for a WIT connection record.
fn client(connection: Connection) -> Result<Client<WasiHttpTransport>, WitError> {
    let options = ConnectionOptions {
        url: connection.url,
        user: connection.user,
        password: connection.password,
        database: connection.database,
        settings: connection.settings,
        connect_timeout_ms: connection.connect_timeout_ms,
        request_timeout_ms: connection.request_timeout_ms,
    };
    Client::new(&options, WasiHttpTransport).map_err(to_wit)
}

fn to_wit(error: Error) -> WitError {
    WitError {
        kind: match error.kind {
            ErrorKind::InvalidInput => WitErrorKind::InvalidInput,
            ErrorKind::Misconfigured => WitErrorKind::Misconfigured,
            ErrorKind::Disconnected => WitErrorKind::Disconnected,
            ErrorKind::Transient => WitErrorKind::Transient,
            ErrorKind::Throttled => WitErrorKind::Throttled,
            ErrorKind::Permanent => WitErrorKind::Permanent,
            ErrorKind::Uncertain => WitErrorKind::Uncertain,
            ErrorKind::Locked => WitErrorKind::Locked,
            ErrorKind::NotFound => WitErrorKind::NotFound,
        },
        message: error.message,
        server: error.server.map(|s| WitServerError {
            code: s.code,
            name: s.name,
            http_status: s.http_status,
        }),
        committed_rows: error.committed_rows,
    }
}

bindings::export!(Component with_types_in bindings);
