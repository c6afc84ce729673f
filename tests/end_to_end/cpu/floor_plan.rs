//! The floor plan holds: inside every crate of the workspace, no two source files import each other, directly or
//! through others — except a module and its own submodules (a folder's `mod.rs` declares its files and re-exports
//! what they define; they use what it holds). A file's imports are the `crate::…` and `super::…` paths of its code
//! (comment lines and an inline `#[cfg(test)] mod tests { … }` left out), a name re-exported by a module (`pub use`)
//! counting as the file that defines it. (Crates cannot form cycles at all: Cargo refuses them.) And between the
//! top-level folders (the binary at the root, `allocator/`, `kernels/`, `gui/`) the crates' dependencies, test
//! ones included, run one way only: the libraries under `allocator/` need nothing of `kernels/` or `gui/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path in the crate (`["caching", "emulate"]`; the root is empty).
type Module = Vec<String>;

/// The `src/` folders of the workspace's crates.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    members
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m).join("src"))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of a file: comment lines and the unit tests dropped.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path that follows `crate::` or `super::` in `code`, groups (`crate::{a::B, c}`) expanded: `(anchor, segments)`.
fn paths(code: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for anchor in ["crate", "super"] {
        let needle = format!("{anchor}::");
        let mut from = 0;
        while let Some(found) = code[from..].find(&needle) {
            let start = from + found;
            from = start + needle.len();
            if code[..start].chars().next_back().is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            for path in expand(&code[from..]) {
                out.push((anchor, path));
            }
        }
    }
    out
}

/// The paths at the head of `rest`: `a::b::C`, or each item of a `{…}` group.
fn expand(rest: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = rest;
    loop {
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(rest[..end].to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(next) => rest = next,
            None => return vec![segments],
        }
    }
    let Some(group) = rest.strip_prefix('{') else { return vec![segments] };
    let mut depth = 0;
    let mut items = Vec::new();
    let mut item = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    items.iter().flat_map(|item| expand(item.trim())).map(|tail| segments.iter().cloned().chain(tail).collect()).collect()
}

/// Names `module` re-exports (`pub use x::{A, B};`, `pub(crate) use …`), with the module that defines them: `code`'s
/// paths resolved from `module` (`crate::`, `super::`, `self::`, or a child of `module`; other crates' left out).
fn reexports(module: &Module, code: &str, modules: &BTreeSet<Module>) -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    for statement in code.split("pub use ").chain(code.split("pub(crate) use ")).skip(1) {
        let statement = statement.split(';').next().unwrap_or_default();
        for path in expand(statement) {
            let (mut base, mut rest) = match path.first().map(String::as_str) {
                Some("crate") => (Vec::new(), &path[1..]),
                Some("self") => (module.clone(), &path[1..]),
                Some("super") => (module[..module.len().saturating_sub(1)].to_vec(), &path[1..]),
                _ => (module.clone(), path.as_slice()),
            };
            while let Some(("super", tail)) = rest.split_first().map(|(head, tail)| (head.as_str(), tail)) {
                base.pop();
                rest = tail;
            }
            let name = path.last().cloned().unwrap_or_default();
            let defined = (0..rest.len()).rev().map(|len| [base.as_slice(), &rest[..len]].concat()).find(|m| modules.contains(m));
            if let Some(defined) = defined.filter(|defined| defined != module) {
                out.insert(name, defined);
            }
        }
    }
    out
}

/// Each module's imports of other modules of the crate (its ancestors, which hold it, left out).
fn imports(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let codes: BTreeMap<Module, String> =
        files.iter().map(|file| (module_of(src, file), code(&std::fs::read_to_string(file).unwrap()))).collect();
    let modules: BTreeSet<Module> = codes.keys().cloned().collect();
    let reexported: BTreeMap<Module, BTreeMap<String, Module>> =
        codes.iter().map(|(module, code)| (module.clone(), reexports(module, code, &modules))).collect();
    let mut graph = BTreeMap::new();
    for (module, code) in &codes {
        let mut targets = BTreeSet::new();
        for (anchor, path) in paths(code) {
            let (mut base, mut rest) = match anchor {
                "crate" => (Vec::new(), path.as_slice()),
                _ => (module[..module.len().saturating_sub(1)].to_vec(), path.as_slice()),
            };
            while let Some(("super", tail)) = rest.split_first().map(|(head, tail)| (head.as_str(), tail)) {
                base.pop();
                rest = tail;
            }
            // The deepest module on the path, then the item after it, where that module re-exports it.
            let mut target = base.clone();
            let mut deepest = modules.contains(&base).then(|| (base.clone(), 0));
            for (depth, segment) in rest.iter().enumerate() {
                target.push(segment.clone());
                if modules.contains(&target) {
                    deepest = Some((target.clone(), depth + 1));
                }
            }
            let deepest = deepest.map(|(found, depth)| {
                let item = rest.get(depth);
                item.and_then(|name| reexported.get(&found).and_then(|names| names.get(name))).cloned().unwrap_or(found)
            });
            if let Some(target) = deepest
                && &target != module
                && !module.starts_with(&target)
            {
                targets.insert(target);
            }
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

/// A cycle of `graph`, if any, as the modules along it.
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        module: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|m| m == module).unwrap_or(0);
                return Some(stack[from..].iter().cloned().chain([module.clone()]).collect());
            }
            None => {}
        }
        marks.insert(module.clone(), Mark::Open);
        stack.push(module.clone());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, graph, marks, stack) {
                return Some(found);
            }
        }
        stack.pop();
        marks.insert(module.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph.keys().find_map(|module| visit(module, graph, &mut marks, &mut Vec::new()))
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut checked = 0;
    for src in crate_sources() {
        let graph = imports(&src);
        checked += graph.len();
        if let Some(found) = cycle(&graph) {
            let names: Vec<String> = found.iter().map(|module| module.join("::")).collect();
            panic!("{}: files import each other: {}", src.display(), names.join(" -> "));
        }
    }
    assert!(checked > 100, "the walk found the workspace's files ({checked})");
}

