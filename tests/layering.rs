//! The crate's module layering, checked from the source text.
//!
//! Every `.rs` file under `src/` is read (from `src/lib.rs` down its `mod`
//! declarations), and every path that names one of the crate's modules is
//! taken from `use` items and from code: `crate::a::b`, `super::` and
//! `self::` resolved against the module the path is written in, and paths
//! that start with a child module's name. That gives the dependency graph
//! between the top-level modules, which must have no cycle and must follow
//! the layers listed in the crate docs (a module uses only modules of the
//! layers before its own); the graph between the files of each module
//! folder, which must have no cycle either; and, in each folder, the graph
//! between its parts, a part being a child module with every module under
//! it, which must have no cycle: two folders whose files use each other
//! in a circle are one tangle even where no two files close it.
//!
//! A textual reading, not the compiler's: a name brought in by `use` and
//! used bare is seen at its `use`, which is where every module edge starts
//! anyway; comments and string literals are skipped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// Uses the layering allows, as (file, top-level module it uses): none.
/// An entry is a debt, named here with its reason until it is paid.
const ALLOWED_UPWARD: &[(&str, &str)] = &[];

/// Module folders whose cycles are only reported, not failed, by their
/// module path ("worker", "worker::event_loop"): none.
const REPORT_ONLY_FOLDERS: &[&str] = &[];

type ModPath = Vec<String>;

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

// ---------------------------------------------------------------------------
// Reading Rust source: just enough of a lexer to find paths, braces and
// `mod` / `use` items outside comments and literals.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where the raw string literal starting at `i` ends (`r"…"`, `r#"…"#`,
/// with an optional `b` or `c` prefix), or None when there is none there.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(c.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let lines_in = |from: usize, to: usize| {
        c[from..to.min(c.len())]
            .iter()
            .filter(|&&x| x == '\n')
            .count()
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += lines_in(start, i);
        } else if let Some(end) = raw_string_end(&c, i) {
            line += lines_in(i, end);
            i = end;
        } else if ch == '"' || (matches!(ch, 'b' | 'c') && next == Some('"')) {
            let start = i;
            i += if ch == '"' { 1 } else { 2 };
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            line += lines_in(start, i);
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            let q = if ch == '\'' { i } else { i + 1 };
            if c.get(q + 1) == Some(&'\\') {
                // An escaped char: '\n', '\'', '\u{1F600}'.
                i = q + 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(q + 2) == Some(&'\'') {
                i = q + 3;
            } else {
                // A lifetime or a label.
                i = q + 1;
                while i < c.len() && is_ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if is_ident_start(ch) {
            if ch == 'r' && next == Some('#') && c.get(i + 2).is_some_and(|&x| is_ident_start(x)) {
                i += 2;
            }
            let start = i;
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(c[start..i].iter().collect()),
                line,
            });
        } else if ch.is_ascii_digit() {
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token {
                tok: Tok::Colons,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

/// A path as written, with the module it is written in (the file's module
/// and any inline `mod` blocks around it).
#[derive(Debug, Clone)]
struct Written {
    segments: Vec<String>,
    lexical: ModPath,
    line: usize,
}

/// What one file declares and uses.
#[derive(Debug, Default)]
struct Scan {
    /// `mod name;` at the file's top level.
    children: Vec<String>,
    paths: Vec<Written>,
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t.map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&Token>, want: &Tok) -> bool {
    t.is_some_and(|t| &t.tok == want)
}

/// One `use` tree from `*i` (after `use`, or inside its braces), each leaf
/// expanded to its full path; `*i` ends on the token after the tree.
fn use_tree(toks: &[Token], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, usize)>) {
    let mut path = prefix.to_vec();
    let line = toks.get(*i).map_or(0, |t| t.line);
    if prefix.is_empty() && is(toks.get(*i), &Tok::Colons) {
        // `::name`: always another crate.
        path.push("::".to_string());
        *i += 1;
    }
    loop {
        match toks.get(*i).map(|t| &t.tok) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
                if is(toks.get(*i), &Tok::Colons) {
                    *i += 1;
                    continue;
                }
                break;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                while *i < toks.len() && !is(toks.get(*i), &Tok::Punct('}')) {
                    use_tree(toks, i, &path, out);
                    // Past the comma (or a token this reading does not
                    // expect, so the loop always moves on).
                    if !is(toks.get(*i), &Tok::Punct('}')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                break;
            }
            _ => break,
        }
    }
    if ident(toks.get(*i)) == Some("as") {
        *i += 2;
    }
    out.push((path, line));
}

fn scan(text: &str, module: &ModPath) -> Scan {
    let toks = tokens(text);
    let mut found = Scan::default();
    let mut depth = 0usize;
    // Inline `mod name { … }` blocks: (name, the depth inside its braces).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let lexical = |inline: &[(String, usize)]| {
        let mut m = module.clone();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
                i += 1;
            }
            Tok::Ident(kw) if kw == "mod" => {
                let Some(name) = ident(toks.get(i + 1)) else {
                    i += 1;
                    continue;
                };
                if is(toks.get(i + 2), &Tok::Punct('{')) {
                    depth += 1;
                    inline.push((name.to_string(), depth));
                    i += 3;
                } else {
                    if inline.is_empty() && is(toks.get(i + 2), &Tok::Punct(';')) {
                        found.children.push(name.to_string());
                    }
                    i += 2;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                i += 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut i, &[], &mut leaves);
                let lexical = lexical(&inline);
                found
                    .paths
                    .extend(leaves.into_iter().map(|(segments, line)| Written {
                        segments,
                        lexical: lexical.clone(),
                        line,
                    }));
            }
            Tok::Ident(first)
                if is(toks.get(i + 1), &Tok::Colons)
                    && ident(toks.get(i + 2)).is_some()
                    && !(i > 0 && is(toks.get(i - 1), &Tok::Colons)) =>
            {
                let line = toks[i].line;
                let mut segments = vec![first.clone()];
                i += 1;
                while is(toks.get(i), &Tok::Colons) {
                    match ident(toks.get(i + 1)) {
                        Some(s) => {
                            segments.push(s.to_string());
                            i += 2;
                        }
                        None => break,
                    }
                }
                found.paths.push(Written {
                    segments,
                    lexical: lexical(&inline),
                    line,
                });
            }
            _ => i += 1,
        }
    }
    found
}

