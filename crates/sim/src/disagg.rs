//! Disaggregated prefill and decode in the simulator: the first `prefill` workers compute
//! prompts, the others decode. The routing core picks each request's pair
//! ([`switchyard_router::RoutingCore::route_pair`]); a prefill worker runs the prompt and
//! produces the first token, then the decode worker pulls the KV blocks it does not hold
//! over the link (bytes per token from the model shape) and generates the rest. Short
//! uncached prompts, and any prompt while the prefill pool is saturated, are prefilled on
//! the decode worker itself.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use thiserror::Error;

use crate::faults::Link;
use crate::report::Distribution;

/// A disaggregated fleet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisaggSim {
    /// Prefill workers; the fleet's other workers decode.
    pub prefill: u32,
    /// The link KV moves over from prefill to decode workers.
    pub link: Link,
    /// Bytes one token's KV takes (see [`crate::ModelShape`]).
    pub kv_bytes_per_token: u64,
}

/// `P:D`: how many prefill and decode workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub prefill: u32,
    pub decode: u32,
}

/// Text that is no [`Split`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a split is PREFILL:DECODE worker counts, both at least 1, got {0:?}")]
pub struct InvalidSplit(pub String);

impl FromStr for Split {
    type Err = InvalidSplit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || InvalidSplit(s.to_string());
        let (p, d) = s.split_once(':').ok_or_else(error)?;
        let prefill: u32 = p.trim().parse().map_err(|_| error())?;
        let decode: u32 = d.trim().parse().map_err(|_| error())?;
        if prefill == 0 || decode == 0 {
            return Err(error());
        }
        Ok(Split { prefill, decode })
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.prefill, self.decode)
    }
}

/// What disaggregation did in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DisaggReport {
    pub prefill_workers: u32,
    pub decode_workers: u32,
    /// Requests prefilled on a prefill worker.
    pub remote_prefills: u64,
    /// Prefilled on the decode worker: the uncached part was short.
    pub local_short: u64,
    /// Prefilled on the decode worker: the prefill pool was saturated.
    pub local_saturated: u64,
    /// Prefilled on the decode worker: no prefill worker could take it (failed, excluded).
    pub local_unavailable: u64,
    /// Prefilled on the decode worker: its media were not encoded, and only that worker
    /// holds them.
    pub local_media: u64,
    /// KV moved from prefill to decode workers.
    pub transferred_bytes: u64,
    /// Prompt tokens the decode workers already held (not moved).
    pub reused_tokens: u64,
    pub transfer_ms: Distribution,
    /// Transfers abandoned because their prefill worker failed (re-prefilled elsewhere).
    pub lost_transfers: u64,
}

impl DisaggReport {
    /// A request prefilled on its decode worker, for `reason`.
    pub(crate) fn count_local(&mut self, reason: switchyard_router::LocalReason) {
        use switchyard_router::LocalReason;
        *match reason {
            LocalReason::Short => &mut self.local_short,
            LocalReason::Saturated => &mut self.local_saturated,
            LocalReason::Unavailable => &mut self.local_unavailable,
            LocalReason::HeldMedia => &mut self.local_media,
        } += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_parse_and_refuse_empty_pools() {
        assert_eq!(
            "2:6".parse::<Split>(),
            Ok(Split {
                prefill: 2,
                decode: 6
            })
        );
        assert_eq!("3:5".parse::<Split>().unwrap().to_string(), "3:5");
        for bad in ["0:4", "4:0", "4", "a:b", "2:3:4", ""] {
            let err = bad.parse::<Split>().unwrap_err();
            assert!(err.to_string().contains("PREFILL:DECODE"), "{bad}: {err}");
        }
    }
}
