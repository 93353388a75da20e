//! `state edit ID`: Meltano's `meltano state edit`, which needs what only a host has (an
//! editor, a file). The component does the reading and the writing, through its own command
//! line: `state --json get ID` gives the state (the text to edit is its merged view, as `get
//! --format pretty` prints it), `state set --force --input-file - ID` writes the result
//! (validated there, under the lock, as any `set`; if it is refused the file is kept).
//! Between the two the host runs the editor as click does: $VISUAL, else $EDITOR, else the
//! first of `sensible-editor`, `vim`, `nano` on PATH, else `vi`; split like a shell would,
//! the file's path last; the edit counts only if the file was saved (its mtime moved).
//! Nothing is written when the editor fails, nothing was saved, the content is empty, or it
//! is the same JSON as before.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context};
use clap::{CommandFactory, Parser};
use clickhouse_component::host_api::cli::{
    ask_to_continue, declined, python_json, GetFormat, StateCommand, OVERWRITE_PROMPT,
};
use clickhouse_component::host_api::cli::{Cli, Command};
use clickhouse_component::host_api::Error;
use clickhouse_component::host_api::State;
use clickhouse_component_host::config::subcommand_position;
use clickhouse_component_host::{CallError, CapturedOutput, CommandInput};

use super::component::run_component;
use super::HostCli;

/// The largest answer `edit` reads back from `get` (what the host lets a response be).
const MAX_STATE_BYTES: usize = 256 << 20;

/// The file `edit` opens in the editor (in its own private directory).
const FILE_NAME: &str = "state.json";

/// Runs `state edit`; returns the exit code.
pub async fn run(
    cli: &HostCli,
    raw_args: &[String],
    id: &str,
    force: bool,
) -> Result<i32, CallError> {
    let json = cli.cli.global.json;
    // The edit is written under the id: refused now, not after the editor, if `set` would be.
    clickhouse_component::host_api::check_new_id(id).map_err(CallError::Component)?;
    let (get, set) = component_commands(cli, raw_args, id)?;
    if !force
        && !ask_to_continue(
            OVERWRITE_PROMPT,
            &mut std::io::stdin().lock(),
            &mut std::io::stderr(),
        )
    {
        return Ok(declined().emit(json, &mut std::io::stdout()));
    }
    let current = CapturedOutput::new(MAX_STATE_BYTES);
    let code = run_component(
        cli,
        &get,
        CommandInput::Bytes(Vec::new()),
        Some(&current),
        &[],
    )
    .await?;
    if code != 0 {
        // The component said why on stderr; with --json its error object is the answer.
        if json {
            std::io::stdout()
                .write_all(&current.contents())
                .map_err(|e| CallError::Runner(e.into()))?;
        }
        return Ok(code);
    }
    let initial = pretty_merged(&current.contents(), id).map_err(CallError::Runner)?;
    let unchanged = |message: &str| {
        eprintln!("{message}");
        if json {
            println!(
                "{}",
                serde_json::json!({"ok": true, "id": id, "changed": false, "message": message})
            );
        }
        Ok(0)
    };
    let dir = private_dir().map_err(CallError::Runner)?;
    let edited = match edit_in_editor(&dir, &initial) {
        Ok(edited) => edited,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(CallError::Runner(e));
        }
    };
    let Some(edited) = edited else {
        let _ = std::fs::remove_dir_all(&dir);
        return unchanged("Edit cancelled - no changes made");
    };
    let edited = edited.trim();
    let same_json = matches!(
        (
            serde_json::from_str::<serde_json::Value>(&initial),
            serde_json::from_str::<serde_json::Value>(edited),
        ),
        (Ok(before), Ok(after)) if before == after
    );
    if edited.is_empty() || same_json {
        let _ = std::fs::remove_dir_all(&dir);
        return unchanged(if edited.is_empty() {
            "Empty content provided - no changes made"
        } else {
            "No changes detected"
        });
    }
    let code = run_component(
        cli,
        &set,
        CommandInput::Bytes(edited.as_bytes().to_vec()),
        None,
        &[],
    )
    .await;
    if matches!(code, Ok(0)) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        // Refused (not a state, the lock, the server): the edit is not lost.
        eprintln!(
            "the edited state is kept in {}",
            dir.join(FILE_NAME).display()
        );
    }
    code
}

/// The text `edit` opens: what `state get --format pretty` prints (Meltano's `json.dumps(...,
/// indent=2)` of the merged state), made from `get --json`'s answer.
fn pretty_merged(answer: &[u8], id: &str) -> anyhow::Result<String> {
    let value: serde_json::Value =
        serde_json::from_slice(answer).context("state get --json printed no JSON object")?;
    let part = |name: &str| match &value[name] {
        serde_json::Value::Object(map) => Ok(map.clone()),
        serde_json::Value::Null => Ok(Default::default()),
        _ => Err(anyhow!("state get --json printed no {name} object")),
    };
    let state = State {
        id: id.to_string(),
        partial: part("partial")?,
        completed: part("completed")?,
    };
    Ok(python_json(
        &serde_json::Value::Object(state.merged()),
        true,
    ))
}

