//! The DLM translation (the DLM paper's Fig. 3): every `dlm` array becomes a pointer to its
//! element type (to an array of its inner dimensions when it has several), allocated with
//! remote memory by a constructor before `main`, so `a[i][j]` reads as before.
//!
//! Input is preprocessed C in which `dlm` was defined as `__attribute__((__rmem_dlm__))`, so
//! the preprocessor has expanded every macro and tree-sitter sees a declaration specifier it
//! knows. Output is the same text with the declarations and the few expressions whose
//! meaning depends on being an array (`sizeof a`, `&a`) rewritten, line for line: the
//! preprocessor's line markers stay, and every rewrite keeps the number of lines of what it
//! replaces, so diagnostics and debuggers point at the user's source.
//!
//! What is rewritten, and why (ARCHITECTURE.md, "rmem cc"):
//! - `dlm T a[N][M]` at file scope: `T (*a)[M] __asm__("a.dlm")`. The symbol is renamed so a
//!   translation unit that declares `a` without `dlm` fails to link instead of reading the
//!   pointer as the array. `extern dlm` declares the same pointer.
//! - `static dlm T a[N]` in a function: a hidden global pointer before the function (the
//!   constructor must reach it), and in the block `extern __typeof__(that) a` naming it.
//! - `sizeof a` -> `(sizeof(*a) * (N))`; `&a` -> `((__typeof__(*a) (*)[N])a)`;
//!   `typeof(a)` -> `typeof(__typeof__(*a)[N])`; `_Alignof(a)` -> `_Alignof(__typeof__(*a))`.
//! - Uses that would change meaning silently are errors: assigning to `a`, `a++`, `a` in
//!   the initializer of a static object (it is allocated at run time).

use std::collections::HashMap;
use std::fmt;
use tree_sitter::{Node, Parser};

/// The attribute `dlm` expands to before translation.
pub const DLM_ATTRIBUTE: &str = "__rmem_dlm__";
/// The `-D` definition that makes `dlm` that attribute.
pub const DLM_DEFINE: &str = "dlm=__attribute__((__rmem_dlm__))";
/// The librmem function the constructor calls for each array (crates/librmem, dlm_static.rs).
pub const ALLOC_FN: &str = "__rmem_dlm_array";

/// A diagnostic at a place in the user's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diag {
    pub file: String,
    pub line: u32,
    pub msg: String,
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: error: {}", self.file, self.line, self.msg)
    }
}

/// The translated text.
pub struct Translated {
    pub text: String,
}

/// One dlm array as the code after its declaration sees it.
#[derive(Clone, Debug)]
struct DlmArray {
    /// The name in scope (a pointer after translation).
    name: String,
    /// The first dimension's text, rewritten; None when not declared (`extern dlm T a[];`).
    first_dim: Option<String>,
}

#[derive(Clone, Debug)]
enum Binding {
    Dlm(DlmArray),
    Other,
}

struct Edit {
    start: usize,
    end: usize,
    text: String,
}

/// One array the constructor allocates.
struct Alloc {
    /// The pointer as the constructor names it.
    target: String,
    /// Bytes, as a C expression.
    bytes: String,
    /// The first dimension, to check at compile time that it is a positive constant.
    dim: Option<String>,
    init: Option<String>,
    name: String,
    at: String,
}

struct Translator<'a> {
    src: &'a str,
    markers: Vec<Marker>,
    scopes: Vec<HashMap<String, Binding>>,
    edits: Vec<Edit>,
    errors: Vec<Diag>,
    allocs: Vec<Alloc>,
    /// Text inserted before a byte offset (hoisted declarations), in order.
    inserts: Vec<(usize, String)>,
    /// Declared names, so a declarator's own identifier is not taken for a use.
    declared: std::collections::HashSet<usize>,
    /// Inside the initializer of an object with static storage.
    static_init: u32,
    tu_tag: String,
    counter: usize,
    /// Every dlm name declared, in any scope.
    dlm_names: Vec<String>,
}

/// A line marker `# LINE "FILE" ...`: the line after it is LINE of FILE.
struct Marker {
    offset: usize,
    line: u32,
    file: String,
}

