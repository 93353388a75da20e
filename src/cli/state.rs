//! `state ...`: the pipeline state store from the command line, a drop-in for `meltano state`
//! (Meltano 4.4.1): the same commands, arguments, options and output, plus extras that do not
//! collide (`--json`, writes through a held lock, `export --format ndjson`, `clear-all`, a
//! positional `list PATTERN`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Subcommand, ValueEnum};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::client::{Client, Error, ErrorKind, Transport};
use crate::platform::Platform;
use crate::state::{json as parts, State, StateStore};

use super::{GlobalArgs, Output, Runner, StoreArgs};

/// Meltano's `SINGER_STATE_KEY`: a state given to `set`, `merge`, `copy`, `move` or `edit`
/// must have it at the top level (unless `--no-validate`).
pub const SINGER_STATE_KEY: &str = "singer_state";

/// `state get --format`.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GetFormat {
    /// Compact single-line JSON (ready for `state set`).
    #[default]
    Json,
    /// Indented JSON (two spaces).
    Pretty,
}

/// `state export --format`.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExportFormat {
    /// One JSON object {"<id>": {"completed": {...}, "partial": {...}}, ...} (Meltano's).
    #[default]
    Json,
    /// One line per state: {"id", "partial", "completed"}.
    Ndjson,
}

/// State commands.
#[derive(Subcommand, Debug, Clone)]
pub enum StateCommand {
    /// List state ids, optionally only those matching an fnmatch pattern (* ? [seq] [!seq]).
    List {
        /// Filter state IDs by pattern (fnmatch, exact: * ? [seq] [!seq]).
        #[arg(long = "pattern", value_name = "PATTERN", conflicts_with = "pattern")]
        pattern_option: Option<String>,
        /// The same as --pattern.
        #[arg(value_name = "PATTERN")]
        pattern: Option<String>,
    },
    /// Print a state: the completed part with the partial part merged over it, `{}` if there
    /// is none (as `meltano state get`); with --json, both parts.
    Get {
        /// State id.
        id: String,
        /// json: compact single line (default); pretty: indented.
        #[arg(long, value_enum, default_value_t = GetFormat::Json, ignore_case = true)]
        format: GetFormat,
    },
    /// Overwrite a state (Meltano `set`): STATE (or --input-file) becomes the completed part,
    /// the partial part is cleared; under the lock on the id.
    Set {
        /// State id.
        id: String,
        /// A JSON object with a top-level "singer_state" key.
        #[arg(value_name = "STATE")]
        state: Option<String>,
        /// Read the state from this JSON file (- for stdin, which needs --force).
        #[arg(long, value_name = "FILE")]
        input_file: Option<PathBuf>,
        /// Skip validation of state structure (not recommended).
        #[arg(long)]
        no_validate: bool,
        /// Store the JSON as the partial part instead (the completed part becomes empty).
        #[arg(long)]
        partial: bool,
        /// Don't prompt for confirmation.
        #[arg(long, alias = "yes")]
        force: bool,
    },
    /// Add bookmarks to existing state (Meltano `merge`): deep-merge STATE, --input-file or
    /// the state of --from-state-id into the partial part, under the lock.
    Merge {
        /// State id.
        id: String,
        /// A JSON object with a top-level "singer_state" key.
        #[arg(value_name = "STATE")]
        state: Option<String>,
        /// Merge state from a JSON file containing Singer state (- for stdin).
        #[arg(long, value_name = "FILE")]
        input_file: Option<PathBuf>,
        /// Merge state from an existing state ID.
        #[arg(long, value_name = "ID")]
        from_state_id: Option<String>,
        /// Skip validation of state structure (not in Meltano's merge).
        #[arg(long)]
        no_validate: bool,
    },
    /// Edit state in your default text editor ($VISUAL / $EDITOR): needs a runner that can
    /// start one (the reference host); a component alone answers misconfigured.
    Edit {
        /// State id.
        id: String,
        /// Don't prompt for confirmation.
        #[arg(long, alias = "yes")]
        force: bool,
    },
    /// Clear one state (succeeds if there is none), or every state with --all.
    Clear {
        /// State id.
        #[arg(value_name = "STATE_ID")]
        id: Option<String>,
        /// Clear all state IDs.
        #[arg(long)]
        all: bool,
        /// Don't prompt for confirmation.
        #[arg(long, alias = "yes")]
        force: bool,
    },
    /// Delete every state (an alias of `clear --all` that never prompts: needs --yes or
    /// --force).
    ClearAll {
        /// Really delete every state.
        #[arg(long, alias = "force")]
        yes: bool,
    },
    /// Copy a state to another id: the destination's completed part becomes the source's
    /// merged state (Meltano `copy`).
    Copy {
        /// Source id.
        src: String,
        /// Destination id.
        dst: String,
        /// Skip validation of the source state's structure.
        #[arg(long)]
        no_validate: bool,
        /// Don't prompt for confirmation.
        #[arg(long, alias = "yes")]
        force: bool,
    },
    /// Move a state to another id (as `copy`), then clear the source.
    Move {
        /// Source id.
        src: String,
        /// Destination id.
        dst: String,
        /// Skip validation of the source state's structure.
        #[arg(long)]
        no_validate: bool,
        /// Don't prompt for confirmation.
        #[arg(long, alias = "yes")]
        force: bool,
    },
    /// Export states to JSON on stdout: one object {"<id>": {"completed": {...}, "partial":
    /// {...}}} (for `state import`), or NDJSON lines with --format ndjson.
    Export {
        /// Only the ids matching this fnmatch pattern.
        pattern: Option<String>,
        /// json: one object (Meltano's, default); ndjson: {"id","partial","completed"} lines.
        #[arg(long, value_enum, default_value_t = ExportFormat::Json, ignore_case = true)]
        format: ExportFormat,
    },
    /// Import states (overwriting each id present) from what `export` prints: one JSON object
    /// {"<id>": {"completed", "partial"}} (Meltano's), or NDJSON lines / a JSON array of
    /// {"id", "partial", "completed"}. Validated first, written in one insert.
    Import {
        /// File to read; - (the default) for stdin.
        #[arg(default_value = "-")]
        file: PathBuf,
    },
}

