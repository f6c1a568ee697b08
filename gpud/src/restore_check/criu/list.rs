//! CRIU's doubly linked lists (`include/common/list.h`), over indices.
//!
//! One [`Links`] holds the `struct list_head` of `n` entries and one head
//! (index `n`). The operations are the header's: `list_add` links an entry
//! right after the head, `list_add_tail` right before it, `list_del` unlinks
//! it and writes the poison values into its own pointers
//! (checkpoint-restore/criu:include/common/list.h, `list_add`, `list_del`).
//! Following a poisoned pointer is where CRIU would read unmapped memory:
//! [`Crash`].
//!
//! [`Cursor`] is `list_for_each_entry_safe` (list.h:231-234): the next entry
//! is read when the current one is reached, before the loop body runs, so
//! whatever the body does to the list the walk goes on from that cached
//! entry.

/// The index a poisoned pointer holds (`LIST_POISON1` / `LIST_POISON2`).
pub(crate) const POISON: usize = usize::MAX;

/// CRIU dereferences a pointer `list_del` poisoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Crash;

/// The `next`/`prev` pointers of `n` entries and a head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Links {
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl Links {
    /// `n` entries, none linked (their pointers zeroed, as `xzalloc` leaves
    /// them; read as poison), and an empty list.
    pub(crate) fn new(n: usize) -> Self {
        let mut links = Self {
            next: vec![POISON; n + 1],
            prev: vec![POISON; n + 1],
        };
        links.init();
        links
    }

    pub(crate) fn head(&self) -> usize {
        self.next.len() - 1
    }

    /// `INIT_LIST_HEAD`: the list is empty again; entries keep their stale
    /// pointers.
    pub(crate) fn init(&mut self) {
        let h = self.head();
        self.next[h] = h;
        self.prev[h] = h;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.next[self.head()] == self.head()
    }

    /// `list_first_entry` (the head itself when the list is empty).
    pub(crate) fn first(&self) -> usize {
        self.next[self.head()]
    }

    /// `__list_add(new, prev, next)`; `prev` and `next` are never poison
    /// when called from [`Links::add`] and [`Links::add_tail`] on a list CRIU
    /// keeps consistent, and a crash when they are.
    fn link(&mut self, new: usize, prev: usize, next: usize) -> Result<(), Crash> {
        if prev == POISON || next == POISON || new == POISON {
            return Err(Crash);
        }
        self.prev[next] = new;
        self.next[new] = next;
        self.prev[new] = prev;
        self.next[prev] = new;
        Ok(())
    }

    /// `list_add`: `e` becomes the first entry.
    pub(crate) fn add(&mut self, e: usize) -> Result<(), Crash> {
        let h = self.head();
        self.link(e, h, self.next[h])
    }

    /// `list_add_tail`: `e` becomes the last entry.
    pub(crate) fn add_tail(&mut self, e: usize) -> Result<(), Crash> {
        let h = self.head();
        self.link(e, self.prev[h], h)
    }

    /// `list_del`: unlinks `e` and poisons its pointers. Unlinking an entry
    /// whose pointers are poisoned writes through them: a crash.
    pub(crate) fn del(&mut self, e: usize) -> Result<(), Crash> {
        let (prev, next) = (self.prev(e)?, self.next(e)?);
        if prev == POISON || next == POISON {
            return Err(Crash);
        }
        self.prev[next] = prev;
        self.next[prev] = next;
        self.next[e] = POISON;
        self.prev[e] = POISON;
        Ok(())
    }

    /// `e->next`; reading through a poisoned `e` is a crash.
    pub(crate) fn next(&self, e: usize) -> Result<usize, Crash> {
        self.next.get(e).copied().ok_or(Crash)
    }

    fn prev(&self, e: usize) -> Result<usize, Crash> {
        self.prev.get(e).copied().ok_or(Crash)
    }

    /// The entries from the head on, as `list_for_each_entry` walks them (at
    /// most `n` steps; a broken list stops at the first poison).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut e = self.first();
        while e != self.head() && e != POISON && out.len() < self.head() {
            out.push(e);
            e = self.next[e];
        }
        out
    }
}

/// A `list_for_each_entry_safe` loop: the entry being visited and the next
/// one, read when `pos` was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) pos: usize,
    pub(crate) next: usize,
}

impl Cursor {
    /// `pos = first, n = pos->next`.
    pub(crate) fn start(links: &Links) -> Result<Self, Crash> {
        let pos = links.first();
        Ok(Self {
            pos,
            next: links.next(pos)?,
        })
    }

    /// The entry to visit; `None` once the walk is back at the head.
    pub(crate) fn current(&self, links: &Links) -> Option<usize> {
        (self.pos != links.head()).then_some(self.pos)
    }

    /// `pos = n, n = n->next`, whatever happened to `n` meanwhile.
    pub(crate) fn advance(&mut self, links: &Links) -> Result<(), Crash> {
        self.pos = self.next;
        self.next = links.next(self.pos)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_prepends_add_tail_appends_del_poisons() {
        let mut l = Links::new(4);
        l.add_tail(0).unwrap();
        l.add_tail(1).unwrap();
        l.add(2).unwrap();
        assert_eq!(l.entries(), [2, 0, 1]);
        l.del(0).unwrap();
        assert_eq!(l.entries(), [2, 1]);
        assert_eq!(l.next(0), Ok(POISON));
        // Unlinking it again writes through the poison.
        assert_eq!(l.del(0), Err(Crash));
        l.add(0).unwrap();
        assert_eq!(l.entries(), [0, 2, 1]);
        l.init();
        assert!(l.is_empty());
    }

    #[test]
    fn the_safe_walk_goes_on_from_the_entry_cached_before_the_body() {
        // 0, 1, 2 listed; while visiting 0 the body takes 0 out and puts
        // it back at the head, and moves 2 to the head too: the walk goes
        // on with 1 (cached), then 1's next at that time.
        let mut l = Links::new(3);
        for e in 0..3 {
            l.add_tail(e).unwrap();
        }
        let mut c = Cursor::start(&l).unwrap();
        assert_eq!(c.current(&l), Some(0));
        l.del(0).unwrap();
        l.add(0).unwrap();
        l.del(2).unwrap();
        l.add(2).unwrap();
        assert_eq!(l.entries(), [2, 0, 1]);
        c.advance(&l).unwrap();
        assert_eq!(c.current(&l), Some(1));
        c.advance(&l).unwrap();
        assert_eq!(c.current(&l), None, "1 was last: 2 and 0 are skipped");
        // A cached entry that was unlinked and not put back: its next is
        // poison, and stepping past it reads unmapped memory.
        let mut c = Cursor::start(&l).unwrap();
        assert_eq!((c.pos, c.next), (2, 0));
        l.del(0).unwrap();
        c.advance(&l).unwrap();
        assert_eq!((c.current(&l), c.next), (Some(0), POISON));
        assert_eq!(c.advance(&l), Err(Crash));
    }
}
