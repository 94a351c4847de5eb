//! Decoding the params of a method and encoding its result: the field named in every error,
//! the `owner` param taken out for the caller's scope, and the bounds on names.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::errors::RpcError;

/// The longest session name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Refuses a session name that is empty or longer than [`MAX_NAME_BYTES`].
pub(super) fn check_name(name: &str) -> Result<(), RpcError> {
    if name.is_empty() {
        return Err(RpcError::invalid_params("name: must not be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(RpcError::invalid_params(format!(
            "name: at most {MAX_NAME_BYTES} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

/// Takes the `owner` param out of `params` (a string, or null for none).
pub(super) fn take_owner(params: &mut Option<Value>) -> Result<Option<String>, RpcError> {
    let Some(Value::Object(map)) = params else {
        return Ok(None);
    };
    match map.remove("owner") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(owner)) => Ok(Some(owner)),
        Some(other) => Err(RpcError::invalid_params(format!(
            "owner: expected a string, got {other}"
        ))),
    }
}

pub(super) fn decode<T: DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    let params = params.unwrap_or(Value::Null);
    if !params.is_object() {
        return Err(RpcError::invalid_params("expected an object"));
    }
    // The path names the field in the message, e.g. "limits.memory_mb: invalid type".
    serde_path_to_error::deserialize(params).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            RpcError::invalid_params(inner)
        } else {
            RpcError::invalid_params(format!("{path}: {inner}"))
        }
    })
}

/// Like [`decode`], for methods whose params are all optional: absent params are defaults.
pub(super) fn decode_or_default<T: DeserializeOwned + Default>(
    params: Option<Value>,
) -> Result<T, RpcError> {
    match params {
        None | Some(Value::Null) => Ok(T::default()),
        Some(params) => decode(Some(params)),
    }
}

pub(super) fn no_params(params: Option<Value>) -> Result<(), RpcError> {
    match params {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(map)) if map.is_empty() => Ok(()),
        Some(Value::Array(list)) if list.is_empty() => Ok(()),
        Some(_) => Err(RpcError::invalid_params("this method takes no params")),
    }
}

/// The result as JSON text, serialized once: a response embeds it as it is.
pub(super) fn encode<T: Serialize>(value: T) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(&value)
        .map_err(|err| RpcError::new(super::errors::code::INTERNAL_ERROR, err.to_string()))
}