/// A failure before connecting: ours (exit code of its kind), or one Meltano reports with
/// its own exit code (1: invalid JSON, `InvalidJobStateError`, mutually exclusive options,
/// an unreadable import; 2: a usage error), which a drop-in must keep.
enum Failure {
    Ours(Error),
    Meltano(Error, i32),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Ours(e)
    }
}

/// An error Meltano answers with exit 1 (a `ClickException` or an uncaught one).
fn meltano1(e: Error) -> Failure {
    Failure::Meltano(e, 1)
}

/// Prints `e` as every error is printed (stderr, or JSON on stdout with --json), exiting with
/// Meltano's `code` instead of the kind's.
fn meltano_failure<T, P>(
    global: &GlobalArgs,
    runner: &mut Runner<'_, T, P>,
    e: Error,
    code: i32,
) -> Output {
    if !global.json {
        super::output::error(false, &e, &mut std::io::sink(), runner.stderr);
    }
    Output {
        text: String::new(),
        json: super::output::error_json(&e),
        code,
    }
}

fn state_json(state: &State) -> Value {
    json!({
        "id": state.id,
        "partial": Value::Object(state.partial.clone()),
        "completed": Value::Object(state.completed.clone()),
    })
}

/// JSON text as Python's `json.dumps` writes it (`ensure_ascii`): every character outside
/// printable ASCII escaped as `\uXXXX` (lowercase hex, surrogate pairs above U+FFFF), so the
/// output is byte for byte Meltano's for the same state (numbers keep their stored text).
/// Compact (`separators=(",", ":")`) or indented by two spaces (`indent=2`).
pub fn python_json(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    }
    .unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && c != '\u{7f}' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// Meltano's `StateService.validate_state`: `InvalidJobStateError` unless the state has
/// `singer_state` at its top level (its message; ours is `invalid-input`).
pub fn validate_state(state: &Map<String, Value>) -> Result<(), Error> {
    if state.contains_key(SINGER_STATE_KEY) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "Invalid state format: {SINGER_STATE_KEY} not found in top level of provided state. \
             State must be valid JSON with a top-level '{SINGER_STATE_KEY}' key. \
             Use --no-validate to bypass this check."
        )))
    }
}

/// Where a `set` / `merge` takes its state from: exactly one of them (Meltano's
/// `MutuallyExclusiveOptionsError`; an empty STATE counts as not given, as in Meltano).
#[derive(Debug, PartialEq, Eq)]
enum Source<'a> {
    Text(&'a str),
    File(&'a Path),
    StateId(&'a str),
}

fn source<'a>(
    state: Option<&'a str>,
    input_file: Option<&'a Path>,
    from_state_id: Option<&'a str>,
    names: &str,
) -> Result<Source<'a>, Error> {
    let given: Vec<Source<'a>> = [
        input_file
            .filter(|p| !p.as_os_str().is_empty())
            .map(Source::File),
        state.filter(|s| !s.is_empty()).map(Source::Text),
        from_state_id.filter(|s| !s.is_empty()).map(Source::StateId),
    ]
    .into_iter()
    .flatten()
    .collect();
    match <[Source; 1]>::try_from(given) {
        Ok([one]) => Ok(one),
        Err(_) => Err(Error::invalid(format!(
            "Must provide exactly one of: {names}"
        ))),
    }
}

/// Reads a file, `-` being the runner's stdin. In a component the file must be in a directory
/// its runner gives it (the reference host gives the file's).
fn read_input<T, P>(file: &Path, runner: &mut Runner<'_, T, P>) -> Result<String, Error> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        runner
            .stdin
            .read_to_string(&mut text)
            .map_err(|e| Error::invalid(format!("reading stdin: {e}")))?;
        return Ok(text);
    }
    std::fs::read_to_string(file).map_err(|e| {
        Error::invalid(format!(
            "reading {}: {e}{}",
            file.display(),
            super::no_files_hint()
        ))
    })
}

/// A state given on the command line or in a file: a JSON object (Meltano: "Invalid JSON
/// provided"), validated unless `no_validate`.
fn parse_given(text: &str, no_validate: bool) -> Result<Map<String, Value>, Error> {
    if text.trim().is_empty() {
        // json.loads("") fails in Meltano; parse_part would read it as {}.
        return Err(Error::invalid(
            "Invalid JSON provided: Expecting value: line 1 column 1 (char 0)",
        ));
    }
    let state = parts::parse_part(text, "the state")
        .map_err(|e| Error::invalid(format!("Invalid JSON provided: {}", e.message)))?;
    if !no_validate {
        validate_state(&state)?;
    }
    Ok(state)
}

/// What a confirmation prompt decided.
enum Confirmed {
    Yes,
    /// Stop with this output (exit 1, as Meltano's `ctx.exit(1)` / click's `Abort`).
    No(Output),
}

/// Meltano's `--force` option: unless given, asks (see [`ask_to_continue`]); a refusal stops
/// with [`declined`].
fn confirm<T, P>(force: bool, prompt: &str, runner: &mut Runner<'_, T, P>) -> Confirmed {
    if force || ask_to_continue(prompt, &mut runner.stdin, &mut runner.stderr) {
        Confirmed::Yes
    } else {
        Confirmed::No(declined())
    }
}

/// What a declined confirmation prints (nothing, or `{"ok": false, "confirmed": false}` with
/// --json) and its exit code (1).
pub fn declined() -> Output {
    Output {
        text: String::new(),
        json: json!({"ok": false, "confirmed": false}),
        code: 1,
    }
}

/// Asks `PROMPT [y/N]: ` on `output` (stderr; click writes it on stdout) and reads one line of
/// `input`, as `click.confirm` does whether or not stdin is a terminal: `y`/`yes` go on (true);
/// `n`/`no`/an empty line stop (false) with no message; at the end of the input (no answer at
/// all) `Aborted!` and false; anything else asks again. The reference host asks with it too
/// (`state edit`, and `set --input-file FILE`, whose file takes the component's stdin).
pub fn ask_to_continue(prompt: &str, input: &mut dyn Read, output: &mut dyn Write) -> bool {
    loop {
        let _ = write!(output, "{prompt} [y/N]: ");
        let _ = output.flush();
        let Some(line) = read_line(input) else {
            let _ = writeln!(output, "\nAborted!");
            return false;
        };
        match line.trim().to_lowercase().as_str() {
            "y" | "yes" => return true,
            "n" | "no" | "" => return false,
            _ => {
                let _ = writeln!(output, "Error: invalid input");
            }
        }
    }
}

