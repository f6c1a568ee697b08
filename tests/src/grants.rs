//! The first promise, checked from what containers were given: no two live
//! containers that can run at the same time hold the same CU of one device.
//!
//! A container's hold on a device comes from its Allocate answer: the CU ID
//! list of `HSA_CU_MASK` for that device, or every CU when it has no mask
//! (a whole GPU or a whole compute partition). Init containers run one after
//! another and before their pod's app containers, so within one pod only two
//! app containers conflict; across pods every pair does.

use std::fmt;

/// One container's hold on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `namespace/name` of the pod (or any name unique among live pods).
    pub pod: String,
    pub container: String,
    pub init: bool,
    /// The device id as HAMi registered it (a GPU or a partition).
    pub device: String,
    /// Inclusive CU ranges; `None`: every CU of the device.
    pub cus: Option<Vec<(u32, u32)>>,
}

/// Two holds that overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub first: Held,
    pub second: Held,
    /// The CUs both hold; `None`: one of them holds the whole device.
    pub shared: Option<Vec<(u32, u32)>>,
}

fn show(cus: Option<&[(u32, u32)]>) -> String {
    match cus {
        None => "every CU".to_owned(),
        Some(ranges) => ranges
            .iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (&self.first, &self.second);
        write!(
            f,
            "device {}: {}/{} holds {} and {}/{} holds {}; both hold {}",
            a.device,
            a.pod,
            a.container,
            show(a.cus.as_deref()),
            b.pod,
            b.container,
            show(b.cus.as_deref()),
            show(self.shared.as_deref())
        )
    }
}

/// Whether the two containers can run at the same time.
fn concurrent(a: &Held, b: &Held) -> bool {
    a.pod != b.pod || (!a.init && !b.init && a.container != b.container)
}

/// The CUs two range lists share, merged; `None` when either is the whole
/// device; empty when they are disjoint.
fn shared(a: Option<&[(u32, u32)]>, b: Option<&[(u32, u32)]>) -> Option<Vec<(u32, u32)>> {
    let (a, b) = (a?, b?);
    let mut both: Vec<(u32, u32)> = a
        .iter()
        .flat_map(|x| b.iter().map(move |y| (x.0.max(y.0), x.1.min(y.1))))
        .filter(|(lo, hi)| lo <= hi)
        .collect();
    both.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(both.len());
    for (lo, hi) in both {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    Some(merged)
}

/// The overlap of `new` with one of `live`, if any.
pub fn overlap_with(new: &Held, live: &[Held]) -> Option<Overlap> {
    live.iter().find_map(|old| {
        if old.device != new.device || !concurrent(old, new) {
            return None;
        }
        let both = shared(old.cus.as_deref(), new.cus.as_deref());
        if both.as_ref().is_some_and(Vec::is_empty) {
            return None;
        }
        Some(Overlap {
            first: old.clone(),
            second: new.clone(),
            shared: both,
        })
    })
}

/// Every overlapping pair among `held`, in order.
pub fn overlaps(held: &[Held]) -> Vec<Overlap> {
    (0..held.len())
        .filter_map(|i| overlap_with(&held[i], &held[..i]))
        .collect()
}

/// The inclusive ranges of a CU ID list (`0-3,8,10-12`).
///
/// # Errors
/// A piece that is not a number or an ascending range.
pub fn parse_id_list(list: &str) -> Result<Vec<(u32, u32)>, String> {
    list.split(',')
        .map(|piece| {
            let piece = piece.trim();
            let (a, b) = piece.split_once('-').unwrap_or((piece, piece));
            let bad = || format!("CU list piece {piece:?} of {list:?}");
            let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b {
                return Err(bad());
            }
            Ok((a, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(pod: &str, container: &str, init: bool, cus: Option<&str>) -> Held {
        Held {
            pod: pod.into(),
            container: container.into(),
            init,
            device: "G".into(),
            cus: cus.map(|c| parse_id_list(c).unwrap()),
        }
    }

    #[test]
    fn pods_that_share_a_cu_overlap_and_the_shared_cus_are_named() {
        let a = held("a", "c", false, Some("0-15"));
        let b = held("b", "c", false, Some("0-25"));
        let found = overlaps(&[a.clone(), b.clone()]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].shared, Some(vec![(0, 15)]));
        assert!(
            found[0].to_string().contains("both hold 0-15"),
            "{}",
            found[0]
        );
        let c = held("c", "c", false, Some("16-39"));
        assert!(overlaps(&[a.clone(), c]).is_empty(), "disjoint slices");
        let whole = held("w", "c", false, None);
        assert_eq!(overlaps(&[a, whole])[0].shared, None, "a whole device");
    }

    #[test]
    fn within_a_pod_only_app_containers_run_together() {
        let init = held("p", "init-0", true, Some("0-9"));
        let app = held("p", "app-0", false, Some("0-9"));
        let app2 = held("p", "app-1", false, Some("5-6"));
        assert!(overlaps(&[init.clone(), app.clone()]).is_empty());
        assert_eq!(overlaps(&[init, app, app2]).len(), 1);
        let other = Held {
            device: "H".into(),
            ..held("q", "c", false, None)
        };
        assert!(overlap_with(&other, &[held("p", "c", false, None)]).is_none());
    }

    #[test]
    fn id_lists_parse_strictly() {
        assert_eq!(
            parse_id_list("0-3,8, 10-12"),
            Ok(vec![(0, 3), (8, 8), (10, 12)])
        );
        assert!(parse_id_list("3-1").is_err());
        assert!(parse_id_list("x").is_err());
        assert_eq!(
            shared(Some(&[(0, 4), (8, 9)]), Some(&[(3, 8)])),
            Some(vec![(3, 4), (8, 8)])
        );
    }
}
