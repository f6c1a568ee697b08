//! The tar headers of a layer, looked at before the `tar` crate reads them.
//!
//! `tar` (0.4.46, `archive.rs` `next_entry`) reads a GNU long-name or
//! long-link record (`L`, `K`) and a PAX record (`x`) whole into memory,
//! whatever size its header declares, before its caller sees anything: a
//! zstd layer of 33,798 bytes declaring a name of some GB took amd-gpud to
//! 5.27 GB (issue 38, F2). [`TarGuard`] sits between the decompressed layer
//! and `tar`, follows the archive's blocks the way `tar` does (header,
//! GNU sparse extension blocks, data padded to 512 bytes; a PAX `size`
//! overriding the next entry's) with `tar`'s own header parsing, and fails
//! the read of a header whose extension record is larger than its bound,
//! before a byte of that record is read.

use std::io::{self, Read};

use tar::{EntryType, GnuExtSparseHeader, Header, PaxExtensions};

use super::{Budget, Trip};

const BLOCK: u64 = 512;
/// Bytes of a GNU long-name or long-link record: a name of `PATH_MAX`
/// (4096) bytes with its NUL. No longer name can be created on Linux, so no
/// layer containerd can unpack holds one.
pub(crate) const MAX_LONG_NAME: u64 = 4096;
/// Bytes of a PAX record (`x` or `g`): a path and a link target of
/// `PATH_MAX` each, with times, ids and the few xattrs (capabilities, an
/// ACL) real layers carry, fit in well under 16 KiB.
pub(crate) const MAX_PAX: u64 = 16 << 10;

/// An extension record refused for its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// What the record is ("GNU long name", ...).
    pub(crate) record: &'static str,
    /// Its header's offset in the uncompressed layer.
    pub(crate) offset: u64,
    /// The size its header (or a PAX `size`) declares.
    pub(crate) size: u64,
    pub(crate) limit: u64,
    /// The bound's constant.
    pub(crate) bound: &'static str,
}

/// The bound of an extension record type, if it is one `tar` reads whole.
fn bound_of(kind: EntryType) -> Option<(&'static str, u64, &'static str)> {
    match kind {
        EntryType::GNULongName => Some(("GNU long name", MAX_LONG_NAME, "MAX_LONG_NAME")),
        EntryType::GNULongLink => Some(("GNU long link", MAX_LONG_NAME, "MAX_LONG_NAME")),
        EntryType::XHeader => Some(("PAX extended header", MAX_PAX, "MAX_PAX")),
        EntryType::XGlobalHeader => Some(("PAX global header", MAX_PAX, "MAX_PAX")),
        _ => None,
    }
}

/// `tar`'s `pax_extensions_value(.., "size")` (`pax.rs`): the first `size`
/// record, if every record before it parses.
fn pax_size(records: &[u8]) -> Option<u64> {
    for record in PaxExtensions::new(records) {
        let record = record.ok()?;
        if record.key() != Ok("size") {
            continue;
        }
        return record.value().ok()?.parse().ok();
    }
    None
}

/// Hands a layer's bytes on to `tar`, looking at each header first.
pub(crate) struct TarGuard<'b, R> {
    inner: R,
    budget: &'b Budget,
    /// Bytes handed on.
    pos: u64,
    /// Where the next block to look at (a header or a GNU sparse
    /// extension block) starts.
    next: u64,
    /// The block at `next` is a sparse extension block of an entry whose
    /// data (this many bytes) follows the last of them.
    sparse_data: Option<u64>,
    block: [u8; 512],
    block_len: usize,
    served: usize,
    /// The body of a PAX `x` record being read, up to its end.
    pax: Option<(Vec<u8>, u64)>,
    /// The `size` of the last PAX record, for the next entry.
    pax_pending: Option<Option<u64>>,
    /// Past the end of the archive, or where `tar` fails anyway.
    passing: bool,
}

impl<'b, R: Read> TarGuard<'b, R> {
    pub(crate) fn new(inner: R, budget: &'b Budget) -> Self {
        Self {
            inner,
            budget,
            pos: 0,
            next: 0,
            sparse_data: None,
            block: [0; 512],
            block_len: 0,
            served: 0,
            pax: None,
            pax_pending: None,
            passing: false,
        }
    }

