//! Copies of page data between buffers, safe from a slow case of `rep movsb`.
//!
//! On CPUs with "fast short rep movsb" (FSRM; AMD Zen 3, the EPYC 7xx3 of the development VM)
//! glibc's `memcpy` copies 2 KiB to 512 KiB with `rep movsb`, and that instruction is about
//! twenty times slower when the destination lies 1 to 31 bytes after the source modulo 4096:
//! a 64 KiB copy takes 34 us there instead of 1.5 us, a 4 KiB one 2.2 us instead of 0.09 us
//! (`(dst - src) % 4096` of 0 or 32 and up are fast). Page data meets exactly those offsets:
//! a 16-byte frame header or seal in front of a page in one buffer and not in the other puts
//! the copy 16 bytes off, and a buffer reused for a whole run keeps it there, so one run
//! pays it on most of its copies and the next on none.
//!
//! [`copy`] and [`extend`] take `memcpy` where it is fast and otherwise a loop of 16-byte
//! vector loads and stores (SSE2, which every x86-64 has: 2.2 us for 64 KiB at any offset).
//! Every copy of a page or of a piece of one (frames, fetch buffers, the servers' slabs, the
//! block cache) goes through them; small copies do not need to (`memcpy` below 2 KiB does
//! not use `rep movsb`). Other architectures get `memcpy`.

/// Below this many bytes `memcpy` does not use `rep movsb` (glibc's threshold is 2112 with
/// AVX2; a little lower is harmless).
const SLOW_MIN: usize = 2048;

/// Whether a copy from `src` to `dst` falls in the slow case: `dst` 1 to 63 bytes after
/// `src` modulo 4096 (31 is the measured edge; 63 leaves a margin for other models).
fn aliased(dst: *const u8, src: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..64).contains(&d)
}

/// `dst.copy_from_slice(src)`, without the slow case. Panics when the lengths differ.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if src.len() >= SLOW_MIN && aliased(dst.as_ptr(), src.as_ptr()) {
        // SAFETY: `dst` and `src` are valid for `src.len()` bytes, and a `&mut` never
        // overlaps a `&`.
        unsafe { vector_copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
        return;
    }
    dst.copy_from_slice(src);
}

/// `out.extend_from_slice(src)`, without the slow case.
pub fn extend(out: &mut Vec<u8>, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= SLOW_MIN {
        out.reserve(src.len());
        let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        if aliased(dst, src.as_ptr()) {
            // SAFETY: `reserve` made room for `src.len()` bytes after the length, which
            // `src` (borrowed, so not part of `out`) cannot overlap; they are written before
            // the length covers them.
            unsafe {
                vector_copy(dst, src.as_ptr(), src.len());
                out.set_len(out.len() + src.len());
            }
            return;
        }
    }
    out.extend_from_slice(src);
}

/// Copy `len` bytes with 16-byte unaligned loads and stores, four at a time (the stride is
/// four times the store size, so the compiler does not turn the loop back into `memcpy`).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes; the two do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    let mut i = 0;
    while i + 64 <= len {
        // SAFETY: i + 64 <= len, and the caller vouches for `len` bytes at both; SSE2 is part
        // of x86-64, and the unaligned forms take any address.
        unsafe {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
            let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
        }
        i += 64;
    }
    // SAFETY: the last len - i (< 64) bytes, within both; memcpy this short uses no rep movsb.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    /// Every offset between the buffers, in and out of the slow case, and lengths around the
    /// loop's stride and the threshold, copy exactly, without touching a byte around them.
    #[test]
    fn copies_exactly_at_every_offset() {
        let src = pattern(80_000);
        let mut big = vec![0xEEu8; 90_000];
        for len in [
            0, 1, 63, 64, 65, 2047, 2048, 2049, 4096, 4111, 65_536, 65_552,
        ] {
            for off in (0..128).chain([4064, 4080, 4095]) {
                big.fill(0xEE);
                let s = &src[7..7 + len];
                copy(&mut big[off..off + len], s);
                assert_eq!(&big[off..off + len], s, "len {len} offset {off}");
                assert!(
                    big[..off].iter().all(|&b| b == 0xEE),
                    "before, len {len} offset {off}"
                );
                assert!(
                    big[off + len..].iter().all(|&b| b == 0xEE),
                    "after, len {len} offset {off}"
                );
            }
        }
    }

    #[test]
    fn extends_exactly_at_every_offset() {
        let src = pattern(70_000);
        for len in [0, 5, 2048, 4096, 65_552] {
            for head in (0..96).chain([4070, 4081]) {
                let mut out = vec![3u8; head];
                extend(&mut out, &src[..len]);
                assert_eq!(out.len(), head + len);
                assert!(out[..head].iter().all(|&b| b == 3));
                assert_eq!(&out[head..], &src[..len], "len {len} head {head}");
            }
        }
    }

    #[test]
    fn the_slow_case_is_what_was_measured() {
        let base = 1 << 20;
        let at = |d: usize| aliased((base + d) as *const u8, base as *const u8);
        assert!(!at(0) && at(1) && at(16) && at(31) && at(63) && !at(64) && !at(4095));
        assert!(at(4096 * 3 + 16), "modulo 4096");
        assert!(
            !aliased(base as *const u8, (base + 16) as *const u8),
            "the source after"
        );
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn lengths_must_match() {
        copy(&mut [0u8; 3], &[1u8; 4]);
    }
}
