//! Stream detection for prefetching (`RMEM_PREFETCH=on`).
//!
//! The pager tells the [`Prefetcher`] about each remote fault (a miss, or a touch of a page
//! whose prefetch is still in flight). Programs rarely make one stream of faults: STREAM's
//! triad walks three arrays at once, a stencil several planes, a threaded program one range
//! per thread, and their faults interleave. A single trend over the last faults (Leap's
//! majority vote) sees only the jumps between the streams. So the prefetcher follows up to
//! [`STREAMS`] streams at once, as the kernel's readahead follows each open file:
//!
//! - a fault `stride` pages after a stream's last fault, or inside (or just past) what was
//!   prefetched for it, continues that stream;
//! - a fault further along a confirmed stream, past pages that are all resident or on their
//!   way, continues it too: the program ran over them without faulting. A replacement policy
//!   that holds part of a loop leaves such islands in every array, and a stream that had to
//!   be confirmed again after each would fault three times per island instead of prefetching;
//! - a fault near the last fault of a stream not yet confirmed gives it a new stride;
//! - any other fault starts a new stream, in place of the one unused longest.
//!
//! A stream is confirmed after [`CONFIRM`] equal strides; from then on each continuation
//! prefetches the next pages along it. The window (how far ahead) starts at 2 and doubles with
//! each continuation, up to a limit. A continuation off the stride's grid (a stride that is
//! not a whole number of pages: rows of 16000 bytes at 4 KiB pages go 4, 4, 4, 3, ...) starts
//! the window again at 2, and from then on the window stays within the strides the grid held
//! between its last two slips, until it has held twice that. A random fault almost never
//! continues a stream, so random access costs only this bookkeeping.

/// Streams followed at once.
pub const STREAMS: usize = 16;
/// Equal strides that confirm a stream.
pub const CONFIRM: u32 = 3;
/// Largest stride followed, in pages (beyond it, a "stream" is just far jumps).
const STRIDE_MAX: i64 = 64;
/// Most strides a confirmed stream may skip over resident pages and still continue.
const SKIP_MAX: i64 = 4096;

#[derive(Debug, Clone, Copy)]
struct Stream {
    last: u64,
    /// 0 while only one fault is known.
    stride: i64,
    /// Consecutive faults `stride` apart.
    seen: u32,
    window: u64,
    /// The farthest page prefetched along this stream.
    issued: Option<u64>,
    /// When it was last continued, for replacement.
    stamp: u64,
    /// Where the stream last slipped off its stride's grid (see [`Prefetcher::advance`]).
    slipped_at: Option<u64>,
    /// Strides between its last two slips: how far the grid holds.
    holds: Option<u64>,
}

impl Stream {
    fn new(page: u64, stamp: u64) -> Stream {
        Stream {
            last: page,
            stride: 0,
            seen: 0,
            window: 0,
            issued: None,
            stamp,
            slipped_at: None,
            holds: None,
        }
    }

    /// `page` continues this stream: the next stride, or a page within what was prefetched
    /// (the program ran through prefetched pages without faulting), or just past it.
    fn continued_by(&self, page: u64) -> bool {
        if self.stride == 0 {
            return false;
        }
        let s = self.stride;
        let ahead = (page as i64 - self.last as i64) * s.signum();
        if ahead <= 0 {
            return false;
        }
        let reach = match self.issued {
            Some(far) => (far as i64 - self.last as i64) * s.signum() + s.abs(),
            None => s.abs(),
        };
        if self.issued.is_some() {
            ahead <= reach
        } else {
            ahead == s.abs()
        }
    }

    /// `page` is further along this confirmed stream and every page between is `here`
    /// (resident or on its way): the program ran over them.
    fn skipped_to(&self, page: u64, here: &impl Fn(u64) -> bool) -> bool {
        if self.stride == 0 || self.seen < CONFIRM {
            return false;
        }
        let s = self.stride;
        // The frontier: the farthest page issued, if it is ahead of the last fault at all (a
        // stream at the edge of the region may have issued nothing past it).
        let from = match self.issued {
            Some(far) if (far as i64 - self.last as i64) * s.signum() > 0 => far as i64,
            _ => self.last as i64,
        };
        let d = page as i64 - from;
        if d * s.signum() <= 0 || d % s != 0 || d / s > SKIP_MAX {
            return false;
        }
        (1..d / s).all(|k| here((from + k * s) as u64))
    }
}

