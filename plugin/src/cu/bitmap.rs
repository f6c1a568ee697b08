//! Per-GPU occupancy of logical CU indices, and the choice of a CU slice.
//!
//! Indices are *logical active* CUs, `0..total` (docs/amd-hardware.md §9.3 "Bit
//! meaning"). On gfx10+ CUs come in WGP pairs `(2k, 2k+1)` and a mask that
//! enables half a pair is silently ignored by ROCr (§9.3 "gfx10+ (WGP)"), so
//! [`CuBitmap::choose`] hands out whole pairs only.

use std::ops::Range;

use super::CuError;

#[cfg(test)]
/// CUs granted for a `gpucores` percentage, as HAMi's scheduler computes it
/// (docs/hami-protocol.md §4.2 "Cores"): `total × percent / 100` rounded
/// **down** (integer division), then clamped to `[1, total]`. A GPU with `total == 0`
/// gets 0 (the scheduler refuses it with `CardInsufficientCore`). Percentages
/// above 100 are clamped to `total` by the same rule.
#[must_use]
pub(crate) fn cus_for_percent(total: u32, percent: u32) -> u32 {
    if total == 0 {
        return 0;
    }
    let raw = u64::from(total) * u64::from(percent) / 100;
    let clamped = raw.clamp(1, u64::from(total));
    u32::try_from(clamped).unwrap_or(total)
}

/// The CUs a grant of `granted` gets on a GPU whose CUs come in units of
/// `unit` (WGP pairs on gfx10+): a grant below one unit (1 CU, HAMi's
/// smallest, on a gfx10+ GPU) gets one whole unit, when one is free,
/// rather than nothing; above that, whole units as before (rounded down).
/// HAMi then counts one CU fewer than the pod holds; the occupancy the
/// plugin rebuilds counts what it holds, and accepts that one unit as within
/// the grant.
pub(crate) fn smallest_share(granted: u32, unit: u32) -> u32 {
    if granted > 0 && granted < unit {
        unit
    } else {
        granted
    }
}

/// Occupancy of one GPU's logical CUs: a compact bitset, one bit per CU
/// (set = claimed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CuBitmap {
    gpu: String,
    total: u32,
    words: Vec<u64>,
}

impl CuBitmap {
    /// An empty (all free) bitmap for `gpu` with `total` logical CUs.
    #[must_use]
    pub(crate) fn new(gpu: impl Into<String>, total: u32) -> Self {
        let words = vec![0; total.div_ceil(64) as usize];
        Self {
            gpu: gpu.into(),
            total,
            words,
        }
    }

    /// The GPU label used in errors.
    #[must_use]
    pub(crate) fn gpu(&self) -> &str {
        &self.gpu
    }

    /// Number of logical CUs.
    #[must_use]
    pub(crate) fn total(&self) -> u32 {
        self.total
    }

    #[cfg(test)]
    /// Whether `cu` exists and is not claimed.
    #[must_use]
    pub(crate) fn is_free(&self, cu: u32) -> bool {
        cu < self.total && !self.bit(cu)
    }

    #[cfg(test)]
    /// Number of free CUs.
    #[must_use]
    pub(crate) fn free_count(&self) -> u32 {
        let claimed: u32 = self.words.iter().map(|w| w.count_ones()).sum();
        self.total - claimed
    }

    /// Marks every CU of `range` claimed. All-or-nothing: on error nothing changes.
    ///
    /// # Errors
    /// [`CuError::OutOfRange`] past `total`; [`CuError::AlreadyClaimed`] on overlap.
    pub(crate) fn claim(&mut self, range: Range<u32>) -> Result<(), CuError> {
        self.check_range(&range)?;
        if let Some(cu) = range.clone().find(|&cu| self.bit(cu)) {
            return Err(CuError::AlreadyClaimed {
                gpu: self.gpu.clone(),
                cu,
            });
        }
        range.for_each(|cu| self.set_bit(cu, true));
        Ok(())
    }

    /// Marks every CU of `range` claimed, whether or not some already are;
    /// returns the first CU that already was.
    ///
    /// # Errors
    /// [`CuError::OutOfRange`] past `total` (then nothing changes).
    pub(crate) fn occupy(&mut self, range: Range<u32>) -> Result<Option<u32>, CuError> {
        self.check_range(&range)?;
        let first = range.clone().find(|&cu| self.bit(cu));
        range.for_each(|cu| self.set_bit(cu, true));
        Ok(first)
    }

