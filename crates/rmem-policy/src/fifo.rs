//! DLM's FIFO in address order: evict the next resident page after the previous victim,
//! cyclically (DLM paper, section III).

use crate::{Admission, PageIndex, PageSet, Policy};

/// Address-order cyclic FIFO. The cursor sits just after the previous victim.
#[derive(Default)]
pub struct Fifo {
    resident: PageSet,
    cursor: PageIndex,
}

impl Fifo {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn insert(&mut self, page: PageIndex, _how: Admission) {
        self.resident.insert(page);
    }

    fn remove(&mut self, page: PageIndex) {
        self.resident.remove(page);
    }

    fn select_victim(&mut self) -> Option<PageIndex> {
        let victim = self.resident.next_cyclic(self.cursor)?;
        self.resident.remove(victim);
        self.cursor = PageIndex(victim.0 + 1);
        Some(victim)
    }

    fn len(&self) -> usize {
        self.resident.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked by hand: resident {2, 5, 9} gives victims 2 then 5. Then 7 and 1 arrive: the
    /// cursor sits at 6, so it finds 7, then 9, then wraps around to 1.
    #[test]
    fn evicts_in_address_order_cyclically() {
        let mut f = Fifo::new();
        for p in [9, 2, 5] {
            f.insert(PageIndex(p), Admission::Fetched);
        }
        assert_eq!(f.select_victim(), Some(PageIndex(2)));
        assert_eq!(f.select_victim(), Some(PageIndex(5)));
        f.insert(PageIndex(7), Admission::Fetched);
        f.insert(PageIndex(1), Admission::ZeroFilled);
        assert_eq!(f.select_victim(), Some(PageIndex(7)));
        assert_eq!(f.select_victim(), Some(PageIndex(9)));
        assert_eq!(f.select_victim(), Some(PageIndex(1)));
        assert_eq!(f.select_victim(), None);
    }

    #[test]
    fn removed_pages_are_never_victims() {
        let mut f = Fifo::new();
        for p in 0..10 {
            f.insert(PageIndex(p), Admission::Fetched);
        }
        f.remove(PageIndex(0));
        f.remove(PageIndex(1));
        assert_eq!(f.select_victim(), Some(PageIndex(2)));
    }
}
