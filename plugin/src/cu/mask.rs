//! The CU ID-list grammar and a strict `HSA_CU_MASK` parser.
//!
//! * ID list (docs/hami-protocol.md §5.1): comma-separated, ascending; a run
//!   of two or more consecutive IDs is written `a-b`, a single ID as `a`
//!   (`0-3,8,10-12`).
//! * `HSA_CU_MASK` (docs/amd-hardware.md §9.3): `Set(;Set)*`,
//!   `Set = GPU_list ':' CU_list`, GPU ids container-local (positions in
//!   `ROCR_VISIBLE_DEVICES`).
//!
//! ROCr stops *silently* at the first bad set and leaves later GPUs unrestricted
//! (§9.3 "Errors"), so we validate every mask we emit, and more strictly than
//! ROCr: no hex CU lists (we never emit them), IDs strictly ascending without
//! overlap, every GPU id below the container's GPU count and used once, every CU
//! below that GPU's count, whole WGP pairs on gfx10+.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Range,
};

use super::CuError;

/// What the parser needs to know about one container-local GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuShape {
    /// Number of logical active CUs (valid CU ids are `0..cu_count`).
    pub(crate) cu_count: u32,
    /// 1 before gfx10, 2 on gfx10+ (WGP pairs `(2k, 2k+1)`).
    pub(crate) cus_per_wgp: u32,
}

