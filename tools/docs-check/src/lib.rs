//! `make docs-check`: every path, file, module, item, flag, test and make
//! target that README.md, ARCHITECTURE.md, SECURITY.md and
//! proto/CONTRACT.md name in backticks still exists in the tree, and
//! BENCHMARKS.md's main table names the commit it ran at, one of HEAD's
//! history. A doc whose names a command checks stays true; one checked by
//! reading drifts.
//!
//! Backticks also hold prose (values, API groups, URLs, commands of other
//! programs), so what counts as a name is decided by rules, not by a list
//! of exceptions:
//! - a **path** has a `/` (not `://`), is relative, and its first part is
//!   no domain (`example.io/x`) or placeholder (`<name>`); it is checked
//!   when it ends with `/` (a directory), has a source file's extension,
//!   or starts with a directory of the tree. It exists when a file or
//!   directory's path ends with it (`*` matches within a part). Paths
//!   under what `.gitignore` ignores (`target/`, `.sandbox/`) are what
//!   builds and runs write, not the tree's;
//! - a **file** is a bare name with a source file's extension
//!   ([`SOURCE_EXTENSIONS`]) or `Dockerfile`/`Makefile`: a file has that
//!   name (data files, `.json` or `.crt`, are what processes write);
//! - a **module or item** is `a::b` (`()` and `<..>` aside): `a` is a
//!   module (file or directory), crate, or type of the tree, and the last
//!   part is defined inside it (an item, a field or variant, a submodule);
//! - a **flag** is `--name` at the start: a flag of ours (clap's `long`
//!   of a field, or `--name` in a source file), unless the text names it
//!   another program's (`kubelet's --flag`);
//! - a **test** is a snake_case name with three underscores or more: a
//!   function (`fn`, Python's `def`) of that name;
//! - a shorter snake_case name appears in a source file as a word;
//! - `make target` is a target of the Makefile.
//!
//! Source files are every file of the tree but the Markdown docs, whose
//! names are what is checked. Code in fenced blocks is example, not
//! checked.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

/// The docs whose names are checked, from the tree's root.
pub const DOCS: &[&str] = &[
    "README.md",
    "ARCHITECTURE.md",
    "SECURITY.md",
    "proto/CONTRACT.md",
];

/// The extensions of a source file named bare (`subsets.rs`).
pub const SOURCE_EXTENSIONS: &[&str] = &[
    "rs", "py", "proto", "md", "toml", "sh", "tpl", "yaml", "yml",
];

/// Directories never walked: git's own, and build outputs beside those
/// `.gitignore` names.
const NEVER_WALKED: &[&str] = &[".git", "target", "node_modules"];

/// One name a doc gives that does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The doc, from the tree's root.
    pub doc: String,
    /// Its line (from 1).
    pub line: usize,
    /// What is named.
    pub name: String,
    /// Why it does not hold.
    pub why: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.doc, self.line, self.name, self.why
        )
    }
}

/// Every problem of the tree at `root`: its docs' names, then
/// BENCHMARKS.md's commit.
pub fn check(root: &Path) -> anyhow::Result<Vec<Problem>> {
    let mut problems = check_names(root)?;
    problems.extend(check_benchmarks(root)?);
    Ok(problems)
}

/// What the tree holds, indexed for the rules.
#[derive(Debug, Default)]
struct Tree {
    /// Every file's path from the root, `/` between parts.
    files: Vec<String>,
    /// Every directory's.
    dirs: Vec<String>,
    /// Names of directories anywhere.
    dir_names: HashSet<String>,
    /// Every source file's path and text.
    sources: Vec<(String, String)>,
    /// Every identifier a source file holds.
    words: HashSet<String>,
    /// Per identifier, the source files that define it (an item, or a
    /// field or variant), by index in `sources`.
    defined: HashMap<String, Vec<usize>>,
    /// Per type, the source files that define or implement it.
    types: HashMap<String, Vec<usize>>,
    /// Every flag of ours.
    flags: HashSet<String>,
    /// Crate names (`a_b` for `a-b`), with their directory.
    crates: HashMap<String, String>,
    /// Our programs: binaries and crates, as the docs name them.
    programs: HashSet<String>,
    /// The Makefile's targets.
    make_targets: HashSet<String>,
}

