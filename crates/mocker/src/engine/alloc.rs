//! A sequence's KV blocks: given all at once or not at all, and returned.

use crate::blocks::{BlockId, BlockManager, Lookup, OutOfBlocks};
use crate::sequence::Sequence;

/// Gives `seq` the blocks for its first `target` tokens, all or nothing.
///
/// Cached blocks are shared first, so that allocating new ones (which may evict) can never
/// evict a block this same allocation relies on.
pub(super) fn allocate(
    blocks: &mut BlockManager,
    seq: &mut Sequence,
    target: u32,
) -> Result<(), OutOfBlocks> {
    let block_size = seq.tokens.block_size();
    let first = seq.full_held as usize;
    let full_target = (target / block_size) as usize;
    let want_partial = !target.is_multiple_of(block_size);
    let had_partial = seq.partial_held();
    let hashes = seq.tokens.sequence_hashes();
    let locals = seq.tokens.local_hashes();

    // Plan: the cached block for each new full block (or none), and how many new blocks
    // that leaves to find, against what is free or evictable. Past the first block that
    // is not cached the rest are taken as not cached without a lookup: a block's hash names
    // its whole prefix, and tails are evicted before their prefixes, so a cached block
    // after an uncached one is rare; `store_or_share` still finds it if it happens.
    let mut plan: smallvec::SmallVec<[Lookup; 8]> = smallvec::SmallVec::new();
    let (mut new, mut reactivated, mut freed) = (0usize, 0usize, 0usize);
    let mut missed = false;
    for (i, &hash) in hashes.iter().enumerate().take(full_target).skip(first) {
        let promoting = i == first && had_partial;
        let lookup = if missed && !promoting {
            Lookup::Miss
        } else {
            blocks.lookup(hash)
        };
        reactivated += usize::from(matches!(lookup, Lookup::Inactive(_)));
        if promoting {
            freed += usize::from(lookup != Lookup::Miss);
        } else if lookup == Lookup::Miss {
            new += 1;
            missed = true;
        }
        plan.push(lookup);
    }
    let keeps_partial = had_partial && full_target == first;
    if want_partial && !keeps_partial {
        new += 1;
    }
    if new > blocks.free() + freed + blocks.inactive() - reactivated {
        return Err(OutOfBlocks);
    }

    let parent = |i: usize| i.checked_sub(1).map(|p| hashes[p]);
    let partial = if had_partial && !keeps_partial {
        seq.blocks.pop()
    } else {
        None
    };
    let mut ids: smallvec::SmallVec<[BlockId; 8]> = smallvec::SmallVec::with_capacity(plan.len());
    for (k, lookup) in plan.iter().enumerate() {
        let i = first + k;
        let id = match (partial.filter(|_| k == 0), *lookup) {
            (Some(p), _) => blocks.promote(p, hashes[i], locals[i], parent(i)),
            (None, Lookup::Active(id) | Lookup::Inactive(id)) => {
                blocks.share(id);
                id
            }
            (None, Lookup::Miss) => BlockId::MAX,
        };
        ids.push(id);
    }
    // Shares done, evict for all the new blocks at once (see `BlockManager::reserve`).
    blocks.reserve(new)?;
    for (k, id) in ids.iter_mut().enumerate() {
        if *id == BlockId::MAX {
            let i = first + k;
            *id = blocks.store_or_share(hashes[i], locals[i], parent(i))?;
        }
    }
    if keeps_partial {
        // The held tail block stays where it is, after the full blocks.
    } else {
        seq.blocks.extend_from_slice(&ids);
        if want_partial {
            let id = blocks.use_partial()?;
            seq.blocks.push(id);
        }
    }
    seq.full_held = full_target as u32;
    Ok(())
}

/// Returns a finished or cancelled sequence's blocks, tail first, keeping them cached.
pub(super) fn release(blocks: &mut BlockManager, seq: &Sequence) {
    for &id in seq.blocks.iter().rev() {
        blocks.release(id);
    }
}
