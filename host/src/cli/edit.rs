//! `state edit ID`: Meltano's `meltano state edit`, which needs what only a host has (an
//! editor, a file). The component does the reading and the writing, through its own command
//! line: `state get --format pretty ID` gives the text to edit, `state set --force
//! --input-file - ID` writes the result (validated there, under the lock, as any `set`).
//! Between the two the host runs the editor as click does: $VISUAL, else $EDITOR, else the
//! first of `sensible-editor`, `vim`, `nano` on PATH, else `vi`; split like a shell would,
//! the file's path last; the edit counts only if the file was saved (its mtime moved).
//! Nothing is written when the editor fails, nothing was saved, the content is empty, or it
//! is the same JSON as before.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context};
use clap::{CommandFactory, Parser};
use clickhouse_component::cli::state::{
    ask_to_continue, declined, GetFormat, StateCommand, OVERWRITE_PROMPT,
};
use clickhouse_component::cli::{Cli, Command};
use clickhouse_component::client::Error;
use clickhouse_component_host::config::subcommand_position;
use clickhouse_component_host::{CallError, CapturedOutput, CommandInput};

use super::command::run_component;
use super::HostCli;

/// The largest state text `edit` reads back from `get` (what the host lets a response be).
const MAX_STATE_BYTES: usize = 256 << 20;

/// Runs `state edit`; returns the exit code.
pub async fn run(
    cli: &HostCli,
    raw_args: &[String],
    id: &str,
    force: bool,
) -> Result<i32, CallError> {
    let json = cli.cli.global.json;
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
    let code = run_component(cli, &get, CommandInput::Bytes(Vec::new()), Some(&current)).await?;
    if code != 0 {
        // The component's error (on stderr) says why; with --json it printed nothing on stdout
        // (get ran without --json), so the host prints the envelope.
        if json {
            println!("{}", serde_json::json!({"ok": false, "exit_code": code}));
        }
        return Ok(code);
    }
    let initial = String::from_utf8(current.contents())
        .map_err(|_| CallError::Runner(anyhow!("state get printed text that is not UTF-8")))?;
    let initial = initial.strip_suffix('\n').unwrap_or(&initial);
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
    let Some(edited) = edit_in_editor(initial).map_err(CallError::Runner)? else {
        return unchanged("Edit cancelled - no changes made");
    };
    let edited = edited.trim();
    if edited.is_empty() {
        return unchanged("Empty content provided - no changes made");
    }
    if let (Ok(before), Ok(after)) = (
        serde_json::from_str::<serde_json::Value>(initial),
        serde_json::from_str::<serde_json::Value>(edited),
    ) {
        if before == after {
            return unchanged("No changes detected");
        }
    }
    run_component(
        cli,
        &set,
        CommandInput::Bytes(edited.as_bytes().to_vec()),
        None,
    )
    .await
}

/// The component command lines for the two halves of `edit`: `get --format pretty ID` (without
/// --json: its stdout is the text to edit) and `set --force --input-file - ID`, each made from
/// the given command line (its other options kept) and checked by parsing it again.
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
    let with = |head: &[&str], keep_json: bool| -> Vec<String> {
        raw_args[..at]
            .iter()
            .cloned()
            .chain(head.iter().map(|s| s.to_string()))
            .chain(tail.iter().cloned())
            .filter(|a| keep_json || a != "--json")
            .collect()
    };
    let get = with(&["get", "--format", "pretty"], false);
    let set = with(&["set", "--force", "--input-file", "-"], true);
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
        false,
        StateCommand::Get {
            id: id.to_string(),
            format: GetFormat::Pretty,
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

/// click.edit(text, extension=".json"): the text (with a final newline) in a new file of a
/// private directory, the editor run on it, the result if the file was saved, else `None`.
fn edit_in_editor(text: &str) -> anyhow::Result<Option<String>> {
    let dir = private_dir()?;
    let result = (|| {
        let file = dir.join("state.json");
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
        let edited = String::from_utf8(edited.to_vec())
            .map_err(|_| anyhow!("the edited state is not UTF-8"))?;
        Ok(Some(edited.replace("\r\n", "\n")))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn mtime(file: &Path) -> anyhow::Result<SystemTime> {
    Ok(std::fs::metadata(file)?.modified()?)
}

/// A new directory only this user can read, under the system's temporary directory.
fn private_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
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
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
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
