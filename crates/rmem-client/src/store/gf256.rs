//! The arithmetic of `ec:K+M`'s Reed-Solomon code: GF(2^8) as reed-solomon-erasure's own
//! `galois_8` field (the same polynomial, so fragments are the same bytes), with the two
//! operations that carry all the work, multiplying a fragment by a constant and adding it to
//! another, done with the vector instructions the CPU at hand has, chosen when the program
//! runs. The crate's own fast path (its `simd-accel` feature) is C compiled with
//! `-march=haswell`: a binary built with it stops with SIGILL on an x86-64 CPU without AVX2
//! (older cluster nodes, virtual machines with a plain CPU model) at the first page it encodes.
//!
//! Each kernel looks up the product of the constant with a byte's low and high nibble in two
//! 16-entry tables (a byte shuffle: `pshufb` on x86-64, `tbl` on aarch64) and adds (XORs) the
//! two: 32 bytes per step with AVX2, 16 with SSSE3 or NEON; the crate's table-driven Rust
//! code takes the tail, and the whole slice on a CPU with none of them.

use reed_solomon_erasure::galois_8;

/// GF(2^8) for [`reed_solomon_erasure::ReedSolomon`], with vector kernels.
#[derive(Clone, Copy, Debug)]
pub struct Gf256;

/// The Reed-Solomon coder the client encodes and rebuilds pages with.
pub type ReedSolomon = reed_solomon_erasure::ReedSolomon<Gf256>;

impl reed_solomon_erasure::Field for Gf256 {
    const ORDER: usize = 256;
    type Elem = u8;

    fn add(a: u8, b: u8) -> u8 {
        galois_8::add(a, b)
    }

    fn mul(a: u8, b: u8) -> u8 {
        galois_8::mul(a, b)
    }

    fn div(a: u8, b: u8) -> u8 {
        galois_8::div(a, b)
    }

    fn exp(a: u8, n: usize) -> u8 {
        galois_8::exp(a, n)
    }

    fn zero() -> u8 {
        0
    }

    fn one() -> u8 {
        1
    }

    fn nth_internal(n: usize) -> u8 {
        n as u8
    }

    fn mul_slice(c: u8, input: &[u8], out: &mut [u8]) {
        apply::<false>(best(), c, input, out);
    }

    fn mul_slice_add(c: u8, input: &[u8], out: &mut [u8]) {
        apply::<true>(best(), c, input, out);
    }
}

/// [`Kernel::best`], found once.
fn best() -> Kernel {
    static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *BEST.get_or_init(Kernel::best)
}

/// A way to multiply a slice by a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// 32 bytes at a time (x86-64 with AVX2).
    Avx2,
    /// 16 bytes at a time (x86-64 with SSSE3).
    Ssse3,
    /// 16 bytes at a time (aarch64, where NEON is always there).
    Neon,
    /// A byte at a time through a 256-entry row of products (any CPU).
    Table,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                return Kernel::Avx2;
            }
            if std::arch::is_x86_feature_detected!("ssse3") {
                return Kernel::Ssse3;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            return Kernel::Neon;
        }
        #[allow(unreachable_code)]
        Kernel::Table
    }

    /// Every kernel this CPU runs, the fastest first.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Avx2, Kernel::Ssse3, Kernel::Neon, Kernel::Table]
            .into_iter()
            .filter(|k| k.runs_here())
            .collect()
    }

    fn runs_here(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Ssse3 => std::arch::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => true,
            Kernel::Table => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// `out = c * input`, or (`ADD`) `out += c * input`, with `kernel`; a kernel this CPU cannot
/// run panics rather than executes.
pub fn apply<const ADD: bool>(kernel: Kernel, c: u8, input: &[u8], out: &mut [u8]) {
    assert_eq!(
        input.len(),
        out.len(),
        "a fragment and its product differ in length"
    );
    assert!(kernel.runs_here(), "{kernel:?} does not run on this CPU");
    let done = match kernel {
        // SAFETY: runs_here() checked that the CPU has AVX2; the slices are of equal length.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::avx2::<ADD>(c, input, out) },
        // SAFETY: as above, for SSSE3.
        #[cfg(target_arch = "x86_64")]
        Kernel::Ssse3 => unsafe { x86::ssse3::<ADD>(c, input, out) },
        // SAFETY: NEON is part of aarch64; the slices are of equal length.
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => unsafe { arm::neon::<ADD>(c, input, out) },
        _ => 0,
    };
    if ADD {
        galois_8::mul_slice_xor(c, &input[done..], &mut out[done..]);
    } else {
        galois_8::mul_slice(c, &input[done..], &mut out[done..]);
    }
}

/// The products of `c` with each value of a byte's low nibble, and of its high nibble.
fn nibble_tables(c: u8) -> &'static ([u8; 16], [u8; 16]) {
    &NIBBLES[c as usize]
}

