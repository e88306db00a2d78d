//! What the settings in this crate share: the error every check returns, and durations
//! that may be turned off.

/// Which key (under `[frontend]` in a configuration file) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} {message}")]
pub struct InvalidConfig {
    pub key: String,
    pub message: String,
}

impl InvalidConfig {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        InvalidConfig {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The key must hold a finite number of at least `min`.
    pub fn check_at_least(key: &str, value: f64, min: f64) -> Result<(), InvalidConfig> {
        if value.is_finite() && value >= min {
            Ok(())
        } else {
            Err(InvalidConfig::new(
                key,
                format!("must be a number of at least {min}, got {value}"),
            ))
        }
    }
}

/// Serde for an optional duration written as a humantime string (`"5s"`) or `"off"`
/// (TOML has no null): `#[serde(with = "crate::settings::duration_or_off")]`.
pub mod duration_or_off {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        if text == "off" {
            return Ok(None);
        }
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            serde::de::Error::custom(format!("{e}: a duration such as \"5s\", or \"off\""))
        })
    }
}