/// The component command lines for the two halves of `edit`: `--json get ID` (its answer is
/// read here) and `set --force --input-file - ID` (with --json only if the user gave it), each
/// made from the given command line (its other options kept) and checked by parsing it again.
fn component_commands(
    cli: &HostCli,
    raw_args: &[String],
    id: &str,
) -> Result<(Vec<String>, Vec<String>), CallError> {
    let unclear = || {
        CallError::Component(Error::invalid(
            "cannot rewrite this `state edit` command line for the component: give options as --name value, before the subcommand",
        ))
    };
    let at = subcommand_position(&HostCli::command(), raw_args, &["state", "edit"])
        .ok_or_else(unclear)?;
    // After `edit`: its ID and the global options; its own --force/--yes go.
    let mut escaped = false;
    let tail: Vec<String> = raw_args[at + 1..]
        .iter()
        .filter(|a| {
            escaped |= *a == "--";
            escaped || !matches!(a.as_str(), "--force" | "--yes")
        })
        .cloned()
        .collect();
    // `head` in place of `edit`; without the user's --json when `drop_json` (the prefix holds
    // no `--`: options and subcommand names only).
    let with = |head: &[&str], drop_json: bool| -> Vec<String> {
        let mut escaped = false;
        let tail = tail.iter().filter(|a| {
            escaped |= *a == "--";
            escaped || !drop_json || *a != "--json"
        });
        raw_args[..at]
            .iter()
            .filter(|a| !drop_json || *a != "--json")
            .cloned()
            .chain(head.iter().map(|s| s.to_string()))
            .chain(tail.cloned())
            .collect()
    };
    let get = with(&["--json", "get"], true);
    let set = with(&["set", "--force", "--input-file", "-"], false);
    let expect = |args: &[String], json: bool, command: StateCommand| -> Result<(), CallError> {
        let reparsed = HostCli::try_parse_from(args).map_err(|_| unclear())?;
        let mut expected: Cli = cli.cli.clone();
        expected.global.json = json;
        if let Command::State { command: c, .. } = &mut expected.command {
            *c = command;
        }
        let same = format!("{:?} {:?}", reparsed.host, reparsed.cli)
            == format!("{:?} {expected:?}", cli.host);
        same.then_some(()).ok_or_else(unclear)
    };
    expect(
        &get,
        true,
        StateCommand::Get {
            id: id.to_string(),
            format: GetFormat::Json,
        },
    )?;
    expect(
        &set,
        cli.cli.global.json,
        StateCommand::Set {
            id: id.to_string(),
            state: None,
            input_file: Some(PathBuf::from("-")),
            no_validate: false,
            partial: false,
            force: true,
        },
    )?;
    Ok((get, set))
}

/// click.edit(text, extension=".json"): the text (with a final newline) in a new file in
/// `dir`, the editor run on it, the result if the file was saved, else `None`.
fn edit_in_editor(dir: &Path, text: &str) -> anyhow::Result<Option<String>> {
    let file = dir.join(FILE_NAME);
    let mut data = text.to_string();
    if !data.is_empty() && !data.ends_with('\n') {
        data.push('\n');
    }
    std::fs::write(&file, data).with_context(|| format!("writing {}", file.display()))?;
    // As click: the mtime set 2 s back, so an editor that saves at once still moves it.
    let handle = std::fs::File::options().write(true).open(&file)?;
    let modified = handle.metadata()?.modified()?;
    handle.set_modified(modified - Duration::from_secs(2))?;
    drop(handle);
    let before = mtime(&file)?;
    run_editor(&file)?;
    if mtime(&file)? == before {
        return Ok(None);
    }
    let edited = std::fs::read(&file)?;
    let edited = edited
        .strip_prefix("\u{feff}".as_bytes())
        .unwrap_or(&edited);
    let edited =
        String::from_utf8(edited.to_vec()).map_err(|_| anyhow!("the edited state is not UTF-8"))?;
    Ok(Some(edited.replace("\r\n", "\n")))
}

fn mtime(file: &Path) -> anyhow::Result<SystemTime> {
    Ok(std::fs::metadata(file)?.modified()?)
}

/// A new directory only this user can read, under the system's temporary directory.
fn private_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for attempt in 0u32..100 {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = base.join(format!(
            "clickhouse-component-edit-{}-{nanos}-{attempt}",
            std::process::id()
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(anyhow!("creating {}: {e}", dir.display())),
        }
    }
    Err(anyhow!(
        "could not create a private directory in {}",
        base.display()
    ))
}

/// The editor click would choose.
fn editor() -> String {
    for key in ["VISUAL", "EDITOR"] {
        if let Some(value) = std::env::var(key).ok().filter(|v| !v.is_empty()) {
            return value;
        }
    }
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
    };
    ["sensible-editor", "vim", "nano"]
        .into_iter()
        .find(|e| on_path(e))
        .unwrap_or("vi")
        .to_string()
}

/// Runs the editor on `file` (click: `shlex.split(editor) + [file]`, no shell), on the host's
/// terminal; a failure is click's "EDITOR: Editing failed".
fn run_editor(file: &Path) -> anyhow::Result<()> {
    let editor = editor();
    let failed = |detail: String| anyhow!("{editor}: Editing failed{detail}");
    let words = shlex::split(&editor)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| failed(": cannot split the editor command".into()))?;
    // Ctrl-C goes to the editor (the terminal's foreground group), not to the host: the host
    // stays to remove the file with the state (as git does while an editor runs).
    #[cfg(unix)]
    let _ignore_interrupts = [
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::quit(),
    ]
    .map(|kind| tokio::signal::unix::signal(kind).ok());
    let status = std::process::Command::new(&words[0])
        .args(&words[1..])
        .arg(file)
        .status()
        .map_err(|e| failed(format!(": {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(failed(String::new()))
    }
}
