//! The documentation stays true to the code: every relative link in README.md and docs/
//! resolves (file and `#anchor`), and docs/configuration.md lists exactly the options and
//! environment variables the CLI's `--help` shows (plus environment variables the code reads
//! without an option, each of which must be read somewhere in the sources),
//! docs/architecture.md's layout names every module of the component and the host, and the
//! module rules it states hold (which module uses which, the host's one path per item).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clickhouse_component_tests::cli_binary;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            lines.push(String::new());
            continue;
        }
        if fenced {
            lines.push(String::new());
            continue;
        }
        // Drop inline code spans.
        let mut out = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        lines.push(out);
    }
    lines
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, punctuation other than `-` and `_`
/// dropped (inline code marks too); repeated headings get `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let base: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `(target)` of every `[text](target)` in the prose.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((n + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let where_ = format!(
                "{}:{line}: ({target})",
                file.strip_prefix(root()).unwrap().display()
            );
            if !resolved.exists() {
                broken.push(format!("{where_}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{where_}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `--long` options and `[env: NAME=...]` of a `--help` text.
fn help_items(args: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = Command::new(cli_binary())
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut options = BTreeSet::new();
    let mut envs = BTreeSet::new();
    for line in text.lines() {
        for word in line.split(|c: char| c.is_whitespace() || c == ',' || c == '=') {
            let word = word.trim_matches(|c| c == '[' || c == ']' || c == '<' || c == '>');
            if word.len() > 2
                && word.starts_with("--")
                && word[2..]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
                && line.trim_start().starts_with('-')
            {
                options.insert(word.to_string());
            }
        }
        let mut rest = line;
        while let Some(i) = rest.find("[env: ") {
            let after = &rest[i + 6..];
            let end = after.find(['=', ']']).unwrap_or(after.len());
            envs.insert(after[..end].to_string());
            rest = &after[end..];
        }
    }
    (options, envs)
}

/// Every backquoted `--option` and `CLICKHOUSE_*` / `MELTANO_*` name in a text.
fn documented(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut options = BTreeSet::new();
    let mut envs = BTreeSet::new();
    for span in text.split('`').skip(1).step_by(2) {
        for word in span.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '(') {
            if word.len() > 2 && word.starts_with("--") && word.as_bytes()[2].is_ascii_lowercase() {
                options.insert(
                    word.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                        .to_string(),
                );
            }
            if (word.starts_with("CLICKHOUSE_") || word.starts_with("MELTANO_"))
                && word
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                envs.insert(word.to_string());
            }
        }
    }
    (options, envs)
}

/// Whether some source file of the component or the host mentions `name` as a string.
fn read_by_the_code(name: &str) -> bool {
    let quoted = format!("\"{name}\"");
    let mut dirs = vec![root().join("src"), root().join("host/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && std::fs::read_to_string(&path)
                    .unwrap_or_default()
                    .contains(&quoted)
            {
                return true;
            }
        }
    }
    false
}

#[test]
fn the_configuration_doc_matches_the_help() {
    let commands: [&[&str]; 6] = [
        &[],
        &["check"],
        &["state"],
        &["state", "set"],
        &["sink"],
        &["lock"],
    ];
    let mut help_options = BTreeSet::new();
    let mut help_envs = BTreeSet::new();
    for args in commands {
        let (o, e) = help_items(args);
        help_options.extend(o);
        help_envs.extend(e);
    }
    help_options.remove("--help");
    help_options.remove("--version");
    assert!(help_options.len() > 20, "{help_options:?}");
    assert!(help_envs.len() > 10, "{help_envs:?}");

    let config = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let (doc_options, doc_envs) = documented(&config);
    // Options of one command documented with that command (state's subcommand flags in
    // docs/state-store.md, sink's in docs/sink.md, lock's in docs/state-store.md).
    let mut elsewhere = String::new();
    for doc in ["docs/state-store.md", "docs/sink.md"] {
        elsewhere.push_str(&std::fs::read_to_string(root().join(doc)).unwrap());
    }
    let (other_options, _) = documented(&elsewhere);

    let undocumented: Vec<_> = help_options
        .iter()
        .filter(|o| !doc_options.contains(*o) && !other_options.contains(*o))
        .collect();
    assert!(
        undocumented.is_empty(),
        "options in --help but not in docs/configuration.md (or the command's doc): {undocumented:?}"
    );
    let unknown: Vec<_> = doc_options.difference(&help_options).collect();
    assert!(
        unknown.is_empty(),
        "options in docs/configuration.md that no --help shows: {unknown:?}"
    );
    let env_undocumented: Vec<_> = help_envs.difference(&doc_envs).collect();
    assert!(
        env_undocumented.is_empty(),
        "environment variables in --help but not in docs/configuration.md: {env_undocumented:?}"
    );
    let env_unread: Vec<_> = doc_envs
        .difference(&help_envs)
        .filter(|e| !read_by_the_code(e))
        .collect();
    assert!(
        env_unread.is_empty(),
        "environment variables in docs/configuration.md that neither --help shows nor the code reads: {env_unread:?}"
    );
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module of the component (`src/`) and the host (`host/src/`) is named in
/// docs/architecture.md's layout (its first fenced block after "## Layout"): a file `x.rs`
/// or a directory `x/` by the word `x`. A module added without a line there fails here.
#[test]
fn the_architecture_layout_names_every_module() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let layout = text
        .split_once("## Layout")
        .and_then(|(_, rest)| rest.split_once("```"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/architecture.md has a fenced layout under '## Layout'");
    let words: BTreeSet<&str> = layout
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("host/src"), &mut files);
    assert!(files.len() > 40, "the sources were found: {}", files.len());
    let mut missing = Vec::new();
    for file in &files {
        let name = if file.file_name().is_some_and(|n| n == "mod.rs") {
            file.parent().unwrap().file_name().unwrap()
        } else {
            file.file_stem().unwrap()
        };
        let name = name.to_str().unwrap();
        if name != "lib" && name != "main" && !words.contains(name) {
            missing.push(file.strip_prefix(root()).unwrap().display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "modules not named in docs/architecture.md's layout: {missing:?}"
    );
}

/// The modules each module of the component names (`crate::a::b`, `super::x` paths, outside
/// its `#[cfg(test)] mod tests` and comments), as `a::b` paths of at most three segments
/// (`state::lock::common`); the key is the module's own path (`state::lock::common`, `state`
/// for `state/mod.rs`).
fn module_uses() -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut uses = std::collections::BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap().with_extension("");
        let mut module: Vec<String> = rel
            .iter()
            .map(|p| p.to_str().unwrap().to_string())
            .collect();
        if module.last().is_some_and(|m| m == "mod" || m == "lib") {
            module.pop();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let code: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let mut used = BTreeSet::new();
        let bytes = code.as_bytes();
        for (at, _) in code
            .match_indices("crate::")
            .chain(code.match_indices("super::"))
        {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let path: Vec<&str> = code[at..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap()
                .split("::")
                .filter(|s| !s.is_empty())
                .collect();
            let target: Vec<String> = if path[0] == "crate" {
                path[1..].iter().map(|s| s.to_string()).collect()
            } else {
                let ups = path.iter().take_while(|s| **s == "super").count();
                let base = module.len().saturating_sub(ups);
                module[..base]
                    .iter()
                    .cloned()
                    .chain(path[ups..].iter().map(|s| s.to_string()))
                    .collect()
            };
            used.insert(target.into_iter().take(3).collect::<Vec<_>>().join("::"));
        }
        uses.insert(module.join("::"), used);
    }
    uses
}

/// The rules of docs/architecture.md's "Which module may use which", checked on the code: for
/// each module, the modules of its group it may name (anything outside the group is checked
/// by the group rules). A `use` added against a rule fails here (checked by adding
/// `use crate::sink::encode;` to `sink/native.rs`, and `crate::state` to `loader/mod.rs`).
#[test]
fn the_dependency_rules_hold() {
    let uses = module_uses();
    assert!(uses.len() > 30, "the modules were found: {}", uses.len());
    // A path names module `m` when it is `m` or below it.
    let names = |path: &str, m: &str| path == m || path.starts_with(&format!("{m}::"));
    let mut broken = Vec::new();
    let mut check =
        |module: &str, forbidden: &[&str], allowed_in_group: Option<(&str, &[&str])>| {
            let used = uses
                .get(module)
                .unwrap_or_else(|| panic!("no module {module}"));
            for path in used {
                if forbidden.iter().any(|f| names(path, f)) {
                    broken.push(format!("{module} uses {path}"));
                }
                if let Some((group, allowed)) = allowed_in_group {
                    let in_group = names(path, group) && !names(module, path);
                    let own = names(path, module);
                    if in_group && !own && !allowed.iter().any(|a| names(path, a)) {
                        broken.push(format!(
                            "{module} uses {path} (allowed in {group}: {allowed:?})"
                        ));
                    }
                }
            }
        };
    // client uses nothing of state or sink; state never uses sink; loader never uses state.
    for (module, _) in uses.iter().filter(|(m, _)| names(m, "client")) {
        check(module, &["state", "sink", "loader", "cli"], None);
    }
    for (module, _) in uses.iter().filter(|(m, _)| names(m, "state")) {
        check(module, &["sink", "loader", "cli"], None);
    }
    for (module, _) in uses.iter().filter(|(m, _)| names(m, "loader")) {
        check(module, &["state", "cli"], None);
    }
    // In sink, only resume (and the driver's resume, which hands it the store) use state.
    for (module, _) in uses.iter().filter(|(m, _)| names(m, "sink")) {
        if module != "sink::resume" && module != "sink::driver" {
            check(module, &["state", "loader", "cli"], None);
        }
    }
    let sink = |allowed: &'static [&'static str]| Some(("sink", allowed));
    check("sink::types", &[], sink(&[]));
    check("sink::scalars", &[], sink(&[]));
    check("sink::json", &[], sink(&["sink::scalars"]));
    check("sink::packed", &[], sink(&["sink::json"]));
    check(
        "sink::native",
        &[],
        sink(&["sink::types", "sink::scalars", "sink::json", "sink::packed"]),
    );
    check("sink::encode", &[], sink(&["sink::json", "sink::packed"]));
    check("sink::statements", &[], sink(&[]));
    check(
        "sink::columns",
        &[],
        sink(&["sink::types", "sink::native", "sink::encode"]),
    );
    let state = |allowed: &'static [&'static str]| Some(("state", allowed));
    for leaf in [
        "state::tables",
        "state::ids",
        "state::json",
        "state::glob",
        "state::known",
        "state::planted",
    ] {
        check(leaf, &[], state(&[]));
    }
    check("state::steps", &[], state(&["state::tables"]));
    // (`super::DEFAULT_STALE_AFTER`: lock's re-export of common's own constant.)
    check(
        "state::lock::common",
        &["state::lock::merge_tree", "state::lock::keeper_map"],
        state(&[
            "state::steps",
            "state::tables",
            "state::ids",
            "state::lock::DEFAULT_STALE_AFTER",
        ]),
    );
    // The dispatch: its engines and common (its own), and the modules below them.
    check(
        "state::lock",
        &[],
        state(&[
            "state::steps",
            "state::tables",
            "state::ids",
            "state::planted",
        ]),
    );
    let lower = [
        "state::steps",
        "state::tables",
        "state::ids",
        "state::planted",
    ];
    for (engine, other) in [
        ("state::lock::merge_tree", "state::lock::keeper_map"),
        ("state::lock::keeper_map", "state::lock::merge_tree"),
    ] {
        check(engine, &[other], None);
        let mut allowed = vec!["state::lock::common"];
        allowed.extend(lower);
        let allowed: &'static [&'static str] = Box::leak(allowed.into_boxed_slice());
        check(engine, &[], state(allowed));
    }
    check(
        "state::schema",
        &[],
        state(&["state::steps", "state::tables", "state::lock::keeper_map"]),
    );
    assert!(
        broken.is_empty(),
        "docs/architecture.md's dependency rules are broken:\n{}",
        broken.join("\n")
    );
}

/// The crate's surface is `host_api` (docs/architecture.md): `src/lib.rs` declares every other
/// module public only under `test-util` (and private otherwise), the host (with its examples)
/// and the Python binding reach the crate only through `host_api`, and only the tests and the
/// benchmarks enable `test-util`.
#[test]
fn hosts_reach_the_crate_only_through_host_api() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let lines: Vec<&str> = lib.lines().map(str::trim).collect();
    let mut public = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("pub mod ") else {
            continue;
        };
        if n > 0 && lines[n - 1] == "#[cfg(feature = \"test-util\")]" {
            // Its private twin, declared when `test-util` is off.
            let twin = lines[n + 1..].windows(2).any(|w| {
                w[0] == "#[cfg(not(feature = \"test-util\"))]" && w[1] == format!("mod {name}")
            });
            assert!(twin, "src/lib.rs: `{line}` has no private twin");
        } else {
            public.push(*line);
        }
    }
    assert_eq!(
        public,
        ["pub mod host_api;"],
        "public modules of src/lib.rs"
    );
    for dir in ["host/src", "host/examples", "python/src"] {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if let Some(at) = line.find("clickhouse_component::") {
                    let path = &line[at + "clickhouse_component::".len()..];
                    assert!(
                        path.starts_with("host_api")
                            || path.starts_with('{') && path[1..].starts_with("host_api"),
                        "{}:{}: {line}",
                        file.display(),
                        n + 1
                    );
                }
            }
        }
    }
    for manifest in ["Cargo.toml", "host/Cargo.toml", "python/Cargo.toml"] {
        let text = std::fs::read_to_string(root().join(manifest)).unwrap();
        let enabled = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.starts_with("test-util ="))
            .any(|l| l.contains("test-util"));
        assert!(!enabled, "{manifest} enables test-util");
    }
}

