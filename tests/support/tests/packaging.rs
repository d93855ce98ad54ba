//! Packaging facts that a user relies on and that no compiler checks: the declared
//! `rust-version` holds for the locked dependency tree, and the CLI built for one backend
//! leaves the other backend's client (and etcd's protoc need) out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// `1.89` and `1.89.0` compare equal; a missing part counts as 0.
fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text.split('.').map(|p| p.parse().unwrap()).collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn the_declared_rust_version_covers_the_locked_dependency_tree() {
    let metadata: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--all-features",
    ]))
    .unwrap();
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let packages = metadata["packages"].as_array().unwrap();
    let mut needed: Vec<(Vec<u64>, String)> = packages
        .iter()
        .filter(|p| !members.contains(&p["id"].as_str().unwrap()))
        .filter_map(|p| {
            let rv = p["rust_version"].as_str()?;
            Some((
                version(rv),
                format!("{} {} needs {rv}", p["name"], p["version"]),
            ))
        })
        .collect();
    needed.sort();
    let (highest, who) = needed
        .last()
        .expect("some dependency declares a rust-version");
    let mut checked = 0;
    for p in packages
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap()))
    {
        let declared = p["rust_version"]
            .as_str()
            .unwrap_or_else(|| panic!("{} declares no rust-version", p["name"]));
        let name = p["name"].as_str().unwrap();
        assert!(
            version(declared) >= *highest,
            "{name} declares rust-version {declared}, but the locked {who}: raise \
             [workspace.package] rust-version"
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} workspace members checked");
}

/// The crates `cargo tree` lists for the CLI built with `features` (all edge kinds).
fn cli_tree(features: &[&str]) -> Vec<String> {
    let mut args = vec![
        "tree",
        "--locked",
        "-p",
        "fencelock-cli",
        "--no-default-features",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    let joined = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", &joined]);
    }
    cargo(&args)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The crates that need protoc at build time (etcd-client's build script).
const PROTOC_USERS: [&str; 3] = ["etcd-client", "prost-build", "tonic-build"];

#[test]
fn the_cli_built_for_etcd_only_has_no_zookeeper_client() {
    let tree = cli_tree(&["etcd"]);
    assert!(tree.iter().any(|c| c == "etcd-client"), "{tree:?}");
    assert!(!tree.iter().any(|c| c == "zookeeper-client"), "{tree:?}");
}

#[test]
fn the_cli_built_for_zookeeper_only_needs_no_etcd_client_and_no_protoc() {
    let tree = cli_tree(&["zookeeper"]);
    assert!(tree.iter().any(|c| c == "zookeeper-client"), "{tree:?}");
    for crate_ in PROTOC_USERS {
        assert!(!tree.iter().any(|c| c == crate_), "{crate_} in {tree:?}");
    }
}

#[test]
fn the_memory_only_cli_of_the_demo_has_neither_backend() {
    let tree = cli_tree(&[]);
    assert!(tree.iter().any(|c| c == "fencelock-connect"), "{tree:?}");
    for crate_ in PROTOC_USERS.iter().chain(&["zookeeper-client"]) {
        assert!(!tree.iter().any(|c| c == crate_), "{crate_} in {tree:?}");
    }
}
