//! `target --config FILE [--input FILE] | --about [--format json]`: a Singer target (Meltano's
//! loader): Singer messages on stdin (or `--input`), rows into ClickHouse exactly once, STATE
//! lines on stdout once everything before them is acknowledged (see [`crate::target`]).

use std::io::{BufReader, Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::client::{Error, Transport};
use crate::platform::Platform;
use crate::target::config::{TargetConfig, SETTINGS};
use crate::target::Target;

use super::Runner;

/// Arguments of `target`.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The settings: a JSON object (Meltano writes it from the loader's `config:`).
    #[arg(long, required_unless_present = "about")]
    pub config: Option<PathBuf>,
    /// Singer messages to read instead of standard input.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Print what the target is and its settings, and exit.
    #[arg(long)]
    pub about: bool,
    /// `--about`'s format: text or json.
    #[arg(long, default_value = "text")]
    pub format: String,
}

/// Name and description, for `--about`.
const NAME: &str = "target-clickhouse-component";
const DESCRIPTION: &str = "Singer target for ClickHouse that loads exactly once: typed, acknowledged INSERTs with deduplication tokens, STATE emitted only after the records before it are committed";

/// Runs `target`; STATE lines go to `stdout`, notes and errors to stderr. Returns the exit
/// code.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    args: &TargetArgs,
    runner: &mut Runner<'_, T, P>,
    stdout: &mut dyn Write,
) -> i32 {
    match run_target(args, runner, stdout) {
        Ok(()) => 0,
        Err(e) => super::output::error(false, &e, &mut std::io::sink(), runner.stderr),
    }
}

fn run_target<T: Transport + Clone, P: Platform + Clone>(
    args: &TargetArgs,
    runner: &mut Runner<'_, T, P>,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    if args.about {
        return about(&args.format, stdout);
    }
    let path = args
        .config
        .as_ref()
        .expect("clap requires --config without --about");
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the config {}: {e}{}",
            path.display(),
            super::no_files_hint()
        ))
    })?;
    let config = TargetConfig::parse(&text)?;
    let input: Box<dyn Read> = match &args.input {
        Some(p) if p.as_os_str() != "-" => Box::new(std::fs::File::open(p).map_err(|e| {
            Error::invalid(format!(
                "cannot open {}: {e}{}",
                p.display(),
                super::no_files_hint()
            ))
        })?),
        _ => std::mem::replace(&mut runner.stdin, Box::new(std::io::empty())),
    };
    let mut input = BufReader::with_capacity(1 << 20, input);
    let started = runner.platform.now();
    let target = Target::new(
        config,
        runner.transport.clone(),
        runner.platform.clone(),
        stdout,
        runner.stderr,
    );
    let summary = target.run(&mut input)?;
    let seconds = (runner.platform.now() - started).as_secs_f64();
    for (stream, table, rows) in &summary.streams {
        let _ = writeln!(
            runner.stderr,
            "target: stream '{}': {rows} rows into {}",
            crate::text::escaped(stream),
            crate::text::escaped(table)
        );
    }
    let _ = writeln!(
        runner.stderr,
        "target: {} records, {} rows in {} chunks, {} STATE messages emitted, {} tables created, {seconds:.2} s",
        summary.records, summary.rows, summary.chunks, summary.states_emitted, summary.tables_created
    );
    Ok(())
}

/// `--about`: capabilities and settings, as Singer SDK targets print them.
fn about(format: &str, stdout: &mut dyn Write) -> Result<(), Error> {
    let settings: Vec<serde_json::Value> = SETTINGS
        .iter()
        .map(|(name, kind, default, description)| {
            json!({"name": name, "type": kind, "default": default, "description": description,
                   "sensitive": *name == "password" || *name == "uri"})
        })
        .collect();
    let text = match format {
        "json" => serde_json::to_string_pretty(&json!({
            "name": NAME,
            "description": DESCRIPTION,
            "version": env!("CARGO_PKG_VERSION"),
            "capabilities": ["about"],
            "settings": settings,
            "messages": ["SCHEMA", "RECORD", "STATE", "ACTIVATE_VERSION"],
        }))
        .expect("JSON"),
        "text" | "markdown" => {
            let mut out = format!(
                "{NAME} {}\n{DESCRIPTION}\n\nSettings:\n",
                env!("CARGO_PKG_VERSION")
            );
            for (name, kind, default, description) in SETTINGS {
                let default = if default.is_empty() {
                    String::new()
                } else {
                    format!(" (default {default})")
                };
                out.push_str(&format!("  {name} ({kind}){default}: {description}\n"));
            }
            out
        }
        other => {
            return Err(Error::invalid(format!(
                "--format must be text or json, not '{}'",
                crate::text::escaped(other)
            )))
        }
    };
    writeln!(stdout, "{text}").map_err(|e| Error::invalid(format!("cannot write: {e}")))
}
