//! Synthetic page reference strings with the access patterns of the workloads the DLM and
//! swap-in history papers evaluate, for the simulator, the policy benchmark and tests.
//!
//! Each generator takes a size in pages (the memory the workload touches, about) and returns
//! a page-granular reference string: consecutive references to one page are one reference,
//! and interleaved streams (STREAM's `a[i]` and `c[i]`) appear as one reference per page per
//! stream. They model page-level behaviour, not arithmetic; the C workloads in `workloads/`
//! (branch bench) are the real programs.

use crate::sim::{Access, Lcg};
use crate::PageIndex;

/// Names accepted by [`generate`].
pub const PATTERN_NAMES: &[&str] = &["stream", "himeno", "cg", "is", "cluster", "random", "sort"];

struct Out(Vec<Access>);

impl Out {
    fn r(&mut self, page: u64) {
        self.push(page, false);
    }
    fn w(&mut self, page: u64) {
        self.push(page, true);
    }
    fn push(&mut self, page: u64, write: bool) {
        match self.0.last_mut() {
            Some(l) if l.page.0 == page => l.write |= write,
            _ => self.0.push(Access {
                page: PageIndex(page),
                write,
            }),
        }
    }
}

/// The reference string of pattern `name` over about `pages` pages, or `None` if unknown.
pub fn generate(name: &str, pages: u64, seed: u64) -> Option<Vec<Access>> {
    let mut o = Out(Vec::new());
    let mut rng = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    let pages = pages.max(16);
    match name {
        // STREAM: three arrays; copy c=a, scale b=c, add c=a+b, triad a=b+c; 3 rounds.
        "stream" => {
            let n = pages / 3;
            let (a, b, c) = (0, n, 2 * n);
            for i in 0..n {
                o.w(a + i);
                o.w(b + i);
                o.w(c + i);
            }
            for _ in 0..3 {
                for (src, src2, dst) in [(a, a, c), (c, c, b), (a, b, c), (b, c, a)] {
                    for i in 0..n {
                        o.r(src + i);
                        o.r(src2 + i);
                        o.w(dst + i);
                    }
                }
            }
        }
        // Himeno: 19-point Jacobi over p with 12 coefficient arrays, into wrk2, copied back
        // to p; a plane is 4 pages, so p is read a plane behind and ahead.
        "himeno" => {
            let arrays = 14;
            let n = pages / arrays;
            let plane = 4.min(n / 4).max(1);
            let at = |k: u64, i: u64| k * n + i;
            for k in 0..arrays {
                for i in 0..n {
                    o.w(at(k, i));
                }
            }
            for _ in 0..3 {
                for i in plane..n - plane {
                    o.r(at(0, i - plane));
                    o.r(at(0, i));
                    o.r(at(0, i + plane));
                    for k in 1..arrays - 1 {
                        o.r(at(k, i));
                    }
                    o.w(at(arrays - 1, i));
                }
                for i in plane..n - plane {
                    o.r(at(arrays - 1, i));
                    o.w(at(0, i));
                }
            }
        }
        // CG: a sparse matrix (values and column indexes, 3/4 of the pages) streamed per
        // product; x gathered at random; then vector updates over five vectors.
        "cg" => {
            let vec_pages = (pages / 4 / 6).max(2);
            let mat = pages - 6 * vec_pages;
            let x = mat;
            let vecs = |k: u64| mat + k * vec_pages;
            for i in 0..pages {
                o.w(i);
            }
            for _ in 0..4 {
                for m in 0..mat {
                    o.r(m);
                    for _ in 0..2 {
                        o.r(x + rng.below(vec_pages));
                    }
                    o.w(vecs(1) + m * vec_pages / mat);
                }
                for k in 2..6 {
                    for i in 0..vec_pages {
                        o.r(vecs(1) + i);
                        o.w(vecs(k) + i);
                    }
                }
            }
        }
        // IS: keys streamed; each key page scatters into random bucket pages; ranks streamed.
        "is" => {
            let keys = pages / 2;
            let buckets = pages - keys;
            for i in 0..keys {
                o.w(i);
            }
            for _ in 0..3 {
                for i in 0..keys {
                    o.r(i);
                    for _ in 0..4 {
                        o.w(keys + rng.below(buckets));
                    }
                }
                for i in 0..buckets {
                    o.r(keys + i);
                }
            }
        }
        // Cluster 3.0: each step scans the (shrinking) distance matrix for the closest pair,
        // then rewrites two rows at random positions.
        "cluster" => {
            for i in 0..pages {
                o.w(i);
            }
            let steps = 24;
            for s in 0..steps {
                let len = pages - pages * s / (2 * steps);
                for i in 0..len {
                    o.r(i);
                }
                for _ in 0..2 {
                    let row = rng.below(len);
                    for i in row..(row + 4).min(len) {
                        o.w(i);
                    }
                }
            }
        }
        // Uniform random reads and writes.
        "random" => {
            for _ in 0..pages * 12 {
                let p = rng.below(pages);
                if rng.below(3) == 0 {
                    o.w(p);
                } else {
                    o.r(p);
                }
            }
        }
        // Merge sort, ping-pong between two halves: each pass merges pairs of runs, taking
        // the next page from either input as the data decides (at random here).
        "sort" => {
            let n = pages / 2;
            for i in 0..n {
                o.w(i);
            }
            let (mut src, mut dst) = (0, n);
            let mut run = 1;
            while run < n {
                let mut lo = 0;
                while lo < n {
                    let mid = (lo + run).min(n);
                    let hi = (lo + 2 * run).min(n);
                    let (mut i, mut j) = (lo, mid);
                    for out in lo..hi {
                        let take_left = j >= hi || (i < mid && rng.below(2) == 0);
                        if take_left {
                            o.r(src + i);
                            i += 1;
                        } else {
                            o.r(src + j);
                            j += 1;
                        }
                        o.w(dst + out);
                    }
                    lo = hi;
                }
                std::mem::swap(&mut src, &mut dst);
                run *= 2;
            }
        }
        _ => return None,
    }
    Some(o.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{compare, simulate};
    use crate::{Fifo, PolicyParams};

    #[test]
    fn every_pattern_is_generated_and_touches_about_its_size() {
        for name in PATTERN_NAMES {
            let t = generate(name, 512, 1).unwrap();
            let touched = t
                .iter()
                .map(|a| a.page.0)
                .collect::<std::collections::HashSet<_>>();
            assert!(
                touched.len() >= 256 && touched.len() <= 512,
                "{name} touches {}",
                touched.len()
            );
            assert!(
                t.windows(2).all(|w| w[0].page != w[1].page),
                "{name} repeats"
            );
        }
        assert!(generate("nope", 10, 1).is_none());
    }

    /// Fifo over a loop three times the memory misses on almost every reference.
    #[test]
    fn fifo_thrashes_on_stream() {
        let t = generate("stream", 300, 1).unwrap();
        let r = simulate(&mut Fifo::new(), &t, 100);
        assert!(r.misses as usize * 100 >= t.len() * 95);
        let rows = compare(&t, 100, &PolicyParams::default());
        assert!(rows.last().unwrap().result.misses < r.misses * 3 / 4);
    }
}