/// The sink's requests have one send, as docs/architecture.md and `sink::statements` say: no
/// other module of the sink sends, waits for or repeats a request itself (the driver only
/// starts a chunk's first attempt, whose answer `statements::send` waits for). Checked by
/// putting a `retry::run` back into the driver.
#[test]
fn the_sink_sends_only_through_its_statements() {
    let dir = root().join("src/sink");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "statements.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for call in [
            "retry::run(",
            "client.send(",
            "client.wait(",
            "client.execute(",
        ] {
            if text.contains(call) {
                found.push(format!("{} calls {call}", path.display()));
            }
        }
    }
    let statements = std::fs::read_to_string(dir.join("statements.rs")).unwrap();
    assert!(statements.contains("retry::run("), "the one send repeats");
    assert!(found.is_empty(), "{found:?}");
}

/// The names a `use` statement's text brings in (`a::{B, C as D}` gives `B` and `D`), and the
/// first segment of its path (`self::` and `crate::` left out).
fn use_names(statement: &str) -> (String, Vec<String>) {
    let path = statement.trim().trim_end_matches(';').trim();
    let path = path
        .strip_prefix("self::")
        .or_else(|| path.strip_prefix("crate::"))
        .unwrap_or(path);
    let (module, rest) = path.split_once("::").unwrap_or(("", path));
    let names = rest
        .split([',', '{', '}'])
        .map(|part| {
            let part = part.trim();
            let name = part.rsplit_once(" as ").map_or(part, |(_, alias)| alias);
            name.rsplit("::").next().unwrap().trim().to_string()
        })
        .filter(|name| !name.is_empty() && name != "self")
        .collect();
    (module.to_string(), names)
}

