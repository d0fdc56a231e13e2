//! rmem-policy: page replacement policies behind the [`Policy`] trait.
//!
//! Entry point: [`by_name`], which builds a policy from its `--policy` name. The runtime feeds
//! a policy the events it can see: a page becoming resident and evictable ([`Policy::insert`]),
//! a first write to a resident page ([`Policy::on_write`]), a page leaving the evictable set
//! for any other reason ([`Policy::remove`]), and asks it for victims
//! ([`Policy::select_victim`]). A policy only ever returns a page it holds, and forgets it as
//! it returns it, so it can never pick a page that is in flight. The same trait drives the
//! live runtime and offline simulation.
#![forbid(unsafe_code)]

mod bitset;
mod fifo;

pub use bitset::PageSet;
pub use fifo::Fifo;

/// Index of a DLM page within the client's region (address = base + index * page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageIndex(pub u64);

/// How a page became resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Fetched from a memory server (a swap-in).
    Fetched,
    /// Zero-filled locally: never written before.
    ZeroFilled,
}

/// A page replacement policy.
pub trait Policy: Send {
    /// The `--policy` name.
    fn name(&self) -> &'static str;
    /// `page` is resident and may be chosen as a victim from now on.
    fn insert(&mut self, page: PageIndex, how: Admission);
    /// `page` took its first write since it became resident.
    fn on_write(&mut self, _page: PageIndex) {}
    /// `page` is no longer evictable (freed by the program). No-op if not held.
    fn remove(&mut self, page: PageIndex);
    /// Choose a victim among the held pages and forget it. `None` when none is held.
    fn select_victim(&mut self) -> Option<PageIndex>;
    /// Pages held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &["fifo"];

/// Build a policy from its name, or `None` if the name is unknown.
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    match name {
        "fifo" => Some(Box::new(Fifo::new())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy only ever returns pages it holds, each once.
    #[test]
    fn policies_only_pick_held_pages() {
        for name in POLICY_NAMES {
            let mut p = by_name(name).unwrap();
            let mut held = std::collections::BTreeSet::new();
            let mut x: u64 = 12345;
            for step in 0..20_000u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let page = PageIndex((x >> 33) % 500);
                match (x >> 20) % 4 {
                    0 | 1 => {
                        if held.insert(page) {
                            p.insert(page, Admission::Fetched);
                        }
                    }
                    2 => {
                        held.remove(&page);
                        p.remove(page);
                    }
                    _ => match p.select_victim() {
                        Some(v) => assert!(
                            held.remove(&v),
                            "{name} picked {v:?} not held at step {step}"
                        ),
                        None => assert!(held.is_empty()),
                    },
                }
                assert_eq!(p.len(), held.len());
            }
        }
    }
}