fn markers(src: &str) -> Vec<Marker> {
    let mut out = Vec::new();
    let mut offset = 0;
    for l in src.split_inclusive('\n') {
        let t = l.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            let rest = rest.trim_start();
            let rest = rest.strip_prefix("line").unwrap_or(rest).trim_start();
            let mut it = rest.splitn(2, char::is_whitespace);
            if let (Some(n), Some(f)) = (it.next().and_then(|n| n.parse().ok()), it.next()) {
                let f = f.trim();
                if let Some(f) = f.strip_prefix('"') {
                    let end = f.find('"').unwrap_or(f.len());
                    out.push(Marker {
                        offset: offset + l.len(),
                        line: n,
                        file: f[..end].to_string(),
                    });
                }
            }
        }
        offset += l.len();
    }
    out
}

/// The text tree-sitter parses: preprocessor lines (line markers, `#pragma`) blanked, same
/// length, so offsets agree with `src`.
fn blank_directives(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for l in src.split_inclusive('\n') {
        if l.trim_start().starts_with('#') {
            for c in l.chars() {
                out.push(if c == '\n' { '\n' } else { ' ' });
            }
        } else {
            out.push_str(l);
        }
    }
    out
}

fn newlines(s: &str) -> usize {
    s.bytes().filter(|&b| b == b'\n').count()
}

/// `s` on one line (the text of an initializer moved elsewhere; comments are gone after
/// preprocessing and strings cannot hold a raw newline).
fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Translate preprocessed C. `tu_tag` makes the names of hoisted function statics unique
/// among translation units.
pub fn translate(src: &str, tu_tag: &str) -> Result<Translated, Vec<Diag>> {
    let parse_text = blank_directives(src);
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_c::LANGUAGE.into())
        .expect("tree-sitter-c matches the tree-sitter version");
    let tree = parser
        .parse(&parse_text, None)
        .expect("a parser with a language and no timeout returns a tree");
    let mut t = Translator {
        src,
        markers: markers(src),
        scopes: vec![HashMap::new()],
        edits: Vec::new(),
        errors: Vec::new(),
        allocs: Vec::new(),
        inserts: Vec::new(),
        declared: Default::default(),
        static_init: 0,
        tu_tag: tu_tag.to_string(),
        counter: 0,
        dlm_names: Vec::new(),
    };
    let root = tree.root_node();
    t.visit_children(root);
    t.check_parse_errors(root);
    let text = t.finish();
    if !t.errors.is_empty() {
        return Err(t.errors);
    }
    Ok(Translated { text })
}

