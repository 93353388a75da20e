//! `state ...`: the pipeline state store from the command line (mirrors `meltano state`).

use std::io::Read;
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::client::{Client, Error, ErrorKind, Transport};
use crate::platform::Platform;
use crate::state::{json as parts, State, StateStore};

use super::{GlobalArgs, Output, Runner, StoreArgs};

/// State commands.
#[derive(Subcommand, Debug, Clone)]
pub enum StateCommand {
    /// List state ids, optionally only those matching an fnmatch PATTERN (* ? [seq] [!seq]).
    List {
        /// fnmatch pattern.
        pattern: Option<String>,
    },
    /// Print a state: the completed part with the partial part merged over it (as
    /// `meltano state get`); with --json, both parts.
    Get {
        /// State id.
        id: String,
    },
    /// Overwrite a state with JSON as its completed part (as `meltano state set`).
    Set {
        /// State id.
        id: String,
        /// A JSON object.
        #[arg(value_name = "JSON")]
        state: String,
        /// Store the JSON as the partial part instead (the completed part becomes empty).
        #[arg(long)]
        partial: bool,
    },
    /// Deep-merge a JSON object into the partial part, under the lock (Meltano `update`).
    Merge {
        /// State id.
        id: String,
        /// A JSON object.
        #[arg(value_name = "JSON")]
        state: String,
    },
    /// Delete one state.
    Clear {
        /// State id.
        id: String,
    },
    /// Delete every state (asks for --yes).
    ClearAll {
        /// Really delete every state.
        #[arg(long)]
        yes: bool,
    },
    /// Copy a state to another id (overwriting it).
    Copy {
        /// Source id.
        src: String,
        /// Destination id.
        dst: String,
    },
    /// Move a state to another id (overwriting it), removing the source.
    Move {
        /// Source id.
        src: String,
        /// Destination id.
        dst: String,
    },
    /// Print states as NDJSON lines {"id", "partial", "completed"}.
    Export {
        /// fnmatch pattern.
        pattern: Option<String>,
    },
    /// Write states from NDJSON lines (or a JSON array) of {"id", "partial", "completed"}, in
    /// one insert; FILE may be - for stdin. Everything is validated before anything is written.
    Import {
        /// File to read, or -.
        file: PathBuf,
    },
}

fn not_found(id: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("no state for id '{}'", id.escape_debug()),
    )
}

fn state_json(state: &State) -> Value {
    json!({
        "id": state.id,
        "partial": Value::Object(state.partial.clone()),
        "completed": Value::Object(state.completed.clone()),
    })
}

fn pretty(map: Map<String, Value>) -> String {
    serde_json::to_string_pretty(&Value::Object(map)).unwrap_or_default()
}

