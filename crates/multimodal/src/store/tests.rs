//! The feature store's rules: each transition and budget, and a property test against a
//! naive model.

use proptest::prelude::*;

use super::*;

#[test]
fn an_item_goes_through_its_life_and_leaves_no_memory_behind() {
    let mut store = FeatureStore::new(1_000, 500, AfterPrefill::Discard);
    assert_eq!(store.acquire(7, 300), Ok(Acquired::Encode));
    assert_eq!(
        store.acquire(7, 300),
        Ok(Acquired::Hit(FeatureState::Encoding))
    );
    assert_eq!(store.cpu_used(), 300);
    store.encoded(7).unwrap();
    assert_eq!(store.stage(7), Ok(true));
    assert_eq!(store.staging_used(), 300);
    store.merged(7).unwrap();
    store.prefilled(7).unwrap();
    assert_eq!(store.staging_used(), 0);
    assert_eq!(store.bytes_in(FeatureState::Prefilled), 300);
    store.release(7).unwrap();
    assert_eq!(store.state(7), Some(FeatureState::Prefilled));
    store.release(7).unwrap();
    assert!(store.is_empty());
    assert_eq!((store.cpu_used(), store.staging_used()), (0, 0));
    assert_eq!(store.release(7), Err(StoreError::Unknown { hash: 7 }));
}

#[test]
fn out_of_order_reports_are_errors_that_change_nothing() {
    let mut store = FeatureStore::new(1_000, 500, AfterPrefill::Discard);
    store.acquire(1, 100).unwrap();
    assert!(matches!(
        store.merged(1),
        Err(StoreError::Illegal {
            from: "encoding",
            to: "merged",
            ..
        })
    ));
    assert!(matches!(store.stage(1), Err(StoreError::Illegal { .. })));
    assert!(matches!(
        store.prefilled(1),
        Err(StoreError::Illegal { .. })
    ));
    store.encoded(1).unwrap();
    assert!(matches!(store.encoded(1), Err(StoreError::Illegal { .. })));
    assert!(matches!(store.failed(1), Err(StoreError::Illegal { .. })));
    assert_eq!(store.state(1), Some(FeatureState::EncodedCpu));
    assert_eq!(store.encoded(9), Err(StoreError::Unknown { hash: 9 }));
    assert!(matches!(
        store.acquire(2, 5_000),
        Err(StoreError::TooLarge { which: "CPU", .. })
    ));
}

#[test]
fn kept_items_serve_the_next_request_and_are_evicted_oldest_first_when_room_is_needed() {
    let mut store = FeatureStore::new(1_000, 1_000, AfterPrefill::KeepCpu);
    for hash in [1, 2, 3] {
        assert_eq!(store.acquire(hash, 300), Ok(Acquired::Encode));
        store.encoded(hash).unwrap();
        store.release(hash).unwrap();
    }
    // A second turn sending item 1 again: a hit, no encoding.
    assert_eq!(
        store.acquire(1, 300),
        Ok(Acquired::Hit(FeatureState::EncodedCpu))
    );
    store.release(1).unwrap();
    // Every let-go item was kept (evictable from then on).
    assert_eq!(store.stats().kept, 4);
    // 400 more bytes: the oldest unheld (2, then 3) go; 1 was let go last.
    assert_eq!(store.acquire(4, 400), Ok(Acquired::Encode));
    assert_eq!(store.state(2), None);
    assert_eq!(store.state(3), Some(FeatureState::EncodedCpu));
    assert_eq!(store.stats().evictions, 1);
    // Held or encoding items are never evicted: with nothing evictable, wait.
    store.acquire(3, 300).unwrap();
    store.acquire(1, 300).unwrap();
    assert_eq!(store.acquire(5, 200), Ok(Acquired::Wait));
    assert_eq!(store.stats().waits, 1);
    assert!(store.cpu_used() <= 1_000);
}

#[test]
fn staging_waits_when_full_and_a_failed_encoding_frees_its_reservation() {
    let mut store = FeatureStore::new(1_000, 400, AfterPrefill::Discard);
    for hash in [1, 2] {
        store.acquire(hash, 300).unwrap();
        store.encoded(hash).unwrap();
    }
    assert_eq!(store.stage(1), Ok(true));
    assert_eq!(store.stage(2), Ok(false));
    assert_eq!((store.stats().waits, store.stats().staging_waits), (0, 1));
    store.merged(1).unwrap();
    store.prefilled(1).unwrap();
    assert_eq!(store.stage(2), Ok(true));
    store.acquire(3, 300).unwrap();
    store.failed(3).unwrap();
    assert_eq!(store.state(3), None);
    assert_eq!(store.cpu_used(), 600);
    // A request that goes before its item is prefilled gives its staging back.
    store.release(2).unwrap();
    assert_eq!(store.staging_used(), 0);
    store.release(1).unwrap();
    assert!(store.is_empty());
}