impl<'a> Translator<'a> {
    fn text(&self, n: Node) -> &'a str {
        &self.src[n.byte_range()]
    }

    fn position(&self, offset: usize) -> (String, u32) {
        let i = self.markers.partition_point(|m| m.offset <= offset);
        match i.checked_sub(1).map(|i| &self.markers[i]) {
            Some(m) => (
                m.file.clone(),
                m.line + newlines(&self.src[m.offset..offset]) as u32,
            ),
            None => (
                "<input>".to_string(),
                1 + newlines(&self.src[..offset]) as u32,
            ),
        }
    }

    fn error(&mut self, n: Node, msg: String) {
        let (file, line) = self.position(n.start_byte());
        self.errors.push(Diag { file, line, msg });
    }

    fn at(&self, n: Node) -> String {
        let (file, line) = self.position(n.start_byte());
        format!("{file}:{line}")
    }

    /// The text of `start..end` with the edits inside it applied.
    fn rewritten(&self, start: usize, end: usize) -> String {
        let mut out = String::new();
        let mut pos = start;
        for e in self
            .edits
            .iter()
            .filter(|e| e.start >= start && e.end <= end)
        {
            out.push_str(&self.src[pos..e.start]);
            out.push_str(&e.text);
            pos = e.end;
        }
        out.push_str(&self.src[pos..end]);
        out
    }

    /// Replace `start..end` (whose inner edits `text` already includes) by `text`, padded
    /// with newlines to the lines it replaces.
    fn replace(&mut self, start: usize, end: usize, text: String) {
        let mut text = text;
        let missing = newlines(&self.src[start..end]).saturating_sub(newlines(&text));
        text.push_str(&"\n".repeat(missing));
        self.edits.retain(|e| !(e.start >= start && e.end <= end));
        let at = self.edits.partition_point(|e| e.start < start);
        self.edits.insert(at, Edit { start, end, text });
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn bind(&mut self, name: &str, b: Binding) {
        self.scopes
            .last_mut()
            .expect("the file scope is never popped")
            .insert(name.to_string(), b);
    }

    fn visit_children(&mut self, n: Node) {
        let mut c = n.walk();
        let kids: Vec<Node> = n.children(&mut c).collect();
        for k in kids {
            self.visit(k);
        }
    }

    fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(HashMap::new());
        f(self);
        self.scopes.pop();
    }

    fn visit(&mut self, n: Node) {
        match n.kind() {
            "declaration" => self.declaration(n),
            "type_definition" => {
                if self.text(n).contains(DLM_ATTRIBUTE) {
                    self.error(
                        n,
                        "dlm cannot be used in a typedef: mark the array variables dlm".into(),
                    );
                }
                self.plain_declaration(n);
            }
            "function_definition" => self.function_definition(n),
            "compound_statement" | "for_statement" | "parameter_list" => {
                self.scoped(|t| t.visit_children(n))
            }
            "parameter_declaration" => self.plain_declaration(n),
            "enumerator" => {
                if let Some(name) = n.child_by_field_name("name") {
                    self.declared.insert(name.id());
                    let s = self.text(name).to_string();
                    self.bind(&s, Binding::Other);
                }
                self.visit_children(n);
            }
            "identifier" => self.identifier(n),
            "type_identifier" => self.type_identifier(n),
            "attribute_specifier" | "gnu_asm_expression" | "string_literal" | "char_literal" => {}
            _ => self.visit_children(n),
        }
    }

    fn function_definition(&mut self, n: Node) {
        let Some(d) = n.child_by_field_name("declarator") else {
            return self.visit_children(n);
        };
        if let Some(name) = declared_name(d) {
            self.declared.insert(name.id());
            let s = self.text(name).to_string();
            self.bind(&s, Binding::Other);
        }
        self.scoped(|t| {
            // Parameters share the body's scope.
            let mut cur = Some(d);
            while let Some(x) = cur {
                if x.kind() == "function_declarator" {
                    if let Some(p) = x.child_by_field_name("parameters") {
                        t.visit_children(p);
                    }
                    break;
                }
                cur = x.child_by_field_name("declarator");
            }
            let mut c = n.walk();
            let kids: Vec<Node> = n.children(&mut c).collect();
            for k in kids {
                if k.kind() == "declaration" {
                    t.visit(k); // K&R parameter declarations
                }
            }
            if let Some(b) = n.child_by_field_name("body") {
                t.visit_children(b);
            }
        });
    }

    /// A declaration without dlm: its names shadow, its sizes and initializers are uses.
    fn plain_declaration(&mut self, n: Node) {
        let has_static_storage = self.scopes.len() == 1 || storage(self, n, "static");
        let mut c = n.walk();
        let kids: Vec<Node> = n.children(&mut c).collect();
        for k in kids {
            if n.field_name_for_child(child_index(n, k)) == Some("declarator") {
                if let Some(name) = declared_name(k) {
                    self.declared.insert(name.id());
                    let s = self.text(name).to_string();
                    self.bind(&s, Binding::Other);
                }
                if k.kind() == "init_declarator" {
                    if let Some(d) = k.child_by_field_name("declarator") {
                        self.visit(d);
                    }
                    if let Some(v) = k.child_by_field_name("value") {
                        self.static_init += has_static_storage as u32;
                        self.visit(v);
                        self.static_init -= has_static_storage as u32;
                    }
                } else {
                    self.visit(k);
                }
            } else {
                self.visit(k);
            }
        }
    }

    fn declaration(&mut self, n: Node) {
        let mut c = n.walk();
        let kids: Vec<Node> = n.children(&mut c).collect();
        let is_dlm = kids
            .iter()
            .any(|k| k.kind() == "attribute_specifier" && self.text(*k).contains(DLM_ATTRIBUTE));
        if !is_dlm {
            return self.plain_declaration(n);
        }
        let file_scope = self.scopes.len() == 1;
        let is_extern = storage(self, n, "extern");
        let is_static = storage(self, n, "static");
        if !file_scope && !is_static && !is_extern {
            let names = kids
                .iter()
                .filter_map(|k| declared_name(*k))
                .map(|k| self.text(k))
                .collect::<Vec<_>>()
                .join(", ");
            return self.error(
                n,
                format!("dlm {names}: an array inside a function can be dlm only if it is static (write static dlm ...): a dlm array is allocated once, before main"),
            );
        }
        let hoist = !file_scope && is_static;
        let function = if hoist { enclosing_function(n) } else { None };
        if hoist && function.is_none() {
            return self.error(
                n,
                "static dlm outside a function body is not supported".into(),
            );
        }
        // The declaration specifiers, without dlm (and, to hoist, without `static`).
        let first_decl = kids
            .iter()
            .position(|k| n.field_name_for_child(child_index(n, *k)) == Some("declarator"))
            .unwrap_or(kids.len());
        let mut specs = String::new();
        for k in &kids[..first_decl] {
            let dlm_attr =
                k.kind() == "attribute_specifier" && self.text(*k).contains(DLM_ATTRIBUTE);
            let storage_kw = k.kind() == "storage_class_specifier";
            if dlm_attr || (hoist && storage_kw) {
                continue;
            }
            self.visit(*k);
            if !specs.is_empty() {
                specs.push(' ');
            }
            specs.push_str(&one_line(&self.rewritten(k.start_byte(), k.end_byte())));
        }
        let func_name = function
            .and_then(|f| f.child_by_field_name("declarator"))
            .and_then(declared_name)
            .map(|x| self.text(x).to_string())
            .unwrap_or_default();

        let mut kept = Vec::new(); // declarator texts for the declaration in place
        let mut after = String::new(); // declarations after it (initial values, aliases)
        let mut hoisted = String::new();
        for k in kids[first_decl..]
            .iter()
            .filter(|k| n.field_name_for_child(child_index(n, **k)) == Some("declarator"))
        {
            let (d, init) = if k.kind() == "init_declarator" {
                (
                    k.child_by_field_name("declarator").unwrap_or(*k),
                    k.child_by_field_name("value"),
                )
            } else {
                (*k, None)
            };
            let Some(name_node) = declared_name(d) else {
                self.visit(*k);
                kept.push(self.rewritten(k.start_byte(), k.end_byte()));
                continue;
            };
            let name = self.text(name_node).to_string();
            self.declared.insert(name_node.id());
            let Some(arr) = first_array(name_node) else {
                // Not an array: dlm does not apply; declared as written.
                self.bind(&name, Binding::Other);
                self.visit(*k);
                kept.push(self.rewritten(k.start_byte(), k.end_byte()));
                continue;
            };
            // Sizes and initial values are visited (rewritten) before being moved.
            self.visit(d);
            let size = arr.child_by_field_name("size");
            let dim = size.map(|s| one_line(&self.rewritten(s.start_byte(), s.end_byte())));
            if dim.as_deref() == Some("*") {
                self.error(*k, format!("dlm {name}: [*] is for parameters"));
                continue;
            }
            let init_text = init.map(|v| {
                self.static_init += 1;
                self.visit(v);
                self.static_init -= 1;
                one_line(&self.rewritten(v.start_byte(), v.end_byte()))
            });
            if is_extern && init_text.is_some() {
                self.error(*k, format!("extern dlm {name} with an initial value: drop extern (it is the definition)"));
                continue;
            }
            // `d` with the array derivation on the name made a pointer to `who`.
            let pointer_decl = |t: &Self, who: &str| {
                format!(
                    "{}(*{who}){}",
                    t.rewritten(d.start_byte(), arr.start_byte()),
                    t.rewritten(arr.end_byte(), d.end_byte())
                )
            };
            let at = self.at(*k);
            self.counter += 1;
            // The pointer the constructor sets, and where its initial values go.
            let target = if hoist {
                let hidden = format!("__dlm_{}_{name}_{}", func_name, self.counter);
                let sym = format!("{func_name}.{name}.dlm.{}.{}", self.counter, self.tu_tag);
                hoisted.push_str(&format!(
                    "__attribute__((__visibility__(\"hidden\"))) {specs} {} __asm__(\"{sym}\"); ",
                    one_line(&pointer_decl(self, &hidden))
                ));
                after.push_str(&format!(
                    " extern __typeof__({hidden}) {name} __asm__(\"{sym}\");"
                ));
                hidden
            } else {
                let label = if is_static {
                    String::new()
                } else {
                    format!(" __asm__(\"{name}.dlm\")")
                };
                kept.push(format!("{}{label}", pointer_decl(self, &name)));
                name.clone()
            };
            if !is_extern {
                let init = init_text.map(|v| {
                    let init_name = format!("__dlm_init_{}", self.counter);
                    let decl = format!("static const __typeof__(*{target}) {init_name}[] = {v}; ");
                    match hoist {
                        true => hoisted.push_str(&decl),
                        false => after.push_str(&format!(" {}", decl.trim_end())),
                    }
                    init_name
                });
                self.allocs
                    .push(alloc(target, &name, dim.clone(), init, at));
            }
            let first_dim = match (&dim, self.allocs.last()) {
                (Some(d), _) => Some(d.clone()),
                (None, Some(a)) if !is_extern && a.init.is_some() => {
                    let i = a.init.as_ref().expect("checked");
                    Some(format!("(sizeof {i} / sizeof {i}[0])"))
                }
                _ => None,
            };
            self.bind(
                &name,
                Binding::Dlm(DlmArray {
                    name: name.clone(),
                    first_dim,
                }),
            );
            self.dlm_names.push(name);
        }
        let mut text = String::new();
        if !kept.is_empty() {
            let keep_storage = |t: &Self| {
                kids[..first_decl]
                    .iter()
                    .filter(|k| k.kind() == "storage_class_specifier")
                    .map(|k| t.text(*k))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let storage_text = if hoist {
                keep_storage(self)
            } else {
                String::new()
            };
            text = format!("{storage_text} {specs} {};", kept.join(", "));
        }
        text.push_str(&after);
        self.replace(n.start_byte(), n.end_byte(), text);
        if let Some(f) = function {
            self.inserts.push((f.start_byte(), hoisted));
        }
    }

    fn identifier(&mut self, n: Node) {
        if self.declared.contains(&n.id()) {
            return;
        }
        let name = self.text(n);
        let Some(Binding::Dlm(a)) = self.lookup(name).cloned() else {
            return;
        };
        // The expression `a` is the operand of: skip parentheses.
        let mut node = n;
        let mut parent = n.parent();
        while let Some(p) = parent.filter(|p| p.kind() == "parenthesized_expression") {
            node = p;
            parent = p.parent();
        }
        let Some(p) = parent else { return };
        match p.kind() {
            "sizeof_expression" => self.sizeof(p, &a),
            // `typeof(a)` where tree-sitter took typeof for a function (in a function body).
            "argument_list" if p.named_child_count() == 1 => {
                let callee = p
                    .parent()
                    .filter(|c| c.kind() == "call_expression")
                    .and_then(|c| c.child_by_field_name("function"))
                    .map(|f| self.text(f));
                if let Some(text) = callee.and_then(|f| array_type_operand(f, &a)) {
                    self.replace(node.start_byte(), node.end_byte(), text);
                }
            }
            "pointer_expression" if self.text(p).trim_start().starts_with('&') => {
                let dim = a.first_dim.as_deref().unwrap_or("");
                let text = format!("((__typeof__(*{0}) (*)[{dim}]){0})", a.name);
                self.replace(p.start_byte(), p.end_byte(), text);
            }
            "assignment_expression"
                if p.child_by_field_name("left").map(|l| l.id()) == Some(node.id()) =>
            {
                self.error(n, format!("dlm array {name} is an array: it cannot be assigned"))
            }
            "update_expression" => {
                self.error(n, format!("dlm array {name} is an array: it cannot be incremented or decremented"))
            }
            _ if self.static_init > 0 => self.error(
                n,
                format!("dlm array {name} is allocated when the program starts: its address cannot initialize a static object; assign it in a function instead"),
            ),
            _ => {}
        }
    }

    /// A dlm name where a type is expected: `sizeof(a)` parsed as a type, or `typeof(a)`.
    fn type_identifier(&mut self, n: Node) {
        let name = self.text(n);
        let Some(Binding::Dlm(a)) = self.lookup(name).cloned() else {
            return;
        };
        let Some(desc) = n.parent().filter(|p| p.kind() == "type_descriptor") else {
            return;
        };
        if desc.named_child_count() != 1 {
            return;
        }
        match desc.parent() {
            Some(p) if p.kind() == "sizeof_expression" => self.sizeof(p, &a),
            Some(p)
                if matches!(
                    p.kind(),
                    "alignof_expression" | "macro_type_specifier" | "typeof_specifier"
                ) =>
            {
                let op = self.text(p).split('(').next().unwrap_or("").trim();
                if let Some(text) = array_type_operand(op, &a) {
                    self.replace(desc.start_byte(), desc.end_byte(), text);
                }
            }
            _ => {}
        }
    }

    fn sizeof(&mut self, p: Node, a: &DlmArray) {
        match &a.first_dim {
            Some(dim) => {
                let text = format!("(sizeof(*{}) * ({dim}))", a.name);
                self.replace(p.start_byte(), p.end_byte(), text);
            }
            None => self.error(
                p,
                format!("sizeof {0}: the size of dlm array {0} is not declared here (declare it with its first dimension: extern dlm T {0}[N]...)", a.name),
            ),
        }
    }

    /// tree-sitter recovers from what it cannot parse; a use of a dlm array inside such a
    /// place would escape the translation, so it is an error.
    fn check_parse_errors(&mut self, root: Node) {
        let names = self.dlm_names.clone();
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if !n.has_error() {
                continue;
            }
            if n.is_error() {
                let text = self.text(n);
                if let Some(name) = names.iter().find(|nm| contains_word(text, nm)) {
                    self.error(n, format!("rmem cc cannot parse the code here, which uses dlm array {name}; simplify it (tree-sitter-c)"));
                } else if text.contains(DLM_ATTRIBUTE) {
                    self.error(
                        n,
                        "rmem cc cannot parse this dlm declaration (tree-sitter-c)".into(),
                    );
                }
                continue;
            }
            let mut c = n.walk();
            stack.extend(n.children(&mut c));
        }
    }

    /// Apply the edits and inserts, then append the constructor.
    fn finish(&mut self) -> String {
        // A dlm the walk did not translate (a parameter, a cast, a typedef): say where.
        let untranslated: Vec<usize> = self
            .src
            .match_indices(DLM_ATTRIBUTE)
            .map(|(i, _)| i)
            .filter(|&i| !self.edits.iter().any(|e| e.start <= i && i < e.end))
            .collect();
        for i in untranslated {
            let (file, line) = self.position(i);
            self.errors.push(Diag {
                file,
                line,
                msg: "dlm is allowed only on arrays declared at file scope or static in a function"
                    .into(),
            });
        }
        let mut cuts: Vec<(usize, usize, String)> = self
            .edits
            .drain(..)
            .map(|e| (e.start, e.end, e.text))
            .collect();
        cuts.extend(self.inserts.drain(..).map(|(at, t)| (at, at, t)));
        cuts.sort_by_key(|c| (c.0, c.1));
        let mut out = String::with_capacity(self.src.len() + 4096);
        let mut pos = 0;
        for (s, e, t) in cuts {
            debug_assert!(s >= pos, "edits never overlap");
            out.push_str(&self.src[pos..s]);
            out.push_str(&t);
            pos = e;
        }
        out.push_str(&self.src[pos..]);
        if !self.allocs.is_empty() {
            out.push_str(&self.constructor());
        }
        out
    }

    fn constructor(&self) -> String {
        let mut c = format!(
            "\n# 1 \"<rmem cc: dlm arrays>\"\nextern void *{ALLOC_FN}(__typeof__(sizeof 0), const void *, __typeof__(sizeof 0), const char *, const char *);\n__attribute__((__constructor__(101))) static void __rmem_cc_constructor(void)\n{{\n"
        );
        for a in &self.allocs {
            if let Some(d) = &a.dim {
                c.push_str(&format!(
                    "    _Static_assert(({d}) > 0, \"dlm array {}: its size must be a positive constant\");\n",
                    a.name
                ));
            }
            let (init, init_bytes) = match &a.init {
                Some(i) => (i.clone(), format!("sizeof {i}")),
                None => ("0".into(), "0".into()),
            };
            c.push_str(&format!(
                "    {} = {ALLOC_FN}({}, {init}, {init_bytes}, \"{}\", \"{}\");\n",
                a.target,
                a.bytes,
                a.name,
                a.at.replace('\\', "\\\\").replace('"', "\\\"")
            ));
        }
        c.push_str("}\n");
        c
    }
}

