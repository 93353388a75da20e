//! The HTTP API's plain parts, native and unit-tested: which route a request names, the
//! percent-decoding of path segments and query values, and the HTTP status of each error kind.

/// One call of the API.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /state/{id}`: the state, or 404.
    GetState(String),
    /// `PUT /state/{id}`: overwrite (`state-store.store.set`).
    PutState(String),
    /// `POST /state/{id}/merge`: Meltano's update under the lock (`state-store.store.update`).
    MergeState(String),
    /// `GET /states?pattern=GLOB`: the matching ids (all without a pattern).
    ListStates(Option<String>),
    /// `POST /sink/{table}?batch-size=N`: the NDJSON body into `table`.
    Sink {
        table: String,
        batch_size: Option<u32>,
    },
}

/// A request the router refuses, before anything else happens.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such route: 404, kind `not-found`.
    NoRoute,
    /// The route exists but not with this method: 405 with `allow`, kind `invalid-input`.
    Method { allow: &'static str },
    /// A malformed path or query (bad escape, not UTF-8, empty id, bad number): 400.
    Malformed(String),
}

/// The route of `method` and `path_with_query` (`/state/a%2Fb?x=1`).
pub fn route(method: &str, path_with_query: &str) -> Result<Route, Refusal> {
    let (path, query) = match path_with_query.split_once('?') {
        Some((p, q)) => (p, q),
        None => (path_with_query, ""),
    };
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let method_is = |allowed: &'static str| {
        if method == allowed {
            Ok(())
        } else {
            Err(Refusal::Method { allow: allowed })
        }
    };
    match segments.as_slice() {
        ["state", id] => {
            let id = segment(id, "state id")?;
            match method {
                "GET" => Ok(Route::GetState(id)),
                "PUT" => Ok(Route::PutState(id)),
                _ => Err(Refusal::Method { allow: "GET, PUT" }),
            }
        }
        ["state", id, "merge"] => {
            method_is("POST")?;
            Ok(Route::MergeState(segment(id, "state id")?))
        }
        ["states"] => {
            method_is("GET")?;
            Ok(Route::ListStates(query_value(query, "pattern")?))
        }
        ["sink", table] => {
            method_is("POST")?;
            let table = segment(table, "table")?;
            let batch_size = match query_value(query, "batch-size")? {
                None => None,
                Some(n) => Some(n.parse::<u32>().map_err(|_| {
                    Refusal::Malformed(format!("batch-size must be a number, not {n:?}"))
                })?),
            };
            Ok(Route::Sink { table, batch_size })
        }
        _ => Err(Refusal::NoRoute),
    }
}

fn segment(raw: &str, what: &str) -> Result<String, Refusal> {
    let decoded = percent_decode(raw, false).map_err(Refusal::Malformed)?;
    if decoded.is_empty() {
        return Err(Refusal::Malformed(format!("the {what} is empty")));
    }
    Ok(decoded)
}

/// The value of `name` in a query string (`+` is a space there), the last one if repeated.
fn query_value(query: &str, name: &str) -> Result<Option<String>, Refusal> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode(key, true).map_err(Refusal::Malformed)? == name {
            found = Some(percent_decode(value, true).map_err(Refusal::Malformed)?);
        }
    }
    Ok(found)
}

/// Percent-decodes `text` (and `+` to a space when `plus_is_space`); the result must be UTF-8.
pub fn percent_decode(text: &str, plus_is_space: bool) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape in {text:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} does not decode to UTF-8"))
}

/// The HTTP status of an error kind (the WIT `error-kind`'s name): 4xx where the same request
/// fails the same way, 5xx where the database or the path to it failed.
pub fn status_of(kind: &str) -> u16 {
    match kind {
        "invalid-input" => 400,
        "not-found" => 404,
        // Another request holds the id's lock for longer than the lock timeout.
        "locked" => 409,
        // The request names what the database does not have (an unknown table or column) or
        // sends what it rejects (a value of the wrong type): retrying will not help.
        "misconfigured" | "permanent" => 422,
        "throttled" => 429,
        "disconnected" => 502,
        "transient" => 503,
        // A write may or may not have committed (a timeout or reset after sending).
        "uncertain" => 504,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("GET", "/state/a%2Fb"),
            Ok(Route::GetState("a/b".into()))
        );
        assert_eq!(route("PUT", "/state/x"), Ok(Route::PutState("x".into())));
        assert_eq!(
            route("POST", "/state/x/merge"),
            Ok(Route::MergeState("x".into()))
        );
        assert_eq!(
            route("GET", "/states?pattern=tap-%2A+x"),
            Ok(Route::ListStates(Some("tap-* x".into())))
        );
        assert_eq!(route("GET", "/states"), Ok(Route::ListStates(None)));
        assert_eq!(
            route("POST", "/sink/db.t?batch-size=500"),
            Ok(Route::Sink {
                table: "db.t".into(),
                batch_size: Some(500)
            })
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(route("GET", "/"), Err(Refusal::NoRoute));
        assert_eq!(route("GET", "/state/x/y"), Err(Refusal::NoRoute));
        assert_eq!(
            route("DELETE", "/state/x"),
            Err(Refusal::Method { allow: "GET, PUT" })
        );
        assert_eq!(
            route("GET", "/sink/t"),
            Err(Refusal::Method { allow: "POST" })
        );
        assert!(matches!(
            route("GET", "/state/"),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            route("GET", "/state/%zz"),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            route("GET", "/state/%ff"),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            route("POST", "/sink/t?batch-size=-1"),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn statuses() {
        assert_eq!(status_of("invalid-input"), 400);
        assert_eq!(status_of("misconfigured"), 422);
        assert_eq!(status_of("locked"), 409);
        assert_eq!(status_of("uncertain"), 504);
        assert_eq!(status_of("something-new"), 500);
    }
}
