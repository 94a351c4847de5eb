//! JSON parsing that notices duplicate object keys. `serde_json::Value` keeps the last of
//! two equal keys without a word, so `{"session_id": "mine", "session_id": "yours"}` would
//! mean whatever the parser happened to keep; here the first duplicate is reported with its
//! path, and the caller refuses the message.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A parsed value and the path of its first duplicate key (`params.limits.memory_mb`,
/// `[2].id`), if it has one.
#[derive(Debug)]
pub struct Checked {
    pub value: Value,
    pub duplicate: Option<String>,
}

/// Parses `bytes` as one JSON value, recording the first duplicate key.
pub fn parse(bytes: &[u8]) -> serde_json::Result<Checked> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let checked = CheckedSeed.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(checked)
}

/// A JSON-RPC message as it was parsed: a batch keeps the duplicate of each request apart.
#[derive(Debug)]
pub enum Message {
    Batch(Vec<Checked>),
    Object(Checked),
    /// Anything else (not a request).
    Other,
}

/// Parses `bytes` as one JSON-RPC message.
pub fn parse_message(bytes: &[u8]) -> serde_json::Result<Message> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let message = deserializer.deserialize_any(MessageVisitor)?;
    deserializer.end()?;
    Ok(message)
}

/// Parses `bytes` as a JSON object for the params of a method: a duplicate key is an
/// error that names it.
pub fn parse_params(bytes: &[u8]) -> Result<Value, ParamsError> {
    let checked = parse(bytes).map_err(ParamsError::Syntax)?;
    match checked.duplicate {
        Some(path) => Err(ParamsError::Duplicate(path)),
        None => Ok(checked.value),
    }
}

/// Why params could not be read.
#[derive(Debug)]
pub enum ParamsError {
    /// Not JSON.
    Syntax(serde_json::Error),
    /// A key that appears twice in one object, by its path.
    Duplicate(String),
}

/// The message of a duplicate key at `path`.
pub fn duplicate_message(path: &str) -> String {
    format!("{path}: duplicate key")
}

struct CheckedSeed;

impl<'de> DeserializeSeed<'de> for CheckedSeed {
    type Value = Checked;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Checked, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

fn plain<E>(value: Value) -> Result<Checked, E> {
    Ok(Checked {
        value,
        duplicate: None,
    })
}

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Checked, E> {
        plain(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Checked, E> {
        plain(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Checked, E> {
        plain(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Checked, E> {
        plain(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Checked, E> {
        plain(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Checked, E> {
        plain(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        plain(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Checked, E> {
        plain(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        let mut items = Vec::new();
        let mut duplicate = None;
        while let Some(item) = seq.next_element_seed(CheckedSeed)? {
            if duplicate.is_none() {
                duplicate = item
                    .duplicate
                    .map(|path| format!("[{}]{}", items.len(), joined(&path)));
            }
            items.push(item.value);
        }
        Ok(Checked {
            value: Value::Array(items),
            duplicate,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let mut object = Map::new();
        let mut duplicate = None;
        while let Some(key) = map.next_key::<String>()? {
            let item = map.next_value_seed(CheckedSeed)?;
            if duplicate.is_none() {
                if object.contains_key(&key) {
                    duplicate = Some(key.clone());
                } else if let Some(path) = item.duplicate {
                    duplicate = Some(format!("{key}{}", joined(&path)));
                }
            }
            object.insert(key, item.value);
        }
        Ok(Checked {
            value: Value::Object(object),
            duplicate,
        })
    }
}

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(CheckedSeed)? {
            items.push(item);
        }
        Ok(Message::Batch(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Message, A::Error> {
        CheckedVisitor.visit_map(map).map(Message::Object)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Message, E> {
        Ok(Message::Other)
    }
}

/// `path` as it continues a parent's path: `.key` or `[3]`.
fn joined(path: &str) -> String {
    if path.starts_with('[') {
        path.to_owned()
    } else {
        format!(".{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_found_with_their_path() {
        let cases = [
            (r#"{"a": 1, "a": 2}"#, Some("a")),
            (
                r#"{"params": {"limits": {"x": 1, "x": 1}}}"#,
                Some("params.limits.x"),
            ),
            (r#"[{"id": 1}, {"id": 1, "id": 2}]"#, Some("[1].id")),
            (r#"{"a": [{"b": 1, "b": 1}]}"#, Some("a[0].b")),
            (r#"{"a": 1, "b": {"a": 2}}"#, None),
        ];
        for (text, expected) in cases {
            let checked = parse(text.as_bytes()).expect(text);
            assert_eq!(checked.duplicate.as_deref(), expected, "{text}");
        }
    }

    #[test]
    fn values_come_out_as_serde_json_reads_them() {
        let text = r#"{"n": -3, "u": 18446744073709551615, "f": 0.5, "s": "\u00e9", "z": null,
                      "l": [true, false, {}]}"#;
        let checked = parse(text.as_bytes()).unwrap();
        let expected: Value = serde_json::from_str(text).unwrap();
        assert_eq!(checked.value, expected);
        assert!(parse(b"{} x").is_err(), "trailing bytes are refused");
    }
}
