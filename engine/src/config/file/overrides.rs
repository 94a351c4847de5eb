//! The `PYVISOR_<SECTION>__<KEY>` environment overrides: each variable is written into the
//! table read from the file, parsed as the type of its key's default, before the table is
//! deserialized, so it passes the same checks as a value from the file.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::{LoadContext, Origin};
use crate::errors::ConfigError;

/// Prefix of the override variables; the section and key follow, split by `__`.
const OVERRIDE_PREFIX: &str = "PYVISOR_";

/// Writes the `PYVISOR_<SECTION>__<KEY>` variables into `table`, each parsed as the type of
/// its key's default, and returns their names.
pub(super) fn apply_overrides(
    table: &mut Table,
    schema: &Table,
    ctx: &LoadContext,
    origins: &mut BTreeMap<String, Origin>,
) -> Result<Vec<String>, ConfigError> {
    let mut applied = Vec::new();
    for (var, raw) in &ctx.vars {
        // PYVISOR_LOG, PYVISOR_CONFIG and the like have no `__`: they are not overrides.
        let Some((section, key)) = var
            .strip_prefix(OVERRIDE_PREFIX)
            .and_then(|rest| rest.split_once("__"))
        else {
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let name = format!("{section}.{key}");
        let origin = Origin::Env(var.clone());
        let Some(default) = schema
            .get(&section)
            .and_then(Value::as_table)
            .and_then(|keys| keys.get(&key))
        else {
            return Err(ConfigError::UnknownKey { origin, key: name });
        };
        let value = raw
            .to_str()
            .ok_or_else(|| "not valid UTF-8".to_owned())
            .and_then(|raw| parse_like(default, raw));
        let value = match value {
            Ok(value) => value,
            Err(message) => {
                return Err(ConfigError::Invalid {
                    origin,
                    key: name,
                    message,
                })
            }
        };
        // check_keys has made sure an existing section is a table.
        if let Some(keys) = table
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
        {
            keys.insert(key, value);
        }
        origins.insert(name, origin);
        applied.push(var.clone());
    }
    Ok(applied)
}

/// Parses an environment value as the type of `default`: lists are comma-separated, booleans
/// `true`/`false`/`1`/`0`.
fn parse_like(default: &Value, raw: &str) -> Result<Value, String> {
    let trimmed = raw.trim();
    match default {
        Value::String(_) => Ok(Value::String(raw.to_owned())),
        Value::Integer(_) => trimmed
            .parse()
            .map(Value::Integer)
            .map_err(|_| format!("expected an integer, got `{raw}`")),
        Value::Float(_) => trimmed
            .parse()
            .map(Value::Float)
            .map_err(|_| format!("expected a number, got `{raw}`")),
        Value::Boolean(_) => match trimmed.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(Value::Boolean(true)),
            "false" | "0" => Ok(Value::Boolean(false)),
            _ => Err(format!("expected true, false, 1 or 0, got `{raw}`")),
        },
        Value::Array(_) => Ok(Value::Array(
            trimmed
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| Value::String(item.to_owned()))
                .collect(),
        )),
        Value::Datetime(_) | Value::Table(_) => Err(format!(
            "a {} cannot be set from the environment",
            default.type_str()
        )),
    }
}
