//! The gateway's modules import one another top-down: no module reaches, through its `use`s and
//! paths, back to itself, and the crate root (`lib.rs`) only declares and re-exports.
//!
//! The graph is read from the sources: every `crate::…`, `super::…` and `child::…` path of a
//! module's non-test code is an edge to the deepest module it names. A child module naming its
//! own parent (`super::Answerer` in `server/h1.rs`) is no edge: the parent is the face its private
//! children implement, as in any Rust crate. Siblings, and modules of other folders, form no
//! cycle; what two modules both need lives in a leaf they both import (`throttled.rs`). Test code
//! (`#[cfg(test)]` items and files) is left out, since tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module, as its path inside the crate (`""` is the root, `server::h1` a child).
type Module = String;

struct Source {
    module: Module,
    /// The code without comments, literals and test-only items.
    code: String,
}

#[test]
fn the_gateway_modules_import_one_another_without_a_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 10, "the sources were not found: {graph:?}");
    let into_root: Vec<_> = graph.iter().filter(|(_, to)| to.contains("")).map(|(from, _)| from).collect();
    assert!(
        into_root.is_empty(),
        "lib.rs only declares and re-exports; these modules import from it: {into_root:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the gateway's modules import one another in a cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found_through_every_kind_of_path() {
    let files = [
        ("", "mod a;\nmod b;\npub use a::A;"),
        ("a", "use crate::b::{self, B};\npub struct A;\n#[cfg(test)]\nmod tests { use crate::c::C; }"),
        ("b", "mod c;\npub struct B;\nfn f() { c::g(); } // crate::a::A\n"),
        ("b::c", "pub fn g() { let _ = \"crate::a::A\"; super::super::a::A; super::B; }"),
    ];
    let sources: Vec<_> =
        files.iter().map(|(module, text)| Source { module: (*module).into(), code: strip(text) }).collect();
    let graph = edges(&sources);
    assert_eq!(graph[""], BTreeSet::from(["a".to_owned()]), "{graph:?}");
    assert_eq!(graph["a"], BTreeSet::from(["b".to_owned()]), "{graph:?}");
    assert_eq!(graph["b"], BTreeSet::from(["b::c".to_owned()]), "{graph:?}");
    assert_eq!(graph["b::c"], BTreeSet::from(["a".to_owned()]), "{graph:?}");
    assert_eq!(find_cycle(&graph).expect("a cycle"), ["a", "b", "b::c", "a"]);
    let without = BTreeMap::from([("a".to_owned(), BTreeSet::from(["b".to_owned()]))]);
    assert_eq!(find_cycle(&without), None);
}

/// Every module's edges to the modules it names.
fn module_graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut sources = Vec::new();
    read_module(src, &src.join("lib.rs"), String::new(), &mut sources);
    edges(&sources)
}

/// Reads `file` as `module`, then the child modules it declares outside test code.
fn read_module(src: &Path, file: &Path, module: Module, sources: &mut Vec<Source>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let code = strip(&text);
    let folder = if module.is_empty() { src.to_path_buf() } else { src.join(module.replace("::", "/")) };
    for child in declared_modules(&code) {
        let child_module = if module.is_empty() { child.clone() } else { format!("{module}::{child}") };
        read_module(src, &folder.join(format!("{child}.rs")), child_module, sources);
    }
    sources.push(Source { module, code });
}

/// The names of `mod name;` declarations (inline `mod name { … }` is not a file of its own).
fn declared_modules(code: &str) -> Vec<String> {
    let words = tokens(code);
    words.windows(3).filter(|w| w[0] == "mod" && w[2] == ";").map(|w| w[1].clone()).collect()
}

fn edges(sources: &[Source]) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module.as_str()).collect();
    let mut graph = BTreeMap::new();
    for source in sources {
        let children: BTreeSet<String> = declared_modules(&source.code).into_iter().collect();
        let mut to = BTreeSet::new();
        for path in paths(&tokens(&source.code)) {
            let Some(target) = resolve(&source.module, &path, &children, &modules) else { continue };
            let parent = !target.is_empty() && source.module.starts_with(&format!("{target}::"));
            if target != source.module && !parent {
                to.insert(target);
            }
        }
        graph.insert(source.module.clone(), to);
    }
    graph
}