// ---------------------------------------------------------------------------
// The crate: its module tree from the `mod` declarations, and every use of
// one of its modules.

/// One use of a module: where it is written and what it names.
#[derive(Debug, Clone)]
struct Use {
    file: String,
    line: usize,
    from: ModPath,
    to: ModPath,
    written: String,
}

impl Use {
    fn evidence(&self) -> String {
        format!("{}:{} {}", self.file, self.line, self.written)
    }
}

struct Crate {
    /// Each module that is a file, with that file.
    files: BTreeMap<ModPath, String>,
    uses: Vec<Use>,
}

/// Read the crate from `src/lib.rs` down; `read` returns a file's text by
/// its path relative to the package root ("src/worker/mod.rs").
fn load(read: &dyn Fn(&str) -> Option<String>) -> Result<Crate, String> {
    let mut files = BTreeMap::new();
    let mut scans = Vec::new();
    // (module, its file, the folder its children's files are in)
    let mut queue: VecDeque<(ModPath, String, String)> =
        VecDeque::from([(Vec::new(), "src/lib.rs".to_string(), "src".to_string())]);
    while let Some((module, file, folder)) = queue.pop_front() {
        let text = read(&file).ok_or_else(|| format!("cannot read {file}"))?;
        let found = scan(&text, &module);
        for child in &found.children {
            let flat = format!("{folder}/{child}.rs");
            let nested = format!("{folder}/{child}/mod.rs");
            let child_file = if read(&flat).is_some() {
                flat
            } else if read(&nested).is_some() {
                nested
            } else {
                return Err(format!(
                    "{file} declares mod {child}, and neither {flat} nor {nested} exists"
                ));
            };
            let mut path = module.clone();
            path.push(child.clone());
            queue.push_back((path, child_file, format!("{folder}/{child}")));
        }
        files.insert(module.clone(), file.clone());
        scans.push((module, file, found));
    }
    let mut uses = Vec::new();
    for (module, file, found) in &scans {
        for w in &found.paths {
            if let Some(to) = resolve(&w.segments, &w.lexical, &files) {
                uses.push(Use {
                    file: file.clone(),
                    line: w.line,
                    from: module.clone(),
                    to,
                    written: w.segments.join("::").trim_end_matches("::self").to_string(),
                });
            }
        }
    }
    Ok(Crate { files, uses })
}

