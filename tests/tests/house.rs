//! The house kept: no circle of imports between the source files of the
//! product's crates and tools (a file that imports another which, through
//! any chain, imports it back). A file's imports are the `crate::`,
//! `super::` and `self::` paths it names outside its tests, each taken to
//! the file that defines the module it names. A child module's file may
//! use what its parent defines; a parent naming a child is a declaration,
//! not an import, unless it names it through one of those paths; what a
//! crate's root re-exports (`pub use`) is its face, not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose files must not import in a circle.
const CRATES: &[&str] = &[
    "proto",
    "runtime",
    "runtime/values",
    "cloud-gateway",
    "cloud-gateway/provider-api",
    "cloud-gateway/sim",
    "cloud-gateway/aws",
    "cloud-gateway/conformance",
    "node-controller",
    "service-controller",
    "route-controller",
    "tools/sandbox",
    "tools/kubectl-ccm",
    "tools/bench",
    "tools/soak",
    "tools/preflight",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src` (`[]` for the crate's root).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    if parts.first().is_some_and(|p| p == "bin") {
        // A binary of its own: its modules are its own crate's.
        return vec![format!("bin:{}", parts.join("/"))];
    }
    parts
}

/// The text a file's imports are read from: no comments, no tests.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The paths a `use` tree or path names after its first `::`, each as
/// its segments: `{a, b::{c, d}}` gives `a`, `b::c`, `b::d`.
fn paths(text: &str) -> Vec<Vec<String>> {
    fn tree(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Vec<Vec<String>> {
        let mut segment = String::new();
        loop {
            match chars.peek() {
                Some(c) if c.is_alphanumeric() || *c == '_' => {
                    segment.push(*c);
                    chars.next();
                }
                Some(':') => {
                    chars.next();
                    if chars.peek() == Some(&':') {
                        chars.next();
                        let rest = tree(chars);
                        return if rest.is_empty() {
                            vec![vec![segment]]
                        } else {
                            rest.into_iter()
                                .map(|mut r| {
                                    r.insert(0, segment.clone());
                                    r
                                })
                                .collect()
                        };
                    }
                    return vec![vec![segment]];
                }
                Some('{') if segment.is_empty() => {
                    chars.next();
                    let mut all = Vec::new();
                    loop {
                        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
                            chars.next();
                        }
                        match chars.peek() {
                            Some('}') | None => {
                                chars.next();
                                return all;
                            }
                            _ => {}
                        }
                        let before = all.len();
                        all.extend(tree(chars));
                        // Skip what the item does not name (`as x`, `*`).
                        while chars.peek().is_some_and(|c| *c != ',' && *c != '}') {
                            chars.next();
                        }
                        if all.len() == before && chars.peek().is_none() {
                            return all;
                        }
                    }
                }
                _ => {
                    return if segment.is_empty() {
                        Vec::new()
                    } else {
                        vec![vec![segment]]
                    };
                }
            }
        }
    }
    tree(&mut text.chars().peekable())
}

/// The file that defines the longest prefix of `path` that is a module.
fn file_of(modules: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Option<PathBuf> {
    (0..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n]).cloned())
}

/// The files each file imports, within one crate.
fn imports(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        let here = module_of(src, file);
        let mut text = code(&std::fs::read_to_string(file).unwrap());
        if here.is_empty() {
            // The crate's face: what its root hands on is not an import.
            text = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("pub use "))
                .collect::<Vec<_>>()
                .join("\n");
        }
        let mut to = BTreeSet::new();
        for (prefix, base) in [
            ("crate::", Vec::new()),
            ("super::", here[..here.len().saturating_sub(1)].to_vec()),
            ("self::", here.clone()),
        ] {
            for (at, _) in text.match_indices(prefix) {
                let before = text[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                for path in paths(&text[at + prefix.len()..]) {
                    let mut full = base.clone();
                    full.extend(path);
                    if let Some(target) = file_of(&modules, &full)
                        && target != *file
                    {
                        to.insert(target);
                    }
                }
            }
        }
        edges.insert(file.clone(), to);
    }
    edges
}

/// Every circle: the strongly connected components of more than one file.
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    let reaches = |from: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for t in edges.get(&f).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        edges.keys().map(|f| (f, reaches(f))).collect();
    let mut found: BTreeSet<Vec<PathBuf>> = BTreeSet::new();
    for (file, from_here) in &reach {
        let circle: Vec<PathBuf> = from_here
            .iter()
            .filter(|other| reach[other].contains(*file))
            .cloned()
            .collect();
        if circle.len() > 1 {
            found.insert(circle);
        }
    }
    found.into_iter().collect()
}

#[test]
fn no_source_file_imports_one_that_imports_it_back() {
    let root = workspace();
    let mut all = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        assert!(src.is_dir(), "{} is gone: update CRATES", src.display());
        for circle in circles(&imports(&src)) {
            all.push(
                circle
                    .iter()
                    .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
                    .collect::<Vec<_>>()
                    .join(" <-> "),
            );
        }
    }
    assert!(all.is_empty(), "import circles:\n{}", all.join("\n"));
}

#[test]
fn a_circle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "use crate::b::{X, y::Z};\nmod w;\n").unwrap();
    std::fs::write(src.join("a/w.rs"), "use super::Y; // crate::b\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct X;\nfn f() -> crate::a::Y { todo!() }\n#[cfg(test)]\nmod t { use crate::lib; }\n",
    )
    .unwrap();
    let found = circles(&imports(src));
    assert_eq!(
        found,
        vec![vec![src.join("a/mod.rs"), src.join("b.rs")]],
        "{found:?}"
    );
    std::fs::write(src.join("b.rs"), "pub struct X;\n").unwrap();
    assert!(circles(&imports(src)).is_empty());
}
