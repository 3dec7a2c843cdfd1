//! The JSON formats are generated as JSON Schema (docs/schema/*.json) from the types that
//! write them, and docs/json.md must name every field of them: these tests fail when a
//! field is added, renamed or removed without the docs (or the published schema) following.
//! `FSPROF_BLESS=1 cargo test -p fsprof --lib json_docs` rewrites the schema files.

use std::{collections::BTreeSet, path::PathBuf};

use serde_json::Value;

use crate::{
    analysis::compare::Comparison,
    results::{RunResult, crash::CrashStudy},
    trace::TraceResult,
};

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// Field names reachable from `node`, following `$ref`s except into `stop` definitions.
fn fields(
    schema: &Value,
    node: &Value,
    stop: &[&str],
    seen: &mut BTreeSet<String>,
    out: &mut BTreeSet<String>,
) {
    if let Some(r) = node.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        if stop.contains(&name) || !seen.insert(name.to_string()) {
            return;
        }
        if let Some(def) = schema["$defs"].get(name) {
            fields(schema, def, stop, seen, out);
        }
        return;
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            out.insert(k.clone());
            fields(schema, v, stop, seen, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = node.get(key) {
            fields(schema, v, stop, seen, out);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        for v in node
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            fields(schema, v, stop, seen, out);
        }
    }
}

/// Identifiers inside the `code spans` of the docs section that starts with `heading`.
fn documented(heading: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_file("docs/json.md")).unwrap();
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in docs/json.md"));
    let rest = &text[start + heading.len()..];
    let section = &rest[..rest.find("\n# ").unwrap_or(rest.len())];
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

/// Checks one format: its published schema is current and the docs name every field.
fn check(schema: schemars::Schema, file: &str, heading: &str, stop: &[&str]) {
    let schema = schema.to_value();
    let path = repo_file(file);
    let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    if std::env::var_os("FSPROF_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap_or_default(),
        text,
        "{file} is stale: FSPROF_BLESS=1 cargo test -p fsprof --lib json_docs"
    );
    let mut names = BTreeSet::new();
    fields(&schema, &schema, stop, &mut BTreeSet::new(), &mut names);
    let docs = documented(heading);
    let missing: Vec<&String> = names.iter().filter(|n| !docs.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "fields docs/json.md ({heading}) does not name: {missing:?}"
    );
    assert!(names.len() > 5, "only {names:?}");
}

#[test]
fn trace_json_is_documented() {
    check(
        schemars::schema_for!(TraceResult),
        "docs/schema/trace.json",
        "# `fsprof trace --json`",
        &[],
    );
}

#[test]
fn run_json_is_documented() {
    // Each cell's trace is the trace format, documented (and checked) above.
    check(
        schemars::schema_for!(RunResult),
        "docs/schema/run.json",
        "# `fsprof run --json`",
        &["TraceResult"],
    );
}

#[test]
fn compare_json_is_documented() {
    check(
        schemars::schema_for!(Comparison),
        "docs/schema/compare.json",
        "# `fsprof compare --json`",
        &[],
    );
}

#[test]
fn crash_json_is_documented() {
    check(
        schemars::schema_for!(CrashStudy),
        "docs/schema/crash.json",
        "# `fsprof crash --json`",
        &["TraceResult", "VmFacts"],
    );
}

#[test]
fn a_field_the_docs_miss_is_caught() {
    let schema = serde_json::json!({
        "properties": {"a": {"$ref": "#/$defs/B"}},
        "$defs": {"B": {"properties": {"undocumented_field": {"type": "integer"}}}}
    });
    let mut names = BTreeSet::new();
    fields(&schema, &schema, &[], &mut BTreeSet::new(), &mut names);
    assert_eq!(
        names,
        BTreeSet::from(["a".into(), "undocumented_field".into()])
    );
    assert!(!documented("# `fsprof trace --json`").contains("undocumented_field"));
}
