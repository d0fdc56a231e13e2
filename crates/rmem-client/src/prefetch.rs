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
//! - a fault near the last fault of a stream not yet confirmed gives it a new stride;
//! - any other fault starts a new stream, in place of the one unused longest.
//!
//! A stream is confirmed after [`CONFIRM`] equal strides; from then on each continuation
//! prefetches the next pages along it. The window (how far ahead) starts at 2 and doubles with
//! each continuation, up to a limit. A random fault almost never continues a stream, so
//! random access costs only this bookkeeping.

/// Streams followed at once.
pub const STREAMS: usize = 16;
/// Equal strides that confirm a stream.
pub const CONFIRM: u32 = 3;
/// Largest stride followed, in pages (beyond it, a "stream" is just far jumps).
const STRIDE_MAX: i64 = 64;

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
}

/// Pages to prefetch: `count` pages `stride` apart from `first`, nearest first. It is a plan,
/// not a list, so that a fault allocates nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    pub first: u64,
    pub stride: i64,
    pub count: u64,
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

    /// A remote fault on `page`. Returns the pages to prefetch now, nearest first.
    pub fn on_fault(&mut self, page: u64) -> Plan {
        self.clock += 1;
        let now = self.clock;
        if let Some(i) = self.streams.iter().position(|s| s.continued_by(page)) {
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
        s.last = page;
        if s.seen < CONFIRM {
            return Plan::default();
        }
        s.window = if s.window == 0 { 2 } else { s.window * 2 }.min(max);
        let stride = s.stride;
        // Continue beyond what was already prefetched, if the program is still inside it.
        let from = match s.issued {
            Some(far) if (far as i64 - page as i64) * stride.signum() > 0 => far as i64,
            _ => page as i64,
        };
        let until = page as i64 + stride * s.window as i64;
        let mut plan = Plan {
            first: (from + stride) as u64,
            stride,
            count: 0,
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

    #[test]
    fn sequential_stream_grows_the_window() {
        let mut p = Prefetcher::new(16);
        assert!(p.on_fault(99).is_empty());
        assert!(p.on_fault(100).is_empty());
        assert!(p.on_fault(101).is_empty());
        // Three strides of 1: confirmed. Window 2.
        assert_eq!(pages(p.on_fault(102)), vec![103, 104]);
        // The program reached the prefetched pages: window 4, continuing past 104.
        assert_eq!(pages(p.on_fault(103)), vec![105, 106, 107]);
        // It ran through 104..106 without faulting and faults on 107: window 8.
        assert_eq!(pages(p.on_fault(107)), (108..=115).collect::<Vec<_>>());
        // Window capped at 16.
        assert_eq!(pages(p.on_fault(116)), (117..=132).collect::<Vec<_>>());
    }

    #[test]
    fn strided_and_backwards_streams() {
        let mut p = Prefetcher::new(4);
        for q in [43, 40, 37] {
            assert!(p.on_fault(q).is_empty());
        }
        assert_eq!(pages(p.on_fault(34)), vec![31, 28]);
        assert_eq!(pages(p.on_fault(31)), vec![25, 22, 19]);
    }

    #[test]
    fn interleaved_streams_are_each_followed() {
        // Three arrays walked together, as in STREAM's triad.
        let mut p = Prefetcher::new(8);
        let bases = [1000u64, 50_000, 90_000];
        let mut issued = vec![Vec::new(); 3];
        for k in 0..6 {
            for (j, b) in bases.iter().enumerate() {
                issued[j].extend(p.on_fault(b + k).pages());
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
            p.on_fault(q);
        }
        assert!(p.on_fault(10_000).is_empty());
        assert!(p.on_fault(20_000).is_empty());
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
            issued += p.on_fault((x >> 33) % pages).count as usize;
        }
        issued
    }

    #[test]
    fn random_faults_prefetch_almost_nothing() {
        // Over many pages, a random fault hardly ever lands near a stream.
        let n = random_prefetches(100_000);
        assert!(n < 100, "{n}");
        // Over few pages (a small array at a big page size), every fault is near one: a
        // stream must still be confirmed three times over before it is followed.
        let n = random_prefetches(1024);
        assert!(
            n < 1000,
            "{n} pages prefetched for 100000 random faults over 1024 pages"
        );
    }
}
