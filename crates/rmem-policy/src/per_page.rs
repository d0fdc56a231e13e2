//! A value per page, held only for the chunks of pages that were given one.
//!
//! Policies keep a few bytes per page they have seen (an admission number, a period). A
//! plain vector indexed by page grows to the highest page ever seen: over a block device of
//! 1 TiB with 4 KiB blocks, a file system's metadata spread over the device made `rmem nbd`'s
//! adaptive policy hold 3.2 GB for pages it had seen once. Here memory grows with the chunks
//! touched (4 Ki pages each), plus 8 bytes per chunk up to the highest.

/// Pages per chunk; rmem-client's page states, locations and stamps use the same (the
/// reasons are in its `pages::CHUNK_PAGES`).
pub const CHUNK_PAGES: usize = 1 << 12;
const CHUNK: usize = CHUNK_PAGES;

/// `T` per page; `fill` for every page never set.
#[derive(Debug, Clone)]
pub struct PerPage<T> {
    chunks: Vec<Option<Box<[T; CHUNK]>>>,
    fill: T,
}

impl<T: Default> Default for PerPage<T> {
    /// Every page reads `T::default()` until set.
    fn default() -> Self {
        PerPage {
            chunks: Vec::new(),
            fill: T::default(),
        }
    }
}

impl<T: Copy + PartialEq> PerPage<T> {
    /// Every page reads `fill` until set.
    pub fn new(fill: T) -> Self {
        PerPage {
            chunks: Vec::new(),
            fill,
        }
    }

    pub fn get(&self, page: u64) -> T {
        match self.chunks.get(page as usize / CHUNK) {
            Some(Some(c)) => c[page as usize % CHUNK],
            _ => self.fill,
        }
    }

    pub fn set(&mut self, page: u64, v: T) {
        let c = page as usize / CHUNK;
        if v == self.fill && !matches!(self.chunks.get(c), Some(Some(_))) {
            return;
        }
        if c >= self.chunks.len() {
            self.chunks.resize_with(c + 1, || None);
        }
        let fill = self.fill;
        let chunk = self.chunks[c].get_or_insert_with(|| {
            let b: Box<[T]> = vec![fill; CHUNK].into_boxed_slice();
            b.try_into()
                .unwrap_or_else(|_| unreachable!("CHUNK elements"))
        });
        chunk[page as usize % CHUNK] = v;
    }

    /// Every page reads `fill` again (the chunks stay).
    pub fn reset(&mut self) {
        let fill = self.fill;
        for c in self.chunks.iter_mut().flatten() {
            c.fill(fill);
        }
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Option<Box<[T; CHUNK]>>>()
            + self.chunks.iter().flatten().count() * CHUNK * std::mem::size_of::<T>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_far_apart_hold_a_chunk_each_and_unset_pages_read_the_fill() {
        let mut v = PerPage::new(7u32);
        assert_eq!(v.get(5), 7);
        v.set(3, 1);
        // 1 TiB of 4 KiB pages away.
        v.set(1 << 28, 2);
        assert_eq!(
            (v.get(3), v.get(1 << 28), v.get(4), v.get(1 << 20)),
            (1, 2, 7, 7)
        );
        // Two chunks, and the list up to the second (8 bytes a chunk): 0.5 MiB, where a
        // vector to page 2^28 would be 1 GiB.
        assert!(
            v.heap_bytes() <= 2 * CHUNK * 4 + ((1 << 16) + 1) * 8,
            "{}",
            v.heap_bytes()
        );
        let before = v.heap_bytes();
        v.set(1 << 24, 7);
        assert_eq!(v.heap_bytes(), before, "the fill is not stored");
        v.reset();
        assert_eq!((v.get(3), v.get(1 << 28)), (7, 7));
    }
}