    #[cfg(test)]
    /// Marks every CU of `range` free. All-or-nothing: on error nothing changes.
    ///
    /// # Errors
    /// [`CuError::OutOfRange`] past `total`; [`CuError::NotClaimed`] on a double free.
    pub(crate) fn release(&mut self, range: Range<u32>) -> Result<(), CuError> {
        self.check_range(&range)?;
        if let Some(cu) = range.clone().find(|&cu| !self.bit(cu)) {
            return Err(CuError::NotClaimed {
                gpu: self.gpu.clone(),
                cu,
            });
        }
        range.for_each(|cu| self.set_bit(cu, false));
        Ok(())
    }

    /// Chooses free CUs for a slice of `want` CUs without claiming them.
    ///
    /// * `cus_per_wgp` is 1 (whole CUs) or 2 (gfx10+: whole WGP pairs
    ///   `(2k, 2k+1)`, `want` rounded **down** to an even count).
    /// * Never more than `want` CUs; exactly the rounded `want` on success.
    /// * One contiguous range when any fits (first fit, lowest start); otherwise
    ///   the fewest ranges (longest free runs first), returned in ascending order.
    ///
    /// # Errors
    /// [`CuError::BadCusPerWgp`]; [`CuError::BelowSmallestShare`] when `want` is
    /// below one unit; [`CuError::NotEnoughFree`] when the free units fall short.
    pub(crate) fn choose(&self, want: u32, cus_per_wgp: u32) -> Result<Vec<Range<u32>>, CuError> {
        let unit = match cus_per_wgp {
            1 | 2 => cus_per_wgp,
            _ => {
                return Err(CuError::BadCusPerWgp {
                    gpu: self.gpu.clone(),
                    cus_per_wgp,
                });
            }
        };
        let want_units = want / unit;
        if want_units == 0 {
            return Err(CuError::BelowSmallestShare {
                gpu: self.gpu.clone(),
                want,
                smallest: unit,
            });
        }
        let runs = self.free_unit_runs(unit);
        let free_units: u32 = runs.iter().map(|r| r.end - r.start).sum();
        if free_units < want_units {
            return Err(CuError::NotEnoughFree {
                gpu: self.gpu.clone(),
                want: want_units * unit,
                free: free_units * unit,
            });
        }
        let picked = pick_runs(runs, want_units);
        Ok(picked
            .into_iter()
            .map(|r| r.start * unit..r.end * unit)
            .collect())
    }

    /// Maximal runs of free allocation units (unit `k` = CUs `k*unit..(k+1)*unit`),
    /// in ascending order. A trailing partial unit is never used.
    fn free_unit_runs(&self, unit: u32) -> Vec<Range<u32>> {
        let units = self.total / unit;
        let unit_free = |k: u32| (k * unit..(k + 1) * unit).all(|cu| !self.bit(cu));
        let mut runs = Vec::new();
        let mut start = None;
        for k in 0..units {
            match (unit_free(k), start) {
                (true, None) => start = Some(k),
                (false, Some(s)) => {
                    runs.push(s..k);
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push(s..units);
        }
        runs
    }

    fn check_range(&self, range: &Range<u32>) -> Result<(), CuError> {
        if range.start > range.end || range.end > self.total {
            return Err(CuError::OutOfRange {
                gpu: self.gpu.clone(),
                start: range.start,
                end: range.end,
                total: self.total,
            });
        }
        Ok(())
    }

    fn bit(&self, cu: u32) -> bool {
        self.words[(cu / 64) as usize] & (1 << (cu % 64)) != 0
    }

    fn set_bit(&mut self, cu: u32, on: bool) {
        let word = &mut self.words[(cu / 64) as usize];
        if on {
            *word |= 1 << (cu % 64);
        } else {
            *word &= !(1 << (cu % 64));
        }
    }
}

/// Picks `want` units from free `runs` (ascending, their total ≥ `want`):
/// the first run that holds all of them, else the longest runs first (fewest
/// ranges), the last one trimmed from its start. Result in ascending order.
fn pick_runs(mut runs: Vec<Range<u32>>, want: u32) -> Vec<Range<u32>> {
    if let Some(r) = runs.iter().find(|r| r.end - r.start >= want) {
        return std::iter::once(r.start..r.start + want).collect();
    }
    // Stable sort: equal lengths keep ascending start order.
    runs.sort_by_key(|r| std::cmp::Reverse(r.len()));
    let mut left = want;
    let mut picked = Vec::new();
    for r in runs {
        if left == 0 {
            break;
        }
        let take = left.min(r.end - r.start);
        picked.push(r.start..r.start + take);
        left -= take;
    }
    picked.sort_by_key(|r| r.start);
    picked
}

#[cfg(test)]
mod tests;
