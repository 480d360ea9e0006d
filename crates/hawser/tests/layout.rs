//! The workspace's layout rules (issues 41 and 62), read from the sources:
//! - the two largest crates, the controller and the agent, keep at most 12 entries at the top
//!   of their `src/`: new code goes into a folder by concern, not beside 50 others;
//! - no file of a crate imports in a circle (a `crate::` or `super::` path from file A to a
//!   file B that reaches A back). A child module's imports of its ancestors are not counted:
//!   that is how one type's `impl` is split by concern (`hawser-core`'s `engine/repair.rs`
//!   is a part of `Engine`, which engine.rs holds and calls), and the module tree says so.
//!   Any other circle fails, whatever a comment says: a circle is a design that grew by
//!   accident, and the next reader cannot change one file of it alone;
//! - no production crate depends on the test harness (`hawser-testkit`, `hawser-e2e`), and
//!   the cluster store (`hawser-store`) depends on no Kubernetes client: the binary's normal
//!   dependencies, followed through every workspace crate's `[dependencies]`, reach neither.
//!
//! Test code (`#[cfg(test)]` modules, `*tests.rs` files) is not counted.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates whose `src/` must stay in folders, and how many entries their top may hold.
const FOLDERED: [&str; 2] = ["hawser-controller", "hawser-agent"];
const MAX_TOP_ENTRIES: usize = 12;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_controller_and_the_agent_keep_at_most_12_entries_at_the_top_of_src() {
    for name in FOLDERED {
        let src = crates_dir().join(name).join("src");
        let mut entries: Vec<String> = fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        assert!(
            entries.len() <= MAX_TOP_ENTRIES,
            "{name}/src has {} entries at its top, more than {MAX_TOP_ENTRIES}: put new files \
             into the folder of their concern (docs/ARCHITECTURE.md lists them): {entries:?}",
            entries.len()
        );
    }
}

#[test]
fn no_file_imports_in_a_circle() {
    let mut found = Vec::new();
    let mut crates: Vec<PathBuf> = fs::read_dir(crates_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    assert!(
        crates.len() >= 10,
        "the workspace's crates are not where this test looks"
    );
    for krate in crates {
        let graph = Graph::of_crate(&krate.join("src"));
        for circle in graph.circles() {
            let name = krate.file_name().unwrap().to_string_lossy().into_owned();
            let lines: Vec<String> = circle
                .iter()
                .flat_map(|m| graph.edges_within(m, &circle))
                .collect();
            found.push(format!(
                "{name}: {}\n    {}",
                circle.join(" <-> "),
                lines.join("\n    ")
            ));
        }
    }
    assert!(
        found.is_empty(),
        "files that import in a circle: break it (move the types both sides use to a file \
         that imports neither), or make the one file a child module of the other if it is a \
         part of the other's impl:\n{}",
        found.join("\n")
    );
}

/// A crate whose integration tests are one binary (`autotests = false`, docs/testing.md)
/// compiles only the files `tests/integration.rs` names: a new file left out would never run.
#[test]
fn every_integration_test_file_is_a_module_of_its_crates_one_test_binary() {
    let mut missing = Vec::new();
    let mut crates = 0;
    for e in fs::read_dir(crates_dir()).unwrap() {
        let krate = e.unwrap().path();
        let manifest = fs::read_to_string(krate.join("Cargo.toml")).unwrap_or_default();
        if !manifest.contains("autotests = false") {
            continue;
        }
        crates += 1;
        let tests = krate.join("tests");
        let root = fs::read_to_string(tests.join("integration.rs")).unwrap();
        let declared: BTreeSet<&str> = root
            .lines()
            .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        for f in fs::read_dir(&tests).unwrap() {
            let path = f.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let is_module =
                path.extension().is_some_and(|x| x == "rs") || path.join("mod.rs").is_file();
            if is_module && stem != "integration" && !declared.contains(stem.as_str()) {
                missing.push(path.display().to_string());
            }
        }
    }
    assert!(
        crates >= 3,
        "the controller, the agent and the store: {crates}"
    );
    assert!(
        missing.is_empty(),
        "test files no `mod` line of their crate's tests/integration.rs names (so never \
         compiled): {missing:?}"
    );
}

/// The end-to-end binaries' `filter` lines in `.config/nextest.toml`'s `e2e` profile, but the
/// last rule's (`package(hawser-e2e)`, which takes every test no earlier rule placed).
fn e2e_placements(config: &str) -> Vec<String> {
    e2e_rules(config)
        .into_iter()
        .flatten()
        .filter(|l| l.starts_with("filter") && !l.contains("package("))
        .map(str::to_string)
        .collect()
}

/// Whether `name` is a whole name in `filter` (so `snapshots` is not found in `snapshot_cut`).
fn names(filter: &str, name: &str) -> bool {
    filter
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|word| word == name)
}