fn alloc(
    target: String,
    name: &str,
    dim: Option<String>,
    init: Option<String>,
    at: String,
) -> Alloc {
    let count = match (&dim, &init) {
        (Some(d), _) => format!("(__typeof__(sizeof 0))({d})"),
        (None, Some(i)) => format!("(sizeof {i} / sizeof {i}[0])"),
        (None, None) => "0".into(),
    };
    Alloc {
        bytes: format!("sizeof(*{target}) * {count}"),
        target,
        dim,
        init,
        name: name.to_string(),
        at,
    }
}

/// The operand that keeps `OP(a)`'s meaning when OP takes the array's type: typeof names
/// the array type again (element type, first dimension), and an array's alignment is its
/// element's. None for other operators.
fn array_type_operand(op: &str, a: &DlmArray) -> Option<String> {
    match op {
        "typeof" | "__typeof__" | "__typeof" | "typeof_unqual" => Some(format!(
            "__typeof__(*{})[{}]",
            a.name,
            a.first_dim.as_deref().unwrap_or("")
        )),
        "_Alignof" | "alignof" | "__alignof__" | "__alignof" => {
            Some(format!("__typeof__(*{})", a.name))
        }
        _ => None,
    }
}

fn contains_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(ident)
            && !text[i + word.len()..].chars().next().is_some_and(ident)
    })
}