/// Pages to prefetch: `count` pages `stride` apart from `first`, nearest first. It is a plan,
/// not a list, so that a fault allocates nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    pub first: u64,
    pub stride: i64,
    pub count: u64,
    /// The fault continued a stream: the program ran over the pages `passed.0..passed.1`
    /// since that stream's previous fault (pages prefetched there were used).
    pub passed: Option<(u64, u64)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn pages(self) -> impl Iterator<Item = u64> {
        (0..self.count).map(move |i| (self.first as i64 + self.stride * i as i64) as u64)
    }
}

/// A multi-stream stride detector with adaptive windows.
#[derive(Debug)]
pub struct Prefetcher {
    streams: Vec<Stream>,
    window_max: u64,
    clock: u64,
}

impl Prefetcher {
    /// `window_max`: most pages ahead to prefetch per stream (at least 1).
    pub fn new(window_max: u64) -> Prefetcher {
        Prefetcher {
            streams: Vec::with_capacity(STREAMS),
            window_max: window_max.max(1),
            clock: 0,
        }
    }

    /// Whether a fault on `page` would continue a confirmed stream (one that prefetches):
    /// what makes the pager fetch the whole page rather than its piece. A stream still
    /// learning its stride is a guess from two or three faults, and the page next to any of
    /// the last 16 faults is no stream at all: counted as near, they made sqlite's random
    /// faults over a page cache it had appended in order fetch whole pages (a quarter of its
    /// footprint local: 25 s against 22 s, and GNU sort 17.5-17.9 s against 15.8-16.0 s,
    /// docs/benchmarks.md "Near a stream: confirmed streams only").
    pub fn near(&self, page: u64) -> bool {
        self.streams
            .iter()
            .any(|s| s.seen >= CONFIRM && s.continued_by(page))
    }

    /// A remote fault on `page`; `here(q)`: page `q` is resident or on its way. Returns the
    /// pages to prefetch now, nearest first.
    pub fn on_fault(&mut self, page: u64, here: impl Fn(u64) -> bool) -> Plan {
        self.clock += 1;
        let now = self.clock;
        if let Some(i) = self.streams.iter().position(|s| s.continued_by(page)) {
            return self.advance(i, page);
        }
        if let Some(i) = self.streams.iter().position(|s| s.skipped_to(page, &here)) {
            return self.advance(i, page);
        }
        // Learn a stride: the unconfirmed stream whose last fault is nearest.
        let near = self
            .streams
            .iter()
            .enumerate()
            .filter(|(_, s)| s.seen < CONFIRM && s.last != page)
            .map(|(i, s)| (i, page as i64 - s.last as i64))
            .filter(|(_, d)| d.abs() <= STRIDE_MAX)
            .min_by_key(|(_, d)| d.abs());
        if let Some((i, d)) = near {
            let s = &mut self.streams[i];
            *s = Stream {
                stride: d,
                seen: 1,
                ..Stream::new(page, now)
            };
            return Plan::default();
        }
        let fresh = Stream::new(page, now);
        if self.streams.len() < STREAMS {
            self.streams.push(fresh);
        } else if let Some(old) = self.streams.iter_mut().min_by_key(|s| s.stamp) {
            *old = fresh;
        }
        Plan::default()
    }