/// The deepest module `path` (as written in `module`) names, if it names one of the crate's.
fn resolve(
    module: &str,
    path: &[String],
    children: &BTreeSet<String>,
    modules: &BTreeSet<&str>,
) -> Option<Module> {
    let mut at: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                at.pop();
                rest = &rest[1..];
            }
        }
        Some("self") => rest = &rest[1..],
        Some(first) if children.contains(first) => {}
        _ => return None,
    }
    for segment in rest {
        let deeper = if at.is_empty() { segment.clone() } else { format!("{}::{segment}", at.join("::")) };
        if !modules.contains(deeper.as_str()) {
            break;
        }
        at.push(segment);
    }
    Some(at.join("::"))
}

/// Every path of the code that starts at `crate`, `super`, `self` or a bare name followed by `::`,
/// with `{a, b::c}` groups expanded into one path each.
fn paths(words: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let starts = words.get(i + 1).is_some_and(|w| w == "::")
            && is_name(&words[i])
            && (i == 0 || words[i - 1] != "::");
        if starts {
            i = path_at(words, i, Vec::new(), &mut found);
        } else {
            i += 1;
        }
    }
    found
}

/// Reads the path starting at `words[i]` onto `prefix`, pushing each complete path into `found`;
/// returns the index after it.
fn path_at(words: &[String], mut i: usize, mut prefix: Vec<String>, found: &mut Vec<Vec<String>>) -> usize {
    loop {
        match words.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                while i < words.len() && words[i] != "}" {
                    if words[i] == "," {
                        i += 1;
                        continue;
                    }
                    i = path_at(words, i, prefix.clone(), found);
                }
                return i + 1;
            }
            Some(word) if is_name(word) => {
                prefix.push(word.to_owned());
                i += 1;
                if words.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                    continue;
                }
                found.push(prefix);
                return i;
            }
            _ => {
                found.push(prefix);
                return i;
            }
        }
    }
}

fn is_name(word: &str) -> bool {
    word.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && word.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The code's words and punctuation (`::` as one token).
fn tokens(code: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut word = String::from(c);
            while let Some(&next) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(next);
                chars.next();
            }
            words.push(word);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            words.push("::".into());
        } else if !c.is_whitespace() {
            words.push(c.to_string());
        }
    }
    words
}

