//! What synthesis learns from a trace.

use switchyard_core::trace::MooncakeRecord;

use crate::prefix::{CoreTree, PrefixTrie, Step};
use crate::stats::Cdf;
use crate::trace_io::{RecordError, RecordProblem};

/// The learned structure of a trace: the core prefix tree with per-node next-step CDFs, and
/// empirical distributions for everything outside it.
#[derive(Debug, Clone)]
pub struct SynthModel {
    pub(super) block_size: u32,
    pub(super) core: CoreTree,
    /// `transitions[i]`: where a request goes after core node `i`.
    pub(super) transitions: Vec<Cdf<Step>>,
    /// `unique_blocks[i]`: blocks of unique prompt of the requests that left core node `i`
    /// into one (empty where none did). Conditioned on the exit node because the two are
    /// far from independent: in conversation traces a first turn leaves near the root with a
    /// long new prompt, a later turn leaves deep in its history with a short one.
    pub(super) unique_blocks: Vec<Cdf<u64>>,
    /// Tokens in the last block (1..=block size), over requests with at least one block.
    pub(super) residual_tokens: Cdf<u64>,
    pub(super) output_length: Cdf<u64>,
    /// Gaps between consecutive arrivals, in milliseconds.
    pub(super) inter_arrival_ms: Cdf<u64>,
    pub(super) source_requests: usize,
}

impl SynthModel {
    /// Learns from `records`, whose hash ids each stand for `block_size` tokens. Fails if the
    /// ids do not form a prefix tree or an input length does not fit its hash ids.
    pub fn learn(records: &[MooncakeRecord], block_size: u32) -> Result<Self, RecordError> {
        let trie = PrefixTrie::build(records)?;
        let core = CoreTree::from_trie(&trie);
        let transitions = (0..core.nodes().len())
            .map(|i| core.transitions(i))
            .collect();

        let mut residuals = Vec::with_capacity(records.len());
        for (record, request) in records.iter().enumerate() {
            if let Some(residual) = residual_tokens(request, block_size)
                .map_err(|problem| RecordError { record, problem })?
            {
                residuals.push(residual);
            }
        }
        let mut tails: Vec<Vec<u64>> = vec![Vec::new(); core.nodes().len()];
        for request in records {
            let (shared, tail) = trie.split(&request.hash_ids);
            if tail > 0 {
                let exit = request.hash_ids[..shared]
                    .last()
                    .and_then(|&id| trie.node_of(id))
                    .and_then(|node| core.node_ending_at(node))
                    .unwrap_or(CoreTree::ROOT);
                tails[exit].push(tail as u64);
            }
        }

        let mut stamps: Vec<u64> = records.iter().map(|r| r.timestamp).collect();
        stamps.sort_unstable();

        Ok(Self {
            block_size,
            core,
            transitions,
            unique_blocks: tails.into_iter().map(Cdf::of_values).collect(),
            residual_tokens: Cdf::of_values(residuals),
            output_length: Cdf::of_values(records.iter().map(|r| r.output_length)),
            inter_arrival_ms: Cdf::of_values(stamps.windows(2).map(|w| w[1] - w[0])),
            source_requests: records.len(),
        })
    }

    /// The learned core tree.
    pub fn core(&self) -> &CoreTree {
        &self.core
    }

    /// Requests in the source trace.
    pub fn source_requests(&self) -> usize {
        self.source_requests
    }
}

/// Tokens in the request's last block, `None` for a request with no blocks (which must then
/// have no input).
fn residual_tokens(
    request: &MooncakeRecord,
    block_size: u32,
) -> Result<Option<u64>, RecordProblem> {
    let blocks = request.hash_ids.len() as u64;
    let size = u64::from(block_size);
    let (min, max) = match blocks {
        0 => (0, 0),
        n => ((n - 1) * size + 1, n * size),
    };
    if !(min..=max).contains(&request.input_length) {
        return Err(RecordProblem::LengthMismatch {
            input_length: request.input_length,
            blocks,
            block_size,
            min,
            max,
        });
    }
    Ok(blocks
        .checked_sub(1)
        .map(|full| request.input_length - full * size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(input_length: u64, ids: &[u64]) -> MooncakeRecord {
        MooncakeRecord {
            media: Vec::new(),
            timestamp: 0,
            input_length,
            output_length: 3,
            hash_ids: ids.to_vec(),
            ..MooncakeRecord::default()
        }
    }

    #[test]
    fn residual_is_the_last_blocks_tokens() {
        assert_eq!(residual_tokens(&row(1100, &[1, 2, 3]), 512), Ok(Some(76)));
        assert_eq!(residual_tokens(&row(1024, &[1, 2]), 512), Ok(Some(512)));
        assert_eq!(residual_tokens(&row(0, &[]), 512), Ok(None));
    }

    #[test]
    fn input_length_that_does_not_fit_is_rejected_with_the_range() {
        let err = SynthModel::learn(&[row(10, &[1]), row(2000, &[1, 2])], 512).unwrap_err();
        assert_eq!(err.record, 1);
        assert_eq!(
            err.to_string(),
            "record 2 of the trace: input_length 2000 does not fit 2 hash ids of 512 tokens \
             (expected 513..=1024); is the block size right?"
        );
    }

    #[test]
    fn learns_unique_tails_and_gaps() {
        let mut rows = vec![row(1500, &[1, 2, 3]), row(600, &[1, 4]), row(512, &[1])];
        rows[1].timestamp = 40;
        rows[2].timestamp = 100;
        let model = SynthModel::learn(&rows, 512).unwrap();
        // [1, 2, 3] leaves the core after block 1 with two unique blocks, [1, 4] with one.
        let tails: Vec<_> = model.unique_blocks[1].probabilities().collect();
        assert_eq!(tails, vec![(1, 0.5), (2, 0.5)]);
        let gaps: Vec<_> = model
            .inter_arrival_ms
            .probabilities()
            .map(|p| p.0)
            .collect();
        assert_eq!(gaps, vec![40, 60]);
        assert_eq!(model.core().blocks(), 1);
        assert_eq!(model.source_requests(), 3);
    }
}