impl Tree {
    fn read(root: &Path) -> anyhow::Result<Self> {
        let mut never: HashSet<String> = NEVER_WALKED.iter().map(|s| s.to_string()).collect();
        if let Ok(ignore) = std::fs::read_to_string(root.join(".gitignore")) {
            never.extend(
                ignore
                    .lines()
                    .map(|l| l.trim().trim_matches('/'))
                    .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.contains(['*', '/']))
                    .map(str::to_owned),
            );
        }
        let mut tree = Tree::default();
        walk(root, "", &never, &mut tree)?;
        tree.index();
        Ok(tree)
    }

    fn index(&mut self) {
        // A module or test binary is named by its file.
        for path in &self.files {
            let file = path.rsplit('/').next().unwrap_or(path);
            let stem = file.split('.').next().unwrap_or(file);
            self.words.insert(stem.to_owned());
        }
        for (i, (path, text)) in self.sources.iter().enumerate() {
            let proto = path.ends_with(".proto");
            let tokens = identifiers(text);
            for w in &tokens {
                self.words.insert(w.to_string());
            }
            for pair in tokens.windows(2) {
                let (keyword, name) = (pair[0], pair[1]);
                if DEFINING.contains(&keyword) {
                    self.defined.entry(name.into()).or_default().push(i);
                }
                if TYPE_DEFINING.contains(&keyword) || keyword == "impl" || keyword == "for" {
                    self.types.entry(name.into()).or_default().push(i);
                }
            }
            // `impl<T> Name<T>`: the type after the generics.
            for at in text.match_indices("impl<").map(|(at, _)| at) {
                let rest = &text[at + 4..];
                if let Some(end) = closing_angle(rest)
                    && let Some(name) = identifiers(&rest[end..]).first()
                {
                    self.types.entry(name.to_string()).or_default().push(i);
                }
            }
            for line in text.lines() {
                if let Some(name) = member(line, proto) {
                    self.defined.entry(name.into()).or_default().push(i);
                }
            }
            if path.ends_with(".rs") {
                self.flags.extend(clap_flags(text));
            }
            self.flags.extend(literal_flags(text));
            if path == "Makefile" {
                self.make_targets.extend(make_targets(text));
            }
            if path.ends_with("Cargo.toml") {
                let dir = path.trim_end_matches("Cargo.toml").trim_end_matches('/');
                for (key, value) in toml_names(text) {
                    if key == "package" {
                        self.crates.insert(value.replace('-', "_"), dir.to_owned());
                    }
                    self.programs.insert(value);
                }
            }
        }
    }

    /// Whether a file or directory's path is `path` or ends with it.
    fn has_path(&self, path: &str, dir: bool) -> bool {
        let matches = |p: &String| {
            if path.contains('*') {
                glob_suffix(p, path)
            } else {
                p == path || p.ends_with(&format!("/{path}"))
            }
        };
        self.dirs.iter().any(matches) || (!dir && self.files.iter().any(matches))
    }

    /// The source files that `name` (a module, crate or type) covers.
    fn scope(&self, name: &str) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        let module_file = format!("{name}.rs");
        for (i, (path, _)) in self.sources.iter().enumerate() {
            let file = path.rsplit('/').next().unwrap_or(path);
            let in_dir =
                path.starts_with(&format!("{name}/")) || path.contains(&format!("/{name}/"));
            let in_crate = self
                .crates
                .get(name)
                .is_some_and(|dir| path.starts_with(&format!("{dir}/")));
            if file == module_file || in_dir || in_crate {
                out.push(i);
            }
        }
        out.extend(self.types.get(name).into_iter().flatten());
        out.extend(
            self.defined
                .get(name)
                .into_iter()
                .flatten()
                .filter(|i| self.sources[**i].1.contains(&format!("mod {name}"))),
        );
        out
    }

    /// Whether `name` is defined in one of `files`: an item, a field or
    /// variant, a submodule's file or directory, or a proto enum's value.
    fn defines(&self, files: &[usize], name: &str) -> bool {
        let here = |i: &usize| files.contains(i);
        if self.defined.get(name).is_some_and(|d| d.iter().any(here)) {
            return true;
        }
        let module = [format!("/{name}.rs"), format!("/{name}/")];
        if files.iter().any(|i| {
            module
                .iter()
                .any(|m| self.sources[*i].0.contains(m.as_str()))
        }) {
            return true;
        }
        // A proto enum's value, as prost names it (`Initialize` for
        // `LOOKUP_PURPOSE_INITIALIZE`).
        let upper = upper_snake(name);
        files.iter().any(|i| {
            let (path, text) = &self.sources[*i];
            path.ends_with(".proto")
                && text.lines().any(|l| {
                    let l = l.trim();
                    l.split_once('=').is_some_and(|(value, _)| {
                        let value = value.trim();
                        value == upper || value.ends_with(&format!("_{upper}"))
                    })
                })
        })
    }
}

