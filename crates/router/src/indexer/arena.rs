//! Items by dense index in pages that never move: the storage of the tree's nodes, keys and
//! worker bits, read by lookups on other threads while the writer adds pages.

use std::sync::{Arc, OnceLock};

pub(crate) const PAGE_BITS: u32 = 12;
const DIR_BITS: u32 = 10;
/// Ids below 2^31 (the top bit of a child link is the branch flag).
const DIRS: usize = 1 << (31 - PAGE_BITS - DIR_BITS);

/// 4,096 items, allocated when first needed.
type Page<T> = OnceLock<Arc<[T]>>;
/// 1,024 pages, allocated when first needed.
type Dir<T> = OnceLock<Box<[Page<T>]>>;

/// Items by dense index, in pages of 4,096 that never move: a directory of 512 directories
/// of 1,024 pages, each allocated when first needed.
pub(crate) struct Arena<T> {
    dirs: Box<[Dir<T>]>,
}

impl<T> std::fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Arena { .. }")
    }
}

impl<T: Default> Arena<T> {
    pub(crate) fn new() -> Self {
        Arena {
            dirs: (0..DIRS).map(|_| OnceLock::new()).collect(),
        }
    }

    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        let dir = self
            .dirs
            .get((i >> (PAGE_BITS + DIR_BITS)) as usize)?
            .get()?;
        let page = dir[((i >> PAGE_BITS) & ((1 << DIR_BITS) - 1)) as usize].get()?;
        page.get((i & ((1 << PAGE_BITS) - 1)) as usize)
    }

    /// Page `p` (items `p·4096..`), if allocated.
    #[inline]
    pub(crate) fn page(&self, p: u32) -> Option<&[T]> {
        let dir = self.dirs.get((p >> DIR_BITS) as usize)?.get()?;
        dir.get((p & ((1 << DIR_BITS) - 1)) as usize)?
            .get()
            .map(|page| &page[..])
    }

    /// Page `p` (items `p·4096..`), allocated if needed (the writer's access). `None` only
    /// past the arena's 2^31 items.
    fn ensure_page(&self, p: u32) -> Option<Arc<[T]>> {
        let dir = self
            .dirs
            .get((p >> DIR_BITS) as usize)?
            .get_or_init(|| (0..1 << DIR_BITS).map(|_| OnceLock::new()).collect());
        let page = dir[(p & ((1 << DIR_BITS) - 1)) as usize]
            .get_or_init(|| (0..1 << PAGE_BITS).map(|_| T::default()).collect());
        Some(Arc::clone(page))
    }
}

/// The writer's handles on the pages of an [`Arena`]: the same memory, indexed without the
/// arena's once-checks (the writer is the one that allocates pages).
pub(crate) struct Pages<T> {
    pages: Vec<Arc<[T]>>,
}

impl<T> std::fmt::Debug for Pages<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pages({})", self.pages.len())
    }
}

impl<T: Default> Pages<T> {
    pub(crate) fn new() -> Self {
        Pages { pages: Vec::new() }
    }

    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        self.pages
            .get((i >> PAGE_BITS) as usize)?
            .get((i & ((1 << PAGE_BITS) - 1)) as usize)
    }

    #[inline]
    pub(crate) fn page(&self, p: u32) -> Option<&[T]> {
        self.pages.get(p as usize).map(|page| &page[..])
    }

    /// The item at `i`, its page allocated in `arena` first if needed.
    pub(crate) fn ensure(&mut self, arena: &Arena<T>, i: u32) -> Option<&T> {
        while self.pages.len() <= (i >> PAGE_BITS) as usize {
            let page = arena.ensure_page(self.pages.len() as u32)?;
            self.pages.push(page);
        }
        self.get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn arena_pages_are_allocated_on_first_use_and_never_move() {
        let arena: Arena<AtomicU64> = Arena::new();
        let mut pages = Pages::new();
        assert!(arena.get(0).is_none());
        let first = pages.ensure(&arena, 5000).map(|c| c as *const AtomicU64);
        assert_eq!(arena.get(5000).map(|c| c as *const AtomicU64), first);
        assert!(
            arena.get(1 << 13).is_none(),
            "the next page is not there yet"
        );
        pages.ensure(&arena, 1 << 22);
        assert_eq!(arena.get(5000).map(|c| c as *const AtomicU64), first);
        assert!(arena.get(1 << 22).is_some());
        assert!(arena.get(u32::MAX).is_none());
        assert!(arena.ensure_page(1 << 19).is_none(), "past the last id");
    }
}
