//! A small Python tokenizer: enough of Python's lexical rules to give every cell a canonical
//! token stream (names, numbers, strings, operators, logical lines and indentation), with
//! comments, blank lines and the layout inside brackets dropped.
//!
//! It also reads the slot markers of templates (`$0`, `$c1`, `$p0`, `$pc0`, `$v0`), which no Python
//! code contains, when asked to.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Name,
    Number,
    Str,
    Op,
    /// A template slot marker (`$0`, `$c0`, `$p0`, `$pc0`, `$v0`).
    Slot,
    /// End of a logical line at the top level.
    Newline,
    Indent,
    Dedent,
}

/// One token, with its canonical text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: Kind,
    /// The canonical text: as written, except that a plain string literal is re-quoted.
    pub text: String,
    /// For a plain (not bytes, not f-) string literal with no escape or quote inside: its value.
    pub value: Option<String>,
}

impl Token {
    fn new(kind: Kind, text: impl Into<String>) -> Token {
        Token {
            kind,
            text: text.into(),
            value: None,
        }
    }

    /// Whether this is the operator `op`.
    pub fn is_op(&self, op: &str) -> bool {
        self.kind == Kind::Op && self.text == op
    }

    /// Whether this is the name `name` (keywords are names here).
    pub fn is_name(&self, name: &str) -> bool {
        self.kind == Kind::Name && self.text == name
    }
}

const OPERATORS: [&str; 24] = [
    "**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", ">>", "<<", "<=", ">=", "==", "!=",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "@=",
];
const SINGLE_OPERATORS: &str = "+-*/%@&|^~<>()[]{},:;.=";
const STRING_PREFIXES: [&str; 9] = ["r", "u", "b", "f", "br", "rb", "fr", "rf", ""];

/// Tokenizes Python source; `None` when it is not valid at the lexical level.
pub fn tokenize(code: &str) -> Option<Vec<Token>> {
    Lexer::new(code, false).run()
}

/// Tokenizes a template, whose slot markers become [`Kind::Slot`] tokens. Templates come
/// from a small set (the table's), so their tokens are kept per thread.
pub fn tokenize_template(key: &str) -> Option<Rc<Vec<Token>>> {
    thread_local! {
        static TEMPLATES: RefCell<HashMap<String, Option<Rc<Vec<Token>>>>> =
            RefCell::new(HashMap::new());
    }
    TEMPLATES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(tokens) = cache.get(key) {
            return tokens.clone();
        }
        if cache.len() > 50_000 {
            cache.clear();
        }
        let tokens = Lexer::new(key, true).run().map(Rc::new);
        cache.insert(key.to_string(), tokens.clone());
        tokens
    })
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    slots: bool,
    depth: usize,
    indents: Vec<usize>,
    tokens: Vec<Token>,
}

impl Lexer {
    fn new(code: &str, slots: bool) -> Lexer {
        Lexer {
            chars: code.chars().collect(),
            pos: 0,
            slots,
            depth: 0,
            indents: vec![0],
            tokens: Vec::new(),
        }
    }

    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn run(mut self) -> Option<Vec<Token>> {
        let mut line_start = true;
        while self.pos < self.chars.len() {
            if line_start && self.depth == 0 {
                line_start = false;
                if !self.indentation()? {
                    continue;
                }
            }
            let c = self.chars[self.pos];
            match c {
                ' ' | '\t' | '\x0c' => self.pos += 1,
                '#' => self.skip_comment(),
                '\\' => {
                    // Explicit line joining: a backslash must end the physical line.
                    self.pos += 1;
                    match (self.peek(0), self.peek(1)) {
                        (Some('\n'), _) | (Some('\r'), Some('\n')) | (Some('\r'), _) => {
                            self.skip_newline()
                        }
                        _ => return None,
                    }
                }
                '\n' | '\r' => {
                    self.skip_newline();
                    if self.depth == 0 {
                        self.end_line();
                        line_start = true;
                    }
                }
                '\'' | '"' => self.string("")?,
                '$' if self.slots => self.slot()?,
                c if c.is_ascii_digit() => self.number(),
                '.' if self.peek(1).is_some_and(|d| d.is_ascii_digit()) => self.number(),
                c if c == '_' || c.is_alphabetic() => self.name()?,
                _ => self.operator()?,
            }
        }
        if self.depth > 0 {
            return None;
        }
        while self.tokens.last().is_some_and(|t| t.kind == Kind::Newline) {
            self.tokens.pop();
        }
        Some(self.tokens)
    }

    /// Reads the indentation of a physical line at the top level; `Ok(false)` for a blank or
    /// comment-only line, which does not count.
    fn indentation(&mut self) -> Option<bool> {
        let mut width = 0;
        let mut i = self.pos;
        while let Some(&c) = self.chars.get(i) {
            match c {
                ' ' => width += 1,
                '\t' => width = (width / 8 + 1) * 8,
                '\x0c' => width = 0,
                _ => break,
            }
            i += 1;
        }
        match self.chars.get(i) {
            None | Some('\n') | Some('\r') | Some('#') => {
                self.pos = i;
                if self.chars.get(i) == Some(&'#') {
                    self.skip_comment();
                }
                self.skip_newline();
                return Some(false);
            }
            _ => {}
        }
        self.pos = i;
        let current = *self.indents.last().expect("the indent stack keeps its 0");
        if width > current {
            if self.tokens.is_empty() {
                return None;
            }
            self.indents.push(width);
            self.tokens.push(Token::new(Kind::Indent, ""));
        } else {
            while width < *self.indents.last().expect("the indent stack keeps its 0") {
                self.indents.pop();
                self.tokens.push(Token::new(Kind::Dedent, ""));
            }
            if width != *self.indents.last().expect("the indent stack keeps its 0") {
                return None;
            }
        }
        Some(true)
    }

