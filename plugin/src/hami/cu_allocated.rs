//! The pod annotation `hami.io/amd-cu-allocated` (docs/hami-protocol.md §5.1).
//!
//! A JSON object mapping each registered GPU `id` to the CUs the pod holds on
//! it, as an ID list: comma-separated, ascending, with runs of two or more
//! consecutive CUs written `a-b`, for example `{"<id>":"0-3,8,10-12"}`. One
//! object per pod, the union over its containers. HAMi never reads it; the
//! plugin's rebuild does, and fails closed on anything malformed. The same
//! ID-list syntax is used in `HSA_CU_MASK` (§5.2), see [`CuList`]'s `Display`.
//!
//! Users can write the annotation on their own pods, so a value is bounded
//! before it is parsed ([`MAX_VALUE_LEN`], [`MAX_GPUS`], [`MAX_RANGES`]) and a
//! list is only ever handled as ranges here: `0-4294967295` costs one range,
//! never four billion indices. Consumers bound each list by the GPU it names
//! ([`CuList::max`]) before they expand it.

use std::{collections::BTreeMap, fmt};

use super::{CU_ALLOCATED_KEY, HamiError, field_problem};

/// Longest value accepted, in bytes. What the plugin writes is far shorter:
/// even every other CU of 64 GPUs of 304 CUs is about 40 kB.
pub(crate) const MAX_VALUE_LEN: usize = 64 * 1024;
/// Most GPU ids in one value (a node registers at most a few dozen devices).
pub(crate) const MAX_GPUS: usize = 256;
/// Most ranges in one CU list (every other CU of a GPU of 8192 CUs).
pub(crate) const MAX_RANGES: usize = 4096;
/// How much of a refused list an error quotes.
const QUOTED: usize = 64;

/// An inclusive range of CU indices, `start <= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CuRange {
    pub(crate) start: u32,
    pub(crate) end: u32,
}

impl CuRange {
    /// Number of CUs in the range.
    pub(crate) fn count(self) -> u64 {
        u64::from(self.end - self.start) + 1
    }
}

/// A set of CU indices, kept as sorted, disjoint, non-adjacent ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CuList(Vec<CuRange>);

impl CuList {
    /// The set of the given CU indices (any order, duplicates allowed).
    pub(crate) fn from_indices(indices: impl IntoIterator<Item = u32>) -> Self {
        let mut sorted: Vec<u32> = indices.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut list = Self::default();
        for cu in sorted {
            list.push(CuRange { start: cu, end: cu });
        }
        list
    }

    /// Parses an ID list such as `0-3,8,10-12`. Adjacent items (`0-3,4`) are
    /// merged; items must be ascending and must not overlap.
    ///
    /// # Errors
    /// The reason, naming the offending item.
    pub(crate) fn parse(s: &str) -> Result<Self, CuListError> {
        if s.is_empty() {
            return Err(CuListError::Empty);
        }
        let mut list = Self::default();
        for item in s.split(',') {
            if list.0.len() >= MAX_RANGES {
                return Err(CuListError::TooManyRanges);
            }
            let range = parse_item(item)?;
            if let Some(&last) = list.0.last()
                && range.start <= last.end
            {
                return Err(CuListError::NotAscending {
                    item: item.to_owned(),
                    last,
                });
            }
            list.push(range);
        }
        Ok(list)
    }

    /// Appends a range lying above every range so far, merging if adjacent.
    fn push(&mut self, range: CuRange) {
        match self.0.last_mut() {
            Some(last) if last.end.checked_add(1) == Some(range.start) => last.end = range.end,
            _ => self.0.push(range),
        }
    }

    /// The ranges, ascending and disjoint.
    pub(crate) fn ranges(&self) -> &[CuRange] {
        &self.0
    }

    /// Number of CUs in the set.
    pub(crate) fn len(&self) -> u64 {
        self.0.iter().map(|r| r.count()).sum()
    }

    /// True when the set holds no CU.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The highest CU index, for checking against the GPU's `devcore`.
    pub(crate) fn max(&self) -> Option<u32> {
        self.0.last().map(|r| r.end)
    }

    /// True when `cu` is in the set.
    pub(crate) fn contains(&self, cu: u32) -> bool {
        self.0.iter().any(|r| r.start <= cu && cu <= r.end)
    }

    #[cfg(test)]
    /// True when the two sets share a CU.
    pub(crate) fn overlaps(&self, other: &Self) -> bool {
        let (mut a, mut b) = (self.0.iter().peekable(), other.0.iter().peekable());
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            if x.end < y.start {
                a.next();
            } else if y.end < x.start {
                b.next();
            } else {
                return true;
            }
        }
        false
    }

    /// The CUs of both sets, computed on the ranges (nothing is expanded).
    #[must_use]
    pub(crate) fn union(&self, other: &Self) -> Self {
        let mut all: Vec<CuRange> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut out = Self::default();
        for r in all {
            match out.0.last_mut() {
                Some(last) if r.start <= last.end.saturating_add(1) => {
                    last.end = last.end.max(r.end);
                }
                _ => out.0.push(r),
            }
        }
        out
    }

    /// The CUs of `self` not in `other`, computed on the ranges.
    #[must_use]
    pub(crate) fn difference(&self, other: &Self) -> Self {
        let mut out = Self::default();
        let mut cuts = other.0.iter().peekable();
        for r in &self.0 {
            // What is left of `r` starts at `start`; `None` once it is all cut.
            let mut start = Some(r.start);
            while let (Some(from), Some(cut)) = (start, cuts.peek().copied()) {
                if cut.end < from {
                    cuts.next();
                    continue;
                }
                if cut.start > r.end {
                    break;
                }
                if cut.start > from {
                    out.push(CuRange {
                        start: from,
                        end: cut.start - 1,
                    });
                }
                if cut.end >= r.end {
                    // The cut may reach into the next range too: keep it.
                    start = None;
                } else {
                    start = Some(cut.end + 1);
                    cuts.next();
                }
            }
            if let Some(start) = start {
                out.push(CuRange { start, end: r.end });
            }
        }
        out
    }

    #[cfg(test)]
    /// True when every CU of `self` is in `other`.
    pub(crate) fn is_subset(&self, other: &Self) -> bool {
        self.difference(other).is_empty()
    }

    /// Every CU index, ascending. Only for a list bounded by its GPU
    /// ([`CuList::max`]): a forged range would be billions of indices.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().flat_map(|r| r.start..=r.end)
    }
}

