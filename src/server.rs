//! Server identity and reachability (`ping`): one read-only query that proves the connection,
//! the credentials and the database are right.

use serde_json::Value;

use crate::client::response::json_text;
use crate::client::{Client, Error, ErrorKind, Query, Transport};

/// What `ping` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `version()`.
    pub version: String,
    /// `timezone()`.
    pub timezone: String,
    /// `currentUser()`.
    pub user: String,
    /// `currentDatabase()`.
    pub database: String,
    /// Round trip of the request, in microseconds.
    pub round_trip_us: u64,
}

/// The statement `ping` runs.
pub const PING_SQL: &str = "SELECT version() AS version, timezone() AS timezone, \
     currentUser() AS user, currentDatabase() AS database";

/// Most bytes of ping's answer (one short row): a server that answers more is not answering it.
const PING_ANSWER_BYTES: usize = 64 * 1024;

/// Connects, authenticates and asks the server who it is.
pub fn ping<T: Transport>(client: &Client<T>) -> Result<ServerInfo, Error> {
    let response = client.execute(
        &Query::read("ping", PING_SQL)
            .format("JSONEachRow")
            .small_answer(PING_ANSWER_BYTES),
    )?;
    let row: Value = json_text(&response.body).map_err(|e| {
        Error::new(
            ErrorKind::Transient,
            format!("the server's answer to ping is not a JSON row: {e}"),
        )
    })?;
    let field = |name: &str| -> Result<String, Error> {
        row.get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Transient,
                    format!("the server's answer to ping has no '{name}'"),
                )
            })
    };
    Ok(ServerInfo {
        version: field("version")?,
        timezone: field("timezone")?,
        user: field("user")?,
        database: field("database")?,
        round_trip_us: response.elapsed_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::testing::{ok, Scripted};
    use crate::client::ConnectionOptions;

    #[test]
    fn ping_reads_one_json_row() {
        let t = Scripted::new(vec![ok(
            r#"{"version":"25.8.1.1","timezone":"UTC","user":"default","database":"db"}"#,
        )]);
        let c = Client::new(&ConnectionOptions::from_url("http://h/db"), &t).unwrap();
        let info = ping(&c).unwrap();
        assert_eq!(info.version, "25.8.1.1");
        assert_eq!(info.database, "db");
        let sent = &t.sent.borrow()[0];
        assert!(sent.path_and_query.contains("default_format=JSONEachRow"));
        assert!(sent.path_and_query.contains("database=db"));
    }

    #[test]
    fn ping_rejects_unexpected_answers() {
        let t = Scripted::new(vec![ok("<html>proxy</html>"), ok(r#"{"version":"1"}"#)]);
        let c = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        assert!(ping(&c).unwrap_err().message.contains("not a JSON row"));
        assert!(ping(&c).unwrap_err().message.contains("no 'timezone'"));
    }
}
