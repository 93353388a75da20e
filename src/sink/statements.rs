//! Every request the sink sends, named in one place with its repeat rule, and the one send, as
//! the state store's requests are ([`crate::state`]'s steps).
//!
//! A request is made only by [`Statement::query`], and sent only by [`send`], which repeats it
//! as its statement says. The sink's rule is one for all of them: a failed attempt is repeated,
//! on an error worth repeating ([`retry::is_worth_retrying`]), up to the sink's retries. The
//! reads change nothing. An INSERT is repeated only under its deduplication token: the sink's
//! retries are 0 without dedup (its configuration refuses retries without it), so a chunk is
//! never sent twice where the server could write it twice. What a failure means once a chunk
//! has been committed (`uncertain`) is the driver's.

use crate::client::retry::{self, Retried, RetryPolicy};
use crate::client::{Client, Error, HttpRequest, InFlight, Query, Response, Transport};
use crate::platform::Platform;

/// One kind of request; its name is the operation header the host logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Statement {
    /// Whether the table deduplicates inserts (at open, with dedup).
    CheckDedup,
    /// The table's columns and their types (at the first send).
    Describe,
    /// The server's time zone (for date-time columns that name none).
    Timezone,
    /// One chunk's INSERT.
    Insert,
}

impl Statement {
    /// The operation name sent in the `x-component-operation` header.
    pub fn name(self) -> &'static str {
        match self {
            Statement::CheckDedup => "check-dedup",
            Statement::Describe => "describe",
            Statement::Timezone => "timezone",
            Statement::Insert => "send",
        }
    }

    /// A request of this statement: an INSERT writes, the others read.
    pub fn query(self, sql: impl Into<String>) -> Query {
        match self {
            Statement::Insert => Query::write(self.name(), sql),
            _ => Query::read(self.name(), sql),
        }
    }
}

/// Sends `request` (of a [`Statement`]), repeating a failed attempt as the module's rule says,
/// up to `retries` times. `in_flight`: the answer to a first attempt already started (a chunk
/// sent while the previous one was read), waited for before any repeat.
pub fn send<T: Transport, P: Platform>(
    client: &Client<T>,
    platform: &P,
    retries: u32,
    request: &HttpRequest,
    mut in_flight: Option<InFlight>,
) -> Result<Retried<Response>, Error> {
    retry::run(
        &RetryPolicy::new(retries),
        platform,
        None,
        || match in_flight.take() {
            Some(answer) => client.wait(request, answer),
            None => client.send(request),
        },
        |e| retry::is_worth_retrying(e.kind),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::Operation;

    #[test]
    fn an_insert_writes_and_every_other_statement_reads() {
        for statement in [
            Statement::CheckDedup,
            Statement::Describe,
            Statement::Timezone,
            Statement::Insert,
        ] {
            let query = statement.query("SELECT 1");
            assert_eq!(query.name, statement.name());
            assert_eq!(
                query.operation == Operation::Write,
                statement == Statement::Insert,
                "{statement:?}"
            );
        }
    }
}