/// Keywords after which a name is defined (Rust, Python, protobuf).
const DEFINING: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "trait",
    "type",
    "const",
    "static",
    "mod",
    "union",
    "macro_rules",
    "def",
    "class",
    "message",
    "service",
    "rpc",
];

/// Those of them that define a type.
const TYPE_DEFINING: &[&str] = &[
    "struct", "enum", "trait", "type", "union", "class", "message",
];

fn walk(root: &Path, rel: &str, never: &HashSet<String>, tree: &mut Tree) -> anyhow::Result<()> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if never.contains(&name) {
            continue;
        }
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let kind = entry.file_type()?;
        if kind.is_dir() {
            tree.dirs.push(path.clone());
            tree.dir_names.insert(name);
            walk(root, &path, never, tree)?;
        } else if kind.is_file() {
            let source = !matches!(
                name.rsplit_once('.').map(|(_, e)| e),
                Some("md" | "svg" | "lock" | "png" | "ico")
            );
            if source
                && entry.metadata()?.len() < 4 << 20
                && let Ok(bytes) = std::fs::read(entry.path())
            {
                tree.sources
                    .push((path.clone(), String::from_utf8_lossy(&bytes).into_owned()));
            }
            tree.files.push(path);
        }
    }
    Ok(())
}

/// The identifiers of `text`, in order.
fn identifiers(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let part = c.is_ascii_alphanumeric() || c == '_';
        match (start, part) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push(&text[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out.retain(|w| !w.starts_with(|c: char| c.is_ascii_digit()));
    out
}

/// Where the `<` that starts `text` closes, past it.
fn closing_angle(text: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The field or variant a line defines: its first identifier followed by
/// `,`, `(`, `{`, `=` or `:` (Rust, after `pub`), or a protobuf field's
/// name (`string name = 1;`).
fn member(line: &str, proto: bool) -> Option<&str> {
    let line = line.trim_start();
    if proto {
        let (left, right) = line.split_once('=')?;
        right
            .trim_start()
            .starts_with(|c: char| c.is_ascii_digit())
            .then_some(())?;
        return identifiers(left).last().copied();
    }
    let line = line
        .strip_prefix("pub(crate) ")
        .or_else(|| line.strip_prefix("pub(super) "))
        .or_else(|| line.strip_prefix("pub "))
        .unwrap_or(line);
    let name = identifiers(line).into_iter().next()?;
    if !line.starts_with(name) {
        return None;
    }
    let rest = line[name.len()..].trim_start();
    (rest.starts_with([',', '(', '{', '=', ':']) && !rest.starts_with("::")).then_some(name)
}

/// The flags clap derives from `src`: a field under `#[arg(...long...)]`
/// is `--field-name`, or the `long = "name"` given.
fn clap_flags(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut long = false;
    for line in src.lines() {
        let line = line.trim();
        if line.starts_with("#[arg(") || line.starts_with("#[clap(") {
            if let Some(at) = line.find("long = \"") {
                let rest = &line[at + 8..];
                if let Some(end) = rest.find('"') {
                    out.push(format!("--{}", &rest[..end]));
                }
            } else if identifiers(line).contains(&"long") {
                long = true;
            }
            continue;
        }
        if line.starts_with("#[") || line.starts_with("///") || line.is_empty() {
            continue;
        }
        if long && let Some(name) = member(line, false) {
            out.push(format!("--{}", name.replace('_', "-")));
        }
        long = false;
    }
    out
}

/// Every `--name` written in `text`.
fn literal_flags(text: &str) -> Vec<String> {
    text.match_indices("--")
        .filter(|(at, _)| !text[..*at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            name.starts_with(|c: char| c.is_ascii_lowercase())
                .then(|| format!("--{name}"))
        })
        .collect()
}

/// A Makefile's targets (`name:` at a line's start).
fn make_targets(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with(['\t', ' ', '#', '.']))
        .filter_map(|l| l.split_once(':'))
        .filter(|(_, rest)| !rest.starts_with('='))
        .flat_map(|(names, _)| names.split_whitespace().map(str::to_owned))
        .collect()
}

/// The `name = "..."` of each `[package]` and `[[bin]]` of a manifest.
fn toml_names(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut table = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.trim_matches(['[', ']']).to_owned();
        } else if let Some(value) = line.strip_prefix("name = \"")
            && (table == "package" || table == "bin")
        {
            out.push((table.clone(), value.trim_end_matches('"').to_owned()));
        }
    }
    out
}