impl fmt::Display for CuList {
    /// The canonical ID list: `a` for a single CU, `a-b` for a run of two or more.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.start == r.end {
                write!(f, "{}", r.start)?;
            } else {
                write!(f, "{}-{}", r.start, r.end)?;
            }
        }
        Ok(())
    }
}

/// Why a CU list such as `0-3,8` does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CuListError {
    #[error("empty CU list")]
    Empty,
    #[error("more than {MAX_RANGES} ranges")]
    TooManyRanges,
    #[error(
        "item {item:?} is not above {}-{}: the list must be ascending and non-overlapping",
        last.start,
        last.end
    )]
    NotAscending { item: String, last: CuRange },
    #[error("item {item:?}: range start is above its end")]
    StartAboveEnd { item: String },
    #[error("item {item:?}: {index:?} is not a CU index")]
    NotAnIndex { item: String, index: String },
    #[error("item {item:?}: CU index {index} is too large")]
    TooLarge { item: String, index: String },
}

fn parse_item(item: &str) -> Result<CuRange, CuListError> {
    let (start, end) = match item.split_once('-') {
        Some((a, b)) => (parse_cu(item, a)?, parse_cu(item, b)?),
        None => {
            let cu = parse_cu(item, item)?;
            (cu, cu)
        }
    };
    if start > end {
        return Err(CuListError::StartAboveEnd {
            item: item.to_owned(),
        });
    }
    Ok(CuRange { start, end })
}

fn parse_cu(item: &str, s: &str) -> Result<u32, CuListError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CuListError::NotAnIndex {
            item: item.to_owned(),
            index: s.to_owned(),
        });
    }
    s.parse().map_err(|_| CuListError::TooLarge {
        item: item.to_owned(),
        index: s.to_owned(),
    })
}

/// The whole annotation: GPU `id` to the pod's CUs on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CuAllocated(pub BTreeMap<String, CuList>);

impl CuAllocated {
    /// Compact JSON with ids sorted and canonical ID lists.
    ///
    /// # Errors
    /// When an id is empty or contains `,` `:` `;`, or a list is empty.
    pub(crate) fn encode(&self) -> Result<String, HamiError> {
        let mut plain = BTreeMap::new();
        for (id, list) in &self.0 {
            check_id(id, &list.to_string())?;
            if list.is_empty() {
                return Err(cu_error(id, "", "empty CU list"));
            }
            plain.insert(id.as_str(), list.to_string());
        }
        serde_json::to_string(&plain).map_err(|e| HamiError::Json {
            annotation: CU_ALLOCATED_KEY,
            reason: e.to_string(),
        })
    }
}

/// Decodes the annotation value.
///
/// # Errors
/// Not a JSON object of strings, a bad id, or a malformed CU list; the error
/// names the id and the list.
pub(crate) fn parse_cu_allocated(s: &str) -> Result<CuAllocated, HamiError> {
    if s.len() > MAX_VALUE_LEN {
        return Err(HamiError::TooLong {
            annotation: CU_ALLOCATED_KEY,
            len: s.len(),
            limit: MAX_VALUE_LEN,
        });
    }
    let plain: BTreeMap<String, String> = serde_json::from_str(s).map_err(|e| HamiError::Json {
        annotation: CU_ALLOCATED_KEY,
        reason: e.to_string(),
    })?;
    if plain.len() > MAX_GPUS {
        return Err(HamiError::TooMany {
            annotation: CU_ALLOCATED_KEY,
            what: "GPU ids",
            count: plain.len(),
            limit: MAX_GPUS,
        });
    }
    let mut out = BTreeMap::new();
    for (id, list) in plain {
        check_id(&id, &list)?;
        let parsed = CuList::parse(&list).map_err(|why| cu_error(&id, &list, &why.to_string()))?;
        out.insert(id, parsed);
    }
    Ok(CuAllocated(out))
}

fn check_id(id: &str, list: &str) -> Result<(), HamiError> {
    match field_problem(id) {
        Some(problem) => Err(cu_error(id, list, &format!("id {problem}"))),
        None => Ok(()),
    }
}

/// The error for `list` of `id`, both quoted at most [`QUOTED`] bytes long
/// (the reason goes into logs and Events).
fn cu_error(id: &str, list: &str, reason: &str) -> HamiError {
    HamiError::CuList {
        id: quote(id),
        list: quote(list),
        reason: reason.to_owned(),
    }
}

fn quote(s: &str) -> String {
    if s.len() <= QUOTED {
        return s.to_owned();
    }
    let mut end = QUOTED;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests;
