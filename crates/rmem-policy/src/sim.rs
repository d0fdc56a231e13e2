//! Offline replay of a page reference string under any [`Policy`] and under Belady's OPT.
//!
//! A reference string is the sequence of pages a program touches, with whether each touch
//! writes ([`Access`]). [`simulate`] replays it with a fixed number of resident pages, feeding
//! the policy exactly the events the live pager feeds it (miss, admission, first write,
//! victim selection), and counts misses (first touches included: the live runtime's
//! zero-fills) and write-backs (dirty victims). [`simulate_opt`] does the same with Belady's
//! rule - evict the page whose next use is farthest away - which no demand-paging policy
//! can beat in misses; it runs in O(n log n) with a precomputed next-use array and a heap.

use crate::{by_name_with, Admission, PageIndex, Policy, PolicyParams, POLICY_NAMES};
use std::collections::{BinaryHeap, HashMap};

/// One page-granular reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub page: PageIndex,
    pub write: bool,
}

/// What a replay counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimResult {
    /// References that found their page not resident (first touches included).
    pub misses: u64,
    /// Of those, first touches (zero-fills live: no policy can avoid them).
    pub first_touches: u64,
    /// Dirty pages evicted (each a page written back).
    pub writebacks: u64,
}

/// Per-page residency for a replay, dense by page index.
#[derive(Default)]
struct Frames {
    /// 0: never touched, 1: not resident, 2: resident clean, 3: resident dirty.
    state: Vec<u8>,
    resident: usize,
}

impl Frames {
    fn get(&mut self, page: PageIndex) -> &mut u8 {
        let i = page.0 as usize;
        if i >= self.state.len() {
            self.state.resize(i + 1, 0);
        }
        &mut self.state[i]
    }
}

/// Replay `trace` with at most `frames` resident pages under `policy`.
pub fn simulate(policy: &mut dyn Policy, trace: &[Access], frames: usize) -> SimResult {
    assert!(frames > 0, "no frames");
    let mut r = SimResult::default();
    let mut f = Frames::default();
    for a in trace {
        let s = *f.get(a.page);
        if s >= 2 {
            if a.write && s == 2 {
                *f.get(a.page) = 3;
                policy.on_write(a.page);
            }
            continue;
        }
        r.misses += 1;
        policy.on_miss(a.page);
        if f.resident == frames {
            let v = policy
                .select_victim()
                .expect("policy holds the resident pages");
            let vs = f.get(v);
            assert!(
                *vs >= 2,
                "{} chose page {} which is not resident",
                policy.name(),
                v.0
            );
            if *vs == 3 {
                r.writebacks += 1;
            }
            *vs = 1;
            f.resident -= 1;
        }
        let how = if s == 0 {
            r.first_touches += 1;
            Admission::ZeroFilled
        } else {
            Admission::Fetched
        };
        *f.get(a.page) = if a.write { 3 } else { 2 };
        f.resident += 1;
        policy.insert(a.page, how);
        if a.write {
            policy.on_write(a.page);
        }
    }
    r
}

/// Replay `trace` with at most `frames` resident pages under Belady's OPT.
pub fn simulate_opt(trace: &[Access], frames: usize) -> SimResult {
    assert!(frames > 0, "no frames");
    // next[i]: position of the next reference to trace[i].page after i (n if none).
    let n = trace.len();
    let mut next = vec![n; n];
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for i in (0..n).rev() {
        if let Some(j) = seen.insert(trace[i].page.0, i) {
            next[i] = j;
        }
    }
    let mut r = SimResult::default();
    let mut f = Frames::default();
    // Resident pages by next use, farthest first, clean before dirty among equals. Entries go
    // stale when a page is referenced again (its next use moves): an entry is live iff it
    // matches `next_use` of its page.
    let mut heap: BinaryHeap<(usize, bool, u64)> = BinaryHeap::new();
    let mut next_use: HashMap<u64, usize> = HashMap::new();
    for (i, a) in trace.iter().enumerate() {
        let s = *f.get(a.page);
        if s < 2 {
            r.misses += 1;
            if s == 0 {
                r.first_touches += 1;
            }
            if f.resident == frames {
                let v = loop {
                    let (u, _, p) = heap.pop().expect("resident pages are in the heap");
                    if next_use.get(&p) == Some(&u) {
                        break p;
                    }
                };
                next_use.remove(&v);
                let vs = f.get(PageIndex(v));
                if *vs == 3 {
                    r.writebacks += 1;
                }
                *vs = 1;
                f.resident -= 1;
            }
            *f.get(a.page) = 2;
            f.resident += 1;
        }
        if a.write {
            *f.get(a.page) = 3;
        }
        next_use.insert(a.page.0, next[i]);
        heap.push((next[i], *f.get(a.page) == 2, a.page.0));
    }
    r
}