/// Runs a state command.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    store: &StoreArgs,
    command: &StateCommand,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    // Validate (and parse, once) what can be checked before connecting.
    let mut import = None;
    let mut given = Map::new();
    match command {
        StateCommand::Import { file } => import = Some(read_import(file, runner)?),
        StateCommand::ClearAll { yes: false } => {
            return Err(Error::invalid(
                "clear-all deletes every state: run again with --yes",
            ))
        }
        StateCommand::Set { id, state, .. } | StateCommand::Merge { id, state } => {
            crate::state::check_id(id)?;
            given = parts::parse_part(state, "the state")?;
        }
        _ => {}
    }
    let options = store.options()?;
    let held = |id: &str| store.held_lock(id);
    let client = Client::new(&global.connection()?, runner.transport.clone())?;
    let store = StateStore::open(client, runner.platform.clone(), &options)?;
    match command {
        StateCommand::List { pattern } => {
            let ids = store.ids(pattern.as_deref())?;
            let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
            Ok(Output::new(text, json!(ids)))
        }
        StateCommand::Get { id } => {
            let state = store.get(id)?.ok_or_else(|| not_found(id))?;
            Ok(Output::new(pretty(state.merged()), state_json(&state)))
        }
        StateCommand::Set { id, state, partial } => {
            let body = parts::parse_part(state, "the state")?;
            let new = if *partial {
                State {
                    id: id.clone(),
                    partial: body,
                    completed: Map::new(),
                }
            } else {
                State {
                    id: id.clone(),
                    partial: Map::new(),
                    completed: body,
                }
            };
            match held(id) {
                Some(handle) => store.set_held(&new, &handle)?,
                None => store.set(&new)?,
            }
            Ok(Output::new(
                format!("set state '{}'", id.escape_debug()),
                json!({"ok": true, "id": id}),
            ))
        }
        StateCommand::Merge { id, .. } => {
            let update = State {
                id: id.clone(),
                partial: given,
                completed: Map::new(),
            };
            let stored = match held(id) {
                Some(handle) => store.update_held(&update, &handle)?,
                None => store.update(&update)?,
            };
            Ok(Output::new(pretty(stored.merged()), state_json(&stored)))
        }
        StateCommand::Clear { id } => {
            let n = match held(id) {
                Some(handle) => store.delete_held(id, &handle)?,
                None => store.delete(id)?,
            };
            if n == 0 {
                return Err(not_found(id));
            }
            Ok(Output::new(
                format!("cleared state '{}'", id.escape_debug()),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::ClearAll { .. } => {
            let n = store.clear_all()?;
            Ok(Output::new(
                format!("cleared {n} states"),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::Copy { src, dst } | StateCommand::Move { src, dst } => {
            let mut state = store.get(src)?.ok_or_else(|| not_found(src))?;
            state.id = dst.clone();
            // Under the destination's lock (and the source's, for the delete of a move).
            match held(dst) {
                Some(handle) => store.set_held(&state, &handle)?,
                None => store.set_locked(&state)?,
            }
            let moved = matches!(command, StateCommand::Move { .. });
            if moved && src != dst {
                match held(src) {
                    Some(handle) => store.delete_held(src, &handle)?,
                    None => store.delete(src)?,
                };
            }
            let verb = if moved { "moved" } else { "copied" };
            Ok(Output::new(
                format!(
                    "{verb} '{}' to '{}'",
                    src.escape_debug(),
                    dst.escape_debug()
                ),
                json!({"ok": true, "from": src, "to": dst}),
            ))
        }
        StateCommand::Export { pattern } => {
            let states = store.get_all(pattern.as_deref())?;
            let lines: String = states
                .iter()
                .map(|s| format!("{}\n", state_json(s)))
                .collect();
            Ok(Output::raw(lines))
        }
        StateCommand::Import { .. } => {
            let states = import.unwrap_or_default();
            let n = states.len();
            store.set_all(&states)?;
            Ok(Output::new(
                format!("imported {n} states"),
                json!({"ok": true, "imported": n}),
            ))
        }
    }
}

/// Reads and validates an import: NDJSON lines or one JSON array of objects with `id`, and
/// optional `partial` / `completed` objects.
fn read_import<T, P>(file: &PathBuf, runner: &mut Runner<'_, T, P>) -> Result<Vec<State>, Error> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        runner
            .stdin
            .read_to_string(&mut text)
            .map_err(|e| Error::invalid(format!("reading stdin: {e}")))?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|e| Error::invalid(format!("reading {}: {e}", file.display())))?;
    }
    // Each item is parsed once, strictly (duplicate keys rejected at any depth, as the store
    // does for every part).
    let mut items: Vec<(usize, Map<String, Value>)> = Vec::new();
    if text.trim_start().starts_with('[') {
        let elements: Vec<&RawValue> = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("the import is not a valid JSON array: {e}")))?;
        for (i, element) in elements.into_iter().enumerate() {
            items.push((
                i + 1,
                parts::parse_part(element.get(), &format!("item {}", i + 1))?,
            ));
        }
    } else {
        for (n, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                items.push((n + 1, parts::parse_part(line, &format!("line {}", n + 1))?));
            }
        }
    }
    let mut states = Vec::with_capacity(items.len());
    for (n, mut item) in items {
        let id = match item.remove("id") {
            Some(Value::String(id)) => id,
            _ => return Err(Error::invalid(format!("item {n}: \"id\" must be a string"))),
        };
        crate::state::check_id(&id)
            .map_err(|e| Error::invalid(format!("item {n}: {}", e.message)))?;
        let mut part = |key: &str| -> Result<Map<String, Value>, Error> {
            match item.remove(key) {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(map)) => Ok(map),
                Some(_) => Err(Error::invalid(format!(
                    "item {n}: \"{key}\" must be an object"
                ))),
            }
        };
        let partial = part("partial")?;
        let completed = part("completed")?;
        states.push(State {
            id,
            partial,
            completed,
        });
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::transport::Transport;

    struct NoNetwork;
    impl Transport for NoNetwork {
        fn send(
            &self,
            _: &crate::client::HttpRequest,
        ) -> Result<crate::client::HttpResponse, crate::client::error::TransportError> {
            panic!("an import is validated before any request")
        }
    }

    fn import(text: &'static str) -> Result<Vec<State>, Error> {
        let mut stderr = Vec::new();
        let mut runner = Runner {
            transport: NoNetwork,
            platform: crate::platform::std_platform::StdPlatform::default(),
            stdin: Box::new(text.as_bytes()),
            stderr: &mut stderr,
            progress: false,
        };
        read_import(&PathBuf::from("-"), &mut runner)
    }

    #[test]
    fn imports_are_parsed_strictly() {
        let states =
            import("{\"id\":\"a\",\"completed\":{\"n\":18446744073709551616}}\n\n").unwrap();
        assert_eq!(states[0].id, "a");
        assert_eq!(
            Value::Object(states[0].completed.clone()).to_string(),
            "{\"n\":18446744073709551616}"
        );
        let states = import("[{\"id\":\"a\"},{\"id\":\"b\",\"partial\":{\"x\":1}}]").unwrap();
        assert_eq!(states.len(), 2);
        for (text, want) in [
            (
                "{\"id\":\"a\",\"completed\":{\"k\":1,\"k\":2}}",
                "duplicate key",
            ),
            ("[{\"id\":\"a\",\"id\":\"b\"}]", "duplicate key"),
            ("{\"id\":\"a\"}\nnot json", "line 2"),
            ("{\"id\":1}", "\"id\" must be a string"),
            ("{\"id\":\"\"}", "must not be empty"),
            (
                "{\"id\":\"a\",\"partial\":[1]}",
                "\"partial\" must be an object",
            ),
            ("[1]", "item 1"),
        ] {
            let e = import(text).unwrap_err();
            assert!(e.message.contains(want), "{text}: {}", e.message);
        }
    }
}