/// Each end-to-end binary is placed by a rule of nextest's `e2e` profile (which tests may run
/// beside it, docs/testing.md). One no rule names still runs, alone and last; this test makes
/// the omission loud instead of a slower `make test`.
#[test]
fn every_end_to_end_binary_is_placed_in_nextest_toml() {
    let config = fs::read_to_string(crates_dir().join("../.config/nextest.toml")).unwrap();
    let filters = e2e_placements(&config);
    assert!(filters.len() >= 5, "e2e rules found: {filters:?}");
    let mut unplaced = Vec::new();
    let mut binaries = 0;
    for f in fs::read_dir(crates_dir().join("hawser-e2e/tests")).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        binaries += 1;
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if !filters.iter().any(|filter| names(filter, &name)) {
            unplaced.push(name);
        }
    }
    assert!(binaries >= 50, "end-to-end binaries found: {binaries}");
    assert!(
        unplaced.is_empty(),
        "end-to-end binaries that no rule of .config/nextest.toml's e2e profile names (they \
         run alone, last): {unplaced:?}; add each to the rule whose comment fits"
    );
}

/// The rules of the `e2e` profile, each as its lines.
fn e2e_rules(config: &str) -> Vec<Vec<&str>> {
    toml_sections(config, "[[profile.e2e.overrides]]")
}

/// The lines (trimmed, without blanks and comments) of each section of `text` whose header
/// is `header`, in order: a table's once, an array of tables' once per element.
fn toml_sections<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
    let mut sections: Vec<Vec<&str>> = Vec::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == header;
            if inside {
                sections.push(Vec::new());
            }
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some(section) = sections.last_mut() {
                section.push(line);
            }
        }
    }
    sections
}

/// nextest takes each setting from the first rule that sets it, and the last rule (every
/// test) sets `priority` and `threads-required`: a rule above it that leaves one out gives
/// its tests the last rule's (the tests that may run beside any other once ran last, among
/// those that must run alone).
#[test]
fn every_e2e_rule_sets_the_priority_and_the_threads_it_takes() {
    let config = fs::read_to_string(crates_dir().join("../.config/nextest.toml")).unwrap();
    let rules = e2e_rules(&config);
    assert!(rules.len() >= 5, "e2e rules found: {rules:?}");
    for rule in &rules {
        for setting in ["priority", "threads-required"] {
            assert!(
                rule.iter().any(|l| l.starts_with(setting)),
                "this rule of .config/nextest.toml's e2e profile does not set {setting}, so \
                 its tests take the last rule's: {rule:?}"
            );
        }
    }
}

#[test]
fn the_placement_check_reads_whole_names_of_the_e2e_rules_only() {
    let config =
        "[[profile.e2e.overrides]]\nfilter = 'binary_id(/^hawser-e2e::(snapshot_cut|qos)$/)'\n\
                  [[profile.e2e.overrides]]\nfilter = 'package(hawser-e2e)'\n\
                  [[profile.ci.overrides]]\nfilter = 'binary_id(hawser-e2e::clones)'\n";
    let filters = e2e_placements(config);
    assert_eq!(filters.len(), 1, "{filters:?}");
    assert!(names(&filters[0], "qos"));
    assert!(names(&filters[0], "snapshot_cut"));
    assert!(!names(&filters[0], "snapshot"), "a part of a name");
    assert!(!names(&filters[0], "clones"), "another profile's rule");
}

/// The test harness crates, which only dev-dependencies (and the e2e crate) may name.
const HARNESS: [&str; 2] = ["hawser-testkit", "hawser-e2e"];

#[test]
fn the_binary_reaches_no_test_harness_and_the_store_no_kubernetes_client() {
    let mut graph = BTreeMap::new();
    for e in fs::read_dir(crates_dir()).unwrap() {
        let krate = e.unwrap().path();
        if let Ok(manifest) = fs::read_to_string(krate.join("Cargo.toml")) {
            let name = krate.file_name().unwrap().to_string_lossy().into_owned();
            graph.insert(name, normal_dependencies(&manifest));
        }
    }
    assert!(
        graph.contains_key("hawser-testkit"),
        "no harness crate where this test looks"
    );
    let from_binary = reachable("hawser", &graph);
    for h in HARNESS {
        assert!(
            !from_binary.contains(h),
            "the hawser binary depends on the test harness {h}: name it under \
             [dev-dependencies] only ({from_binary:?})"
        );
    }
    let from_store = reachable("hawser-store", &graph);
    for k in ["hawser-kube", "reqwest", "kube", "k8s-openapi"] {
        assert!(
            !from_store.contains(k),
            "hawser-store depends on {k}: the Kubernetes client and the store on custom \
             resources live in hawser-kube ({from_store:?})"
        );
    }
}

