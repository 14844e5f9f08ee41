//! The layers of `src/` point one way (docs/architecture.md): each module imports only from
//! the layers before it in [`LAYERS`], never from its own level's other modules nor from a
//! layer above.
//!
//! Every file under `src/` is read and parsed (with `syn`), and every path that leaves its
//! module is checked: `use` trees (groups included), fully qualified paths in code (types,
//! expressions, patterns, trait bounds, macro paths) and `crate::…`/`super::…` paths inside
//! macro invocations (`pin_project!`, `matches!`, …). A path through a name the crate root
//! re-exports (`crate::Scope`) counts as a path into the module that defines it. Comments and
//! doc links are not imports and are not read.
//!
//! Exempt: `#[cfg(test)]` unit-test modules (inline or in files of their own) and the `loom`
//! models inside `src/` (`#[cfg(all(test, loom))]` modules). They test a layer from outside
//! and may import from anywhere. `src/lib.rs`, the crate root that declares every module and
//! re-exports the public API, is above every layer.
//!
//! Besides: the tree core (`src/tree/`) names no tokio type and no `std::sync` item (it takes
//! its atomics and locks from the `sync` shim, so that loom sees all of them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The layers, bottom first. A module may import from the layers before its own; the modules
/// of one level are peers and do not import each other. A module that does not exist yet has
/// its place too (`telemetry`), so that it is checked when it lands.
const LAYERS: &[&[&str]] = &[
    &["sync"],
    &["time"],
    &["panic"],
    &["cause"],
    &["budget"],
    &["error"],
    &["spec"],
    &["telemetry"],
    &["tree"],
    &["scope"],
    &["child", "guard"],
    &["quiesce"],
    &["retry", "fanout"],
    &["registry"],
    &["reconcile"],
    &["wire"],
    &["integrations"],
    &["testing"],
];

/// The level of a top-level module in [`LAYERS`].
fn level(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// An import that points the wrong way (or that the test cannot place).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    import: String,
    why: String,
}

/// Where each file of the crate sits, found by following `mod` declarations from `lib.rs`.
struct ModuleFile {
    path: PathBuf,
    /// The module path of the file (`["tree", "cancel"]`).
    module: Vec<String>,
    /// A file of a `#[cfg(test)]` module or a loom model.
    exempt: bool,
}

/// Whether `attrs` make an item test-only (`#[cfg(test)]`, `#[cfg(all(test, loom))]`, …).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let tokens = a.meta.require_list().map(|l| l.tokens.clone());
            tokens.is_ok_and(|t| mentions_ident(t, "test"))
        }
    })
}

fn mentions_ident(tokens: TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == name,
        TokenTree::Group(g) => mentions_ident(g.stream(), name),
        _ => false,
    })
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The file that `mod name;` in the file `parent` (a module file of module path `module`)
/// refers to.
fn child_file(parent: &Path, name: &str) -> PathBuf {
    let stem = parent.file_stem().and_then(|s| s.to_str());
    let dir = match stem {
        Some("lib" | "mod") => parent.parent().unwrap().to_path_buf(),
        _ => parent.with_extension(""),
    };
    let file = dir.join(format!("{name}.rs"));
    if file.exists() {
        file
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// Every module file of the crate, from `lib.rs` down.
fn module_files() -> Vec<ModuleFile> {
    let mut out = Vec::new();
    let mut work = vec![ModuleFile {
        path: src().join("lib.rs"),
        module: Vec::new(),
        exempt: false,
    }];
    while let Some(file) = work.pop() {
        let ast = parse(&file.path);
        let mut found = Vec::new();
        collect_mod_decls(&ast.items, &mut Vec::new(), file.exempt, &mut found);
        for (inline, name, exempt) in found {
            // A `mod` in an inline module lives in that module's folder.
            let mut parent = file.path.clone();
            for m in &inline {
                parent = parent.with_extension("").join(format!("{m}.rs"));
            }
            let mut module = file.module.clone();
            module.extend(inline);
            module.push(name.clone());
            work.push(ModuleFile {
                path: child_file(&parent, &name),
                module,
                exempt,
            });
        }
        out.push(file);
    }
    out
}

/// The `mod name;` declarations in `items` and the inline modules within them: (inline modules
/// on the way, name, exempt).
fn collect_mod_decls(
    items: &[syn::Item],
    inline: &mut Vec<String>,
    exempt: bool,
    out: &mut Vec<(Vec<String>, String, bool)>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        let exempt = exempt || is_test_only(&m.attrs);
        match &m.content {
            None => out.push((inline.clone(), m.ident.to_string(), exempt)),
            Some((_, items)) => {
                inline.push(m.ident.to_string());
                collect_mod_decls(items, inline, exempt, out);
                inline.pop();
            }
        }
    }
}

/// The names the crate root re-exports, with the top-level module each comes from, and the
/// top-level modules it declares.
fn root_names() -> (BTreeMap<String, String>, BTreeSet<String>) {
    let ast = parse(&src().join("lib.rs"));
    let mut names = BTreeMap::new();
    let mut modules = BTreeSet::new();
    for item in &ast.items {
        match item {
            syn::Item::Mod(m) => {
                modules.insert(m.ident.to_string());
            }
            syn::Item::Use(u) => reexports(&u.tree, None, &mut names),
            _ => {}
        }
    }
    (names, modules)
}

fn reexports(tree: &syn::UseTree, from: Option<&str>, names: &mut BTreeMap<String, String>) {
    match tree {
        syn::UseTree::Path(p) => {
            let first = p.ident.to_string();
            reexports(&p.tree, Some(from.unwrap_or(&first)), names);
        }
        syn::UseTree::Name(n) => {
            if let Some(from) = from {
                names.insert(n.ident.to_string(), from.to_string());
            }
        }
        syn::UseTree::Rename(r) => {
            if let Some(from) = from {
                names.insert(r.rename.to_string(), from.to_string());
            }
        }
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| reexports(t, from, names)),
        syn::UseTree::Glob(_) => {}
    }
}