    fn skip_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n' && c != '\r') {
            self.pos += 1;
        }
    }

    fn skip_newline(&mut self) {
        match (self.peek(0), self.peek(1)) {
            (Some('\r'), Some('\n')) => self.pos += 2,
            (Some('\n'), _) | (Some('\r'), _) => self.pos += 1,
            _ => {}
        }
    }

    fn end_line(&mut self) {
        if self
            .tokens
            .last()
            .is_some_and(|t| !matches!(t.kind, Kind::Newline | Kind::Indent | Kind::Dedent))
        {
            self.tokens.push(Token::new(Kind::Newline, ""));
        }
    }

    fn name(&mut self) -> Option<()> {
        let start = self.pos;
        while self
            .peek(0)
            .is_some_and(|c| c == '_' || c.is_alphanumeric())
        {
            self.pos += 1;
        }
        let word: String = self.chars[start..self.pos].iter().collect();
        if matches!(self.peek(0), Some('\'') | Some('"'))
            && STRING_PREFIXES.contains(&word.to_ascii_lowercase().as_str())
        {
            return self.string(&word);
        }
        self.tokens.push(Token::new(Kind::Name, word));
        Some(())
    }

    fn number(&mut self) {
        let start = self.pos;
        let hex = self.peek(0) == Some('0') && matches!(self.peek(1), Some('x' | 'X'));
        while let Some(c) = self.peek(0) {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                self.pos += 1;
                if !hex && matches!(c, 'e' | 'E') && matches!(self.peek(0), Some('+' | '-')) {
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        self.tokens.push(Token::new(Kind::Number, text));
    }

    fn slot(&mut self) -> Option<()> {
        let start = self.pos;
        self.pos += 1;
        while self.peek(0).is_some_and(|c| matches!(c, 'p' | 'c' | 'v')) {
            self.pos += 1;
        }
        let digits = self.pos;
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if digits == self.pos {
            return None;
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        self.tokens.push(Token::new(Kind::Slot, text));
        Some(())
    }

    /// Reads a string literal whose prefix (already consumed) is `prefix`.
    fn string(&mut self, prefix: &str) -> Option<()> {
        let quote = self.chars[self.pos];
        let triple = self.peek(1) == Some(quote) && self.peek(2) == Some(quote);
        let open = if triple { 3 } else { 1 };
        let body_start = self.pos + open;
        let formatted = prefix.to_ascii_lowercase().contains('f');
        let body_end = scan_string(&self.chars, body_start, quote, triple, formatted)?;
        self.pos = body_end + open;
        let body: String = self.chars[body_start..body_end].iter().collect();
        let lower = prefix.to_ascii_lowercase();
        let plain = !formatted && !body.contains(['\\', '\'', '"', '\n', '\r']);
        let token = if plain {
            let bytes = lower.contains('b');
            Token {
                kind: Kind::Str,
                text: format!("{}'{}'", if bytes { "b" } else { "" }, body),
                value: (!bytes).then_some(body),
            }
        } else {
            let quotes: String = std::iter::repeat_n(quote, open).collect();
            Token::new(Kind::Str, format!("{prefix}{quotes}{body}{quotes}"))
        };
        self.tokens.push(token);
        Some(())
    }

    fn operator(&mut self) -> Option<()> {
        for op in OPERATORS {
            let n = op.chars().count();
            if self.chars.len() >= self.pos + n
                && op
                    .chars()
                    .eq(self.chars[self.pos..self.pos + n].iter().copied())
            {
                self.pos += n;
                self.tokens.push(Token::new(Kind::Op, op));
                return Some(());
            }
        }
        let c = self.chars[self.pos];
        if !SINGLE_OPERATORS.contains(c) {
            return None;
        }
        match c {
            '(' | '[' | '{' => self.depth += 1,
            ')' | ']' | '}' => self.depth = self.depth.checked_sub(1)?,
            _ => {}
        }
        self.pos += 1;
        self.tokens.push(Token::new(Kind::Op, c.to_string()));
        Some(())
    }
}

/// Finds where the body of a string starting at `start` ends (the index of its closing
/// quote); `None` when it does not end. In an f-string, quotes inside a replacement field
/// open nested strings (Python 3.12).
fn scan_string(
    chars: &[char],
    start: usize,
    quote: char,
    triple: bool,
    formatted: bool,
) -> Option<usize> {
    let mut i = start;
    let mut fields = 0usize;
    loop {
        let c = *chars.get(i)?;
        match c {
            '\\' => i += 2,
            '\n' | '\r' if !triple && fields == 0 => return None,
            '{' if formatted => {
                if fields == 0 && chars.get(i + 1) == Some(&'{') {
                    i += 2;
                } else {
                    fields += 1;
                    i += 1;
                }
            }
            '}' if formatted && fields > 0 => {
                fields -= 1;
                i += 1;
            }
            '\'' | '"' if formatted && fields > 0 => {
                let inner_triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                let open = if inner_triple { 3 } else { 1 };
                i = scan_string(chars, i + open, c, inner_triple, false)? + open;
            }
            c if c == quote => {
                if !triple {
                    return Some(i);
                }
                if chars.get(i + 1) == Some(&quote) && chars.get(i + 2) == Some(&quote) {
                    return Some(i);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
}