/// One step of a request's life against the store.
#[derive(Debug, Clone)]
enum Op {
    Acquire(u64, u64),
    Encoded(u64),
    Failed(u64),
    Stage(u64),
    Unstage(u64),
    Merged(u64),
    Prefilled(u64),
    Release(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let hash = 0u64..6;
    prop_oneof![
        (hash.clone(), 1u64..400).prop_map(|(h, b)| Op::Acquire(h, b)),
        hash.clone().prop_map(Op::Encoded),
        hash.clone().prop_map(Op::Failed),
        hash.clone().prop_map(Op::Stage),
        hash.clone().prop_map(Op::Unstage),
        hash.clone().prop_map(Op::Merged),
        hash.clone().prop_map(Op::Prefilled),
        hash.prop_map(Op::Release),
    ]
}

/// The naive model: a list of (hash, state, bytes, refs, released order), every rule
/// spelled out with no bookkeeping shortcuts.
#[derive(Debug, Default)]
struct Naive {
    items: Vec<(u64, FeatureState, u64, u32, u64)>,
    clock: u64,
}

impl Naive {
    fn cpu(&self) -> u64 {
        self.items.iter().map(|i| i.2).sum()
    }
    fn staging(&self) -> u64 {
        self.items
            .iter()
            .filter(|i| matches!(i.1, FeatureState::Staged | FeatureState::Merged))
            .map(|i| i.2)
            .sum()
    }
    fn find(&self, hash: u64) -> Option<usize> {
        self.items.iter().position(|i| i.0 == hash)
    }
    fn settle(&mut self, at: usize, policy: AfterPrefill) {
        let item = self.items[at];
        if item.3 > 0 || item.1 == FeatureState::Encoding {
            return;
        }
        match policy {
            AfterPrefill::Discard => {
                self.items.remove(at);
            }
            AfterPrefill::KeepCpu => {
                self.clock += 1;
                self.items[at].1 = FeatureState::EncodedCpu;
                self.items[at].4 = self.clock;
            }
        }
    }
}

proptest! {
    #[test]
    fn the_store_agrees_with_a_naive_model_and_never_exceeds_its_budgets(
        ops in proptest::collection::vec(op(), 1..120),
        keep in any::<bool>(),
    ) {
        let (cpu_budget, staging_budget) = (1_000u64, 500u64);
        let policy = if keep { AfterPrefill::KeepCpu } else { AfterPrefill::Discard };
        let mut store = FeatureStore::new(cpu_budget, staging_budget, policy);
        let mut naive = Naive::default();
        for op in ops {
            match op {
                Op::Acquire(h, b) => {
                    let got = store.acquire(h, b).unwrap();
                    let want = if let Some(at) = naive.find(h) {
                        naive.items[at].3 += 1;
                        Acquired::Hit(naive.items[at].1)
                    } else {
                        let mut evictable: Vec<(u64, u64)> = naive
                            .items
                            .iter()
                            .filter(|i| i.3 == 0 && i.1 == FeatureState::EncodedCpu)
                            .map(|i| (i.4, i.0))
                            .collect();
                        evictable.sort_unstable();
                        let reclaimable: u64 = evictable
                            .iter()
                            .map(|&(_, h)| naive.items[naive.find(h).unwrap()].2)
                            .sum();
                        if cpu_budget - naive.cpu() + reclaimable < b {
                            Acquired::Wait
                        } else {
                            for (_, old) in evictable {
                                if cpu_budget - naive.cpu() >= b {
                                    break;
                                }
                                let at = naive.find(old).unwrap();
                                naive.items.remove(at);
                            }
                            naive.items.push((h, FeatureState::Encoding, b, 1, 0));
                            Acquired::Encode
                        }
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Encoded(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].1 == FeatureState::Encoding => {
                            naive.items[at].1 = FeatureState::EncodedCpu;
                            naive.settle(at, policy);
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.encoded(h).is_ok(), ok);
                }
                Op::Failed(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].1 == FeatureState::Encoding => {
                            naive.items.remove(at);
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.failed(h).is_ok(), ok);
                }
                Op::Stage(h) => {
                    let want = match naive.find(h) {
                        None => None,
                        Some(at) => match naive.items[at].1 {
                            FeatureState::Staged | FeatureState::Merged => Some(true),
                            FeatureState::EncodedCpu | FeatureState::Prefilled => {
                                let fits = naive.staging() + naive.items[at].2 <= staging_budget;
                                if fits {
                                    naive.items[at].1 = FeatureState::Staged;
                                }
                                Some(fits)
                            }
                            FeatureState::Encoding => None,
                        },
                    };
                    prop_assert_eq!(store.stage(h).ok(), want);
                }
                Op::Unstage(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].1 == FeatureState::Staged => {
                            naive.items[at].1 = FeatureState::EncodedCpu;
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.unstage(h).is_ok(), ok);
                }
                Op::Merged(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].1 == FeatureState::Staged => {
                            naive.items[at].1 = FeatureState::Merged;
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.merged(h).is_ok(), ok);
                }
                Op::Prefilled(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].1 == FeatureState::Merged => {
                            naive.items[at].1 = FeatureState::Prefilled;
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.prefilled(h).is_ok(), ok);
                }
                Op::Release(h) => {
                    let ok = match naive.find(h) {
                        Some(at) if naive.items[at].3 > 0 => {
                            naive.items[at].3 -= 1;
                            naive.settle(at, policy);
                            true
                        }
                        _ => false,
                    };
                    prop_assert_eq!(store.release(h).is_ok(), ok);
                }
            }
            prop_assert_eq!(store.cpu_used(), naive.cpu());
            prop_assert_eq!(store.staging_used(), naive.staging());
            prop_assert!(store.cpu_used() <= cpu_budget);
            prop_assert!(store.staging_used() <= staging_budget);
            prop_assert_eq!(store.len(), naive.items.len());
            for state in FeatureState::ALL {
                let want: u64 = naive.items.iter().filter(|i| i.1 == state).map(|i| i.2).sum();
                prop_assert_eq!(store.bytes_in(state), want);
            }
        }
    }
}
