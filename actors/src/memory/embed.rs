//! Code turned into vectors for similarity: the [`Embedder`] trait and [`LocalEmbedder`], a
//! feature-hashing embedder that needs no network and no model.
//!
//! The local embedder tokenises Python source (identifiers, strings, numbers, punctuation;
//! comments dropped) and hashes features of it into a fixed number of dimensions: the names
//! used, the shape of the code (the functions and methods it calls, attribute chains, keyword
//! arguments with the call they go to, short string arguments with their call) weighted above
//! the names, and character trigrams for what tokens miss. Method and keyword features do not
//! depend on variable names, so `df.fillna(method='ffill')` and `sales.fillna(method="bfill")`
//! come out close, and `df.ffill()` does not.

use xxhash_rust::xxh3::xxh3_64;

/// Dimensions of the local embedder's vectors.
pub const LOCAL_DIMS: usize = 128;

/// Turns code into a vector; vectors of one embedder are compared by cosine similarity.
pub trait Embedder: Send + Sync + 'static {
    /// Names the embedder and its version: stored vectors of another name are recomputed.
    fn name(&self) -> &str;
    /// Length of every vector it returns.
    fn dims(&self) -> usize;
    /// A vector of unit length (all zeros for code with no features, or when the embedder
    /// cannot answer: such code matches nothing).
    fn embed(&self, code: &str) -> Vec<f32>;
    /// Vectors of several texts, in order; embedders that pay per request take them at once.
    fn embed_batch(&self, texts: &[&str]) -> Vec<Vec<f32>> {
        texts.iter().map(|text| self.embed(text)).collect()
    }
    /// Texts it could not embed since it started.
    fn errors(&self) -> u64 {
        0
    }
}

/// The default embedder: hashed token, shape and trigram features (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalEmbedder;

impl Embedder for LocalEmbedder {
    fn name(&self) -> &str {
        "local-hash-v2"
    }

    fn dims(&self) -> usize {
        LOCAL_DIMS
    }

    fn embed(&self, code: &str) -> Vec<f32> {
        let mut vector = vec![0f32; LOCAL_DIMS];
        for (feature, weight) in features(code) {
            let hash = xxh3_64(feature.as_bytes());
            let slot = (hash as usize) % LOCAL_DIMS;
            let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
            vector[slot] += sign * weight;
        }
        normalize(&mut vector);
        vector
    }
}

/// Scales `vector` to unit length (leaves a zero vector alone).
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// A lexical token of Python source.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    Name(String),
    Str(String),
    Num,
    Punct(char),
}

