//! The layers of `docs/architecture.md` ("Layers"), checked from the source: every reference a
//! module of `src/` makes to another (its `use` lines and the `crate::`, `super::` and `self::`
//! paths in its code) points to a module of the same layer or one below, and no two files
//! import each other, directly or through others. Test code (`#[cfg(test)]` items and the
//! `tests` modules) and comments are left out; a name re-exported by a parent module counts as
//! a reference to the module that defines it.
//!
//! No exception list: a change that breaks a rule fails here with the references that do.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path (`["sync", "reconciler"]`; empty for the crate root).
type ModPath = Vec<String>;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every source file of the library with its module path, test modules left out.
fn modules() -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = repo().join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
            if rel == "main.rs" {
                return None;
            }
            let mut segs: ModPath = rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
            if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
                segs.pop();
            }
            (!segs.iter().any(|s| s == "tests")).then_some((segs, path))
        })
        .collect()
}

/// The source with comments, string and char literals blanked, and `#[cfg(test)]` items cut.
fn code(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let start = 2 + hashes;
            let end = rest[start..].find(&close).map_or(rest.len(), |e| start + e + close.len());
            out.push_str("\"\"");
            i += end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if bytes[i] == b'\'' && (rest[1..].starts_with('\\') || rest.get(2..3) == Some("'")) {
            // A char literal ('x' or '\n'); a lifetime has no closing quote here.
            let end = rest[2..].find('\'').map_or(rest.len(), |e| e + 3);
            out.push_str("' '");
            i += end;
        } else {
            let c = rest.chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    cut_test_items(&out)
}

/// Removes each item that follows a `#[cfg(test)]` attribute (up to its `;` or its block).
fn cut_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let semi = after.find(';');
        let brace = after.find('{');
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (Some(s), None) => s + 1,
            (_, Some(b)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The paths a `use` tree names (`a::{b, c::d}` gives `a::b` and `a::c::d`; `self` in a group
/// names the group's prefix).
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn parse(tokens: &[String], pos: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        while let Some(t) = tokens.get(*pos).map(String::as_str) {
            *pos += 1;
            match t {
                "{" => {
                    while let Some(next) = tokens.get(*pos).map(String::as_str) {
                        match next {
                            "}" => {
                                *pos += 1;
                                break;
                            }
                            "," => *pos += 1,
                            _ => parse(tokens, pos, &path, out),
                        }
                    }
                    return;
                }
                "*" => break,
                "self" if !path.is_empty() => break,
                _ => {
                    path.push(t.to_owned());
                    match tokens.get(*pos).map(String::as_str) {
                        Some("::") => *pos += 1,
                        Some("as") => {
                            *pos += 2;
                            break;
                        }
                        _ => break,
                    }
                }
            }
        }
        out.push(path);
    }
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut chars = tree.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                tokens.push("::".into());
            }
            '{' | '}' | ',' | '*' => tokens.push(c.to_string()),
            _ => {}
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    let mut out = Vec::new();
    let mut pos = 0;
    parse(&tokens, &mut pos, &[], &mut out);
    out
}

/// The `use` statements of `code`: (is `pub`, each path it names).
fn use_statements(code: &str) -> Vec<(bool, Vec<Vec<String>>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let before = rest[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let after = &rest[at + 3..];
        let end = after.find(';').unwrap_or(after.len());
        out.push((public, expand_use(&after[..end])));
        rest = &after[end..];
    }
    out
}

/// The byte offset of `word` as a whole word in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(word).map(|a| a + from) {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if boundary(before) && boundary(after) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The `crate::`/`super::`/`self::` paths written in code outside `use` lines.
fn inline_paths(code: &str, children: &[String]) -> Vec<Vec<String>> {
    let mut without_uses = String::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        without_uses.push_str(&rest[..at]);
        let after = &rest[at..];
        rest = &after[after.find(';').map_or(after.len(), |e| e + 1)..];
    }
    without_uses.push_str(rest);
    let mut out = Vec::new();
    let roots = ["crate", "super", "self"].into_iter().chain(children.iter().map(String::as_str));
    for root in roots {
        let mut from = 0;
        let text = without_uses.as_str();
        while let Some(at) = find_word(&text[from..], root).map(|a| a + from) {
            from = at + root.len();
            let tail = &text[at..];
            let mut path: Vec<String> = Vec::new();
            for seg in tail.split("::") {
                let ident: String = seg.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let whole = ident.len() == seg.len();
                if !ident.is_empty() {
                    path.push(ident);
                }
                if !whole {
                    break;
                }
            }
            let qualified = at == 0 || !text[..at].ends_with("::");
            if path.len() > 1 && tail.starts_with(&format!("{root}::")) && qualified {
                out.push(path);
            }
        }
    }
    out
}