/// One line of `input` (without its newline), read byte by byte (nothing after it is
/// consumed); `None` at the end of the input before any byte.
fn read_line(input: &mut dyn Read) -> Option<String> {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match input.read(&mut byte) {
            Ok(0) | Err(_) => break,
            Ok(_) if byte[0] == b'\n' => return Some(String::from_utf8_lossy(&bytes).into()),
            Ok(_) => bytes.push(byte[0]),
        }
    }
    if bytes.is_empty() {
        None
    } else {
        Some(String::from_utf8_lossy(&bytes).into())
    }
}

/// What a write prints: nothing on stdout (Meltano logs it), `message` on stderr; with
/// --json, `json` on stdout.
fn done<T, P>(
    global: &GlobalArgs,
    runner: &mut Runner<'_, T, P>,
    message: String,
    json: Value,
) -> Output {
    if !global.json {
        let _ = writeln!(runner.stderr, "{}", super::output::sanitize(&message));
    }
    Output::new(String::new(), json)
}

fn quoted(id: &str) -> std::borrow::Cow<'_, str> {
    crate::state::escape_id(id)
}

/// Meltano's confirmation prompt of `set` and `edit`.
pub const OVERWRITE_PROMPT: &str = "This will overwrite the state's current value. Continue?";

const EDIT_UNSUPPORTED: &str = "state edit opens $VISUAL / $EDITOR, which a WebAssembly component cannot start: run it through the reference host, or edit by hand: state get --format pretty ID > state.json; $EDITOR state.json; state set --force --input-file - ID < state.json";

/// Runs a state command: validates (and parses, once) what can be checked before connecting,
/// asks for confirmation, then connects and runs it.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    store_args: &StoreArgs,
    command: &StateCommand,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    let prepared = match prepare(command, runner) {
        Ok(prepared) => prepared,
        Err(Failure::Ours(e)) => return Err(e),
        Err(Failure::Meltano(e, code)) => return Ok(meltano_failure(global, runner, e, code)),
    };
    if let Some((force, prompt)) = prepared.confirmation {
        if let Confirmed::No(output) = confirm(force, prompt, runner) {
            return Ok(output);
        }
    }
    let options = store_args.options()?;
    let client = Client::new(&global.connection()?, runner.transport.clone())?;
    let store = StateStore::open(client, runner.platform.clone(), &options)?;
    execute(global, store_args, &store, command, prepared, runner)
}