/// The code without comments, without the contents of string and character literals, and
/// without the items marked `#[cfg(test)]`.
fn strip(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if let Some((lead, hashes)) = raw_string_start(rest).filter(|_| !after_word(text, i)) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = &rest[lead + hashes + 1..];
            i += lead + hashes + 1 + body.find(&close).map_or(body.len(), |end| end + close.len());
            out.push_str("\"\"");
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if bytes[i] == b'\'' && is_char_literal(rest) {
            i += 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    without_test_items(&out)
}

/// Whether `rest` opens a raw string literal (`r"`, `r#"`, `br#"`…); if so, how many bytes come
/// before its opening `"`, and its count of `#`.
fn raw_string_start(rest: &str) -> Option<(usize, usize)> {
    let lead = if rest.starts_with("br") { 2 } else { usize::from(rest.starts_with('r')) };
    let after = &rest[lead..];
    let hashes = after.len() - after.trim_start_matches('#').len();
    (lead > 0 && after[hashes..].starts_with('"')).then_some((lead, hashes))
}

/// Whether the byte at `i` continues a word (so that an `r` there is no raw string's).
fn after_word(text: &str, i: usize) -> bool {
    text[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Whether the `'` at the start of `rest` opens a character literal rather than a lifetime.
fn is_char_literal(rest: &str) -> bool {
    let mut chars = rest.chars().skip(1);
    matches!((chars.next(), chars.next()), (Some('\\'), _) | (Some(_), Some('\'')))
}

/// `code` without each item that follows a `#[cfg(test)]`: up to its `;`, or its `{ … }` block.
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        let mut depth = 0usize;
        let mut end = rest.len();
        for (index, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = index + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = index + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A cycle of `graph`, as the modules along it (the first again at the end), if it has one.
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        module: &'a str,
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<&'a str, Mark>,
        trail: &mut Vec<&'a str>,
    ) -> Option<Vec<Module>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = trail.iter().position(|m| *m == module).expect("an open module is on the trail");
                let mut cycle: Vec<Module> = trail[from..].iter().map(|m| (*m).to_owned()).collect();
                cycle.push(module.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(module, Mark::Open);
        trail.push(module);
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, trail) {
                return Some(cycle);
            }
        }
        trail.pop();
        marks.insert(module, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph.keys().find_map(|module| visit(module, graph, &mut marks, &mut Vec::new()))
}

/// ARCHITECTURE.md's table of the gateway's modules says, for each, the modules it imports: the
/// table and the code must say the same. Each module of the code is counted under the row of its
/// nearest ancestor the table names (`proxy::spend` under `proxy`; `server::h1` has a row of its
/// own); an edge inside one row, and one into a leaf, need no mention.
#[test]
fn the_architecture_table_names_every_import_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("../../ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let (rows, leaves) = architecture_table(&text);
    assert!(rows.len() > 10 && leaves.len() >= 3, "the table was not found: {rows:?} {leaves:?}");
    let row_of = |module: &str| -> Option<String> {
        let mut path = module.replace("::", "/");
        loop {
            if rows.contains_key(&path) {
                return Some(path);
            }
            path = path.rsplit_once('/')?.0.to_owned();
        }
    };
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in module_graph(&root.join("src")) {
        // The crate root only declares and re-exports (the other test holds it to that).
        let Some(from_row) = row_of(&from).filter(|row| !row.is_empty()) else { continue };
        for to in targets {
            let Some(to_row) = row_of(&to) else {
                assert!(leaves.contains(&to), "{from} imports {to}, which the table has no row for");
                continue;
            };
            // A parent naming its own child that has a row (server -> server/h1) is listed too.
            if to_row != from_row {
                seen.entry(from_row.clone()).or_default().insert(to_row);
            }
        }
    }
    let mut wrong = Vec::new();
    for (row, listed) in rows.iter().filter(|(row, _)| !row.is_empty()) {
        let used = seen.get(row).cloned().unwrap_or_default();
        let missing: Vec<_> = used.difference(listed).collect();
        let extra: Vec<_> = listed.difference(&used).collect();
        if !missing.is_empty() || !extra.is_empty() {
            wrong.push(format!("{row}: imports {missing:?} too, and not {extra:?}"));
        }
    }
    assert!(wrong.is_empty(), "ARCHITECTURE.md's module table:\n{}", wrong.join("\n"));
}

/// The rows of ARCHITECTURE.md's module table (module -> the modules it imports besides the
/// leaves), and the leaves. An imports cell starts at column 50 or later; a row's cells may go on
/// over the lines below it.
fn architecture_table(text: &str) -> (BTreeMap<String, BTreeSet<String>>, BTreeSet<String>) {
    let mut lines = text.lines().skip_while(|line| !line.starts_with("module        owns"));
    lines.next();
    let (mut rows, mut leaves) = (BTreeMap::<String, BTreeSet<String>>::new(), BTreeSet::new());
    let mut current = None;
    for line in lines.take_while(|line| !line.starts_with("```")) {
        if let Some(listed) = line.strip_suffix(": the leaves") {
            leaves.extend(listed.split(", ").map(str::to_owned));
            continue;
        }
        let trimmed = line.trim_start();
        if !trimmed.is_empty() && line.len() - trimmed.len() < 4 {
            let name = trimmed.split_whitespace().next().unwrap_or_default();
            let name = if name == "lib.rs" { String::new() } else { name.to_owned() };
            rows.entry(name.clone()).or_default();
            current = Some(name);
        }
        let Some(row) = &current else { continue };
        // The cells are separated by two spaces or more; the imports are the last, from column 50.
        let mut column = 0;
        for cell in line.split("  ") {
            let start = column;
            column += cell.len() + 2;
            let cell = cell.trim();
            if cell.is_empty() || start < 50 || cell == "-" || cell.starts_with('(') {
                continue;
            }
            let imports = rows.entry(row.clone()).or_default();
            imports.extend(cell.split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_owned));
        }
    }
    (rows, leaves)
}
