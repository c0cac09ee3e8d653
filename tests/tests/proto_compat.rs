//! `make proto-compat`: the buf CLI (pinned in `tools/buf`) compares
//! `cloudgateway.v1` with the last release's descriptors
//! (`proto/compat/baseline.json`) under buf's PACKAGE rules. It passes on
//! the tree and on additions, and fails on a copy with a breaking change,
//! naming it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `buf breaking` on `module` against the baseline: its exit code
/// and what it printed.
fn breaking(module: &Path) -> (i32, String) {
    let root = workspace();
    let buf = root.join("tools/buf/node_modules/.bin/buf");
    assert!(
        buf.exists(),
        "{} is missing: `npm ci --prefix tools/buf` installs it (make test does)",
        buf.display()
    );
    let out = Command::new(buf)
        .arg("breaking")
        .arg(module)
        .arg("--against")
        .arg(root.join("proto/compat/baseline.json"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A copy of the contract with `file`'s `from` replaced by `to`.
fn changed(file: &str, from: &str, to: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let proto = workspace().join("proto");
    std::fs::copy(proto.join("buf.yaml"), dir.path().join("buf.yaml")).unwrap();
    let v1 = dir.path().join("cloudgateway/v1");
    std::fs::create_dir_all(&v1).unwrap();
    for entry in std::fs::read_dir(proto.join("cloudgateway/v1")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, v1.join(path.file_name().unwrap())).unwrap();
    }
    let target = v1.join(file);
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(text.contains(from), "{file} no longer has {from:?}");
    std::fs::write(&target, text.replacen(from, to, 1)).unwrap();
    dir
}

#[test]
fn the_contract_is_compatible_with_the_last_release_and_additions_are_free() {
    let (code, out) = breaking(&workspace().join("proto"));
    assert_eq!(code, 0, "{out}");
    let added = changed(
        "common.proto",
        "  string address = 2;\n",
        "  string address = 2;\n  // Added after the release.\n  string zone = 3;\n",
    );
    let (code, out) = breaking(added.path());
    assert_eq!(code, 0, "an addition breaks nothing: {out}");
}

#[test]
fn a_field_removed_or_renumbered_an_rpc_or_an_enum_value_removed_fails_naming_it() {
    let cases = [
        (
            "common.proto",
            "  string address = 2;\n",
            "",
            r#"field "2" with name "address" on message "NodeAddress" was deleted"#,
        ),
        (
            "common.proto",
            "  string address = 2;\n",
            "  string address = 7;\n",
            r#"field "2" with name "address" on message "NodeAddress" was deleted"#,
        ),
        (
            "routes.proto",
            "  rpc DeleteRoute(DeleteRouteRequest) returns (DeleteRouteResponse);\n",
            "",
            r#"RPC "DeleteRoute" on service "Routes" was deleted"#,
        ),
        (
            "common.proto",
            "  NODE_ADDRESS_TYPE_EXTERNAL_DNS = 5;\n",
            "",
            r#"enum value "5" on enum "NodeAddressType" was deleted"#,
        ),
    ];
    for (file, from, to, named) in cases {
        let copy = changed(file, from, to);
        let (code, out) = breaking(copy.path());
        assert_ne!(code, 0, "{file}: {from:?} -> {to:?} passed");
        assert!(out.contains(named), "{file}: {from:?} -> {to:?}:\n{out}");
    }
}