    /// Stream `i` continues at `page`: count it, and once confirmed prefetch along it.
    fn advance(&mut self, i: usize, page: u64) -> Plan {
        let max = self.window_max;
        let s = &mut self.streams[i];
        s.stamp = self.clock;
        s.seen += 1;
        // A fault inside the window but off the stride's grid: the program's stride is not a
        // whole number of pages (a column read down rows of 16000 bytes at 4 KiB pages goes
        // 4, 4, 4, 3, ...), so what lay ahead on the old grid was mostly not its pages. The
        // window starts again from the fault, short, rather than doubling over more of them
        // (at 4 KiB pages ImageMagick's blur prefetched 33 pages per fault, 55 s against 7 s
        // without prefetching). It slips again about as many strides after this as it did
        // after the last slip: prefetching is kept within that (`holds`, below).
        if s.stride != 0 && (page as i64 - s.last as i64) % s.stride != 0 {
            s.window = 0;
            if let Some(at) = s.slipped_at {
                s.holds = Some(((page as i64 - at as i64) / s.stride).unsigned_abs().max(1));
            }
            s.slipped_at = Some(page);
        }
        let passed = match page.cmp(&s.last) {
            std::cmp::Ordering::Greater => Some((s.last + 1, page)),
            std::cmp::Ordering::Less => Some((page + 1, s.last)),
            std::cmp::Ordering::Equal => None,
        };
        s.last = page;
        if s.seen < CONFIRM {
            return Plan {
                passed,
                ..Plan::default()
            };
        }
        s.window = if s.window == 0 { 2 } else { s.window * 2 }.min(max);
        let stride = s.stride;
        // Within the grid's hold since the last slip (at least the next step); a grid that
        // held twice that is trusted again (a stride that slipped once or twice, or a stray
        // fault taken for a slip, must not keep a regular stream at one page ahead).
        let ahead = match (s.slipped_at, s.holds) {
            (Some(at), Some(holds)) => {
                let done = ((page as i64 - at as i64) / stride).unsigned_abs();
                if done >= 2 * holds {
                    s.holds = None;
                    s.window
                } else {
                    s.window.min(holds.saturating_sub(done).max(1))
                }
            }
            _ => s.window,
        };
        // The whole window from the fault, not only beyond what was issued before: a page
        // issued earlier may be gone again (evicted before the program came, or never fetched
        // because it was resident then), and a stream that trusted its old frontier would fault
        // on every page up to it. The pager skips pages resident or in flight.
        let from = page as i64;
        let until = page as i64 + stride * ahead as i64;
        let mut plan = Plan {
            first: (from + stride) as u64,
            stride,
            count: 0,
            passed,
        };
        let mut q = from + stride;
        while (until - q) * stride.signum() >= 0 && q >= 0 {
            plan.count += 1;
            s.issued = Some(q as u64);
            q += stride;
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(p: Plan) -> Vec<u64> {
        p.pages().collect()
    }

    /// Nothing resident.
    fn none(_: u64) -> bool {
        false
    }

    #[test]
    fn only_a_confirmed_stream_is_near() {
        let mut p = Prefetcher::new(4);
        assert!(p.on_fault(100, none).is_empty());
        // The page next to a lone fault, and a stride learnt from two faults, are guesses.
        assert!(!p.near(101) && !p.near(99));
        assert!(p.on_fault(102, none).is_empty());
        assert!(!p.near(104), "a stride of two faults");
        assert!(p.on_fault(104, none).is_empty());
        assert!(!p.near(106), "two equal strides");
        // The third equal stride confirms it: it prefetches, and its next steps are near.
        assert_eq!(pages(p.on_fault(106, none)), vec![108, 110]);
        assert!(p.near(108) && p.near(110) && p.near(112));
        assert!(
            !p.near(106) && !p.near(105) && !p.near(113),
            "at or behind its last fault, or past its reach"
        );
    }

    #[test]
    fn a_stream_continues_past_resident_pages() {
        let mut p = Prefetcher::new(4);
        for q in 10..13 {
            assert!(p.on_fault(q, none).is_empty());
        }
        assert_eq!(pages(p.on_fault(13, none)), vec![14, 15]);
        // 16..40 stayed resident (a policy's stable set): the fault on 40 continues it.
        let held = |q: u64| (16..40).contains(&q);
        assert_eq!(pages(p.on_fault(40, held)), vec![41, 42, 43, 44]);
        // It says what the program ran over since the stream's previous fault.
        assert_eq!(p.on_fault(45, none).passed, Some((41, 45)));
        // A stream going down to page 0 issues nothing past it (3 issued 2 and 1, the fault on
        // 0 nothing): a fault on 0 again is no step of it.
        let mut down = Prefetcher::new(2);
        for q in [6, 5, 4] {
            down.on_fault(q, none);
        }
        assert_eq!(pages(down.on_fault(3, none)), vec![2, 1]);
        assert_eq!(down.on_fault(0, none).passed, Some((1, 3)));
        let again = down.on_fault(0, |_| true);
        assert!(again.is_empty() && again.passed.is_none());
        // A page missing in between breaks it: 60 is no continuation when 57 is remote.
        let holes = |q: u64| (53..60).contains(&q) && q != 57;
        let broken = p.on_fault(60, holes);
        assert!(broken.is_empty() && broken.passed.is_none());
    }

    #[test]
    fn sequential_stream_grows_the_window() {
        let mut p = Prefetcher::new(16);
        assert!(p.on_fault(99, none).is_empty());
        assert!(p.on_fault(100, none).is_empty());
        assert!(p.on_fault(101, none).is_empty());
        // Three strides of 1: confirmed. Window 2.
        assert_eq!(pages(p.on_fault(102, none)), vec![103, 104]);
        // The program reached the prefetched pages: window 4 from the fault (104 is in
        // flight or resident: the pager skips it).
        assert_eq!(pages(p.on_fault(103, none)), vec![104, 105, 106, 107]);
        // It ran through 104..106 without faulting and faults on 107: window 8.
        assert_eq!(
            pages(p.on_fault(107, none)),
            (108..=115).collect::<Vec<_>>()
        );
        // Window capped at 16.
        assert_eq!(
            pages(p.on_fault(116, none)),
            (117..=132).collect::<Vec<_>>()
        );
    }

    #[test]
    fn strided_and_backwards_streams() {
        let mut p = Prefetcher::new(4);
        for q in [43, 40, 37] {
            assert!(p.on_fault(q, none).is_empty());
        }
        assert_eq!(pages(p.on_fault(34, none)), vec![31, 28]);
        assert_eq!(pages(p.on_fault(31, none)), vec![28, 25, 22, 19]);
    }

    #[test]
    fn interleaved_streams_are_each_followed() {
        // Three arrays walked together, as in STREAM's triad.
        let mut p = Prefetcher::new(8);
        let bases = [1000u64, 50_000, 90_000];
        let mut issued = vec![Vec::new(); 3];
        for k in 0..6 {
            for (j, b) in bases.iter().enumerate() {
                issued[j].extend(p.on_fault(b + k, none).pages());
            }
        }
        for (j, b) in bases.iter().enumerate() {
            assert!(issued[j].len() >= 6, "stream {j}: {:?}", issued[j]);
            assert!(issued[j].iter().all(|q| q > &(b + 1) && q < &(b + 30)));
        }
    }

    #[test]
    fn a_broken_stream_stops_prefetching() {
        let mut p = Prefetcher::new(8);
        for q in 0..5 {
            p.on_fault(q, none);
        }
        assert!(p.on_fault(10_000, none).is_empty());
        assert!(p.on_fault(20_000, none).is_empty());
    }

    /// A column read down rows of 16000 bytes at 4 KiB pages: the program touches page
    /// floor(k * 3.90625) for each row k, a stride of 4 pages that slips back by one every
    /// ten or so rows. A page prefetched and not yet reached is `here` (no fault); only pages
    /// the program reaches unprefetched fault. Of the pages prefetched, most must be ones it
    /// reaches (a window that grew on every fault inside it prefetched 8291 pages one past
    /// the program's for 3803 it used; restarted short at each slip, 2370 for 2872; kept
    /// within the strides the grid held before, 256 for 2748), and most of its pages still
    /// come prefetched.
    #[test]
    fn a_stride_that_slips_keeps_its_window_short() {
        let mut p = Prefetcher::new(64);
        let touched: std::collections::BTreeSet<u64> =
            (0..4000u64).map(|k| k * 16000 / 4096).collect();
        let mut issued = std::collections::BTreeSet::new();
        for &q in &touched {
            if issued.contains(&q) {
                continue;
            }
            let plan = p.on_fault(q, |r| issued.contains(&r));
            issued.extend(plan.pages());
        }
        let wasted = issued.difference(&touched).count();
        let used = issued.intersection(&touched).count();
        assert!(
            wasted * 4 < used && used * 2 > touched.len(),
            "{wasted} pages prefetched past the program's, {used} used of {}",
            touched.len()
        );
    }

    /// A stride of 4 pages that slips twice, ten strides apart, then holds for hundreds: its
    /// window is kept within ten strides while that is all the grid has held, and regrows to
    /// the limit once the grid has held twice that.
    #[test]
    fn a_stream_that_slipped_twice_then_holds_regrows_its_window() {
        let mut p = Prefetcher::new(16);
        let page = |k: u64| 4 * k + u64::from(k >= 10) + u64::from(k >= 20);
        let mut issued = std::collections::BTreeSet::new();
        let mut largest_late = 0;
        for k in 0..400 {
            let q = page(k);
            if issued.contains(&q) {
                continue;
            }
            let plan = p.on_fault(q, |r| issued.contains(&r));
            if (20..40).contains(&k) {
                assert!(plan.count <= 10, "row {k}: {plan:?}");
            }
            if k >= 60 {
                largest_late = largest_late.max(plan.count);
            }
            issued.extend(plan.pages());
        }
        assert_eq!(largest_late, 16, "the window regrew to its limit");
    }

    /// Pages prefetched for 100000 uniform random faults over `pages` pages.
    fn random_prefetches(pages: u64) -> usize {
        let mut p = Prefetcher::new(16);
        let mut x = 1u64;
        let mut issued = 0;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            issued += p.on_fault((x >> 33) % pages, none).count as usize;
        }
        issued
    }

    #[test]
    fn random_faults_prefetch_almost_nothing() {
        // Over many pages, a random fault hardly ever lands near a stream.
        let n = random_prefetches(100_000);
        assert!(n < 100, "{n}");
        // Over few pages (a small array at a big page size), every fault is near one: a
        // stream must still be confirmed three times over before it is followed. (A plan
        // names its whole window, pages fetched before included, which the pager skips: at
        // most 2 pages per 100 faults.)
        let n = random_prefetches(1024);
        assert!(
            n < 2000,
            "{n} pages prefetched for 100000 random faults over 1024 pages"
        );
    }
}