/// [`nibble_tables`] for every constant, made when the program is compiled (8 KiB).
static NIBBLES: [([u8; 16], [u8; 16]); 256] = {
    let mut t = [([0u8; 16], [0u8; 16]); 256];
    let mut c = 0;
    while c < 256 {
        let mut i = 0;
        while i < 16 {
            t[c].0[i] = product(c as u8, i as u8);
            t[c].1[i] = product(c as u8, (i as u8) << 4);
            i += 1;
        }
        c += 1;
    }
    t
};

/// a * b in GF(2^8) modulo x^8 + x^4 + x^3 + x^2 + 1, galois_8's polynomial (shift and add;
/// for the tables above only: `galois_8::mul` looks products up).
const fn product(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    p
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The kernel over the whole 32-byte steps of `input`; returns the bytes done.
    ///
    /// # Safety
    /// The CPU has AVX2; `out` is as long as `input`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2<const ADD: bool>(c: u8, input: &[u8], out: &mut [u8]) -> usize {
        let (low, high) = super::nibble_tables(c);
        let steps = input.len() / 32;
        // SAFETY: the tables are 16 bytes; step i reads input[32i..32i+32] and reads and
        // writes out[32i..32i+32], within both slices (i < len / 32, out.len() == len); the
        // unaligned forms take any address.
        unsafe {
            let low = _mm256_broadcastsi128_si256(_mm_loadu_si128(low.as_ptr().cast()));
            let high = _mm256_broadcastsi128_si256(_mm_loadu_si128(high.as_ptr().cast()));
            let nibble = _mm256_set1_epi8(0x0f);
            let (src, dst) = (
                input.as_ptr().cast::<__m256i>(),
                out.as_mut_ptr().cast::<__m256i>(),
            );
            let step = |i: usize| {
                let x = _mm256_loadu_si256(src.add(i));
                let lo = _mm256_shuffle_epi8(low, _mm256_and_si256(x, nibble));
                let hi =
                    _mm256_shuffle_epi8(high, _mm256_and_si256(_mm256_srli_epi64(x, 4), nibble));
                let mut p = _mm256_xor_si256(lo, hi);
                if ADD {
                    p = _mm256_xor_si256(p, _mm256_loadu_si256(dst.add(i)));
                }
                _mm256_storeu_si256(dst.add(i), p);
            };
            let mut i = 0;
            // Two steps at a time: their loads and shuffles overlap.
            while i + 2 <= steps {
                step(i);
                step(i + 1);
                i += 2;
            }
            if i < steps {
                step(i);
            }
        }
        steps * 32
    }

    /// As [`avx2`], 16 bytes a step.
    ///
    /// # Safety
    /// The CPU has SSSE3; `out` is as long as `input`.
    #[target_feature(enable = "ssse3")]
    pub(super) unsafe fn ssse3<const ADD: bool>(c: u8, input: &[u8], out: &mut [u8]) -> usize {
        let (low, high) = super::nibble_tables(c);
        let steps = input.len() / 16;
        // SAFETY: as in avx2, with 16-byte steps.
        unsafe {
            let low = _mm_loadu_si128(low.as_ptr().cast());
            let high = _mm_loadu_si128(high.as_ptr().cast());
            let nibble = _mm_set1_epi8(0x0f);
            let (src, dst) = (
                input.as_ptr().cast::<__m128i>(),
                out.as_mut_ptr().cast::<__m128i>(),
            );
            for i in 0..steps {
                let x = _mm_loadu_si128(src.add(i));
                let lo = _mm_shuffle_epi8(low, _mm_and_si128(x, nibble));
                let hi = _mm_shuffle_epi8(high, _mm_and_si128(_mm_srli_epi64(x, 4), nibble));
                let mut p = _mm_xor_si128(lo, hi);
                if ADD {
                    p = _mm_xor_si128(p, _mm_loadu_si128(dst.add(i)));
                }
                _mm_storeu_si128(dst.add(i), p);
            }
        }
        steps * 16
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    /// The kernel over the whole 16-byte steps of `input`; returns the bytes done.
    ///
    /// # Safety
    /// `out` is as long as `input`.
    pub(super) unsafe fn neon<const ADD: bool>(c: u8, input: &[u8], out: &mut [u8]) -> usize {
        let (low, high) = super::nibble_tables(c);
        let steps = input.len() / 16;
        // SAFETY: the tables are 16 bytes; step i reads input[16i..16i+16] and reads and
        // writes out[16i..16i+16], within both slices; NEON is part of aarch64.
        unsafe {
            let low = vld1q_u8(low.as_ptr());
            let high = vld1q_u8(high.as_ptr());
            let nibble = vdupq_n_u8(0x0f);
            for i in 0..steps {
                let x = vld1q_u8(input.as_ptr().add(16 * i));
                let lo = vqtbl1q_u8(low, vandq_u8(x, nibble));
                let hi = vqtbl1q_u8(high, vshrq_n_u8::<4>(x));
                let mut p = veorq_u8(lo, hi);
                if ADD {
                    p = veorq_u8(p, vld1q_u8(out.as_ptr().add(16 * i)));
                }
                vst1q_u8(out.as_mut_ptr().add(16 * i), p);
            }
        }
        steps * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reed_solomon_erasure::Field;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn every_kernel_here_multiplies_as_the_field_does() {
        let kernels = Kernel::available();
        assert!(kernels.contains(&Kernel::Table));
        crate::tell!(
            "kernels on this CPU: {kernels:?}, best {:?}",
            Kernel::best()
        );
        // Lengths around each kernel's step, so that the tails are taken too.
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 100, 4096, 4097 + 64] {
            let input = bytes(len, len as u64 + 7);
            let before = bytes(len, len as u64 + 99);
            for c in 0..=255u8 {
                let want: Vec<u8> = input.iter().map(|&x| galois_8::mul(c, x)).collect();
                let want_add: Vec<u8> = input
                    .iter()
                    .zip(&before)
                    .map(|(&x, &o)| galois_8::mul(c, x) ^ o)
                    .collect();
                for &k in &kernels {
                    let mut out = before.clone();
                    apply::<false>(k, c, &input, &mut out);
                    assert!(out == want, "{k:?} c={c} len={len}");
                    let mut out = before.clone();
                    apply::<true>(k, c, &input, &mut out);
                    assert!(out == want_add, "{k:?} add c={c} len={len}");
                }
            }
        }
    }

    #[test]
    fn fragments_are_the_bytes_galois_8_makes() {
        // Pages stored by one build are rebuilt by another: the code must not change.
        let (k, m, len) = (4, 2, 4096 + 48);
        let data: Vec<Vec<u8>> = (0..k).map(|i| bytes(len, i as u64 + 1)).collect();
        let mut ours: Vec<Vec<u8>> = data
            .iter()
            .cloned()
            .chain((0..m).map(|_| vec![0; len]))
            .collect();
        let mut theirs = ours.clone();
        ReedSolomon::new(k, m).unwrap().encode(&mut ours).unwrap();
        galois_8::ReedSolomon::new(k, m)
            .unwrap()
            .encode(&mut theirs)
            .unwrap();
        assert!(ours == theirs);
        // And a page comes back from any K of them.
        let mut lost: Vec<Option<Vec<u8>>> = ours.iter().cloned().map(Some).collect();
        lost[0] = None;
        lost[3] = None;
        ReedSolomon::new(k, m)
            .unwrap()
            .reconstruct(&mut lost)
            .unwrap();
        assert!(lost.into_iter().map(Option::unwrap).collect::<Vec<_>>() == ours);
        assert_eq!(Gf256::mul(0x53, 0xca), galois_8::mul(0x53, 0xca));
    }

    #[test]
    #[should_panic(expected = "does not run on this CPU")]
    fn a_kernel_the_cpu_lacks_is_refused() {
        let absent = if cfg!(target_arch = "aarch64") {
            Kernel::Avx2
        } else {
            Kernel::Neon
        };
        apply::<false>(absent, 3, &[1, 2, 3], &mut [0; 3]);
    }
}
