//! Stride detection for prefetching (`RMEM_PREFETCH=on`), after Leap's majority trend
//! (Al Maruf and Chowdhury, "Effectively Prefetching Remote Memory with Leap", ATC 2020).
//!
//! The pager tells the [`Prefetcher`] about each remote fault (a miss, or a touch of a page
//! whose prefetch is still in flight). It keeps the last [`HISTORY`] page deltas; if one delta
//! is a strict majority of them (found with Boyer-Moore's vote), the stream has that stride and
//! the prefetcher asks for the next pages along it. The window (how far ahead) starts at 2
//! and doubles each time the program arrives inside or just past what was prefetched (the
//! prefetches were used), up to a limit; it drops back when the trend breaks. No majority: no
//! prefetch, so random access costs only this bookkeeping.

/// Deltas remembered.
pub const HISTORY: usize = 8;
/// Largest stride followed, in pages (beyond it, a "stream" is just far jumps).
const STRIDE_MAX: i64 = 64;

/// A stride detector with an adaptive window.
#[derive(Debug)]
pub struct Prefetcher {
    deltas: [i64; HISTORY],
    filled: usize,
    next: usize,
    last: Option<u64>,
    window: u64,
    window_max: u64,
    /// The farthest page already prefetched along the current trend, and its stride.
    issued: Option<(u64, i64)>,
}

impl Prefetcher {
    /// `window_max`: most pages ahead to prefetch (at least 1).
    pub fn new(window_max: u64) -> Prefetcher {
        Prefetcher {
            deltas: [0; HISTORY],
            filled: 0,
            next: 0,
            last: None,
            window: 0,
            window_max: window_max.max(1),
            issued: None,
        }
    }

    /// The majority delta of the history, if any.
    fn trend(&self) -> Option<i64> {
        let d = &self.deltas[..self.filled];
        let (mut cand, mut votes) = (0i64, 0usize);
        for &x in d {
            if votes == 0 {
                cand = x;
                votes = 1;
            } else if x == cand {
                votes += 1;
            } else {
                votes -= 1;
            }
        }
        let count = d.iter().filter(|&&x| x == cand).count();
        (count * 2 > d.len() && d.len() >= 3).then_some(cand)
    }

    /// A remote fault on `page`. Returns the pages to prefetch now, nearest first.
    pub fn on_fault(&mut self, page: u64) -> Vec<u64> {
        // Did the program arrive inside (or just past) what was prefetched? Then the stream
        // went on through pages it touched without faulting: count it as one more stride,
        // not as the jump between the faults we saw.
        let used = self.issued.filter(|&(far, s)| {
            let ahead = (far as i64 - page as i64) * s.signum();
            ahead >= -s.abs() && ahead <= self.window as i64 * s.abs()
        });
        if let Some(last) = self.last {
            self.deltas[self.next] = match used {
                Some((_, s)) => s,
                None => page as i64 - last as i64,
            };
            self.next = (self.next + 1) % HISTORY;
            self.filled = (self.filled + 1).min(HISTORY);
        }
        self.last = Some(page);
        let Some(stride) = self.trend().filter(|s| *s != 0 && s.abs() <= STRIDE_MAX) else {
            self.window = 0;
            self.issued = None;
            return Vec::new();
        };
        let used = used.is_some_and(|(_, s)| s == stride);
        self.window = if used {
            (self.window * 2).clamp(2, self.window_max)
        } else {
            2.min(self.window_max)
        };
        let from = match self.issued {
            Some((far, s)) if used && s == stride => far as i64,
            _ => page as i64,
        };
        let until = page as i64 + stride * self.window as i64;
        let mut out = Vec::new();
        let mut q = from + stride;
        while (until - q) * stride.signum() >= 0 {
            if q < 0 {
                break;
            }
            out.push(q as u64);
            q += stride;
        }
        if let Some(&far) = out.last() {
            self.issued = Some((far, stride));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_stream_grows_the_window() {
        let mut p = Prefetcher::new(16);
        assert!(p.on_fault(100).is_empty());
        assert!(p.on_fault(101).is_empty());
        assert!(p.on_fault(102).is_empty());
        // Three deltas of 1: a trend. Window 2.
        assert_eq!(p.on_fault(103), vec![104, 105]);
        // The program reached the prefetched pages: window 4, continuing from 105.
        assert_eq!(p.on_fault(104), vec![106, 107, 108]);
        assert_eq!(p.on_fault(106), vec![109, 110, 111, 112, 113, 114]);
    }

    #[test]
    fn strided_and_backwards_streams() {
        let mut p = Prefetcher::new(4);
        for q in [40, 37, 34, 31] {
            p.on_fault(q);
        }
        assert_eq!(p.on_fault(28), vec![22, 19, 16]);
    }

    #[test]
    fn random_faults_prefetch_nothing() {
        let mut p = Prefetcher::new(16);
        let mut x = 1u64;
        let mut issued = 0;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            issued += p.on_fault((x >> 33) % 100_000).len();
        }
        assert_eq!(issued, 0);
    }
}
