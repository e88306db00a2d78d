//! Request identity.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A request's id inside Switchyard (the HTTP-facing id is a separate string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Priority tiers: under overload the lowest are shed first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    BestEffort,
    #[default]
    Standard,
    Premium,
}

impl Priority {
    /// Lowest first.
    pub const ALL: [Priority; 3] = [Priority::BestEffort, Priority::Standard, Priority::Premium];

    pub fn name(self) -> &'static str {
        match self {
            Priority::BestEffort => "best_effort",
            Priority::Standard => "standard",
            Priority::Premium => "premium",
        }
    }

    /// 0 for the lowest tier.
    pub fn rank(self) -> usize {
        self as usize
    }
}