/// The `pub` items declared at the top level of a Rust file (`pub struct X`, `pub fn x`,
/// `pub use a::{X, Y}`, ...), not `pub(crate)` ones nor modules: each name with, for a `use`,
/// its path's first segment (empty for a declaration).
fn top_level_pub_items(text: &str) -> Vec<(String, String)> {
    let mut items = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("pub ") else {
            continue;
        };
        if rest.starts_with("mod ") {
            continue;
        }
        if let Some(statement) = rest.strip_prefix("use ") {
            let mut statement = statement.to_string();
            while !statement.trim_end().ends_with(';') {
                statement.push_str(lines.next().expect("a `use` ends with `;`"));
            }
            let (module, names) = use_names(&statement);
            items.extend(names.into_iter().map(|name| (module.clone(), name)));
            continue;
        }
        let mut words = rest.split_whitespace();
        let keywords = [
            "struct", "enum", "fn", "async", "unsafe", "const", "static", "type", "trait",
        ];
        let name = words.find(|w| !keywords.contains(w)).unwrap_or_default();
        let name: String = name
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        items.push((String::new(), name));
    }
    items
}

/// The host's public items have one path each (host/src/lib.rs and docs/architecture.md say
/// the rule): a module of host/src/lib.rs is public (the command line's plumbing, whose items
/// the root never re-exports) or private (its public items re-exported at the root, anything
/// else `pub(crate)`). So no `pub use` of the root takes from a public module, every top-level
/// `pub` item of a private module is re-exported at the root, and no doc names a private
/// module's path (Rust code that does would not compile). Checked by putting
/// `pub use config::HostArgs;` back into host/src/lib.rs, and by making `runtime` public.
#[test]
fn the_host_has_one_path_per_item() {
    let host = root().join("host/src");
    let lib = std::fs::read_to_string(host.join("lib.rs")).unwrap();
    let (mut public, mut private) = (BTreeSet::new(), BTreeSet::new());
    for line in lib.lines() {
        if let Some(name) = line.strip_prefix("pub mod ") {
            public.insert(name.trim_end_matches(';').to_string());
        } else if let Some(name) = line.strip_prefix("mod ") {
            private.insert(name.trim_end_matches(';').to_string());
        }
    }
    assert!(
        !private.is_empty() && !public.is_empty(),
        "host/src/lib.rs declares modules: {public:?} {private:?}"
    );
    let mut exported = BTreeSet::new();
    for (module, name) in top_level_pub_items(&lib) {
        assert!(
            !public.contains(&module),
            "host/src/lib.rs re-exports `{module}::{name}` at the root, and `{module}` is a public \
             module: two paths to one item (a module is public or re-exported, not both)"
        );
        assert!(
            private.contains(&module),
            "host/src/lib.rs: `pub {name}` is not a re-export from one of its private modules \
             ({private:?})"
        );
        exported.insert(name);
    }
    let mut unexported = Vec::new();
    for module in &private {
        let file = host.join(format!("{module}.rs"));
        let file = if file.exists() {
            file
        } else {
            host.join(module).join("mod.rs")
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (_, name) in top_level_pub_items(&text) {
            if !exported.contains(&name) {
                unexported.push(format!("{module}::{name}"));
            }
        }
    }
    assert!(
        unexported.is_empty(),
        "public items of the host's private modules that the root does not re-export (re-export \
         them in host/src/lib.rs, or make them pub(crate)): {unexported:?}"
    );
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("clickhouse_component_host::") {
                let path = &line[at + "clickhouse_component_host::".len()..];
                let module: String = path
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    !private.contains(&module),
                    "{}:{}: `{module}` is a private module of the host: its items are at the \
                     root: {line}",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}