#[test]
fn the_dependency_walk_counts_normal_dependencies_only() {
    let manifest = "[package]\nname = \"a\"\n\n[dependencies]\nb.workspace = true\n\
                    c = { path = \"../c\" }\n# d = \"1\"\n\n[[test]]\nname = \"x\"\n\n\
                    [dev-dependencies]\nhawser-testkit.workspace = true\n\n\
                    [build-dependencies]\ne = \"1\"\n";
    assert_eq!(normal_dependencies(manifest), ["b", "c"]);
    let graph = BTreeMap::from([
        ("a".to_string(), vec!["b".to_string()]),
        ("b".to_string(), vec!["hawser-testkit".to_string()]),
    ]);
    assert!(reachable("a", &graph).contains("hawser-testkit"));
}

/// The names under a manifest's `[dependencies]` (not dev-, build- or target-specific ones).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    toml_sections(manifest, "[dependencies]")
        .into_iter()
        .flatten()
        .map(|line| {
            line.split(['=', '.', ' '])
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Every crate reachable from `from` through `graph` (crates outside it are leaves).
fn reachable(from: &str, graph: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(c) = todo.pop() {
        for d in graph.get(&c).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_circle_check_finds_a_circle_even_a_commented_one_and_not_a_child_using_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    fs::write(src.join("a/mod.rs"), "pub mod c;\nuse crate::b::B;\n").unwrap();
    fs::write(src.join("a/c.rs"), "use super::super::b;\n").unwrap();
    fs::write(
        src.join("b.rs"),
        "#[cfg(test)]\nfn helper() {}\nuse crate::{x, a::c::C};\n#[cfg(test)]\nmod tests { use crate::a::A; }\n",
    )
    .unwrap();
    let circles = Graph::of_crate(src).circles();
    assert_eq!(circles, vec![vec!["a::c".to_string(), "b".to_string()]]);

    // A comment excuses nothing.
    fs::write(
        src.join("a/c.rs"),
        "// A circle by design: b is the other half.\nuse super::super::b;\n",
    )
    .unwrap();
    assert_eq!(Graph::of_crate(src).circles().len(), 1);
    // Code past the `use` lines counts too.
    fs::write(
        src.join("a/c.rs"),
        "use std::fmt;\n\nfn f() { super::super::b::g() }\n",
    )
    .unwrap();
    assert_eq!(Graph::of_crate(src).circles().len(), 1);

    // A child module that uses its parent (a part of the parent's impl) is no circle: `b`
    // names `a::c`, and `a::c` names only `a`, its parent.
    fs::write(src.join("a/c.rs"), "use crate::a::A;\nimpl A {}\n").unwrap();
    assert!(Graph::of_crate(src).circles().is_empty());
}

/// The imports between the files of one crate: module path -> (module path -> the first line
/// that imports it).
struct Graph {
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    fn of_crate(src: &Path) -> Graph {
        let mut files = Vec::new();
        collect_rs(src, &mut files);
        let modules: BTreeMap<String, PathBuf> =
            files.into_iter().map(|f| (module_of(src, &f), f)).collect();
        let mut edges = BTreeMap::new();
        for (module, file) in &modules {
            let text = fs::read_to_string(file).unwrap();
            edges.insert(module.clone(), imports(module, &text, &modules));
        }
        Graph { edges }
    }

    /// Every set of two or more files that reach each other (Tarjan's strongly connected
    /// components), each sorted.
    fn circles(&self) -> Vec<Vec<String>> {
        let mut t = Tarjan::default();
        for m in self.edges.keys() {
            if !t.index.contains_key(m) {
                t.visit(m, self);
            }
        }
        let mut out: Vec<Vec<String>> = t.found.into_iter().filter(|c| c.len() > 1).collect();
        for c in &mut out {
            c.sort();
        }
        out.sort();
        out
    }

    fn edges_within(&self, from: &str, circle: &[String]) -> Vec<String> {
        self.edges[from]
            .iter()
            .filter(|(to, _)| circle.contains(to))
            .map(|(to, line)| format!("{from} -> {to}: {line}"))
            .collect()
    }
}

#[derive(Default)]
struct Tarjan {
    next: usize,
    index: BTreeMap<String, usize>,
    low: BTreeMap<String, usize>,
    stack: Vec<String>,
    on_stack: BTreeSet<String>,
    found: Vec<Vec<String>>,
}

impl Tarjan {
    fn visit(&mut self, v: &str, g: &Graph) {
        self.index.insert(v.to_string(), self.next);
        self.low.insert(v.to_string(), self.next);
        self.next += 1;
        self.stack.push(v.to_string());
        self.on_stack.insert(v.to_string());
        for w in g.edges[v].keys() {
            if !self.index.contains_key(w) {
                self.visit(w, g);
                let low = self.low[v].min(self.low[w]);
                self.low.insert(v.to_string(), low);
            } else if self.on_stack.contains(w) {
                let low = self.low[v].min(self.index[w]);
                self.low.insert(v.to_string(), low);
            }
        }
        if self.low[v] == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack.remove(&w);
                let done = w == v;
                component.push(w);
                if done {
                    break;
                }
            }
            self.found.push(component);
        }
    }
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && !p.file_stem().unwrap().to_string_lossy().ends_with("tests")
        {
            out.push(p);
        }
    }
}

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs`, `main.rs` and `a/mod.rs` name their folder.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The files `module` imports, each with the first line that does, leaving out its own
/// ancestors (see the file's doc) and test modules.
fn imports(
    module: &str,
    text: &str,
    modules: &BTreeMap<String, PathBuf>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut in_test = false;
    let mut after_cfg_test = false;
    // A `use crate::{` group that rustfmt spread over lines is read as one line.
    let mut group = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if !group.is_empty() || line.contains("crate::{") && !line.contains('}') {
            group.push_str(line.split("//").next().unwrap_or(""));
            group.push(' ');
            if !line.contains('}') {
                continue;
            }
        }
        let joined = std::mem::take(&mut group);
        let line = if joined.is_empty() {
            line
        } else {
            joined.trim()
        };
        // A `#[cfg(test)] mod tests` runs to the end of its file, by this codebase's habit,
        // and may import what the product does not: it is left out. Any other `#[cfg(test)]`
        // item is read as product code, so that it cannot hide the code after it.
        if line.starts_with("#[cfg(test)]") {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test && line.starts_with("#[") {
            continue;
        }
        if after_cfg_test {
            after_cfg_test = false;
            in_test |= line.starts_with("mod ") || line.starts_with("pub mod ");
        }
        if in_test {
            continue;
        }
        if line.starts_with("//") {
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        for path in paths_in(code, module) {
            if let Some(target) = longest_module(&path, modules) {
                if target != module && !module.starts_with(&format!("{target}::")) {
                    out.entry(target).or_insert_with(|| line.to_string());
                }
            }
        }
    }
    out
}

/// The module paths a line names from the crate's root: `crate::a::b`, `super::b` (relative
/// to `module`), and each name of a `crate::{a, b::c}` group.
fn paths_in(code: &str, module: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let parent: Vec<String> = {
        let mut p: Vec<String> = module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        p.pop();
        p
    };
    let mut rest = code;
    while let Some(at) = find_root(rest) {
        let (prefix, after) = if rest[at..].starts_with("crate::") {
            (Vec::new(), &rest[at + "crate::".len()..])
        } else {
            let mut base = parent.clone();
            let mut after = &rest[at..];
            while let Some(a) = after.strip_prefix("super::") {
                after = a;
                base.pop();
            }
            (base, after)
        };
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let mut p = prefix.clone();
                p.extend(ident_path(item.trim()));
                out.push(p);
            }
            rest = &group[end..];
        } else {
            let mut p = prefix.clone();
            let names = ident_path(after);
            let used: usize = names.iter().map(|n| n.len() + 2).sum();
            p.extend(names);
            out.push(p);
            rest = &after[used.min(after.len())..];
        }
    }
    out
}

/// Where the next `crate::` or `super::` starts, if it is a path (not part of a longer name).
fn find_root(s: &str) -> Option<usize> {
    let mut from = 0;
    while from < s.len() {
        let hit = ["crate::", "super::"]
            .iter()
            .filter_map(|k| s[from..].find(k).map(|i| from + i))
            .min()?;
        let before = s[..hit].chars().next_back();
        if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '$')) {
            return Some(hit);
        }
        from = hit + 1;
    }
    None
}

/// The leading `a::b::c` of `s`, as names.
fn ident_path(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = s;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        names.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    names
}

fn longest_module(path: &[String], modules: &BTreeMap<String, PathBuf>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("::"))
        .find(|m| modules.contains_key(m))
}
