//! Shrinks a built component for embedders (host/build.rs, the library component): binaryen's
//! `wasm-opt -Oz` on its core module, spliced back in place, and the `component-name` custom
//! section (names for tools, not used to run it) dropped.
//!
//! A component is a sequence of sections; the core module is one top-level section (id 1)
//! whose body is the module. `wasm-opt` keeps a module's exports and may drop an import
//! nothing calls (the component refers to the module by those names only, and a core
//! instantiation may be given more imports than the module asks for), so the optimised
//! module replaces the old one in place, with its new size. The result is validated where it is used: the host
//! compiles it, and the tests run it.

use std::ops::Range;
use std::path::Path;
use std::process::Command;

/// The features rustc's wasm32-wasip2 output uses: `wasm-opt` must neither refuse them nor emit
/// newer ones (with `--all-features`, binaryen 120+ writes encodings wasmtime 48 refuses).
const FEATURES: &[&str] = &[
    "--mvp-features",
    "--enable-bulk-memory",
    "--enable-multivalue",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-reference-types",
    "--enable-sign-ext",
];

/// Reads an unsigned LEB128 number at `at`; returns it and the index after it.
fn read_leb(bytes: &[u8], mut at: usize) -> Option<(usize, usize)> {
    let (mut value, mut shift) = (0usize, 0);
    loop {
        let byte = *bytes.get(at)?;
        at += 1;
        value |= usize::from(byte & 0x7f).checked_shl(shift)?;
        shift += 7;
        if byte < 0x80 {
            return Some((value, at));
        }
    }
}

fn write_leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A top-level section: its id, where it starts (its id byte) and its body.
struct Section {
    id: u8,
    start: usize,
    body: Range<usize>,
}

/// The top-level sections of a component (`\0asm`, version 13, layer 1), or `None`.
fn sections(component: &[u8]) -> Option<Vec<Section>> {
    if component.get(..8)? != b"\0asm\x0d\x00\x01\x00" {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 8;
    while at < component.len() {
        let (size, body) = read_leb(component, at + 1)?;
        let end = body.checked_add(size).filter(|&e| e <= component.len())?;
        out.push(Section {
            id: component[at],
            start: at,
            body: body..end,
        });
        at = end;
    }
    Some(out)
}

/// Whether a custom section (id 0) is named `name`.
fn is_custom(component: &[u8], section: &Section, name: &str) -> bool {
    section.id == 0
        && read_leb(component, section.body.start)
            .and_then(|(len, at)| component.get(at..at.checked_add(len)?))
            .is_some_and(|n| n == name.as_bytes())
}

/// Shrinks the component at `path` in place with `wasm_opt`, working in `work` (a directory).
/// Errors say what failed; the component is then left as it was (it is written once, last).
pub fn shrink(path: &Path, wasm_opt: &Path, work: &Path) -> Result<(), String> {
    let component = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let sections = sections(&component).ok_or("the component's sections do not parse")?;
    let modules: Vec<&Section> = sections.iter().filter(|s| s.id == 1).collect();
    // The program is the largest core module (the others are small shims).
    let program = modules
        .iter()
        .max_by_key(|s| s.body.len())
        .ok_or("the component has no core module")?;
    let (before, after) = (work.join("core.wasm"), work.join("core.opt.wasm"));
    std::fs::write(&before, &component[program.body.clone()]).map_err(|e| e.to_string())?;
    let status = Command::new(wasm_opt)
        .arg("-Oz")
        .args(FEATURES)
        .arg(&before)
        .arg("-o")
        .arg(&after)
        .status()
        .map_err(|e| format!("running {}: {e}", wasm_opt.display()))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", wasm_opt.display()));
    }
    let optimised = std::fs::read(&after).map_err(|e| e.to_string())?;
    let mut out = component[..8].to_vec();
    for section in &sections {
        if section.start == program.start {
            out.push(1);
            write_leb(&mut out, optimised.len());
            out.extend_from_slice(&optimised);
        } else if !is_custom(&component, section, "component-name") {
            out.extend_from_slice(&component[section.start..section.body.end]);
        }
    }
    std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))
}
