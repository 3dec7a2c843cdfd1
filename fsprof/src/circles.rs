//! A test that no source file imports, through others, itself: in fsprof and in its eBPF
//! programs, file to file (`layering.rs` holds the layers apart; this holds the files of one
//! layer apart). A circle is broken by putting the shared name where both can import it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// A source file's module path (`aggregate/stacks.rs` → `aggregate::stacks`, a `mod.rs`
/// or `lib.rs`/`main.rs` its folder's).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !["mod", "lib", "main"].contains(&stem) {
        parts.push(stem.into());
    }
    parts.join("::")
}

/// The paths a use tree names after its prefix, to two levels (`{a::{b, c}, d}` → `a::b`,
/// `a::c`, `d`); `text` starts right after `crate::` or `super::`.
fn paths(text: &str) -> Vec<String> {
    fn tree(s: &mut std::iter::Peekable<std::str::Chars>, prefix: &str, out: &mut Vec<String>) {
        let mut name = String::new();
        while let Some(&c) = s.peek() {
            if c.is_alphanumeric() || c == '_' {
                name.push(c);
                s.next();
            } else if c == ':' {
                s.next();
                if s.peek() == Some(&':') {
                    s.next();
                    let deeper = join(prefix, &name);
                    return tree(s, &deeper, out);
                }
            } else if c == '{' {
                s.next();
                loop {
                    tree(s, prefix, out);
                    match s.next() {
                        Some(',') => continue,
                        _ => return,
                    }
                }
            } else if c.is_whitespace() && name.is_empty() {
                s.next();
            } else {
                break;
            }
        }
        if !name.is_empty() {
            out.push(join(prefix, &name));
        }
    }
    fn join(prefix: &str, name: &str) -> String {
        match (prefix.is_empty(), name) {
            (true, _) => name.into(),
            (false, "self") => prefix.into(),
            _ => format!("{prefix}::{name}"),
        }
    }
    let mut out = Vec::new();
    tree(&mut text.chars().peekable(), "", &mut out);
    out
}

/// Module → the modules it imports (the longest module each path names), tests left out.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = vec![src.to_path_buf()];
    let mut sources = BTreeMap::new();
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension() == Some("rs".as_ref()) {
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .to_string();
            sources.insert(module_of(p.strip_prefix(src).unwrap()), code);
        }
    }
    let known: BTreeSet<String> = sources.keys().cloned().collect();
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].join("::"))
            .find(|m| known.contains(m))
    };
    let mut out = BTreeMap::new();
    for (module, code) in &sources {
        // `super` of a file's module is its folder's module.
        let parent = module.rsplit_once("::").map_or("", |p| p.0).to_string();
        let mut to = BTreeSet::new();
        for (prefix, base) in [("crate::", String::new()), ("super::", parent)] {
            for (i, _) in code.match_indices(prefix) {
                for p in paths(&code[i + prefix.len()..]) {
                    let full = if base.is_empty() {
                        p
                    } else {
                        format!("{base}::{p}")
                    };
                    to.extend(resolve(&full).filter(|m| m != module && !m.is_empty()));
                }
            }
        }
        out.insert(module.clone(), to);
    }
    out
}

/// A circle of the graph, if it has one: the modules along it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            return Some(path[at..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, g, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_use_tree_reader_sees_nested_paths() {
    assert_eq!(
        paths("{background,\n    symbols::{self, At}, wakes::{W, x}};"),
        [
            "background",
            "symbols",
            "symbols::At",
            "wakes::W",
            "wakes::x"
        ]
    );
    assert_eq!(paths("report::crash::html(s)"), ["report::crash::html"]);
}

#[test]
fn a_circle_through_super_and_crate_paths_is_found() {
    let dir = std::env::temp_dir().join(format!("fsprof-circles-{}", std::process::id()));
    let files = [
        ("lib.rs", "mod aggregate;\nmod report;"),
        ("aggregate/mod.rs", "pub mod stacks;\npub mod wakes;"),
        (
            "aggregate/stacks.rs",
            "use super::{\n    wakes::{self, TopWake},\n};",
        ),
        ("aggregate/wakes.rs", "pub fn f(a: super::stacks::At) {}"),
        ("report/mod.rs", "use crate::aggregate::wakes::TopWake;"),
    ];
    for (f, text) in files {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let g = graph(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        g["report"],
        BTreeSet::from(["aggregate::wakes".to_string()])
    );
    assert_eq!(
        circle(&g),
        Some(vec!["aggregate::stacks".into(), "aggregate::wakes".into()])
    );
}

#[test]
fn no_source_file_imports_itself_through_others() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [root.join("src"), root.join("../fsprof-ebpf/src")] {
        let g = graph(&src);
        let edges: usize = g.values().map(BTreeSet::len).sum();
        assert!(edges > 20, "{}: only {edges} imports found", src.display());
        assert_eq!(circle(&g), None, "a circle of imports in {}", src.display());
    }
}
