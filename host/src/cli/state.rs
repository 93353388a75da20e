//! `state ...`: the pipeline state store from the command line (mirrors `meltano state`).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use clap::Subcommand;
use clickhouse_component::client::{Error, ErrorKind};
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::{CallError, State};
use serde_json::{json, Map, Value};

use super::{open_store, Output, StoreArgs};

/// State commands.
#[derive(Subcommand, Debug)]
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

fn not_found(id: &str) -> CallError {
    CallError::Component(Error::new(
        ErrorKind::NotFound,
        format!("no state for id '{}'", id.escape_debug()),
    ))
}

fn invalid(message: String) -> CallError {
    CallError::Component(Error::invalid(message))
}

fn parse_object(text: &str) -> Result<Map<String, Value>, CallError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid("the state must be a JSON object".into())),
        Err(e) => Err(invalid(format!("the state is not valid JSON: {e}"))),
    }
}

fn state_json(state: &State) -> Value {
    let parse = |t: &str| serde_json::from_str::<Value>(t).unwrap_or(Value::Null);
    json!({"id": state.id, "partial": parse(&state.partial), "completed": parse(&state.completed)})
}

fn merged_view(state: &State) -> Value {
    let parse = |t: &str| match serde_json::from_str::<Value>(t) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let mut merged = parse(&state.completed);
    clickhouse_component::state::json::deep_merge(&mut merged, &parse(&state.partial));
    Value::Object(merged)
}

/// Runs a state command.
pub async fn run(
    global: &GlobalArgs,
    store: &StoreArgs,
    command: &StateCommand,
) -> Result<Output, CallError> {
    // Validate what can be validated before connecting.
    let import = match command {
        StateCommand::Import { file } => Some(read_import(file)?),
        StateCommand::ClearAll { yes: false } => {
            let hint = if std::io::stdin().is_terminal() {
                "this deletes every state: run again with --yes"
            } else {
                "clear-all deletes every state and needs --yes"
            };
            return Err(invalid(hint.into()));
        }
        _ => None,
    };
    let (mut session, handle) = open_store(global, store).await?;
    let instance = &mut session.instance;
    match command {
        StateCommand::List { pattern } => {
            let ids = instance.state_ids(handle, pattern.as_deref()).await?;
            let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
            Ok(Output::new(text, json!(ids)))
        }
        StateCommand::Get { id } => {
            let state = instance
                .state_get(handle, id)
                .await?
                .ok_or_else(|| not_found(id))?;
            let merged = merged_view(&state);
            Ok(Output::new(
                serde_json::to_string_pretty(&merged).unwrap_or_default(),
                state_json(&state),
            ))
        }
        StateCommand::Set { id, state, partial } => {
            let body = Value::Object(parse_object(state)?).to_string();
            let (p, c) = if *partial {
                (body, String::new())
            } else {
                (String::new(), body)
            };
            let state = State {
                id: id.clone(),
                partial: p,
                completed: c,
            };
            instance.state_set(handle, &state).await?;
            Ok(Output::new(
                format!("set state '{}'", id.escape_debug()),
                json!({"ok": true, "id": id}),
            ))
        }
        StateCommand::Merge { id, state } => {
            let state = State {
                id: id.clone(),
                partial: Value::Object(parse_object(state)?).to_string(),
                completed: String::new(),
            };
            let stored = instance.state_update(handle, &state).await?;
            Ok(Output::new(
                serde_json::to_string_pretty(&merged_view(&stored)).unwrap_or_default(),
                state_json(&stored),
            ))
        }
        StateCommand::Clear { id } => {
            let n = instance.state_delete(handle, id).await?;
            if n == 0 {
                return Err(not_found(id));
            }
            Ok(Output::new(
                format!("cleared state '{}'", id.escape_debug()),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::ClearAll { .. } => {
            let n = instance.state_clear_all(handle).await?;
            Ok(Output::new(
                format!("cleared {n} states"),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::Copy { src, dst } | StateCommand::Move { src, dst } => {
            let mut state = instance
                .state_get(handle, src)
                .await?
                .ok_or_else(|| not_found(src))?;
            state.id = dst.clone();
            instance.state_set(handle, &state).await?;
            let moved = matches!(command, StateCommand::Move { .. });
            if moved && src != dst {
                instance.state_delete(handle, src).await?;
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
            let states = instance.state_get_all(handle, pattern.as_deref()).await?;
            let lines: String = states
                .iter()
                .map(|s| format!("{}\n", state_json(s)))
                .collect();
            // NDJSON is already machine-readable: --json prints the same lines.
            let mut out = Output::new(lines.clone(), Value::Null);
            out.json = Value::String(lines);
            Ok(out)
        }
        StateCommand::Import { .. } => {
            let states = import.unwrap_or_default();
            let n = states.len();
            instance.state_set_all(handle, &states).await?;
            Ok(Output::new(
                format!("imported {n} states"),
                json!({"ok": true, "imported": n}),
            ))
        }
    }
}

/// Reads and validates an import file: NDJSON lines or one JSON array of objects with `id`,
/// and optional `partial` / `completed` objects.
fn read_import(file: &PathBuf) -> Result<Vec<State>, CallError> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| invalid(format!("reading stdin: {e}")))?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|e| invalid(format!("reading {}: {e}", file.display())))?;
    }
    let items: Vec<(usize, Value)> = if text.trim_start().starts_with('[') {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i + 1, v))
                .collect(),
            Ok(_) | Err(_) => {
                return Err(invalid("the import file is not a valid JSON array".into()))
            }
        }
    } else {
        let mut items = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value = serde_json::from_str(line)
                .map_err(|e| invalid(format!("line {}: not valid JSON: {e}", n + 1)))?;
            items.push((n + 1, value));
        }
        items
    };
    let mut states = Vec::with_capacity(items.len());
    for (n, item) in items {
        let Value::Object(map) = item else {
            return Err(invalid(format!("item {n}: expected an object with \"id\"")));
        };
        let id = map
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("item {n}: \"id\" must be a string")))?;
        let part = |key: &str| -> Result<String, CallError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(v @ Value::Object(_)) => Ok(v.to_string()),
                Some(_) => Err(invalid(format!("item {n}: \"{key}\" must be an object"))),
            }
        };
        states.push(State {
            id: id.to_string(),
            partial: part("partial")?,
            completed: part("completed")?,
        });
    }
    Ok(states)
}
