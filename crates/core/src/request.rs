//! Request identity.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A request's id inside Switchyard (the HTTP-facing id is a separate string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The id a request's remote prefill is tracked under, apart from the request itself
    /// (which is tracked on its decode worker): a 63-bit mix of the id, so it collides with
    /// another request's as rarely as random ids do. The top bit stays clear, as in every
    /// id a frontend gives its own requests (a frontend marks other frontends' requests
    /// with it).
    pub fn prefill_stage(self) -> RequestId {
        // splitmix64's finaliser over the id and a constant of this use.
        let mut x = self.0 ^ 0x7072_6566_696c_6c21;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        RequestId((x ^ (x >> 31)) >> 1)
    }
}

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