/// Walks one file and records where its paths lead.
struct Imports<'a> {
    /// The module path of the code being walked (the file's, then inline modules').
    module: Vec<String>,
    /// Depth inside test-only inline modules (their paths are not checked).
    in_test: usize,
    /// Each path that leaves the file's module, as (the top-level module or root name it
    /// reaches, the path as written).
    found: &'a mut Vec<(String, String)>,
}

impl Imports<'_> {
    /// Where `segments` (a path as written, from its first segment) leads: the first segment
    /// below the crate root, if the path is `crate::…` or climbs there with `super::…`.
    fn record(&mut self, segments: &[String]) {
        if self.in_test > 0 || segments.is_empty() {
            return;
        }
        let shown = segments.join("::");
        let target = match segments[0].as_str() {
            "crate" => segments.get(1).cloned(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                if ups > self.module.len() {
                    panic!(
                        "{shown}: climbs above the crate root from {:?}",
                        self.module
                    );
                }
                let base = &self.module[..self.module.len() - ups];
                match base.first() {
                    Some(top) => Some(top.clone()),
                    None => segments.get(ups).cloned(),
                }
            }
            _ => None,
        };
        if let Some(target) = target {
            self.found.push((target, shown));
        }
    }

    /// The `crate::…` and `super::…` paths inside macro tokens (also in `{…}` groups).
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.scan_tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while is_path_sep(&tokens, j) {
                        match tokens.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            Some(TokenTree::Group(g)) => {
                                // `crate::{a::X, b}`: each item's first segment.
                                for item in split_commas(g.stream()) {
                                    let mut s = segments.clone();
                                    s.extend(item);
                                    self.record(&s);
                                }
                                segments.clear();
                                j += 3;
                                break;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 {
                        self.record(&segments);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

/// Whether `tokens[j..]` starts with `::`.
fn is_path_sep(tokens: &[TokenTree], j: usize) -> bool {
    matches!(
        (tokens.get(j), tokens.get(j + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':'
    )
}

/// The leading identifiers of each comma-separated item of a `{…}` use group.
fn split_commas(tokens: TokenStream) -> Vec<Vec<String>> {
    let mut items = vec![Vec::new()];
    for t in tokens {
        match t {
            TokenTree::Punct(p) if p.as_char() == ',' => items.push(Vec::new()),
            TokenTree::Ident(i) => {
                let item = items.last_mut().unwrap();
                if item.is_empty() {
                    item.push(i.to_string());
                }
            }
            _ => {}
        }
    }
    items.retain(|i| !i.is_empty());
    items
}

impl<'ast> Visit<'ast> for Imports<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let test = is_test_only(&m.attrs);
        self.module.push(m.ident.to_string());
        self.in_test += usize::from(test);
        syn::visit::visit_item_mod(self, m);
        self.in_test -= usize::from(test);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefixes = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut prefixes);
        for p in prefixes {
            self.record(&p);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {
        // `pub(in crate::x)` names where an item is visible, not what it uses.
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.scan_tokens(m.tokens.clone());
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Doc comments and doc links are not imports.
    }
}

/// Every path of a use tree, as far as its leading segments go (`crate::tree::{self, Node}`
/// gives `crate::tree::self` and `crate::tree::Node`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut p = prefix.clone();
            p.push(n.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            p.push(r.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Glob(_) => {
            let mut p = prefix.clone();
            p.push("*".to_string());
            out.push(p);
        }
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

/// Every import of every non-exempt file that points the wrong way.
fn violations(files: &[ModuleFile]) -> Vec<Violation> {
    let (names, modules) = root_names();
    let mut out = Vec::new();
    for file in files.iter().filter(|f| !f.exempt && !f.module.is_empty()) {
        let shown = file.path.strip_prefix(src().parent().unwrap()).unwrap();
        let shown = shown.display().to_string();
        let own = &file.module[0];
        let Some(own_level) = level(own) else {
            out.push(Violation {
                file: shown,
                import: own.clone(),
                why: "module has no place in LAYERS (docs/architecture.md)".into(),
            });
            continue;
        };
        let ast = parse(&file.path);
        let mut found = Vec::new();
        let mut imports = Imports {
            module: file.module.clone(),
            in_test: 0,
            found: &mut found,
        };
        imports.visit_file(&ast);
        for (target, import) in found {
            let module = if modules.contains(&target) {
                target.clone()
            } else if let Some(from) = names.get(&target) {
                from.clone()
            } else {
                out.push(Violation {
                    file: shown.clone(),
                    import,
                    why: format!("`{target}` is neither a module nor a name of the crate root"),
                });
                continue;
            };
            if &module == own {
                continue;
            }
            match level(&module) {
                Some(l) if l < own_level => {}
                Some(l) if l == own_level => out.push(Violation {
                    file: shown.clone(),
                    import,
                    why: format!("`{own}` and `{module}` are peers: neither imports the other"),
                }),
                Some(_) => out.push(Violation {
                    file: shown.clone(),
                    import,
                    why: format!("`{own}` is below `{module}`"),
                }),
                None => out.push(Violation {
                    file: shown.clone(),
                    import,
                    why: format!("`{module}` has no place in LAYERS"),
                }),
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn report(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("  {}: `{}`: {}", v.file, v.import, v.why))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_import_points_down_the_layers() {
    let files = module_files();
    let found = violations(&files);
    assert!(
        found.is_empty(),
        "imports that point the wrong way (see docs/architecture.md):\n{}",
        report(&found)
    );
}

#[test]
fn every_file_under_src_is_checked_or_a_test_module() {
    let reached: BTreeSet<PathBuf> = module_files().into_iter().map(|f| f.path).collect();
    let mut missed = Vec::new();
    let mut dirs = vec![src()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !reached.contains(&path) {
                missed.push(path.display().to_string());
            }
        }
    }
    assert!(
        missed.is_empty(),
        "files under src/ that no `mod` declaration reaches: {missed:?}"
    );
}

/// The check would catch an import that points up: a lower layer that names a higher one,
/// through a module path, a use group, a root re-export, `super::` and a macro.
#[test]
fn an_import_pointing_up_is_caught() {
    let (names, _) = root_names();
    let cases = [
        (vec!["tree", "units"], "use crate::scope::Scope;"),
        (vec!["tree"], "use crate::{cause::Cause, quiesce::Report};"),
        (vec!["child", "ticket"], "fn f(_: &crate::Report) {}"),
        (vec!["spec"], "fn f() -> super::Scope { todo!() }"),
        (vec!["child"], "const G: () = { let _ = crate::guard::x; };"),
        (
            vec!["scope", "future"],
            "pin_project_lite::pin_project! { struct S { q: crate::quiesce::Quiesce } }",
        ),
        (
            vec!["error"],
            "impl From<crate::tree::Refused> for Error { }",
        ),
    ];
    for (module, code) in cases {
        let ast = syn::parse_file(code).unwrap();
        let mut found = Vec::new();
        Imports {
            module: module.iter().map(|s| s.to_string()).collect(),
            in_test: 0,
            found: &mut found,
        }
        .visit_file(&ast);
        let own = level(module[0]).unwrap();
        let caught = found.iter().any(|(target, _)| {
            let m = names.get(target).map_or(target.as_str(), String::as_str);
            level(m).is_some_and(|l| l >= own) && m != module[0]
        });
        assert!(caught, "not caught in {module:?}: {code} (found {found:?})");
    }
    // And test modules are exempt.
    let ast = syn::parse_file("#[cfg(test)] mod tests { use crate::quiesce::Report; }").unwrap();
    let mut found = Vec::new();
    Imports {
        module: vec!["tree".into()],
        in_test: 0,
        found: &mut found,
    }
    .visit_file(&ast);
    assert!(found.is_empty(), "{found:?}");
}

/// The tree core takes its atomics, `Arc` and locks from the `sync` shim (loom sees all of
/// them) and uses no tokio type (DESIGN: the core is runtime-free).
#[test]
fn the_tree_core_names_no_tokio_and_no_std_sync() {
    let mut found = Vec::new();
    for file in module_files() {
        if file.exempt || file.module.first().is_none_or(|m| m != "tree") {
            continue;
        }
        let ast = parse(&file.path);
        let mut paths = Vec::new();
        Everything(&mut paths).visit_file(&ast);
        for p in paths {
            let bad = p.first().is_some_and(|s| s == "tokio")
                || (p.first().is_some_and(|s| s == "std") && p.get(1).is_some_and(|s| s == "sync"));
            if bad {
                found.push(format!("{}: {}", file.path.display(), p.join("::")));
            }
        }
    }
    assert!(found.is_empty(), "the tree core names: {found:#?}");
}

/// Every path and use tree outside test-only modules, as written.
struct Everything<'a>(&'a mut Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Everything<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        use_paths(&u.tree, &mut Vec::new(), self.0);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.0
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}
