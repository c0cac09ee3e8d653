//! `docs-check` on a copy of this tree: it passes as the tree is, and
//! fails naming what a rename broke, and a main benchmark table of a commit
//! not in the history.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=docs-check",
            "-c",
            "user.email=docs-check@example.com",
        ])
        .args(args)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The tree's files as git sees them (tracked, or new and not ignored),
/// copied into `to`, committed there.
fn copy_tree(to: &Path) {
    let from = workspace();
    let files = git(
        &from,
        &[
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ],
    );
    for file in files.split('\0').filter(|f| !f.is_empty()) {
        let source = from.join(file);
        if !source.is_file() {
            continue; // deleted in the work tree
        }
        let target = to.join(file);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&source, &target).unwrap();
    }
    git(to, &["init", "-q"]);
    git(to, &["add", "-A"]);
    git(to, &["commit", "-q", "-m", "copy"]);
}

/// Runs the check on `root`: whether it passed, and what it said.
fn check(root: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_docs-check"))
        .arg(root)
        .output()
        .expect("run docs-check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Makes BENCHMARKS.md's main table name `sha`.
fn name_commit(root: &Path, sha: &str) {
    let path = root.join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text
        .find(ccm_docs_check::COMMIT_MARK)
        .expect("a main table naming a commit");
    let start = at + ccm_docs_check::COMMIT_MARK.len();
    let end = start + text[start..].find(' ').unwrap();
    let text = format!("{}{sha}{}", &text[..start], &text[end..]);
    std::fs::write(path, text).unwrap();
}

#[test]
fn the_check_fails_naming_a_renamed_file_and_a_table_of_no_commit_of_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_tree(root);
    let head = git(root, &["rev-parse", "--short=12", "HEAD"]);
    name_commit(root, head.trim());
    let (ok, said) = check(root);
    assert!(ok, "the tree as it is passes:\n{said}");

    let (from, to) = (
        root.join("service-controller/src/membership.rs"),
        root.join("service-controller/src/kept.rs"),
    );
    std::fs::rename(&from, &to).unwrap();
    let (ok, said) = check(root);
    assert!(!ok, "a renamed file fails the check");
    assert!(
        said.contains("ARCHITECTURE.md:") && said.contains("`membership.rs`: no file of that name"),
        "{said}"
    );
    std::fs::rename(&to, &from).unwrap();

    name_commit(root, "0123456789ab");
    let (ok, said) = check(root);
    assert!(!ok);
    assert!(
        said.contains("BENCHMARKS.md:") && said.contains("0123456789ab"),
        "{said}"
    );
}