/// Replay `trace` with at most `frames` resident pages under true LRU: the page used longest
/// ago leaves. No live policy can run it (the pager sees faults, not uses: only the kernel
/// reads the accessed bits), so it is a reference: what a recency signal for mapped pages
/// (accessed bits, or a second-chance list whose touches cost a fault each) could at best
/// buy over fifo on the trace.
pub fn simulate_lru(trace: &[Access], frames: usize) -> SimResult {
    assert!(frames > 0, "no frames");
    const NIL: usize = usize::MAX;
    let mut r = SimResult::default();
    let mut f = Frames::default();
    // A doubly linked list of the resident pages, most recently used at the head, dense by
    // page index.
    let (mut prev, mut next): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let (mut head, mut tail) = (NIL, NIL);
    for a in trace {
        let p = a.page.0 as usize;
        if p >= prev.len() {
            prev.resize(p + 1, NIL);
            next.resize(p + 1, NIL);
        }
        let s = *f.get(a.page);
        if s >= 2 {
            // Unlink, to be pushed at the head below.
            match prev[p] {
                NIL => head = next[p],
                q => next[q] = next[p],
            }
            match next[p] {
                NIL => tail = prev[p],
                q => prev[q] = prev[p],
            }
        } else {
            r.misses += 1;
            if s == 0 {
                r.first_touches += 1;
            }
            if f.resident == frames {
                let v = tail;
                tail = prev[v];
                match tail {
                    NIL => head = NIL,
                    t => next[t] = NIL,
                }
                let vs = f.get(PageIndex(v as u64));
                if *vs == 3 {
                    r.writebacks += 1;
                }
                *vs = 1;
                f.resident -= 1;
            }
            *f.get(a.page) = 2;
            f.resident += 1;
        }
        if a.write {
            *f.get(a.page) = 3;
        }
        prev[p] = NIL;
        next[p] = head;
        match head {
            NIL => tail = p,
            h => prev[h] = p,
        }
        head = p;
    }
    r
}

/// One row of [`compare`]: a policy (or `OPT`) and what it counted.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub result: SimResult,
}

/// Replay `trace` under every policy in [`POLICY_NAMES`], LRU (a reference no live policy
/// can run: [`simulate_lru`]) and OPT (the last row).
pub fn compare(trace: &[Access], frames: usize, params: &PolicyParams) -> Vec<Row> {
    let mut rows: Vec<Row> = POLICY_NAMES
        .iter()
        .map(|name| {
            let mut p = by_name_with(name, params).expect("listed policy");
            Row {
                name: name.to_string(),
                result: simulate(&mut *p, trace, frames),
            }
        })
        .collect();
    rows.push(Row {
        name: "LRU".into(),
        result: simulate_lru(trace, frames),
    });
    rows.push(Row {
        name: "OPT".into(),
        result: simulate_opt(trace, frames),
    });
    rows
}

/// A small deterministic PRNG (PCG-style LCG) for tests and synthetic traces.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        (self.next_u64() >> 11) % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(pages: &[u64]) -> Vec<Access> {
        pages
            .iter()
            .map(|&p| Access {
                page: PageIndex(p),
                write: false,
            })
            .collect()
    }

    /// The textbook example: 1 2 3 4 1 2 5 1 2 3 4 5 with 3 frames: OPT 7 misses. DLM's
    /// address-order fifo, worked by hand, 10: victims 1, 2, 3, 4, 5, 1, 2 (arrival-order
    /// FIFO would take 9).
    #[test]
    fn belady_textbook() {
        let t = reads(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
        assert_eq!(simulate_opt(&t, 3).misses, 7);
        assert_eq!(simulate(&mut crate::Fifo::new(), &t, 3).misses, 10);
    }

    #[test]
    fn writebacks_count_dirty_victims() {
        let t = vec![
            Access {
                page: PageIndex(0),
                write: true,
            },
            Access {
                page: PageIndex(1),
                write: false,
            },
            Access {
                page: PageIndex(2),
                write: false,
            },
            Access {
                page: PageIndex(3),
                write: false,
            },
        ];
        let r = simulate(&mut crate::Fifo::new(), &t, 2);
        assert_eq!((r.misses, r.first_touches, r.writebacks), (4, 4, 1));
        // OPT breaks ties in next use (never again, here) by evicting clean pages first.
        assert_eq!(simulate_opt(&t, 2).writebacks, 0);
    }

    /// LRU on the textbook string with 3 frames: 10 misses; with 4, 8 (Belady's anomaly is
    /// FIFO's, not LRU's: more frames never miss more). A loop one page longer than memory
    /// misses on every reference, and the last two pages of a hot pair are never evicted by a
    /// scan of the others.
    #[test]
    fn lru_counts_the_textbook_strings() {
        let t = reads(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
        assert_eq!(simulate_lru(&t, 3).misses, 10);
        assert_eq!(simulate_lru(&t, 4).misses, 8);
        let lp: Vec<u64> = (0..50).map(|i| i % 5).collect();
        assert_eq!(simulate_lru(&reads(&lp), 4).misses, 50);
        // 1 and 2 are used between every two others: they stay.
        let mut hot = Vec::new();
        for i in 0..40 {
            hot.extend([1, 2, 10 + i % 8]);
        }
        let r = simulate_lru(&reads(&hot), 4);
        assert_eq!(r.misses, 2 + 40, "{r:?}");
        assert_eq!(simulate_lru(&reads(&hot), 4).writebacks, 0);
    }

    /// OPT is never beaten, on random traces of several shapes and sizes.
    #[test]
    fn opt_is_never_beaten() {
        let mut rng = Lcg(42);
        for case in 0..60 {
            let pages = 8 + rng.below(120);
            let frames = 1 + rng.below(pages) as usize;
            let len = 200 + rng.below(3000) as usize;
            let mut t = Vec::with_capacity(len);
            let mut cur = 0;
            for _ in 0..len {
                // Mix uniform jumps, sequential runs and a hot set.
                cur = match rng.below(4) {
                    0 => rng.below(pages),
                    1 => rng.below(pages.min(6)),
                    _ => (cur + 1) % pages,
                };
                t.push(Access {
                    page: PageIndex(cur),
                    write: rng.below(3) == 0,
                });
            }
            let rows = compare(&t, frames, &PolicyParams::default());
            let opt = rows.last().unwrap().result.misses;
            for r in &rows {
                assert!(
                    r.result.misses >= opt,
                    "case {case}: {} {} < OPT {opt} ({pages} pages, {frames} frames)",
                    r.name,
                    r.result.misses
                );
            }
        }
    }
}