/// Sorts `ranges`, drops empty ones and merges overlapping or adjacent ones.
#[must_use]
pub(crate) fn normalize(ranges: &[Range<u32>]) -> Vec<Range<u32>> {
    let mut sorted: Vec<Range<u32>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u32>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Renders half-open `ranges` as a canonical ID list (normalised first), e.g.
/// `[0..4, 8..9, 10..13]` → `0-3,8,10-12`. Empty input gives an empty string.
#[must_use]
pub(crate) fn format_id_list(ranges: &[Range<u32>]) -> String {
    normalize(ranges)
        .iter()
        .map(|r| {
            if r.end - r.start == 1 {
                r.start.to_string()
            } else {
                format!("{}-{}", r.start, r.end - 1)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses an ID list into half-open ranges, in order. Strict: decimal only,
/// no empty tokens, `a <= b` in `a-b`, each token strictly after the previous.
///
/// # Errors
/// [`CuError::Malformed`] naming the problem.
pub(crate) fn parse_id_list(text: &str) -> Result<Vec<Range<u32>>, CuError> {
    let mut out: Vec<Range<u32>> = Vec::new();
    for token in text.split(',') {
        let (a, b) = match token.split_once('-') {
            Some((a, b)) => (parse_id(text, a)?, parse_id(text, b)?),
            None => {
                let a = parse_id(text, token)?;
                (a, a)
            }
        };
        if a > b {
            return Err(CuError::malformed(
                text,
                format!("descending range {token:?}"),
            ));
        }
        let end = b
            .checked_add(1)
            .ok_or_else(|| CuError::malformed(text, format!("id {b} too large")))?;
        if out.last().is_some_and(|last| a < last.end) {
            return Err(CuError::malformed(
                text,
                format!("{token:?} is not ascending"),
            ));
        }
        out.push(a..end);
    }
    Ok(out)
}

fn parse_id(text: &str, token: &str) -> Result<u32, CuError> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CuError::malformed(
            text,
            format!("{token:?} is not a decimal id"),
        ));
    }
    token
        .parse()
        .map_err(|_| CuError::malformed(text, format!("id {token:?} too large")))
}

/// Parses an `HSA_CU_MASK` in ID-list form for a container whose GPUs, in
/// container-local order, are `gpus`. Returns the enabled CUs per GPU id.
/// Whitespace is ignored, as ROCr does.
///
/// # Errors
/// [`CuError::Malformed`] on any grammar or index-space violation,
/// [`CuError::SplitWgp`] for half a WGP on a gfx10+ GPU.
pub(crate) fn parse_cu_mask(
    text: &str,
    gpus: &[GpuShape],
) -> Result<BTreeMap<u32, BTreeSet<u32>>, CuError> {
    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = BTreeMap::new();
    for set in clean.split(';') {
        let Some((gpu_list, cu_list)) = set.split_once(':') else {
            return Err(CuError::malformed(text, format!("set {set:?} lacks ':'")));
        };
        if cu_list.starts_with("0x") || cu_list.starts_with("0X") {
            return Err(CuError::malformed(text, "hex CU lists are not accepted"));
        }
        let cus = parse_id_list(cu_list)?;
        for gpu in parse_id_list(gpu_list)?.into_iter().flatten() {
            let shape = usize::try_from(gpu)
                .ok()
                .and_then(|i| gpus.get(i))
                .ok_or_else(|| CuError::malformed(text, format!("GPU id {gpu} out of range")))?;
            let set = cu_set(text, gpu, *shape, &cus)?;
            if out.insert(gpu, set).is_some() {
                return Err(CuError::malformed(text, format!("duplicate GPU id {gpu}")));
            }
        }
    }
    Ok(out)
}

/// Checks `cus` against one GPU's shape and expands them into a set.
fn cu_set(
    text: &str,
    gpu: u32,
    shape: GpuShape,
    cus: &[Range<u32>],
) -> Result<BTreeSet<u32>, CuError> {
    if let Some(r) = cus.iter().find(|r| r.end > shape.cu_count) {
        return Err(CuError::malformed(
            text,
            format!(
                "GPU {gpu}: CU {} not below its {} CUs",
                r.end - 1,
                shape.cu_count
            ),
        ));
    }
    let set: BTreeSet<u32> = cus.iter().cloned().flatten().collect();
    if shape.cus_per_wgp == 2
        && let Some(&cu) = set.iter().find(|&&cu| !set.contains(&(cu ^ 1)))
    {
        return Err(CuError::SplitWgp {
            gpu: gpu.to_string(),
            cu,
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: GpuShape = GpuShape {
        cu_count: 304,
        cus_per_wgp: 1,
    };
    const WGP: GpuShape = GpuShape {
        cu_count: 64,
        cus_per_wgp: 2,
    };

    #[test]
    fn formats_canonical_id_lists() {
        assert_eq!(format_id_list(&[0..4, 8..9, 10..13]), "0-3,8,10-12");
        assert_eq!(format_id_list(&[10..13, 0..2, 2..4, 5..5]), "0-3,10-12");
        assert_eq!(format_id_list(&[]), "");
    }

    #[test]
    fn parses_id_lists() {
        assert_eq!(
            parse_id_list("0-3,8,10-12").unwrap(),
            vec![0..4, 8..9, 10..13]
        );
        for bad in [
            "",
            "1,",
            "-1",
            "3-1",
            "0-3,2",
            "4,4",
            "a",
            "+1",
            "0x3",
            "4294967295",
        ] {
            assert!(parse_id_list(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn parses_masks_per_gpu() {
        let m = parse_cu_mask(" 0:0-3 ; 1,2:8-9,12-13", &[PLAIN, WGP, PLAIN]).unwrap();
        assert_eq!(m[&0], (0..4).collect());
        assert_eq!(m[&1], [8, 9, 12, 13].into_iter().collect());
        assert_eq!(m[&2], m[&1]);
    }

    #[test]
    fn rejects_what_rocr_would_silently_drop() {
        let gpus = [PLAIN, WGP];
        for bad in [
            "",
            "0:0-3;",
            "0:0-3;0:4-5",  // duplicate GPU id
            "0,0:0-3",      // duplicate inside a GPU list
            "2:0-3",        // GPU id past the container's GPUs
            "0:0-304",      // CU id not below the count
            "1:0-64",       // CU id not below the count (WGP GPU)
            "1:1-2",        // half WGPs
            "1:0-2",        // trailing half WGP
            "0:0x0000FFFF", // hex form is never emitted by us
            "0-0:",         // empty CU list
            "0;1:0-1",      // set without ':'
            "0:1:2",        // two ':'
        ] {
            assert!(parse_cu_mask(bad, &gpus).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            parse_cu_mask("1:1-2", &gpus),
            Err(CuError::SplitWgp { cu: 1, .. })
        ));
    }
}