/// The workspace's members, as `(top-level folder, manifest)`.
fn members() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_sources()
        .into_iter()
        .map(|src| {
            let dir = src.parent().unwrap();
            let relative = dir.strip_prefix(root).unwrap();
            let folder = relative.components().next().map_or(".".to_owned(), |c| c.as_os_str().to_string_lossy().into_owned());
            (folder, std::fs::read_to_string(dir.join("Cargo.toml")).unwrap())
        })
        .collect()
}

/// A manifest's package name and the `heapscope-*` crates it depends on, in any dependency table.
fn package_and_dependencies(manifest: &str) -> (String, BTreeSet<String>) {
    let (mut name, mut dependencies, mut section) = (String::new(), BTreeSet::new(), String::new());
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
        } else if section == "package" && line.starts_with("name") {
            name = line.split('"').nth(1).unwrap_or_default().to_owned();
        } else if section.ends_with("dependencies") && line.starts_with("heapscope-") {
            dependencies.insert(line.split(['.', ' ', '=']).next().unwrap_or_default().to_owned());
        }
    }
    (name, dependencies)
}

/// The folders' graph: an edge from a folder to each other folder one of its crates depends on.
fn folder_graph(members: &[(String, String)]) -> BTreeMap<Module, BTreeSet<Module>> {
    let folder_of: BTreeMap<String, String> =
        members.iter().map(|(folder, manifest)| (package_and_dependencies(manifest).0, folder.clone())).collect();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (folder, manifest) in members {
        let edges = graph.entry(vec![folder.clone()]).or_default();
        for dependency in package_and_dependencies(manifest).1 {
            if let Some(target) = folder_of.get(&dependency).filter(|target| *target != folder) {
                edges.insert(vec![target.clone()]);
            }
        }
    }
    graph
}

#[test]
fn no_two_top_level_folders_depend_on_each_other() {
    let members = members();
    let graph = folder_graph(&members);
    assert!(graph.len() >= 4, "the root, allocator, kernels and gui: {graph:?}");
    if let Some(found) = cycle(&graph) {
        let names: Vec<String> = found.iter().map(|folder| folder.join("/")).collect();
        panic!("folders depend on each other: {}", names.join(" -> "));
    }
    let allocator = &graph[&vec!["allocator".to_owned()]];
    assert!(allocator.is_empty(), "the libraries under allocator/ depend on {allocator:?}");
    // The check itself, on a made-up workspace where a backend's tests use the kernels.
    let looped = [
        (
            "allocator".to_owned(),
            "[package]\nname = \"heapscope-a\"\n[dev-dependencies]\nheapscope-k = { workspace = true }".to_owned(),
        ),
        ("kernels".to_owned(), "[package]\nname = \"heapscope-k\"\n[dependencies]\nheapscope-a.workspace = true".to_owned()),
    ];
    let found = cycle(&folder_graph(&looped)).map(|found| found.concat());
    assert_eq!(found, Some(vec!["allocator".to_owned(), "kernels".to_owned(), "allocator".to_owned()]));
}

#[test]
fn the_import_scanner_sees_groups_supers_and_reexports() {
    let source = "use crate::{a::B, c::{d::E, F}};\nuse super::super::g::H;\n// use crate::commented::Out;\nlet x = crate::Root;";
    let found = paths(&code(source));
    let as_text: Vec<String> = found.iter().map(|(anchor, path)| format!("{anchor}::{}", path.join("::"))).collect();
    assert_eq!(as_text, ["crate::a::B", "crate::c::d::E", "crate::c::F", "crate::Root", "super::super::g::H"]);
    let module = |path: &[&str]| path.iter().map(|part| (*part).to_owned()).collect::<Module>();
    let modules: BTreeSet<Module> =
        [module(&[]), module(&["heap"]), module(&["caching"]), module(&["caching", "backing"])].into();
    let names = reexports(&module(&[]), "pub use heap::{Heap, HeapConfig};\npub use nowhere::X;", &modules);
    assert_eq!(names.get("HeapConfig"), Some(&module(&["heap"])));
    assert!(!names.contains_key("X"));
    let names = reexports(&module(&["caching"]), "pub(crate) use backing::Backing;\npub use crate::heap::Heap;", &modules);
    assert_eq!((names.get("Backing"), names.get("Heap")), (Some(&module(&["caching", "backing"])), Some(&module(&["heap"]))));
    // Only an inline test module is left out: a `mod tests;` declaration and what follows it are code.
    assert_eq!(code("#[cfg(test)]\nmod tests;\nuse crate::a::B;"), "#[cfg(test)]\nmod tests;\nuse crate::a::B;");
    assert_eq!(code("use crate::a::B;\n#[cfg(test)]\nmod tests {\n    use crate::c::D;\n}"), "use crate::a::B;");
    // A cycle through three modules is found; a chain is not.
    let module = |name: &str| vec![name.to_owned()];
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    graph.insert(module("a"), [module("b")].into());
    graph.insert(module("b"), [module("c")].into());
    graph.insert(module("c"), BTreeSet::new());
    assert_eq!(cycle(&graph), None);
    graph.insert(module("c"), [module("a")].into());
    assert_eq!(cycle(&graph).map(|found| found.len()), Some(4));
}