/// The file module a path names: `crate::`, `super::` and `self::` against
/// the module it is written in, or a child module's name; the longest
/// prefix that is a file module. None for other crates and for names that
/// are not modules.
fn resolve(
    segments: &[String],
    lexical: &ModPath,
    files: &BTreeMap<ModPath, String>,
) -> Option<ModPath> {
    let first = segments.first()?;
    let (mut base, rest) = match first.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (lexical.clone(), &segments[1..]),
        "super" => {
            let mut base = lexical.clone();
            let supers = segments.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            (base, &segments[supers..])
        }
        name => {
            let mut child = lexical.clone();
            child.push(name.to_string());
            if !files.contains_key(&child) {
                return None;
            }
            (lexical.clone(), segments)
        }
    };
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    while !files.contains_key(&base) {
        base.pop()?;
    }
    Some(base)
}

// ---------------------------------------------------------------------------
// Graphs.

/// Edges with the uses that make them: from -> to -> uses.
type Graph = BTreeMap<String, BTreeMap<String, Vec<Use>>>;

fn add(graph: &mut Graph, from: String, to: String, u: &Use) {
    graph.entry(to.clone()).or_default();
    graph
        .entry(from)
        .or_default()
        .entry(to)
        .or_default()
        .push(u.clone());
}

/// The graph between top-level modules, without `ALLOWED_UPWARD`; and the
/// allowed entries that matched nothing.
fn top_level_graph(krate: &Crate) -> (Graph, Vec<(&'static str, &'static str)>) {
    let mut graph = Graph::new();
    let mut used = BTreeSet::new();
    for u in &krate.uses {
        let (Some(from), Some(to)) = (u.from.first(), u.to.first()) else {
            continue;
        };
        if from == to {
            continue;
        }
        if let Some(allowed) = ALLOWED_UPWARD
            .iter()
            .find(|(file, top)| u.file == *file && to == top)
        {
            used.insert(*allowed);
            continue;
        }
        add(&mut graph, from.clone(), to.clone(), u);
    }
    let unused = ALLOWED_UPWARD
        .iter()
        .filter(|a| !used.contains(*a))
        .copied()
        .collect();
    (graph, unused)
}

/// The graph between the file modules inside one top-level module. A use
/// of one's own ancestor is left out: a submodule is part of its parent's
/// implementation (it sees the parent's private items, as `inline.rs`
/// implements methods of `event_loop.rs`'s `EventLoop`), so a parent and
/// its children are one unit to the modules around them.
fn folder_graph(krate: &Crate, top: &str) -> Graph {
    let mut graph = Graph::new();
    for u in &krate.uses {
        if u.from.first().map(String::as_str) == Some(top)
            && u.to.first().map(String::as_str) == Some(top)
            && u.from != u.to
            && !u.from.starts_with(&u.to)
        {
            add(&mut graph, show(&u.from), show(&u.to), u);
        }
    }
    graph
}

/// The graph between the parts of the module `parent`: its child modules,
/// each standing for its whole folder (the child and every module under
/// it). A use from anywhere in one part of anywhere in another is an edge
/// between the two; uses of `parent` itself and of modules outside it are
/// no edges here (a part that uses its parent is, as in `folder_graph`,
/// part of the parent's implementation). So a circle through different
/// files of two folders (`a/x.rs` uses `b.rs`, `b/y.rs` uses `a.rs`),
/// which no two files close, is a cycle between the parts `a` and `b`.
fn parts_graph(krate: &Crate, parent: &[String]) -> Graph {
    let depth = parent.len();
    let part = |m: &ModPath| (m.len() > depth && m.starts_with(parent)).then(|| show(&m[..=depth]));
    let mut graph = Graph::new();
    for u in &krate.uses {
        if let (Some(from), Some(to)) = (part(&u.from), part(&u.to))
            && from != to
        {
            add(&mut graph, from, to, u);
        }
    }
    graph
}