/// A file's module path made absolute: `crate::`, `super::` and `self::` resolved.
fn absolute(path: &[String], module: &[String], is_child: impl Fn(&str) -> bool) -> Option<ModPath> {
    let mut base: ModPath = module.to_vec();
    let mut segs = path.iter().peekable();
    match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            base.clear();
        }
        Some("self") => {
            segs.next();
        }
        Some("super") => {
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                base.pop();
            }
        }
        // A child module (`use child::Name`); else an extern crate or a name in scope.
        Some(first) if is_child(first) => {}
        _ => return None,
    }
    base.extend(segs.cloned());
    Some(base)
}

struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
    /// Per module: the names its `pub use` lines re-export, with the absolute path they name.
    reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    /// Per module: the absolute paths its code refers to.
    refs: BTreeMap<ModPath, Vec<ModPath>>,
}

impl Crate {
    fn read() -> Self {
        let files = modules();
        let mut reexports = BTreeMap::new();
        let mut refs = BTreeMap::new();
        for (module, path) in &files {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let code = code(&text);
            let is_child = |seg: &str| {
                let mut child = module.clone();
                child.push(seg.to_owned());
                files.contains_key(&child)
            };
            let mut names = BTreeMap::new();
            let mut paths = Vec::new();
            for (public, used) in use_statements(&code) {
                for p in used {
                    let Some(abs) = absolute(&p, module, is_child) else { continue };
                    if public && abs.len() > module.len() && abs.starts_with(module) {
                        // A re-export of a child's name: not a dependency of this module.
                        names.insert(abs.last().cloned().unwrap_or_default(), abs);
                    } else {
                        paths.push(abs);
                    }
                }
            }
            let children: Vec<String> = files
                .keys()
                .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
                .filter_map(|m| m.last().cloned())
                .collect();
            paths.extend(inline_paths(&code, &children).iter().filter_map(|p| absolute(p, module, is_child)));
            reexports.insert(module.clone(), names);
            refs.insert(module.clone(), paths);
        }
        Self { files, reexports, refs }
    }

    /// The module that defines what `path` names: its longest module prefix, followed through
    /// re-exports.
    fn resolve(&self, path: &[String]) -> ModPath {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let prefix = (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| self.files.contains_key(p));
            let Some(prefix) = prefix else { return Vec::new() };
            let Some(name) = path.get(prefix.len()) else { return prefix };
            match self.reexports.get(&prefix).and_then(|r| r.get(name)) {
                Some(target) => {
                    let mut next = target.clone();
                    next.extend(path[prefix.len() + 1..].iter().cloned());
                    path = next;
                }
                None => return prefix,
            }
        }
        path
    }

    /// Module to module references (the crate root left out), each with the paths that make it.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), BTreeSet<String>> {
        let mut out: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
        for (from, paths) in &self.refs {
            for p in paths {
                let to = self.resolve(p);
                if to.is_empty() || to == *from {
                    continue;
                }
                out.entry((from.clone(), to)).or_default().insert(p.join("::"));
            }
        }
        out
    }
}

/// The layer table of docs/architecture.md: module path to layer number.
fn layers() -> Vec<(ModPath, u32)> {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).expect("docs/architecture.md");
    let section = doc.split("\n## Layers\n").nth(1).expect("docs/architecture.md has a \"## Layers\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut out = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|c| c.parse::<u32>().ok()) else { continue };
        let modules = cells.get(2).copied().unwrap_or_default();
        for name in modules.split('`').skip(1).step_by(2) {
            out.push((name.split("::").map(str::to_owned).collect(), layer));
        }
    }
    assert!(!out.is_empty(), "the Layers table of docs/architecture.md names no module");
    out
}