/// What a command brings before it connects.
#[derive(Default)]
struct Prepared {
    /// The states of `import`.
    import: Option<Vec<State>>,
    /// The state `set` / `merge` were given (STATE or --input-file).
    given: Map<String, Value>,
    /// Whether to ask (`--force` given, the prompt) before going on.
    confirmation: Option<(bool, &'static str)>,
}

/// The checks a command passes before it connects: ids, exactly one state source, the state
/// itself (parsed once), the import; and the confirmation it asks for.
fn prepare<T, P>(
    command: &StateCommand,
    runner: &mut Runner<'_, T, P>,
) -> Result<Prepared, Failure> {
    Ok(match command {
        StateCommand::Import { file } => {
            let text = read_input(file, runner)?;
            Prepared {
                import: Some(parse_import(&text).map_err(meltano1)?),
                ..Prepared::default()
            }
        }
        StateCommand::ClearAll { yes: false } => {
            return Err(Error::invalid(
                "clear-all deletes every state: run again with --yes (or use clear --all)",
            )
            .into())
        }
        StateCommand::Clear { id, all, force } => {
            if id.as_deref().is_some_and(|s| !s.is_empty()) == *all {
                return Err(Failure::Meltano(
                    Error::invalid("A state ID or the --all flag must be provided, but not both"),
                    2,
                ));
            }
            if let Some(id) = id {
                crate::state::check_id(id)?;
            }
            ask(*force, "This will clear state for the job(s). Continue?")
        }
        StateCommand::Set {
            id,
            state,
            input_file,
            no_validate,
            force,
            ..
        } => {
            crate::state::check_new_id(id)?;
            let from = source(
                state.as_deref(),
                input_file.as_deref(),
                None,
                "--input-file,STATE",
            )
            .map_err(meltano1)?;
            prepare_set(from, *no_validate, *force, runner)?
        }
        StateCommand::Merge {
            id,
            state,
            input_file,
            from_state_id,
            no_validate,
        } => {
            crate::state::check_new_id(id)?;
            let from = source(
                state.as_deref(),
                input_file.as_deref(),
                from_state_id.as_deref(),
                "--input-file,STATE,--from-state-id",
            )
            .map_err(meltano1)?;
            Prepared {
                given: given_state(from, *no_validate, runner)?,
                ..Prepared::default()
            }
        }
        StateCommand::Copy {
            src, dst, force, ..
        } => prepare_copy(src, dst, *force, COPY_PROMPT)?,
        StateCommand::Move {
            src, dst, force, ..
        } => prepare_copy(src, dst, *force, MOVE_PROMPT)?,
        StateCommand::Edit { id, .. } => {
            crate::state::check_new_id(id)?;
            return Err(Error::new(ErrorKind::Misconfigured, EDIT_UNSUPPORTED).into());
        }
        _ => Prepared::default(),
    })
}

/// `copy`'s question (Meltano's words).
const COPY_PROMPT: &str = "This will overwrite state for the destination. Continue?";
/// `move`'s question (Meltano's words).
const MOVE_PROMPT: &str =
    "This will clear the source state and overwrite destination state. Continue?";

/// `copy` / `move`: both ids checked (the source is read, and cleared by `move`: any stored id;
/// the destination is written: a new id's rules), and the question.
fn prepare_copy(
    src: &str,
    dst: &str,
    force: bool,
    prompt: &'static str,
) -> Result<Prepared, Error> {
    crate::state::check_id(src)?;
    crate::state::check_new_id(dst)?;
    Ok(ask(force, prompt))
}

/// A command that asks `prompt` before it runs, unless `force`.
fn ask(force: bool, prompt: &'static str) -> Prepared {
    Prepared {
        confirmation: Some((force, prompt)),
        ..Prepared::default()
    }
}

/// `set`: the given state, and the overwrite question (which cannot be read from stdin when
/// the state comes from there).
fn prepare_set<T, P>(
    from: Source<'_>,
    no_validate: bool,
    force: bool,
    runner: &mut Runner<'_, T, P>,
) -> Result<Prepared, Failure> {
    if matches!(from, Source::File(file) if file.as_os_str() == "-") && !force {
        return Err(Error::invalid(
            "--input-file - reads the state from stdin, where the confirmation would be read: add --force",
        )
        .into());
    }
    Ok(Prepared {
        given: given_state(from, no_validate, runner)?,
        ..ask(force, OVERWRITE_PROMPT)
    })
}

/// The state a `set` / `merge` was given, parsed and (unless `no_validate`) validated; empty
/// for `--from-state-id` (read after connecting), whose id is checked here.
fn given_state<T, P>(
    from: Source<'_>,
    no_validate: bool,
    runner: &mut Runner<'_, T, P>,
) -> Result<Map<String, Value>, Failure> {
    let text = match from {
        Source::Text(text) => text.to_string(),
        Source::File(file) => read_input(file, runner)?,
        Source::StateId(src) => {
            crate::state::check_id(src)?;
            return Ok(Map::new());
        }
    };
    parse_given(&text, no_validate).map_err(meltano1)
}

/// Runs a prepared, confirmed command on the store.
fn execute<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    store_args: &StoreArgs,
    store: &StateStore<T, P>,
    command: &StateCommand,
    prepared: Prepared,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    let held = |id: &str| store_args.held_lock(id);
    match command {
        StateCommand::List {
            pattern_option,
            pattern,
        } => {
            let ids = store.ids(pattern_option.as_deref().or(pattern.as_deref()))?;
            if ids.is_empty() && !global.json {
                let _ = writeln!(runner.stderr, "No state IDs found.");
            }
            Ok(Output::new(list_text(&ids), json!(ids)))
        }
        StateCommand::Get { id, format } => {
            let state = store.get(id)?.unwrap_or_else(|| State {
                id: id.clone(),
                ..State::default()
            });
            let text = python_json(&Value::Object(state.merged()), *format == GetFormat::Pretty);
            Ok(Output::new(text, state_json(&state)))
        }
        StateCommand::Set { id, partial, .. } => set(
            Ctx {
                global,
                store_args,
                store,
                runner,
            },
            id,
            *partial,
            prepared.given,
        ),
        StateCommand::Merge {
            id,
            from_state_id,
            no_validate,
            ..
        } => merge(
            Ctx {
                global,
                store_args,
                store,
                runner,
            },
            id,
            from_state_id.as_deref(),
            *no_validate,
            prepared.given,
        ),
        StateCommand::Clear { id: Some(id), .. } if !id.is_empty() => {
            let n = match held(id) {
                Some(handle) => store.delete_held(id, &handle)?,
                None => store.delete(id)?,
            };
            // Meltano says nothing here (whether or not there was a state).
            Ok(Output::new(
                String::new(),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::Clear { .. } | StateCommand::ClearAll { .. } => {
            let n = store.clear_all()?;
            Ok(done(
                global,
                runner,
                format!("{n} state(s) were successfully cleared"),
                json!({"ok": true, "cleared": n}),
            ))
        }
        StateCommand::Copy {
            src,
            dst,
            no_validate,
            ..
        }
        | StateCommand::Move {
            src,
            dst,
            no_validate,
            ..
        } => {
            let moved = matches!(command, StateCommand::Move { .. });
            copy_or_move(
                global,
                store_args,
                store,
                runner,
                (src, dst),
                *no_validate,
                moved,
            )
        }
        StateCommand::Export { pattern, format } => {
            let states = store.get_all(pattern.as_deref())?;
            Ok(Output::raw(export_text(&states, *format)))
        }
        StateCommand::Import { .. } => {
            let states = prepared.import.unwrap_or_default();
            let n = states.len();
            store.set_all(&states)?;
            Ok(done(
                global,
                runner,
                format!("Successfully imported {n} state(s)."),
                json!({"ok": true, "imported": n}),
            ))
        }
        StateCommand::Edit { .. } => Err(Error::new(ErrorKind::Misconfigured, EDIT_UNSUPPORTED)),
    }
}

/// Meltano `update` (what its `set` and `merge` call), through a held lock if there is one.
fn update<T: Transport + Clone, P: Platform + Clone>(
    store_args: &StoreArgs,
    store: &StateStore<T, P>,
    state: &State,
) -> Result<State, Error> {
    match store_args.held_lock(&state.id) {
        Some(handle) => store.update_held(state, &handle),
        None => store.update(state),
    }
}

/// What a state command runs with.
struct Ctx<'c, 'r, T: Transport + Clone, P: Platform + Clone> {
    global: &'c GlobalArgs,
    store_args: &'c StoreArgs,
    store: &'c StateStore<T, P>,
    runner: &'c mut Runner<'r, T, P>,
}

/// `set ID STATE`: Meltano's `update` of the completed part, or with `--partial` the partial
/// part replaced alone.
fn set<T: Transport + Clone, P: Platform + Clone>(
    ctx: Ctx<'_, '_, T, P>,
    id: &str,
    partial: bool,
    given: Map<String, Value>,
) -> Result<Output, Error> {
    if partial {
        let new = State {
            id: id.to_string(),
            partial: given,
            completed: Map::new(),
        };
        match ctx.store_args.held_lock(id) {
            Some(handle) => ctx.store.set_held(&new, &handle)?,
            None => ctx.store.set_locked(&new)?,
        }
    } else {
        update(
            ctx.store_args,
            ctx.store,
            &State {
                id: id.to_string(),
                partial: Map::new(),
                completed: given,
            },
        )?;
    }
    Ok(done(
        ctx.global,
        ctx.runner,
        format!("State for {} was successfully set.", quoted(id)),
        json!({"ok": true, "id": id}),
    ))
}

/// `merge ID STATE` (or `--from-state-id SRC`): Meltano's `update` of the partial part.
fn merge<T: Transport + Clone, P: Platform + Clone>(
    ctx: Ctx<'_, '_, T, P>,
    id: &str,
    from_state_id: Option<&str>,
    no_validate: bool,
    given: Map<String, Value>,
) -> Result<Output, Error> {
    let partial = match from_state_id.filter(|s| !s.is_empty()) {
        Some(src) => {
            let merged = ctx.store.get(src)?.map(|s| s.merged()).unwrap_or_default();
            if !no_validate {
                if let Err(e) = validate_state(&merged) {
                    return Ok(meltano_failure(ctx.global, ctx.runner, e, 1));
                }
            }
            merged
        }
        None => given,
    };
    let stored = update(
        ctx.store_args,
        ctx.store,
        &State {
            id: id.to_string(),
            partial,
            completed: Map::new(),
        },
    )?;
    Ok(done(
        ctx.global,
        ctx.runner,
        format!("State for {} was successfully merged.", quoted(id)),
        state_json(&stored),
    ))
}

/// `copy` / `move` (Meltano: set(dst, get(src))): the source's merged view becomes the
/// destination's completed part; `move` then deletes the source (not when it is the
/// destination: Meltano would lose the state, we keep it).
fn copy_or_move<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    store_args: &StoreArgs,
    store: &StateStore<T, P>,
    runner: &mut Runner<'_, T, P>,
    (src, dst): (&String, &String),
    no_validate: bool,
    moved: bool,
) -> Result<Output, Error> {
    let held = |id: &str| store_args.held_lock(id);
    // A missing source reads as {}, which fails validation (as in Meltano).
    let merged = store.get(src)?.map(|s| s.merged()).unwrap_or_default();
    if !no_validate {
        if let Err(e) = validate_state(&merged) {
            return Ok(meltano_failure(global, runner, e, 1));
        }
    }
    let state = State {
        id: dst.clone(),
        partial: Map::new(),
        completed: merged,
    };
    match held(dst) {
        Some(handle) => store.update_held(&state, &handle)?,
        None => store.update(&state)?,
    };
    if moved && src != dst {
        match held(src) {
            Some(handle) => store.delete_held(src, &handle)?,
            None => store.delete(src)?,
        };
    }
    let message = if moved {
        format!(
            "State for {} was successfully moved to {}.",
            quoted(src),
            quoted(dst)
        )
    } else {
        format!(
            "State for {} was successfully copied from {}.",
            quoted(dst),
            quoted(src)
        )
    };
    Ok(done(
        global,
        runner,
        message,
        json!({"ok": true, "from": src, "to": dst}),
    ))
}

/// What `list` prints: one line per id, escaped ([`crate::state::escape_id`]: control
/// characters, backslashes), so that a line is one id and names it unambiguously (with
/// --json, the exact ids).
fn list_text(ids: &[String]) -> String {
    ids.iter()
        .map(|id| format!("{}\n", crate::state::escape_id(id)))
        .collect()
}

/// What `export` prints.
fn export_text(states: &[State], format: ExportFormat) -> String {
    match format {
        ExportFormat::Json => {
            let object: Map<String, Value> = states
                .iter()
                .map(|s| {
                    (
                        s.id.clone(),
                        json!({
                            "completed": Value::Object(s.completed.clone()),
                            "partial": Value::Object(s.partial.clone()),
                        }),
                    )
                })
                .collect();
            format!("{}\n", python_json(&Value::Object(object), false))
        }
        ExportFormat::Ndjson => states
            .iter()
            .map(|s| format!("{}\n", state_json(s)))
            .collect(),
    }
}

/// The entries of a JSON object, in order, each value's text kept (duplicate keys are seen).
struct Entries(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Parses an import: Meltano's export (one object {"<id>": {"completed", "partial"}}), or
/// ours with --format ndjson (lines of {"id", "partial", "completed"}), or a JSON array of
/// the same. NDJSON is recognised by its first line: an object with a string "id" (a
/// Meltano entry is an object, never a string). Everything is validated strictly
/// (duplicate keys rejected at any depth, parts must be objects or null).
fn parse_import(text: &str) -> Result<Vec<State>, Error> {
    let trimmed = text.trim_start();
    let mut items: Vec<(String, Map<String, Value>)> = Vec::new();
    let first_line = trimmed.lines().next().unwrap_or_default();
    let ndjson = first_line.len() <= parts::MAX_PART_BYTES
        && matches!(
            // Leniently here (the strict parse below names what is wrong with it).
            serde_json::from_str::<Map<String, Value>>(first_line).map(|m| m.get("id").cloned()),
            Ok(Some(Value::String(_)))
        );
    if trimmed.starts_with('[') {
        let elements: Vec<&RawValue> = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("the import is not a valid JSON array: {e}")))?;
        for (i, element) in elements.into_iter().enumerate() {
            let what = format!("item {}", i + 1);
            items.push((what.clone(), parts::parse_part(element.get(), &what)?));
        }
    } else if ndjson {
        for (n, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                let what = format!("line {}", n + 1);
                items.push((what.clone(), parts::parse_part(line, &what)?));
            }
        }
    } else {
        return parse_meltano_import(text);
    }
    let mut states = Vec::with_capacity(items.len());
    for (what, mut item) in items {
        let id = match item.remove("id") {
            Some(Value::String(id)) => id,
            _ => return Err(Error::invalid(format!("{what}: \"id\" must be a string"))),
        };
        crate::state::check_new_id(&id)
            .map_err(|e| Error::invalid(format!("{what}: {}", e.message)))?;
        let partial = import_part(&mut item, "partial", &what)?;
        let completed = import_part(&mut item, "completed", &what)?;
        states.push(State {
            id,
            partial,
            completed,
        });
    }
    Ok(states)
}