fn reaches(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(n) = todo.pop() {
        for next in graph.get(&n).into_iter().flat_map(|e| e.keys()) {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

/// A group of modules that all reach each other, and one shortest cycle
/// through one of them (the modules in order, the first repeated at the
/// end).
#[derive(Debug)]
struct Cycle {
    members: Vec<String>,
    path: Vec<String>,
}

/// For each module on a cycle, a shortest cycle through it, each cycle
/// named once: two circles that share a module (`a -> b -> a` and
/// `c -> b -> c`) are both named, not only the one through the group's
/// first module.
fn cycles(graph: &Graph) -> Vec<Cycle> {
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reaches(graph, n))).collect();
    let mut out: Vec<Cycle> = Vec::new();
    for start in graph.keys() {
        if !reach[start].contains(start) {
            continue;
        }
        let Some(path) = shortest_cycle(graph, start) else {
            continue;
        };
        if out.iter().any(|c| same_cycle(&c.path, &path)) {
            continue;
        }
        let members: Vec<String> = graph
            .keys()
            .filter(|n| reach[start].contains(*n) && reach[*n].contains(start))
            .cloned()
            .collect();
        out.push(Cycle { members, path });
    }
    out
}

/// Breadth first from `start` back to itself.
fn shortest_cycle(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.to_string()]);
    while let Some(n) = queue.pop_front() {
        for next in graph[&n].keys() {
            if next == start {
                let mut cycle = vec![start.to_string(), n.clone()];
                let mut at = n.clone();
                while let Some(p) = parent.get(&at) {
                    cycle.push(p.clone());
                    at = p.clone();
                }
                cycle.reverse();
                return Some(cycle);
            }
            if !parent.contains_key(next) {
                parent.insert(next.clone(), n.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// Two closed paths (first module repeated at the end) that are one cycle
/// entered at different modules.
fn same_cycle(a: &[String], b: &[String]) -> bool {
    let (a, b) = (&a[..a.len() - 1], &b[..b.len() - 1]);
    a.len() == b.len() && (0..a.len()).any(|k| a.iter().cycle().skip(k).take(a.len()).eq(b))
}

fn describe(graph: &Graph, cycle: &Cycle) -> String {
    let mut text = format!("cycle: {}", cycle.path.join(" -> "));
    if cycle.members.len() + 1 > cycle.path.len() {
        text.push_str(&format!(
            " (one of the cycles among {}, which all reach each other)",
            cycle.members.join(", ")
        ));
    }
    for pair in cycle.path.windows(2) {
        let uses = &graph[&pair[0]][&pair[1]];
        text.push_str(&format!(
            "\n    {} -> {}: {}{}",
            pair[0],
            pair[1],
            uses[0].evidence(),
            match uses.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        ));
    }
    text
}

// ---------------------------------------------------------------------------
// The layers as the crate docs state them.

/// The numbered list under `# Layers` in the crate docs: the modules named
/// in backquotes before each item's first colon.
fn stated_layers(lib_rs: &str) -> Result<Vec<Vec<String>>, String> {
    let doc: Vec<&str> = lib_rs
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let start = doc
        .iter()
        .position(|l| l.trim() == "# Layers")
        .ok_or("src/lib.rs: no `# Layers` section in the crate docs")?;
    let mut items: Vec<String> = Vec::new();
    for l in &doc[start + 1..] {
        if l.starts_with('#') {
            break;
        }
        let numbered = l
            .split_once(". ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match numbered {
            Some((_, rest)) => items.push(rest.to_string()),
            None if l.starts_with(' ') && !items.is_empty() => {
                let last = items.last_mut().expect("checked");
                last.push(' ');
                last.push_str(l.trim());
            }
            None => {}
        }
    }
    let layers: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            let names = item.split(':').next().unwrap_or("");
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect();
    if layers.is_empty() || layers.iter().any(Vec::is_empty) {
        return Err(format!(
            "src/lib.rs: the `# Layers` list does not name modules in each item: {items:?}"
        ));
    }
    Ok(layers)
}

/// Every top-level module in exactly one layer, and each edge going to an
/// earlier layer; the problems found.
fn check_layers(krate: &Crate, graph: &Graph, layers: &[Vec<String>]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (n, layer) in layers.iter().enumerate() {
        for name in layer {
            if layer_of.insert(name, n + 1).is_some() {
                problems.push(format!("`{name}` is listed in two layers"));
            }
        }
    }
    let tops: BTreeSet<&str> = krate
        .files
        .keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].as_str())
        .collect();
    for top in &tops {
        if !layer_of.contains_key(top) {
            problems.push(format!(
                "module `{top}` is in no layer of the crate docs' list"
            ));
        }
    }
    for name in layer_of.keys() {
        if !tops.contains(name) {
            problems.push(format!(
                "the layers list `{name}`, which is not a module of the crate"
            ));
        }
    }
    for (from, edges) in graph {
        for (to, uses) in edges {
            if let (Some(&a), Some(&b)) = (layer_of.get(from.as_str()), layer_of.get(to.as_str()))
                && b >= a
            {
                problems.push(format!(
                    "`{from}` (layer {a}) uses `{to}` (layer {b}): {}",
                    uses.iter()
                        .map(Use::evidence)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// The checks on this crate.

fn this_crate() -> Crate {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = load(&|rel: &str| std::fs::read_to_string(root.join(rel)).ok())
        .unwrap_or_else(|e| panic!("{e}"));
    // Every file under src/ is part of the module tree (src/main.rs is the
    // binary, another crate), so nothing escapes the check.
    let known: BTreeSet<&String> = krate.files.values().collect();
    let mut todo = vec![root.join("src")];
    let mut stray = Vec::new();
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if rel != "src/main.rs" && !known.contains(&rel) {
                    stray.push(rel);
                }
            }
        }
    }
    assert!(
        stray.is_empty(),
        "files under src/ that no mod declares: {stray:?}"
    );
    krate
}

#[test]
fn top_level_modules_have_no_cycle_and_follow_the_layers_in_the_crate_docs() {
    let krate = this_crate();
    let (graph, unused) = top_level_graph(&krate);
    for (file, top) in unused {
        eprintln!("note: {file} no longer uses {top}; its entry in ALLOWED_UPWARD can go");
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "the top-level modules use each other in a cycle:\n{}",
        found
            .iter()
            .map(|c| describe(&graph, c))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let lib_rs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let layers = stated_layers(&lib_rs).unwrap_or_else(|e| panic!("{e}"));
    let problems = check_layers(&krate, &graph, &layers);
    assert!(
        problems.is_empty(),
        "the modules do not follow the layers in src/lib.rs:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_files_of_each_module_folder_have_no_cycle() {
    let krate = this_crate();
    let tops: BTreeSet<&String> = krate
        .files
        .keys()
        .filter(|m| m.len() > 1)
        .map(|m| &m[0])
        .collect();
    assert!(
        tops.contains(&"plugin".to_string()),
        "the scan found the plugin folder"
    );
    let mut failures = Vec::new();
    for top in tops {
        let graph = folder_graph(&krate, top);
        let found = cycles(&graph);
        if found.is_empty() {
            continue;
        }
        let text = format!(
            "src/{top}/: files use each other in a cycle:\n{}",
            found
                .iter()
                .map(|c| describe(&graph, c))
                .collect::<Vec<_>>()
                .join("\n")
        );
        if REPORT_ONLY_FOLDERS.contains(&top.as_str()) {
            eprintln!("known, not failed yet: {text}");
        } else {
            failures.push(text);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_parts_of_each_module_folder_have_no_cycle() {
    let krate = this_crate();
    // Every module with children, but the crate itself: the top-level
    // modules have their own check, with the layers.
    let parents: BTreeSet<&[String]> = krate
        .files
        .keys()
        .filter(|m| m.len() >= 2)
        .map(|m| &m[..m.len() - 1])
        .collect();
    assert!(
        parents.contains(["worker".to_string()].as_slice()),
        "the scan found the worker folder"
    );
    let mut failures = Vec::new();
    for parent in parents {
        let graph = parts_graph(&krate, parent);
        let found = cycles(&graph);
        if found.is_empty() {
            continue;
        }
        let folder = parent.join("/");
        let text = format!(
            "src/{folder}/: its parts (a module with everything under it) use each other in a cycle:\n{}",
            found
                .iter()
                .map(|c| describe(&graph, c))
                .collect::<Vec<_>>()
                .join("\n")
        );
        if REPORT_ONLY_FOLDERS.contains(&show(parent).as_str()) {
            eprintln!("known, not failed yet: {text}");
        } else {
            failures.push(text);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// The checker itself, on made-up crates.

fn made_up(files: &[(&str, &str)]) -> Crate {
    let files: BTreeMap<String, String> = files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect();
    load(&|rel: &str| files.get(rel).cloned()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_cycle_between_top_level_modules_is_found_and_named() {
    let krate = made_up(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("src/a.rs", "use crate::b::thing;\n"),
        ("src/b.rs", "pub fn thing() {\n    crate::c::other();\n}\n"),
        (
            "src/c.rs",
            "use super::a;\n// crate::b in a comment\nconst S: &str = \"crate::b\";\n",
        ),
    ]);
    let (graph, _) = top_level_graph(&krate);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, ["a", "b", "c", "a"]);
    let text = describe(&graph, &found[0]);
    assert!(text.contains("cycle: a -> b -> c -> a"), "{text}");
    assert!(
        text.contains("b -> c: src/b.rs:2 crate::c::other"),
        "{text}"
    );
    assert!(
        !graph["c"].contains_key("b"),
        "comments and strings are not uses"
    );
}

#[test]
fn super_and_child_paths_resolve_to_the_file_they_name() {
    let krate = made_up(&[
        ("src/lib.rs", "pub mod m;\n"),
        (
            "src/m/mod.rs",
            "pub mod d;\npub mod e;\nfn f() { d::g(); }\n",
        ),
        (
            "src/m/d.rs",
            "use super::e::{self, Y};\npub fn g() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        (
            "src/m/e.rs",
            "pub struct Y;\nfn h() -> char { let _q = '\"'; super::super::m::d::g(); 'x' }\n",
        ),
    ]);
    let graph = folder_graph(&krate, "m");
    let edges = |from: &str| {
        graph
            .get(from)
            .map(|e| e.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(edges("m"), ["m::d"]);
    assert_eq!(
        edges("m::d"),
        ["m::e"],
        "the tests module's super is m::d itself"
    );
    assert_eq!(edges("m::e"), ["m::d"]);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, ["m::d", "m::e", "m::d"]);
}

#[test]
fn a_use_of_a_later_layer_is_refused() {
    let krate = made_up(&[
        ("src/lib.rs", "pub mod low;\npub mod high;\npub mod lost;\n"),
        ("src/low.rs", "fn f() { crate::high::g() }\n"),
        ("src/high.rs", "pub fn g() {}\n"),
        ("src/lost.rs", ""),
    ]);
    let (graph, _) = top_level_graph(&krate);
    let layers = stated_layers(
        "//! # Layers\n//!\n//! 1. `low`: the bottom\n//! 2. `high`,\n//!    `gone`: the top\n",
    )
    .unwrap();
    assert_eq!(layers, [vec!["low"], vec!["high", "gone"]]);
    let problems = check_layers(&krate, &graph, &layers).join("\n");
    assert!(
        problems.contains("`low` (layer 1) uses `high` (layer 2): src/low.rs:1 crate::high::g"),
        "{problems}"
    );
    assert!(
        problems.contains("module `lost` is in no layer"),
        "{problems}"
    );
    assert!(
        problems.contains("`gone`, which is not a module"),
        "{problems}"
    );
}

#[test]
fn a_circle_between_two_folders_is_a_cycle_of_their_parent_though_no_two_files_close_it() {
    let krate = made_up(&[
        ("src/lib.rs", "pub mod w;\n"),
        ("src/w/mod.rs", "pub mod a;\npub mod b;\n"),
        ("src/w/a.rs", "pub mod x;\npub fn f() {}\n"),
        ("src/w/a/x.rs", "use crate::w::b::g;\n"),
        ("src/w/b.rs", "pub mod y;\npub fn g() {}\n"),
        ("src/w/b/y.rs", "fn h() {\n    super::super::a::f();\n}\n"),
    ]);
    assert!(
        cycles(&folder_graph(&krate, "w")).is_empty(),
        "file by file, no two close the circle"
    );
    let graph = parts_graph(&krate, &["w".to_string()]);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, ["w::a", "w::b", "w::a"]);
    let text = describe(&graph, &found[0]);
    assert!(
        text.contains("w::a -> w::b: src/w/a/x.rs:1 crate::w::b::g"),
        "{text}"
    );
    assert!(
        text.contains("w::b -> w::a: src/w/b/y.rs:2 super::super::a::f"),
        "{text}"
    );
    assert!(
        parts_graph(&krate, &["w".to_string(), "a".to_string()]).is_empty(),
        "inside a/ the one part uses nothing beside it"
    );
}

#[test]
fn two_circles_through_one_module_are_both_named() {
    let krate = made_up(&[
        ("src/lib.rs", "pub mod w;\n"),
        (
            "src/w/mod.rs",
            "pub mod calls;\npub mod event_loop;\npub mod pool;\n",
        ),
        (
            "src/w/calls.rs",
            "use super::event_loop::Loop;\nuse super::pool::lock;\n",
        ),
        (
            "src/w/event_loop.rs",
            "use super::calls;\npub struct Loop;\n",
        ),
        ("src/w/pool.rs", "use super::calls;\npub fn lock() {}\n"),
    ]);
    let graph = parts_graph(&krate, &["w".to_string()]);
    let found: Vec<_> = cycles(&graph).into_iter().map(|c| c.path).collect();
    assert_eq!(
        found,
        [
            vec!["w::calls", "w::event_loop", "w::calls"],
            vec!["w::pool", "w::calls", "w::pool"],
        ]
    );
}
