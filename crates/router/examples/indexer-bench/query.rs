//! A lookup's query, and how the bench makes lookups.

use switchyard_core::hash::sequence_hashes;
use switchyard_core::{LocalBlockHash, SequenceHash};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{Indexer, OverlapScores};

/// A query's blocks: their local hashes, and the sequence hashes a router has for them
/// (computed when the query is made, outside any timing).
pub struct Query {
    pub locals: Vec<LocalBlockHash>,
    pub seqs: Vec<SequenceHash>,
}

impl Query {
    pub fn new(locals: Vec<LocalBlockHash>) -> Self {
        let seqs = sequence_hashes(&locals);
        Query { locals, seqs }
    }

    pub fn len(&self) -> usize {
        self.locals.len()
    }
}

/// How lookups are made: with the query's sequence hashes (as the frontend and the
/// simulator do), or by local hashes alone (`--keys-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Hashes,
    Keys,
}

impl Lookup {
    pub fn find(self, index: &Indexer, q: &Query, out: &mut OverlapScores) {
        match self {
            Lookup::Hashes => index.find_matches_hashed_into(&q.locals, &q.seqs, out),
            Lookup::Keys => index.find_matches_into(&q.locals, out),
        }
    }

    pub fn find_shared(self, index: &SharedIndexer, q: &Query, out: &mut OverlapScores) {
        match self {
            Lookup::Hashes => index.find_matches_hashed_into(&q.locals, &q.seqs, out),
            Lookup::Keys => index.find_matches_into(&q.locals, out),
        }
    }
}
