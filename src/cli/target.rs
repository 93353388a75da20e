//! `target --config FILE [--input FILE] | --about [--format json]`: a Singer target (Meltano's
//! loader): Singer messages on stdin (or `--input`), rows into ClickHouse exactly once, STATE
//! lines on stdout once everything before them is acknowledged (see [`crate::loader`]).

use std::io::{BufReader, Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::client::{Error, Transport};
use crate::loader::config::TargetConfig;
use crate::loader::settings::{Origin, Setting, SETTINGS};
use crate::loader::Target;
use crate::platform::Platform;

use super::Runner;

/// Arguments of `target`.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The settings: a JSON object (Meltano writes it from the loader's `config:`).
    #[arg(long, required_unless_present_any = ["about", "version"])]
    pub config: Option<PathBuf>,
    /// Singer messages to read instead of standard input.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Print what the target is and its settings, and exit.
    #[arg(long)]
    pub about: bool,
    /// `--about`'s format: text, json or markdown.
    #[arg(long, default_value = "text")]
    pub format: String,
    /// Print the target's name and version, and exit.
    #[arg(long)]
    pub version: bool,
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
    if args.version {
        return writeln!(stdout, "{NAME} v{}", env!("CARGO_PKG_VERSION"))
            .map_err(|e| Error::invalid(format!("cannot write: {e}")));
    }
    let path = args
        .config
        .as_ref()
        .expect("clap requires --config without --about or --version");
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the config {}: {e}{}",
            path.display(),
            super::no_files_hint()
        ))
    })?;
    let config = TargetConfig::parse(&text)?;
    for warning in &config.warnings {
        let _ = writeln!(runner.stderr, "target: warning: {warning}");
    }
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

/// The capabilities (as the Singer SDK names them) this target has: `target-schema` is
/// `default_target_schema`; `batch` reads jsonl files in `batch_dirs`. Not among them:
/// `stream-maps` (declined: [`SETTINGS`]).
const CAPABILITIES: &[&str] = &[
    "about",
    "activate-version",
    "batch",
    "hard-delete",
    "schema-flattening",
    "target-schema",
];

/// `--about`: capabilities and settings, as Singer SDK targets print them (`json`, `markdown`),
/// or as text.
fn about(format: &str, stdout: &mut dyn Write) -> Result<(), Error> {
    let text = match format {
        "json" => serde_json::to_string_pretty(&about_json()).expect("JSON"),
        "markdown" => about_markdown(),
        "text" => about_text(),
        other => {
            return Err(Error::invalid(format!(
                "--format must be text, json or markdown, not '{}'",
                crate::text::escaped(other)
            )))
        }
    };
    writeln!(stdout, "{text}").map_err(|e| Error::invalid(format!("cannot write: {e}")))
}

/// The setting's description with what the target does with it.
fn described(s: &Setting) -> String {
    let origin = match s.origin {
        Origin::Hub => "",
        Origin::Sdk => " (Singer SDK setting)",
        Origin::Ours => " (this target's own)",
    };
    format!("{}{origin}", s.description)
}

fn about_json() -> serde_json::Value {
    let mut properties = serde_json::Map::new();
    for s in SETTINGS {
        let mut p = serde_json::Map::new();
        p.insert("type".into(), json!([s.kind.name(), "null"]));
        if let Some(default) = s.default {
            p.insert(
                "default".into(),
                serde_json::from_str(default).expect("JSON default"),
            );
        }
        p.insert("description".into(), json!(described(s)));
        if !s.allowed.is_empty() {
            p.insert("enum".into(), json!(s.allowed));
        }
        if s.secret {
            p.insert("secret".into(), json!(true));
            p.insert("writeOnly".into(), json!(true));
        }
        properties.insert(s.name.into(), serde_json::Value::Object(p));
    }
    json!({
        "name": NAME,
        "description": DESCRIPTION,
        "version": env!("CARGO_PKG_VERSION"),
        "sdk_version": null,
        "supported_python_versions": null,
        "capabilities": CAPABILITIES,
        "settings": {"type": "object", "properties": properties},
        "messages": ["SCHEMA", "RECORD", "STATE", "ACTIVATE_VERSION"],
    })
}

fn about_markdown() -> String {
    let mut out = format!("# `{NAME}`\n\n{DESCRIPTION}\n\n## Capabilities\n\n");
    for c in CAPABILITIES {
        out.push_str(&format!("* `{c}`\n"));
    }
    out.push_str("\n## Settings\n\n| Setting | Required | Default | Description |\n|:--------|:--------:|:-------:|:------------|\n");
    for s in SETTINGS {
        let default = s
            .default
            .map_or("None".to_string(), |d| d.trim_matches('"').to_string());
        out.push_str(&format!(
            "| {} | False | {default} | {} |\n",
            s.name,
            described(s).replace('|', "\\|")
        ));
    }
    out.push_str(&format!(
        "\nA full list of supported settings and capabilities is available by running: `{NAME} --about`\n"
    ));
    out
}

fn about_text() -> String {
    let mut out = format!(
        "{NAME} {}\n{DESCRIPTION}\n\nCapabilities: {}\n\nSettings:\n",
        env!("CARGO_PKG_VERSION"),
        CAPABILITIES.join(", ")
    );
    for s in SETTINGS {
        let default = s
            .default
            .map(|d| format!(" (default {})", d.trim_matches('"')))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {} ({}){default}: {}\n",
            s.name,
            s.kind.name(),
            described(s)
        ));
    }
    out
}