fn import_part(
    item: &mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<Map<String, Value>, Error> {
    match item.remove(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(Error::invalid(format!(
            "{what}: \"{key}\" must be an object"
        ))),
    }
}

/// Meltano's import format: `{"<id>": {"completed": {...}|null, "partial": {...}|null}}`
/// (other keys of an entry ignored, as Meltano does).
fn parse_meltano_import(text: &str) -> Result<Vec<State>, Error> {
    if text.trim().is_empty() {
        return Err(Error::invalid(
            "Invalid JSON: Expecting value: line 1 column 1 (char 0)",
        ));
    }
    let Entries(entries) = serde_json::from_str(text).map_err(|e| {
        Error::invalid(format!(
            "the import must be one JSON object {{\"<state id>\": {{\"completed\": ..., \"partial\": ...}}}} (as export prints), or NDJSON: it {}", parts::describe_error(text, &e)
        ))
    })?;
    let mut seen = std::collections::HashSet::new();
    let mut states = Vec::with_capacity(entries.len());
    for (id, raw) in entries {
        let what = format!("state '{}'", crate::state::lock::shorten(&id));
        if !seen.insert(id.clone()) {
            return Err(Error::invalid(format!(
                "{what} appears twice (duplicate key)"
            )));
        }
        crate::state::check_new_id(&id)
            .map_err(|e| Error::invalid(format!("{what}: {}", e.message)))?;
        if !raw.get().trim_start().starts_with('{') {
            return Err(Error::invalid(format!(
                "{what}: expected an object {{\"completed\": ..., \"partial\": ...}}"
            )));
        }
        let mut entry = parts::parse_part(raw.get(), &what)?;
        let completed = import_part(&mut entry, "completed", &what)?;
        let partial = import_part(&mut entry, "partial", &what)?;
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
    use clap::Parser;

    use crate::cli::{Cli, Command};

    #[derive(Clone)]
    struct NoNetwork;
    impl Transport for NoNetwork {
        fn send(
            &self,
            _: &crate::client::HttpRequest,
        ) -> Result<crate::client::HttpResponse, crate::client::error::TransportError> {
            panic!("nothing is sent before the input is validated and confirmed")
        }
    }

    /// Runs a state command line with `stdin`, without a server (the URL points nowhere and
    /// the transport panics): for what is decided before connecting.
    fn run_offline(args: &[&str], stdin: &'static str) -> (i32, String, String) {
        let mut argv = vec!["clickhouse-component", "--url", "http://nowhere:1", "state"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).unwrap();
        let mut stderr = Vec::new();
        let mut stdout = Vec::new();
        let platform = crate::platform::std_platform::StdPlatform::default();
        let code = {
            let mut runner = Runner {
                transport: NoNetwork,
                platform: &platform,
                stdin: Box::new(stdin.as_bytes()),
                stderr: &mut stderr,
                progress: false,
                memory_limit: None,
            };
            crate::cli::run(&cli, &mut runner, &mut stdout)
        };
        (
            code,
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(stderr).unwrap(),
        )
    }

    fn parse(args: &[&str]) -> Result<StateCommand, clap::Error> {
        let mut argv = vec!["clickhouse-component", "state"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::State { command, .. } => command,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn the_command_line_is_meltanos() {
        assert!(matches!(
            parse(&["get", "a"]).unwrap(),
            StateCommand::Get {
                format: GetFormat::Json,
                ..
            }
        ));
        assert!(matches!(
            parse(&["get", "a", "--format", "PRETTY"]).unwrap(),
            StateCommand::Get {
                format: GetFormat::Pretty,
                ..
            }
        ));
        assert!(parse(&["get", "a", "--format", "yaml"]).is_err());
        match parse(&["list", "--pattern", "tap-*"]).unwrap() {
            StateCommand::List {
                pattern_option,
                pattern,
            } => {
                assert_eq!((pattern_option.as_deref(), pattern), (Some("tap-*"), None))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["list", "tap-*"]).unwrap(),
            StateCommand::List {
                pattern: Some(_),
                pattern_option: None
            }
        ));
        assert!(parse(&["list", "a", "--pattern", "b"]).is_err());
        match parse(&[
            "set",
            "--force",
            "a",
            "--input-file",
            "f.json",
            "--no-validate",
        ])
        .unwrap()
        {
            StateCommand::Set {
                id,
                state,
                input_file,
                no_validate,
                force,
                partial,
            } => {
                assert_eq!(id, "a");
                assert_eq!(state, None);
                assert_eq!(input_file, Some(PathBuf::from("f.json")));
                assert!(no_validate && force && !partial);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["merge", "a", "--from-state-id", "b"]).unwrap(),
            StateCommand::Merge {
                from_state_id: Some(_),
                state: None,
                ..
            }
        ));
        assert!(matches!(
            parse(&["clear", "--all", "--force"]).unwrap(),
            StateCommand::Clear {
                id: None,
                all: true,
                force: true
            }
        ));
        assert!(matches!(
            parse(&["clear", "a", "--yes"]).unwrap(),
            StateCommand::Clear { force: true, .. }
        ));
        assert!(matches!(
            parse(&["clear-all", "--force"]).unwrap(),
            StateCommand::ClearAll { yes: true }
        ));
        assert!(matches!(
            parse(&["copy", "a", "b", "--force"]).unwrap(),
            StateCommand::Copy { force: true, .. }
        ));
        assert!(matches!(
            parse(&["move", "a", "b"]).unwrap(),
            StateCommand::Move { force: false, .. }
        ));
        assert!(matches!(
            parse(&["edit", "a"]).unwrap(),
            StateCommand::Edit { .. }
        ));
        match parse(&["import"]).unwrap() {
            StateCommand::Import { file } => assert_eq!(file, PathBuf::from("-")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["export", "--format", "ndjson"]).unwrap(),
            StateCommand::Export {
                format: ExportFormat::Ndjson,
                pattern: None
            }
        ));
        assert!(matches!(
            parse(&["export"]).unwrap(),
            StateCommand::Export {
                format: ExportFormat::Json,
                ..
            }
        ));
    }

    #[test]
    fn json_is_printed_as_python_prints_it() {
        let v: Value = serde_json::from_str(
            r#"{"singer_state":{"b":{"é":"ü😀\u007f\n"},"a":[1,{}],"n":18446744073709551616}}"#,
        )
        .unwrap();
        assert_eq!(
            python_json(&v, false),
            r#"{"singer_state":{"b":{"\u00e9":"\u00fc\ud83d\ude00\u007f\n"},"a":[1,{}],"n":18446744073709551616}}"#
        );
        assert_eq!(
            python_json(&json!({"a": {"b": 1}, "c": []}), true),
            "{\n  \"a\": {\n    \"b\": 1\n  },\n  \"c\": []\n}"
        );
        assert_eq!(python_json(&json!({}), false), "{}");
        assert_eq!(python_json(&json!({}), true), "{}");
    }

    #[test]
    fn states_need_singer_state_unless_not_validated() {
        let e = parse_given(r#"{"bookmarks":{}}"#, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(
            e.message
                .contains("singer_state not found in top level of provided state"),
            "{}",
            e.message
        );
        assert!(e.message.contains("--no-validate"));
        assert!(parse_given(r#"{"bookmarks":{}}"#, true).is_ok());
        assert!(parse_given(r#"{"singer_state":null}"#, false).is_ok());
        // Nested is not enough: the key must be at the top level.
        assert!(parse_given(r#"{"x":{"singer_state":{}}}"#, false).is_err());
        for bad in [
            "",
            "  ",
            "[1]",
            "{",
            r#"{"singer_state":1,"singer_state":2}"#,
        ] {
            let e = parse_given(bad, true).unwrap_err();
            assert!(
                e.message.starts_with("Invalid JSON provided"),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn exactly_one_source_of_state() {
        let names = "--input-file,STATE,--from-state-id";
        assert_eq!(
            source(Some("{}"), None, None, names).unwrap(),
            Source::Text("{}")
        );
        assert_eq!(
            source(None, Some(Path::new("f")), None, names).unwrap(),
            Source::File(Path::new("f"))
        );
        assert_eq!(
            source(None, None, Some("b"), names).unwrap(),
            Source::StateId("b")
        );
        for (s, f, i) in [
            (None, None, None),
            (Some(""), None, None),
            (Some("{}"), Some(Path::new("f")), None),
            (Some("{}"), None, Some("b")),
            (Some("{}"), Some(Path::new("f")), Some("b")),
        ] {
            let e = source(s, f, i, names).unwrap_err();
            assert_eq!(
                e.message,
                "Must provide exactly one of: --input-file,STATE,--from-state-id"
            );
        }
    }

    #[test]
    fn destructive_commands_confirm_as_click_does() {
        // No answer (stdin at its end, as when not interactive): Aborted!, exit 1.
        let (code, out, err) = run_offline(&["set", "a", r#"{"singer_state":{}}"#], "");
        assert_eq!((code, out.as_str()), (1, ""));
        assert!(
            err.starts_with("This will overwrite the state's current value. Continue? [y/N]: "),
            "{err}"
        );
        assert!(err.ends_with("\nAborted!\n"), "{err}");
        // No, or an empty line (the default): exit 1, nothing more said.
        for answer in ["n\n", "NO\n", "\n", "  \n"] {
            let (code, _, err) = run_offline(&["clear", "a"], answer);
            assert_eq!(code, 1, "{answer:?}");
            assert_eq!(
                err,
                "This will clear state for the job(s). Continue? [y/N]: "
            );
        }
        // Anything else asks again.
        let (code, _, err) = run_offline(&["copy", "a", "b"], "maybe\nn\n");
        assert_eq!(code, 1);
        assert_eq!(err.matches("Continue? [y/N]: ").count(), 2);
        assert!(err.contains("Error: invalid input\n"));
        let (code, out, _) = run_offline(&["--json", "move", "a", "b"], "");
        assert_eq!(code, 1);
        assert_eq!(out, "{\"ok\":false,\"confirmed\":false}\n");
        // Invalid input is refused before asking.
        // ... with Meltano's exit codes: 1 for a state it refuses, 2 for a usage error.
        let (code, _, err) = run_offline(&["set", "a", "{}"], "");
        assert_eq!(code, 1);
        assert!(err.contains("singer_state not found"), "{err}");
        assert!(!err.contains("Continue?"));
        let (code, _, err) = run_offline(&["clear"], "");
        assert_eq!(code, 2);
        assert!(err.contains("A state ID or the --all flag must be provided, but not both"));
        assert_eq!(run_offline(&["clear", "a", "--all", "--force"], "").0, 2);
        assert_eq!(run_offline(&["set", "a"], "").0, 1, "no state given");
        assert_eq!(run_offline(&["set", "a", "[1]"], "").0, 1);
        assert_eq!(run_offline(&["merge", "a", "{", "--no-validate"], "").0, 1);
        assert_eq!(
            run_offline(&["merge", "a", "{}", "--from-state-id", "b"], "").0,
            1
        );
        let (code, out, _) = run_offline(&["--json", "import"], "not json");
        assert_eq!(code, 1);
        assert!(out.contains("\"kind\":\"invalid-input\""), "{out}");
        let (code, _, err) = run_offline(&["set", "a", "--input-file", "-"], "{}");
        assert_eq!(code, 2);
        assert!(err.contains("add --force"), "{err}");
        // clear-all (our alias) never prompts: it needs --yes / --force.
        let (code, _, err) = run_offline(&["clear-all"], "y\n");
        assert_eq!(code, 2);
        assert!(!err.contains("Continue?"));
    }

    #[test]
    fn writes_refuse_ids_with_control_characters_reads_take_them() {
        let refused = "state id contains the control character U+001B at byte 3; ids are job names and may not hold control characters";
        let id = "esc\x1b[31mRED";
        let state = r#"{"singer_state":{}}"#;
        for args in [
            vec!["set", "--force", id, state],
            vec!["merge", id, state],
            vec!["copy", "--force", "src", id],
            vec!["move", "--force", "src", id],
            vec!["edit", "--force", id],
        ] {
            let (code, out, err) = run_offline(&args, "");
            assert_eq!(code, ErrorKind::InvalidInput.exit_code(), "{args:?}: {err}");
            assert_eq!(
                (out.as_str(), err.as_str()),
                ("", format!("error (invalid-input): {refused}\n").as_str()),
                "{args:?}"
            );
        }
        for (id, named) in [
            ("nul\0", "U+0000 at byte 3"),
            ("bel\x07", "U+0007 at byte 3"),
            ("id\nnl", "U+000A at byte 2"),
            ("c1\u{9b}", "U+009B at byte 2"),
        ] {
            let (code, _, err) = run_offline(&["set", "--force", id, state], "");
            assert_eq!(code, 2, "{id:?}");
            assert!(err.contains(named), "{err}");
        }
        // An import with one such id is refused whole (Meltano's exit 1 for an import).
        let (code, _, err) = run_offline(
            &["import"],
            "{\"ok\":{\"completed\":{}},\"bad\\u001b[2J\":{\"completed\":{}}}",
        );
        assert_eq!(code, 1);
        assert!(
            err.contains(
                "state 'bad\\x1b[2J': state id contains the control character U+001B at byte 3"
            ),
            "{err}"
        );
        let (code, _, err) = run_offline(&["import"], "{\"id\":\"a\\nb\"}\n");
        assert_eq!(code, 1);
        assert!(
            err.contains("line 1: state id contains the control character U+000A"),
            "{err}"
        );
        // Reads, deletes and sources take such ids: these get as far as their question (no
        // answer here, so nothing is sent).
        for args in [
            vec!["clear", id],
            vec!["copy", id, "dst"],
            vec!["move", id, "dst"],
        ] {
            let (code, _, err) = run_offline(&args, "n\n");
            assert_eq!(code, 1, "{args:?}: {err}");
            assert!(err.ends_with("Continue? [y/N]: "), "{args:?}: {err}");
        }
    }

    #[test]
    fn ids_are_listed_escaped() {
        let ids: Vec<String> = [
            "tap-a",
            "esc\x1b[31mRED",
            "escRED",
            "id\nnl",
            "back\\slash",
            "é\u{85}",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            list_text(&ids),
            "tap-a\nesc\\x1b[31mRED\nescRED\nid\\nnl\nback\\\\slash\né\\u{85}\n"
        );
        // As printed (through sanitize, which leaves the escaped form alone): one line per id.
        let mut out = Vec::new();
        Output::new(list_text(&ids), json!(ids)).emit(false, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), list_text(&ids));
        // --json: the exact ids.
        let mut out = Vec::new();
        Output::new(list_text(&ids), json!(ids)).emit(true, &mut out);
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), json!(ids));
        // Messages name them the same way.
        assert_eq!(quoted("a\x07b\\"), "a\\x07b\\\\");
    }

    #[test]
    fn read_line_stops_at_the_newline() {
        let mut input: &[u8] = b"yes\nrest";
        assert_eq!(read_line(&mut input).as_deref(), Some("yes"));
        assert_eq!(input, b"rest");
        assert_eq!(read_line(&mut input).as_deref(), Some("rest"));
        assert_eq!(read_line(&mut input), None);
    }

    #[test]
    fn edit_needs_a_runner_with_an_editor() {
        let (code, _, err) = run_offline(&["edit", "a", "--force"], "");
        assert_eq!(code, ErrorKind::Misconfigured.exit_code());
        assert!(err.contains("$EDITOR"), "{err}");
    }

    #[test]
    fn export_prints_meltanos_object_or_ndjson() {
        let states = vec![
            State {
                id: "b".into(),
                partial: Map::new(),
                completed: json!({"singer_state": {"ü": 1}})
                    .as_object()
                    .unwrap()
                    .clone(),
            },
            State {
                id: "a".into(),
                partial: json!({"singer_state": {}}).as_object().unwrap().clone(),
                completed: Map::new(),
            },
        ];
        assert_eq!(
            export_text(&states, ExportFormat::Json),
            "{\"b\":{\"completed\":{\"singer_state\":{\"\\u00fc\":1}},\"partial\":{}},\"a\":{\"completed\":{},\"partial\":{\"singer_state\":{}}}}\n"
        );
        assert_eq!(
            export_text(&states, ExportFormat::Ndjson),
            "{\"id\":\"b\",\"partial\":{},\"completed\":{\"singer_state\":{\"ü\":1}}}\n{\"id\":\"a\",\"partial\":{\"singer_state\":{}},\"completed\":{}}\n"
        );
        assert_eq!(export_text(&[], ExportFormat::Json), "{}\n");
        // What export prints, import reads back, in both formats.
        for format in [ExportFormat::Json, ExportFormat::Ndjson] {
            assert_eq!(parse_import(&export_text(&states, format)).unwrap(), states);
        }
    }

    #[test]
    fn imports_read_meltanos_object() {
        let states = parse_import(
            "{\n  \"x\": {\"completed\": {\"n\": 18446744073709551616}, \"partial\": null},\n  \"id\": {\"partial\": {\"p\": 1}, \"other\": 1}\n}\n",
        )
        .unwrap();
        assert_eq!(states.len(), 2);
        assert_eq!(states[0].id, "x");
        assert_eq!(
            Value::Object(states[0].completed.clone()).to_string(),
            "{\"n\":18446744073709551616}"
        );
        assert!(states[0].partial.is_empty());
        assert_eq!(
            states[1].id, "id",
            "an object under \"id\" is a state called id"
        );
        assert_eq!(states[1].partial, *json!({"p": 1}).as_object().unwrap());
        assert!(parse_import("{}").unwrap().is_empty());
        for (text, want) in [
            ("", "Invalid JSON"),
            ("{\"a\":{},\"a\":{}}", "appears twice"),
            ("{\"a\":1}", "expected an object"),
            (
                "{\"a\":{\"completed\":[1]}}",
                "\"completed\" must be an object",
            ),
            ("{\"a\":{\"completed\":{\"k\":1,\"k\":2}}}", "duplicate key"),
            ("{\"\":{}}", "must not be empty"),
            ("\"text\"", "one JSON object"),
            ("{\"a\":{}", "one JSON object"),
        ] {
            let e = parse_import(text).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput);
            assert!(e.message.contains(want), "{text}: {}", e.message);
        }
    }

    #[test]
    fn imports_still_read_ndjson_and_arrays() {
        let states =
            parse_import("{\"id\":\"a\",\"completed\":{\"n\":18446744073709551616}}\n\n").unwrap();
        assert_eq!(states[0].id, "a");
        assert_eq!(
            Value::Object(states[0].completed.clone()).to_string(),
            "{\"n\":18446744073709551616}"
        );
        let states = parse_import("[{\"id\":\"a\"},{\"id\":\"b\",\"partial\":{\"x\":1}}]").unwrap();
        assert_eq!(states.len(), 2);
        for (text, want) in [
            (
                "{\"id\":\"a\",\"completed\":{\"k\":1,\"k\":2}}",
                "duplicate key",
            ),
            ("[{\"id\":\"a\",\"id\":\"b\"}]", "duplicate key"),
            ("{\"id\":\"a\"}\nnot json", "line 2"),
            ("{\"id\":\"a\"}\n{\"id\":1}", "\"id\" must be a string"),
            ("{\"id\":\"a\"}\n{\"id\":\"\"}", "must not be empty"),
            (
                "{\"id\":\"a\",\"partial\":[1]}",
                "\"partial\" must be an object",
            ),
            ("[1]", "item 1"),
        ] {
            let e = parse_import(text).unwrap_err();
            assert!(e.message.contains(want), "{text}: {}", e.message);
        }
    }
}