/// Tokens of `code`; comments are dropped, strings keep their (unescaped-as-written) text.
pub(crate) fn tokenize(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' {
            let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
            let open = if triple { 3 } else { 1 };
            let mut j = i + open;
            let mut text = String::new();
            while j < chars.len() {
                if chars[j] == '\\' {
                    j += 2;
                    continue;
                }
                let closes = chars[j] == c
                    && (!triple || (chars.get(j + 1) == Some(&c) && chars.get(j + 2) == Some(&c)));
                if closes || (!triple && chars[j] == '\n') {
                    break;
                }
                text.push(chars[j]);
                j += 1;
            }
            tokens.push(Token::Str(text));
            i = (j + open).min(chars.len());
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A string prefix such as f"..." or rb'...' belongs to the string.
            let prefix = word.len() <= 2 && word.chars().all(|p| "rRbBfFuU".contains(p));
            if !(prefix && matches!(chars.get(i), Some('\'' | '"'))) {
                tokens.push(Token::Name(word));
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || matches!(chars[i], '.' | '_')) {
                i += 1;
            }
            tokens.push(Token::Num);
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// The names of the functions and methods `code` calls, sorted, each once: the shape that
/// tells one failing approach from another with the same error.
pub fn code_shape(code: &str) -> Vec<String> {
    let tokens = tokenize(code);
    let mut calls: Vec<String> = tokens
        .windows(2)
        .filter_map(|pair| match pair {
            [Token::Name(name), Token::Punct('(')] if !is_keyword(name) => Some(name.clone()),
            _ => None,
        })
        .collect();
    calls.sort();
    calls.dedup();
    calls
}

/// A 64-bit set of the functions and methods `code` calls (hashed). Two statements that both
/// call something, but nothing in common, are not the same approach: a check skips such rows
/// without comparing their vectors.
pub fn call_signature(code: &str) -> u64 {
    code_shape(code)
        .iter()
        .fold(0, |bits, call| bits | 1 << (xxh3_64(call.as_bytes()) % 64))
}

/// Whether statements with call signatures `a` and `b` may be the same approach.
pub fn may_match(a: u64, b: u64) -> bool {
    a == 0 || b == 0 || a & b != 0
}

/// The names `code` mentions (a stand-in for the names it reads when the worker's facts are
/// not there), each once.
pub fn mentioned_names(code: &str) -> Vec<String> {
    let tokens = tokenize(code);
    let mut names: Vec<String> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, token)| match token {
            Token::Name(name)
                if !is_keyword(name) && (i == 0 || tokens[i - 1] != Token::Punct('.')) =>
            {
                Some(name.clone())
            }
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

fn is_keyword(name: &str) -> bool {
    matches!(
        name,
        "if" | "elif"
            | "while"
            | "for"
            | "in"
            | "not"
            | "and"
            | "or"
            | "return"
            | "import"
            | "from"
            | "as"
            | "with"
            | "def"
            | "class"
            | "lambda"
            | "print"
            | "is"
            | "else"
            | "try"
            | "except"
            | "None"
            | "True"
            | "False"
            | "assert"
            | "del"
            | "yield"
    )
}

/// The weighted features of `code`.
fn features(code: &str) -> Vec<(String, f32)> {
    let tokens = tokenize(code);
    let mut features = Vec::with_capacity(tokens.len() * 2);
    // The call each open parenthesis belongs to, to tie keywords and strings to it.
    let mut calls: Vec<Option<String>> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| &tokens[p]);
        let next = tokens.get(i + 1);
        match token {
            Token::Name(name) => {
                let after_dot = previous == Some(&Token::Punct('.'));
                if after_dot {
                    features.push((format!("m:.{name}"), 1.5));
                    if let Some(Token::Name(owner)) = i.checked_sub(2).map(|p| &tokens[p]) {
                        features.push((format!("a:{owner}.{name}"), 0.5));
                    }
                } else {
                    features.push((format!("n:{name}"), 0.6));
                }
                if next == Some(&Token::Punct('(')) && !is_keyword(name) {
                    features.push((format!("c:{name}"), 2.0));
                }
                let keyword = next == Some(&Token::Punct('='))
                    && tokens.get(i + 2) != Some(&Token::Punct('='));
                if let (true, Some(Some(call))) = (keyword, calls.last()) {
                    features.push((format!("k:{call}.{name}"), 3.0));
                    if let Some(Token::Str(value)) = tokens.get(i + 2) {
                        features.push((format!("kv:{call}.{name}={value}"), 1.2));
                    }
                }
            }
            Token::Str(text) => {
                if text.chars().count() <= 24 {
                    features.push((format!("s:{text}"), 0.5));
                    if let Some(Some(call)) = calls.last() {
                        features.push((format!("cs:{call}({text})"), 1.0));
                    }
                }
            }
            Token::Punct('(') => {
                let call = match previous {
                    Some(Token::Name(name)) if !is_keyword(name) => Some(name.clone()),
                    _ => None,
                };
                calls.push(call);
            }
            Token::Punct(')') => {
                calls.pop();
            }
            Token::Punct('[') => {
                if let Some(Token::Str(key)) = next {
                    features.push((format!("i:[{key}]"), 2.0));
                }
            }
            Token::Num | Token::Punct(_) => {}
        }
    }
    let squeezed: Vec<char> = code
        .split_whitespace()
        .flat_map(|word| word.chars().chain(std::iter::once(' ')))
        .collect();
    for gram in squeezed.windows(3) {
        features.push((format!("g:{}", gram.iter().collect::<String>()), 0.12));
    }
    features
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &str, b: &str) -> f32 {
        let embedder = LocalEmbedder;
        let (x, y) = (embedder.embed(a), embedder.embed(b));
        x.iter().zip(&y).map(|(p, q)| p * q).sum()
    }

    #[test]
    fn the_same_approach_with_other_names_is_close() {
        let same = cosine(
            "df = df.fillna(method='ffill')",
            "sales = sales.fillna(method='ffill')",
        );
        assert!(same > 0.85, "{same}");
        let fix = cosine("df = df.fillna(method='ffill')", "df = df.ffill()");
        assert!(fix < 0.7, "{fix}");
        let hourly = "idx = pd.date_range('2024-01-01', periods=48, freq='H')";
        let again = cosine(
            hourly,
            "rng = pd.date_range('2024-03-01', periods=12, freq='H')",
        );
        let fixed = cosine(
            hourly,
            "idx = pd.date_range('2024-01-01', periods=48, freq='h')",
        );
        assert!(again > fixed, "{again} {fixed}");
        let unrelated = cosine("x = 1", "df = df.fillna(method='ffill')");
        assert!(unrelated < 0.3, "{unrelated}");
    }

    #[test]
    fn shape_and_names() {
        assert_eq!(
            code_shape("s = pd.read_csv(p, squeeze=True).head()\nprint(s)"),
            ["head", "read_csv"]
        );
        assert_eq!(mentioned_names("y = x.mean() + z # w"), ["x", "y", "z"]);
        assert_eq!(
            tokenize("f'a{b}' + \"c\""),
            [
                Token::Str("a{b}".into()),
                Token::Punct('+'),
                Token::Str("c".into())
            ]
        );
    }
}
