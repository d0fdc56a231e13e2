//! The page reference trace format that `rmem run --trace` writes and `rmem sim` reads.
//!
//! ```text
//! header (16 bytes):  magic "RMEMTRC1" | page size: u32 LE | flags: u32 LE (0)
//! record (repeated):  varint(zigzag(page - previous page) << 1 | write) | varint(us since previous record)
//! ```
//!
//! Varints are LEB128 (7 bits a byte, low first). The first record's deltas are from page 0
//! and time 0 (the start of the trace). A sequential scan costs 2 bytes a reference. The file
//! ends where the records end; a record cut short (a killed program) ends it too.

use crate::sim::Access;
use crate::PageIndex;
use std::io::{self, Read, Write};

/// The first 8 bytes of every trace.
pub const MAGIC: &[u8; 8] = b"RMEMTRC1";

/// Writes a trace.
pub struct TraceWriter<W: Write> {
    out: W,
    last_page: u64,
    last_us: u64,
    records: u64,
}

fn put_varint(out: &mut impl Write, mut v: u64) -> io::Result<()> {
    let mut buf = [0u8; 10];
    let mut n = 0;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            buf[n] = b;
            n += 1;
            break;
        }
        buf[n] = b | 0x80;
        n += 1;
    }
    out.write_all(&buf[..n])
}

/// Read a varint; `None` at a clean end of input, an error in the middle of one.
fn get_varint(input: &mut (impl Read + ?Sized)) -> io::Result<Option<u64>> {
    let mut v = 0u64;
    for i in 0..10 {
        let mut b = [0u8];
        if input.read(&mut b)? == 0 {
            return if i == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        v |= ((b[0] & 0x7f) as u64) << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some(v));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "varint longer than 10 bytes",
    ))
}

impl<W: Write> TraceWriter<W> {
    /// Start a trace of pages of `page_size` bytes: writes the header.
    pub fn new(mut out: W, page_size: u32) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        out.write_all(&page_size.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        Ok(TraceWriter {
            out,
            last_page: 0,
            last_us: 0,
            records: 0,
        })
    }

    /// Append one reference at `us` microseconds from the start (non-decreasing).
    pub fn record(&mut self, page: PageIndex, write: bool, us: u64) -> io::Result<()> {
        let delta = page.0.wrapping_sub(self.last_page) as i64;
        let zigzag = ((delta << 1) ^ (delta >> 63)) as u64;
        put_varint(&mut self.out, zigzag << 1 | write as u64)?;
        put_varint(&mut self.out, us.saturating_sub(self.last_us))?;
        self.last_page = page.0;
        self.last_us = us.max(self.last_us);
        self.records += 1;
        Ok(())
    }

    /// References written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A trace read back.
#[derive(Debug, Default)]
pub struct Trace {
    pub page_size: u32,
    pub accesses: Vec<Access>,
    /// Microseconds from the start, one per access.
    pub times_us: Vec<u64>,
}

impl Trace {
    /// Parse a trace. A record cut short at the end is dropped (the program was killed).
    pub fn read(mut input: impl Read) -> io::Result<Trace> {
        let mut head = [0u8; 16];
        input.read_exact(&mut head)?;
        if &head[..8] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an rmem trace (bad magic)",
            ));
        }
        let page_size = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        let mut t = Trace {
            page_size,
            ..Trace::default()
        };
        // A record cut short ends the trace; any other read error is an error.
        let next = |input: &mut dyn Read| match get_varint(input) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            r => r,
        };
        let (mut page, mut us) = (0u64, 0u64);
        while let Some(v) = next(&mut input)? {
            let Some(dt) = next(&mut input)? else {
                break;
            };
            let z = v >> 1;
            let delta = ((z >> 1) as i64) ^ -((z & 1) as i64);
            page = page.wrapping_add(delta as u64);
            us += dt;
            t.accesses.push(Access {
                page: PageIndex(page),
                write: v & 1 == 1,
            });
            t.times_us.push(us);
        }
        Ok(t)
    }

    /// The same references at a larger page size (a multiple of this one): pages are merged
    /// and consecutive references to one merged page collapse into one (a write if any was).
    pub fn coarsen(&self, page_size: u32) -> Vec<Access> {
        assert!(page_size >= self.page_size && page_size.is_multiple_of(self.page_size));
        let f = (page_size / self.page_size) as u64;
        let mut out: Vec<Access> = Vec::with_capacity(self.accesses.len());
        for a in &self.accesses {
            let page = PageIndex(a.page.0 / f);
            match out.last_mut() {
                Some(l) if l.page == page => l.write |= a.write,
                _ => out.push(Access {
                    page,
                    write: a.write,
                }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let mut buf = Vec::new();
        let refs = [
            (5u64, false, 0u64),
            (6, true, 3),
            (1 << 40, false, 1000),
            (2, false, 1000),
        ];
        {
            let mut w = TraceWriter::new(&mut buf, 4096).unwrap();
            for &(p, wr, us) in &refs {
                w.record(PageIndex(p), wr, us).unwrap();
            }
            w.flush().unwrap();
        }
        let t = Trace::read(&buf[..]).unwrap();
        assert_eq!(t.page_size, 4096);
        let got: Vec<_> = t
            .accesses
            .iter()
            .zip(&t.times_us)
            .map(|(a, &us)| (a.page.0, a.write, us))
            .collect();
        assert_eq!(got, refs);
        // A sequential scan is two bytes a reference.
        let mut buf = Vec::new();
        {
            let mut w = TraceWriter::new(&mut buf, 4096).unwrap();
            for p in 0..1000 {
                w.record(PageIndex(p), false, p).unwrap();
            }
        }
        assert_eq!(buf.len(), 16 + 2 * 1000);
        // Cut short: the partial record is dropped.
        assert_eq!(
            Trace::read(&buf[..buf.len() - 1]).unwrap().accesses.len(),
            999
        );
    }

    #[test]
    fn coarsen_merges_pages() {
        let t = Trace {
            page_size: 4096,
            accesses: [0, 1, 15, 16, 3]
                .iter()
                .map(|&p| Access {
                    page: PageIndex(p),
                    write: p == 1,
                })
                .collect(),
            times_us: vec![0; 5],
        };
        let c = t.coarsen(65536);
        let pages: Vec<_> = c.iter().map(|a| (a.page.0, a.write)).collect();
        assert_eq!(pages, [(0, true), (1, false), (0, false)]);
    }
}
