//! acp-child's own ACP Registry manifest (`dist/acp-registry/acp-child/agent.json`) is valid
//! against the registry's schema (vendored in `tests/acp-registry/`, source noted there), says
//! this workspace's version, and is read by acp-host's own parser as the binary it describes.

use std::path::Path;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
}

fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(workspace().join("tests/acp-registry/agent.schema.json"))
        .expect("the vendored schema");
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).expect("the registry's schema compiles")
}

#[test]
fn acp_childs_manifest_is_valid_against_the_registrys_schema() {
    let text = std::fs::read(workspace().join("dist/acp-registry/acp-child/agent.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let validator = schema();
    let errors: Vec<String> = validator
        .iter_errors(&manifest)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(manifest["id"], "acp-child");
    assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(manifest["license"], "MIT OR Apache-2.0");
    let registry = format!(
        r#"{{"version": "1.0.0", "agents": [{}]}}"#,
        String::from_utf8(text).unwrap()
    );
    let registry =
        protocol::acp_registry::Registry::parse(registry.as_bytes(), "agent.json").unwrap();
    let ours = registry.find("acp-child").unwrap();
    let Some(protocol::acp_registry::Choice::Binary { target, .. }) =
        ours.choose(Some("linux-x86_64"))
    else {
        panic!("a linux-x86_64 binary");
    };
    assert_eq!(target.cmd, "./acp-child");
    assert!(
        target.archive.ends_with("-x86_64-unknown-linux-gnu.tar.gz"),
        "{}",
        target.archive
    );
}

/// The schema is not a formality: it refuses what the format does not allow.
#[test]
fn the_schema_refuses_a_bad_manifest() {
    let validator = schema();
    let bad = serde_json::json!({
        "id": "Bad_Id", "name": "x", "version": "1.0.0", "description": "d",
        "distribution": {"binary": {"plan9-mips": {"archive": "https://x/a.tar.gz", "cmd": "a"}}},
    });
    assert!(!validator.is_valid(&bad));
}
