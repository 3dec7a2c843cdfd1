//! The crate's layers, lowest first, and a test that no module imports one above it: the
//! pipeline lab → workload → probes → aggregate → trace → results → analysis → report stays
//! readable only if nothing runs back up.

/// Lowest first; modules on one line are peers and may not import each other either.
const LAYERS: &[&[&str]] = &[
    &["os", "signals", "units", "syscall_table"],
    &["lab"],
    &["vm"],
    &["workload"],
    &["suite"],
    &["probes"],
    &["aggregate"],
    &["target"],
    &["trace"],
    &["results"],
    &["analysis"],
    &["report"],
    &["history"],
    &["check"],
    &["run"],
    &["cli"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Top-level modules a source text names through `crate::` (in paths and `use` trees),
/// leaving out its tests.
fn imports(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(tree) = rest.strip_prefix('{') {
            // Names at the first level of `crate::{a::…, b, c::{…}}`.
            let mut depth = 0;
            let mut name = String::new();
            let mut expect_name = true;
            for c in tree.chars() {
                let ends_name = !(c.is_alphanumeric() || c == '_');
                if ends_name && !name.is_empty() {
                    out.push(std::mem::take(&mut name));
                    expect_name = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => expect_name = true,
                    c if depth == 0 && expect_name && !ends_name => name.push(c),
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

#[test]
fn the_import_parser_sees_paths_and_use_trees() {
    let src = "use crate::{\n    lab::{self, FsKind},\n    os,\n    probes::X,\n};\nfn f() { crate::trace::run(); }\n#[cfg(test)]\nuse crate::report;";
    assert_eq!(imports(src), ["lab", "os", "probes", "trace"]);
}

#[test]
fn no_module_imports_a_layer_above_its_own() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    let mut wrong = Vec::new();
    let mut files = vec![src.clone()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = p.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let module = top.trim_end_matches(".rs");
        if [
            "main",
            "lib",
            "layering",
            "circles",
            "json_docs",
            "test_support",
        ]
        .contains(&module)
            || p.extension() != Some("rs".as_ref())
        {
            continue;
        }
        let own = layer(module).unwrap_or_else(|| panic!("{module} is in no layer"));
        for m in imports(&std::fs::read_to_string(&p).unwrap()) {
            let theirs = layer(&m).unwrap_or_else(|| panic!("{m} is in no layer"));
            if m != module && theirs >= own {
                wrong.push(format!("{} imports {m}", rel.display()));
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} imports found");
    assert!(wrong.is_empty(), "imports against the layers: {wrong:#?}");
}