/// The layer of `module`: the most specific entry of the table that contains it.
fn layer_of(table: &[(ModPath, u32)], module: &[String]) -> Option<u32> {
    table.iter().filter(|(p, _)| module.starts_with(p)).max_by_key(|(p, _)| p.len()).map(|(_, l)| *l)
}

fn name(m: &[String]) -> String {
    if m.is_empty() { "crate".into() } else { m.join("::") }
}

#[test]
fn every_module_has_a_layer() {
    let table = layers();
    let missing: Vec<String> =
        modules().keys().filter(|m| !m.is_empty() && layer_of(&table, m).is_none()).map(|m| name(m)).collect();
    assert!(missing.is_empty(), "modules not in the Layers table of docs/architecture.md: {missing:?}");
}

#[test]
fn no_module_refers_to_a_layer_above_it() {
    let table = layers();
    let krate = Crate::read();
    let mut wrong = Vec::new();
    for ((from, to), via) in krate.edges() {
        let (Some(lf), Some(lt)) = (layer_of(&table, &from), layer_of(&table, &to)) else { continue };
        if lt > lf {
            wrong.push(format!("{} (layer {lf}) -> {} (layer {lt}): {}", name(&from), name(&to), join(&via)));
        }
    }
    assert!(wrong.is_empty(), "references to a higher layer:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_modules_refer_to_each_other_directly_or_through_others() {
    let krate = Crate::read();
    let edges = krate.edges();
    let mut graph: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().insert(to);
    }
    let circles = strongly_connected(&graph);
    let text: Vec<String> = circles
        .iter()
        .map(|c| {
            let members: BTreeSet<&ModPath> = c.iter().copied().collect();
            let ties: Vec<String> = edges
                .iter()
                .filter(|((f, t), _)| members.contains(f) && members.contains(t))
                .map(|((f, t), via)| format!("  {} -> {}: {}", name(f), name(t), join(via)))
                .collect();
            format!("circle of {}:\n{}", c.iter().map(|m| name(m)).collect::<Vec<_>>().join(", "), ties.join("\n"))
        })
        .collect();
    assert!(circles.is_empty(), "import circles:\n{}", text.join("\n"));
}

/// The checker itself: re-exports resolve to the defining module, test code and comments
/// are not references, and a circle is found.
#[test]
fn the_checker_reads_uses_reexports_and_circles() {
    let uses = use_statements(&code("use crate::{a::{self, B}, c::d::E as F};\npub use x::Y;"));
    assert_eq!(uses[0].1, [vec!["crate", "a"], vec!["crate", "a", "B"], vec!["crate", "c", "d", "E"]]);
    assert!(uses[1].0, "pub use");
    let cut =
        code("// crate::a::x\nfn f() { crate::b::g(); \"crate::c\"; }\n#[cfg(test)]\nmod tests { use crate::d::h; }\n");
    let paths = inline_paths(&cut, &[]);
    assert_eq!(paths, [vec!["crate", "b", "g"]], "{cut}");
    assert!(!cut.contains("crate::d"));
    let a = vec!["a".to_owned()];
    let b = vec!["b".to_owned()];
    let c = vec!["c".to_owned()];
    let graph: BTreeMap<&ModPath, BTreeSet<&ModPath>> =
        [(&a, [&b].into()), (&b, [&c].into()), (&c, [&a].into())].into_iter().collect();
    assert_eq!(strongly_connected(&graph).len(), 1);
}

fn join(via: &BTreeSet<String>) -> String {
    via.iter().take(6).cloned().collect::<Vec<_>>().join(", ")
}

/// The strongly connected components with more than one member (Tarjan).
fn strongly_connected<'a>(graph: &BTreeMap<&'a ModPath, BTreeSet<&'a ModPath>>) -> Vec<Vec<&'a ModPath>> {
    struct State<'a> {
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<&'a ModPath>>,
    }
    fn visit<'a>(v: &'a ModPath, graph: &BTreeMap<&'a ModPath, BTreeSet<&'a ModPath>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}