    /// Reads the block at `next` and looks at it.
    fn take_block(&mut self) -> io::Result<()> {
        let mut len = 0;
        while len < self.block.len() {
            let n = self
                .inner
                .read(self.block.get_mut(len..).unwrap_or_default())?;
            if n == 0 {
                break;
            }
            len += n;
        }
        self.block_len = len;
        self.served = 0;
        if len < self.block.len() {
            self.passing = true; // end of the stream: `tar` ends or fails
            return Ok(());
        }
        let end = self.next + BLOCK;
        match self.sparse_data.take() {
            Some(data) => self.sparse_extension(end, data),
            None => self.header(end),
        }
        .map_err(|r| {
            self.budget.trip(Trip::Record(r));
            io::Error::other(format!("{} record refused", r.record))
        })
    }

    fn sparse_extension(&mut self, end: u64, data: u64) -> Result<(), Refusal> {
        let mut ext = GnuExtSparseHeader::new();
        ext.as_mut_bytes().copy_from_slice(&self.block);
        if ext.is_extended() {
            self.sparse_data = Some(data);
            self.next = end;
        } else {
            self.after(end, data);
        }
        Ok(())
    }

    /// The next block is `data` bytes (padded) past `end`.
    fn after(&mut self, end: u64, data: u64) {
        match data
            .checked_add(BLOCK - 1)
            .and_then(|d| end.checked_add(d & !(BLOCK - 1)))
        {
            Some(next) => self.next = next,
            None => self.passing = true, // `tar` fails: "size overflow"
        }
    }

    fn header(&mut self, end: u64) -> Result<(), Refusal> {
        if let Some((body, _)) = self.pax.take() {
            self.pax_pending = Some(pax_size(&body)); // `tar` read it whole
        }
        if self.block.iter().all(|b| *b == 0) {
            self.passing = true; // `tar` ends the archive here
            return Ok(());
        }
        let mut header = Header::new_old();
        header.as_mut_bytes().copy_from_slice(&self.block);
        let kind = header.entry_type();
        let Ok(mut size) = header.entry_size() else {
            self.passing = true; // `tar` fails on this header
            return Ok(());
        };
        let bound = bound_of(kind);
        if let (Some(Some(pax)), None) = (self.pax_pending, bound) {
            size = pax;
        }
        if let Some((record, limit, name)) = bound
            && size > limit
        {
            return Err(Refusal {
                record,
                offset: self.next,
                size,
                limit,
                bound: name,
            });
        }
        let recognized = header.as_gnu().is_some() || header.as_ustar().is_some();
        let consumed = !(recognized
            && matches!(
                kind,
                EntryType::GNULongName | EntryType::GNULongLink | EntryType::XHeader
            ));
        if consumed {
            self.pax_pending = None; // `tar` hands this entry out with them
        } else if kind == EntryType::XHeader {
            self.pax = Some((
                Vec::with_capacity(usize::try_from(size).unwrap_or(0)),
                end + size,
            ));
        }
        let sparse =
            kind == EntryType::GNUSparse && header.as_gnu().is_some_and(|g| g.is_extended());
        if sparse {
            self.sparse_data = Some(size);
            self.next = end;
        } else {
            self.after(end, size);
        }
        Ok(())
    }

    /// Keeps the bytes of a PAX record being read (looked at with the next
    /// header).
    fn capture(&mut self, bytes: &[u8]) {
        let Some((body, body_end)) = &mut self.pax else {
            return;
        };
        let start = self.pos - bytes.len() as u64;
        let keep = body_end.saturating_sub(start).min(bytes.len() as u64);
        body.extend_from_slice(
            bytes
                .get(..usize::try_from(keep).unwrap_or(0))
                .unwrap_or_default(),
        );
    }
}

impl<R: Read> Read for TarGuard<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.served == self.block_len && !self.passing && self.pos == self.next {
            self.take_block()?;
        }
        if self.served < self.block_len {
            let from = self
                .block
                .get(self.served..self.block_len)
                .unwrap_or_default();
            let n = from.len().min(buf.len());
            buf.get_mut(..n)
                .unwrap_or_default()
                .copy_from_slice(from.get(..n).unwrap_or_default());
            self.served += n;
            self.pos += n as u64;
            return Ok(n);
        }
        let room = if self.passing {
            buf.len()
        } else {
            usize::try_from(self.next - self.pos).map_or(buf.len(), |left| left.min(buf.len()))
        };
        let buf = buf.get_mut(..room).unwrap_or_default();
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        if !self.passing {
            self.capture(buf.get(..n).unwrap_or_default());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