fn child_index(parent: Node, child: Node) -> u32 {
    let mut c = parent.walk();
    let i = parent
        .children(&mut c)
        .position(|k| k.id() == child.id())
        .expect("a child of its parent");
    i as u32
}

fn storage(t: &Translator, n: Node, kw: &str) -> bool {
    let mut c = n.walk();
    let found = n
        .children(&mut c)
        .any(|k| k.kind() == "storage_class_specifier" && t.text(k) == kw);
    found
}

fn enclosing_function(n: Node) -> Option<Node> {
    let mut p = n.parent();
    while let Some(x) = p {
        if x.kind() == "function_definition"
            && x.parent().is_some_and(|g| g.kind() == "translation_unit")
        {
            return Some(x);
        }
        p = x.parent();
    }
    None
}

/// The identifier a declarator declares.
fn declared_name(d: Node) -> Option<Node> {
    match d.kind() {
        "identifier" | "type_identifier" => Some(d),
        "parenthesized_declarator" | "attributed_declarator" => {
            let mut c = d.walk();
            let kids: Vec<Node> = d.named_children(&mut c).collect();
            kids.into_iter().find_map(declared_name)
        }
        _ => d.child_by_field_name("declarator").and_then(declared_name),
    }
}

/// The array declarator applied to the name first (`a[N]` in `a[N][M]` and in `*a[N]`),
/// or None when the name is not an array (`(*a)[N]` is a pointer).
fn first_array(name: Node) -> Option<Node> {
    let mut p = name.parent()?;
    while matches!(
        p.kind(),
        "parenthesized_declarator" | "attributed_declarator"
    ) {
        p = p.parent()?;
    }
    (p.kind() == "array_declarator").then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(src: &str) -> String {
        translate(&src.replace("dlm ", "__attribute__((__rmem_dlm__)) "), "t")
            .map(|t| t.text)
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn err(src: &str) -> String {
        match translate(&src.replace("dlm ", "__attribute__((__rmem_dlm__)) "), "t") {
            Ok(t) => panic!("translated:\n{}", t.text),
            Err(e) => e
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn file_scope_arrays_become_pointers_to_their_rows() {
        let t = tr("dlm double a[100][100], x[100];\nint main(void) { return a[1][2] + x[3]; }\n");
        assert!(
            t.contains("double (*a)[100] __asm__(\"a.dlm\"), (*x) __asm__(\"x.dlm\");"),
            "{t}"
        );
        assert!(t.contains("return a[1][2] + x[3];"), "{t}");
        assert!(
            t.contains(
                "a = __rmem_dlm_array(sizeof(*a) * (__typeof__(sizeof 0))(100), 0, 0, \"a\""
            ),
            "{t}"
        );
    }

    #[test]
    fn sizeof_and_address_keep_their_meaning() {
        let t = tr("dlm int a[10][4];\nlong f(void) { return sizeof a + sizeof(a) + sizeof a[0]; }\nvoid *g(void) { return &a; }\n");
        assert!(
            t.contains("return (sizeof(*a) * (10)) + (sizeof(*a) * (10)) + sizeof a[0];"),
            "{t}"
        );
        assert!(t.contains("return ((__typeof__(*a) (*)[10])a);"), "{t}");
    }

    #[test]
    fn typeof_and_alignof_name_the_array_type() {
        let t = tr("dlm int a[10][4];\n__typeof__(a) *p;\nint n = _Alignof(a);\n");
        assert!(t.contains("__typeof__(__typeof__(*a)[10]) *p;"), "{t}");
        assert!(t.contains("_Alignof(__typeof__(*a));"), "{t}");
        let t = tr("dlm int a[10][4];\nvoid f(void) { __typeof__(a) *p = &a; }\n");
        assert!(
            t.contains("__typeof__(__typeof__(*a)[10]) *p = ((__typeof__(*a) (*)[10])a);"),
            "{t}"
        );
    }

    #[test]
    fn shadowing_locals_are_not_rewritten() {
        let t = tr("dlm int a[10];\nlong f(void) { int a[3]; return sizeof a; }\nlong g(int a) { return sizeof a; }\n");
        assert!(t.contains("{ int a[3]; return sizeof a; }"), "{t}");
        assert!(t.contains("{ return sizeof a; }"), "{t}");
    }

    #[test]
    fn function_statics_are_hoisted() {
        let t = tr("int f(int i)\n{\n  static dlm int buf[8], k;\n  return buf[i] + k;\n}\n");
        assert!(
            t.contains("__asm__(\"f.buf.dlm.1.t\"); int f(int i)"),
            "{t}"
        );
        assert!(
            t.contains(
                "static int k; extern __typeof__(__dlm_f_buf_1) buf __asm__(\"f.buf.dlm.1.t\");"
            ),
            "{t}"
        );
        assert_eq!(newlines(&t[..t.find("<rmem cc").unwrap()]), 6, "{t}");
    }

    #[test]
    fn initial_values_and_sizes_from_them() {
        let t = tr("dlm int t[] = {1,\n 2,\n 3};\nint n(void) { return sizeof t; }\n");
        assert!(t.contains("int (*t) __asm__(\"t.dlm\"); static const __typeof__(*t) __dlm_init_1[] = {1,  2,  3};\n\n\n"), "{t}");
        assert!(
            t.contains("(sizeof(*t) * ((sizeof __dlm_init_1 / sizeof __dlm_init_1[0])))"),
            "{t}"
        );
    }

    #[test]
    fn silent_changes_are_errors() {
        assert!(err("dlm int a[4];\nvoid f(int *p) { a = p; }\n")
            .contains(":2: error: dlm array a is an array: it cannot be assigned"));
        assert!(err("dlm int a[4];\nint *p = a;\n").contains("cannot initialize a static object"));
        assert!(err("void f(void) { dlm int a[4]; }\n").contains("only if it is static"));
        assert!(err("extern dlm int a[];\nlong n = sizeof a;\n").contains("is not declared here"));
        assert!(err("dlm int a[4];\nint f(int *p) { return p++ == a++; }\n")
            .contains("cannot be incremented"));
        assert!(err("void f(dlm int a[4]);\n").contains("dlm is allowed only"));
    }

    #[test]
    fn line_markers_give_positions() {
        let e = err("# 7 \"user.c\"\ndlm int a[4];\n\nvoid f(int *p) { a = p; }\n");
        assert!(e.starts_with("user.c:9: error:"), "{e}");
    }
}