/// `GatewayBusy` → `GATEWAY_BUSY`.
fn upper_snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Whether `path` ends with `pattern`, part by part, `*` matching within
/// a part.
fn glob_suffix(path: &str, pattern: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let want: Vec<&str> = pattern.split('/').collect();
    parts.len() >= want.len()
        && parts[parts.len() - want.len()..]
            .iter()
            .zip(&want)
            .all(|(p, w)| glob_part(p, w))
}

fn glob_part(part: &str, pattern: &str) -> bool {
    match pattern.split_once('*') {
        None => part == pattern,
        Some((head, tail)) => {
            part.len() >= head.len() + tail.len() && part.starts_with(head) && part.ends_with(tail)
        }
    }
}

/// Each inline code span of a Markdown `text` outside fenced blocks, with
/// its line (from 1) and the text before it on that line.
fn spans(text: &str) -> Vec<(usize, &str, &str)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        let mut offset = 0;
        while let Some(open) = rest.find('`') {
            let after = &rest[open + 1..];
            let Some(close) = after.find('`') else { break };
            out.push((n + 1, &after[..close], &line[..offset + open]));
            offset += open + close + 2;
            rest = &after[close + 1..];
        }
    }
    out
}

/// Whether `word` is an identifier.
fn is_identifier(word: &str) -> bool {
    !word.is_empty()
        && !word.starts_with(|c: char| c.is_ascii_digit())
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// How the names of metrics end (Prometheus' units and kinds): the rest,
/// under a registry's prefix, is what the code registers.
const METRIC_SUFFIXES: &[&str] = &["_total", "_seconds", "_bytes", "_info"];

/// The problem with the name `span`, if any (see the module's rules);
/// `before` is the text before it on its line.
fn judge(tree: &Tree, span: &str, before: &str) -> Option<String> {
    let span = span.trim();
    if let Some(flag) = span.strip_prefix("--") {
        let name: String = flag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.is_empty() || tree.flags.contains(&format!("--{name}")) {
            return None;
        }
        // `kubelet's --flag`: another program's.
        let owner = before
            .trim_end()
            .strip_suffix("'s")
            .and_then(|b| b.split_whitespace().last())
            .map(|w| w.trim_start_matches(['(', '[', '"']));
        if owner.is_some_and(|o| !tree.programs.contains(o)) {
            return None;
        }
        return Some("no flag of that name".into());
    }
    if let Some(target) = span.strip_prefix("make ") {
        let target = target.split_whitespace().next().unwrap_or_default();
        return (!tree.make_targets.contains(target))
            .then(|| "no Makefile target of that name".into());
    }
    if span.contains(char::is_whitespace) {
        // A command: only the tree's paths in it are names.
        return span
            .split_whitespace()
            .find_map(|word| judge_path(tree, word, true));
    }
    if span.contains("::") {
        return judge_item(tree, span);
    }
    if span.contains('/') {
        return judge_path(tree, span, false);
    }
    if let Some((_, ext)) = span.rsplit_once('.')
        && (SOURCE_EXTENSIONS.contains(&ext) || matches!(span, "Dockerfile" | "Makefile"))
        && is_identifier(&span[..span.len() - ext.len() - 1].replace(['-', '.'], "_"))
    {
        let name = format!("/{span}");
        let found = tree.files.iter().any(|f| f == span || f.ends_with(&name));
        return (!found).then(|| "no file of that name".into());
    }
    if matches!(span, "Dockerfile" | "Makefile") {
        return (!tree.files.iter().any(|f| f == span)).then(|| "no file of that name".into());
    }
    if is_identifier(span) && span.starts_with(|c: char| c.is_ascii_lowercase()) {
        if let Some(name) = METRIC_SUFFIXES.iter().find_map(|s| span.strip_suffix(s)) {
            // A metric: its name as registered, under any prefix.
            let parts: Vec<&str> = name.split('_').collect();
            let found = tree.words.contains(span)
                || (0..parts.len().saturating_sub(1))
                    .any(|i| tree.words.contains(&parts[i..].join("_")));
            return (!found).then(|| "no metric of that name".into());
        }
        let underscores = span.matches('_').count();
        if underscores >= 3 && !tree.defined.contains_key(span) {
            return Some("no test or function of that name".into());
        }
        if (1..3).contains(&underscores) && !tree.words.contains(span) {
            return Some("named in no source file".into());
        }
    }
    None
}

/// The problem with `span` if it is a path of the tree (see the module's
/// rules); in a command, only words with a source file's extension or
/// under a directory of the tree count.
fn judge_path(tree: &Tree, span: &str, in_command: bool) -> Option<String> {
    if !span.contains('/')
        || span.contains("://")
        || span.starts_with(['/', '~'])
        || span.contains(['<', '>', '$', '"', '\'', '{', '(', '[', '=', ':', ','])
    {
        return None;
    }
    let first = span.split('/').next().unwrap_or_default();
    if first.is_empty() || first.get(1..).is_some_and(|r| r.contains('.')) {
        // `example.io/x`: an API group, a domain.
        return None;
    }
    let dir = span.ends_with('/');
    let path = span.trim_end_matches('/');
    let last = path.rsplit('/').next().unwrap_or_default();
    let extension = last
        .rsplit_once('.')
        .is_some_and(|(_, e)| SOURCE_EXTENSIONS.contains(&e));
    let under_tree_dir = tree.dir_names.contains(first);
    if !(dir && !in_command || extension || under_tree_dir) {
        return None;
    }
    // What builds and runs write (`target/`, `.sandbox/`) is no path of
    // the tree; nor is a subresource (`pods/proxy`).
    if NEVER_WALKED.contains(&first) || (first.starts_with('.') && !tree.dir_names.contains(first))
    {
        return None;
    }
    (!tree.has_path(path, dir)).then(|| {
        if dir {
            "no directory of that path".into()
        } else {
            "no file or directory of that path".into()
        }
    })
}

/// The problem with `a::b::c`, if any.
fn judge_item(tree: &Tree, span: &str) -> Option<String> {
    let mut text = span.trim_end_matches("()").to_owned();
    while let Some(open) = text.find('<') {
        let end = closing_angle(&text[open..]).map(|e| open + e)?;
        text.replace_range(open..end, "");
    }
    let parts: Vec<&str> = text.split("::").collect();
    if parts.iter().any(|p| !is_identifier(p)) {
        return None;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if first == "crate" || first == "self" || first == "super" || first == "std" {
        return None;
    }
    let scope = tree.scope(first);
    if scope.is_empty() {
        return Some(format!("no module, crate or type `{first}`"));
    }
    (!tree.defines(&scope, last)).then(|| format!("`{first}` defines no `{last}`"))
}

/// The names of the [`DOCS`] at `root` that do not hold.
pub fn check_names(root: &Path) -> anyhow::Result<Vec<Problem>> {
    let tree = Tree::read(root)?;
    let mut problems = Vec::new();
    for doc in DOCS {
        let text =
            std::fs::read_to_string(root.join(doc)).with_context(|| format!("read {doc}"))?;
        for (line, span, before) in spans(&text) {
            if let Some(why) = judge(&tree, span, before) {
                problems.push(Problem {
                    doc: doc.to_string(),
                    line,
                    name: span.to_owned(),
                    why,
                });
            }
        }
    }
    Ok(problems)
}

/// What the main table's header must say: `at commit <sha>`.
pub const COMMIT_MARK: &str = "at commit ";

/// What the harness adds when the tree had changes no commit holds.
pub const NOT_COMMITTED: &str = "with changes not committed";

/// The problem with BENCHMARKS.md's main table at `root`, if any: its
/// header (the first `Produced by` line) must name, `at commit <sha>`, a
/// commit of HEAD's history, and no changes beside it.
pub fn check_benchmarks(root: &Path) -> anyhow::Result<Vec<Problem>> {
    let doc = "BENCHMARKS.md";
    let text = std::fs::read_to_string(root.join(doc)).with_context(|| format!("read {doc}"))?;
    let problem = |line: usize, name: &str, why: String| Problem {
        doc: doc.into(),
        line,
        name: name.into(),
        why,
    };
    let Some((n, header)) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("Produced by"))
    else {
        return Ok(vec![problem(
            1,
            "Produced by",
            "no main table header".into(),
        )]);
    };
    let line = n + 1;
    let Some(at) = header.find(COMMIT_MARK) else {
        return Ok(vec![problem(
            line,
            "Produced by",
            format!("the main table names no commit (`{COMMIT_MARK}<sha>`)"),
        )]);
    };
    let sha: String = header[at + COMMIT_MARK.len()..]
        .trim_start_matches('`')
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    if !(7..=40).contains(&sha.len()) {
        return Ok(vec![problem(
            line,
            "Produced by",
            format!("`{COMMIT_MARK}` names no commit id"),
        )]);
    }
    if header.contains(NOT_COMMITTED) {
        return Ok(vec![problem(
            line,
            &sha,
            "the main table ran on changes no commit holds".into(),
        )]);
    }
    let ancestor = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["merge-base", "--is-ancestor", &sha, "HEAD"])
        .output()
        .context("run git")?;
    Ok(match ancestor.status.code() {
        Some(0) => Vec::new(),
        Some(1) => vec![problem(line, &sha, "not a commit of HEAD's history".into())],
        _ => vec![problem(
            line,
            &sha,
            format!(
                "git knows no such commit here (a shallow clone?): {}",
                String::from_utf8_lossy(&ancestor.stderr).trim()
            ),
        )],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Tree {
        let mut tree = Tree::default();
        for (path, text) in files {
            let mut dir = String::new();
            for part in path.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
                dir = if dir.is_empty() {
                    part.to_string()
                } else {
                    format!("{dir}/{part}")
                };
                if !tree.dirs.contains(&dir) {
                    tree.dirs.push(dir.clone());
                    tree.dir_names.insert(part.to_string());
                }
            }
            tree.files.push(path.to_string());
            tree.sources.push((path.to_string(), text.to_string()));
        }
        tree.index();
        tree
    }

    fn sample() -> Tree {
        tree(&[
            (
                "node-controller/Cargo.toml",
                "[package]\nname = \"node-controller\"\n[[bin]]\nname = \"node-controller\"\n",
            ),
            (
                "node-controller/src/context.rs",
                "pub struct Context {\n    pub nodes: u8,\n}\nimpl Context {\n    pub async fn lookup(&self) {}\n}\n",
            ),
            (
                "node-controller/src/args.rs",
                "#[derive(Parser)]\npub struct Args {\n    /// How many.\n    #[arg(long, default_value_t = 1)]\n    pub node_deletion_min_nodes: u32,\n    #[arg(long = \"cluster-cidr\")]\n    pub cidr: String,\n}\n",
            ),
            (
                "node-controller/src/reconcile.rs",
                "pub async fn sync_nodes() {}\n#[test]\nfn a_node_is_initialised_once() {}\n",
            ),
            (
                "cloud-gateway/src/cloud/instance_lookups.rs",
                "pub enum Purpose {\n    Initialize,\n    Refresh(u8),\n}\n",
            ),
            (
                "proto/cloudgateway/v1/instances.proto",
                "enum LookupPurpose {\n  LOOKUP_PURPOSE_INITIALIZE = 1;\n}\nmessage Host { string provider_id = 2; }\n",
            ),
            ("Makefile", "docs-check:\n\tcargo run\ntest: docs-check\n"),
            (
                "tests/tests/e2e.rs",
                "run(\"--cloud-provider=external\");\n",
            ),
        ])
    }

    #[test]
    fn paths_and_files_are_found_where_they_are_and_missed_where_they_are_not() {
        let tree = sample();
        let judge = |s: &str| judge(&tree, s, "");
        assert_eq!(judge("cloud/instance_lookups.rs"), None);
        assert_eq!(judge("cloud-gateway/src/cloud/"), None);
        assert_eq!(judge("cloudgateway/v1/*.proto"), None);
        assert_eq!(judge("reconcile.rs"), None);
        assert!(judge("tagging.rs").unwrap().contains("no file"));
        assert!(judge("cloud/instance_lookup.rs").is_some());
        assert!(judge("tagging/").is_some(), "a directory named must exist");
        // Not the tree's: runtime outputs, API groups, subresources, URL
        // paths, data files, placeholders.
        for prose in [
            "target/debug/",
            ".sandbox/pki/ca.crt",
            "diagnostics.cloudgateway.io/v1",
            "pods/proxy",
            "/debug/status",
            "endpoints.json",
            "<release>-viewer",
            "tls.crt",
        ] {
            assert_eq!(judge(prose), None, "{prose}");
        }
    }

    #[test]
    fn items_must_be_defined_inside_the_module_crate_or_type_named() {
        let tree = sample();
        let judge = |s: &str| judge(&tree, s, "");
        assert_eq!(judge("Context::lookup"), None);
        assert_eq!(judge("reconcile::sync_nodes"), None);
        assert_eq!(judge("cloud::instance_lookups"), None);
        assert_eq!(judge("node_controller::Context"), None);
        assert_eq!(
            judge("LookupPurpose::Initialize"),
            None,
            "a proto enum's value"
        );
        assert_eq!(judge("Purpose::Refresh"), None, "a variant");
        assert_eq!(judge("Context::nodes"), None, "a field");
        assert!(
            judge("reconcile::sync_services")
                .unwrap()
                .contains("defines no")
        );
        assert!(judge("Context::look_up()").is_some());
        assert!(judge("plan::lb_spec").unwrap().contains("no module"));
    }

    #[test]
    fn flags_tests_and_make_targets_are_ours_or_named_as_another_programs() {
        let tree = sample();
        let judge = |s: &str, before: &str| judge(&tree, s, before);
        assert_eq!(judge("--node-deletion-min-nodes", ""), None);
        assert_eq!(judge("--cluster-cidr 10.0.0.0/8", ""), None);
        assert_eq!(
            judge("--cloud-provider=external", ""),
            None,
            "in a source file"
        );
        assert!(judge("--node-deletion-max-share", "").is_some());
        assert_eq!(judge("--rotate-server-certificates", "or kubelet's "), None);
        assert!(
            judge("--gone", "the node-controller's ").is_some(),
            "ours when a program of ours is named"
        );
        assert_eq!(judge("a_node_is_initialised_once", ""), None);
        assert!(judge("a_node_is_never_initialised", "").is_some());
        assert_eq!(judge("sync_nodes", ""), None);
        assert!(judge("sync_routes", "").is_some());
        assert_eq!(judge("make docs-check", ""), None);
        assert_eq!(
            judge("node_controller_sync_nodes_total", ""),
            None,
            "a metric"
        );
        assert!(judge("node_controller_syncs_total", "").is_some());
        assert_eq!(judge("e2e", ""), None);
        assert!(judge("make bench-everything", "").is_some());
        // Prose: values, commands of other programs, words.
        for prose in [
            "cargo build --release --bin kubectl-ccm",
            "-o json",
            "plan",
            "a",
            "Cloud.provider",
        ] {
            assert_eq!(judge(prose, ""), None, "{prose}");
        }
    }

    #[test]
    fn code_in_fenced_blocks_is_not_read_and_spans_know_their_line() {
        let text = "one `a.rs`\n```sh\n`b.rs`\n```\ntwo `c.rs` and `d.rs`\n";
        let got: Vec<(usize, &str)> = spans(text).into_iter().map(|(l, s, _)| (l, s)).collect();
        assert_eq!(got, [(1, "a.rs"), (5, "c.rs"), (5, "d.rs")]);
    }
}
