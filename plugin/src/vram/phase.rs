//! The VRAM a pod can use at once from the start of one of its containers
//! on (docs/hami-protocol.md §4.2): the pod's cap follows its containers'
//! phases instead of adding every grant, and never exceeds what HAMi counts.
//!
//! HAMi (v2.10.0, `pkg/device/initContainer.go`) counts a pod's VRAM on a
//! GPU as `max(init peak, app sum)`, sidecars among the init peaks, and the
//! app sum alone once every init container succeeded. What runs at once:
//! - while a regular init container runs: its grant and the sidecars
//!   started before it (init containers run one after another);
//! - a sidecar, when it starts: the same, itself with the earlier sidecars;
//! - from the first app container on: every app container and every
//!   sidecar.
//!
//! The cap at each PreStartContainer is the smaller of what runs at once and
//! HAMi's count, so that the caps of a node's pods never add up to more than
//! HAMi placed there. Where HAMi undercounts (an app container beside a
//! sidecar), the cap is HAMi's count: a container that bypasses the memory
//! hook cannot take VRAM HAMi gave another pod.

use std::collections::BTreeMap;

use crate::hami::containers::{EntryContainer, Stage};

/// Bytes per region (the GPU's PCI address) of one container's grant.
pub(crate) type Grant = BTreeMap<String, u64>;

/// The smallest cap amd-gpud takes (`SetPodVramLimits` refuses less than
/// 1 MiB): a region the pod uses nowhere in this phase gets it.
const FLOOR: u64 = 1024 * 1024;

fn add(into: &mut Grant, grant: &Grant) {
    for (region, bytes) in grant {
        let sum = into.entry(region.clone()).or_default();
        *sum = sum.saturating_add(*bytes);
    }
}

/// HAMi's count of the pod per region: `max(init peak, app sum)`.
pub(crate) fn hami_count(grants: &[Grant], containers: &[EntryContainer<'_>]) -> Grant {
    let mut apps = Grant::new();
    let mut peak = Grant::new();
    for (grant, container) in grants.iter().zip(containers) {
        if container.stage == Stage::App {
            add(&mut apps, grant);
        } else {
            for (region, bytes) in grant {
                let top = peak.entry(region.clone()).or_default();
                *top = (*top).max(*bytes);
            }
        }
    }
    for (region, bytes) in apps {
        let top = peak.entry(region).or_default();
        *top = (*top).max(bytes);
    }
    peak
}

/// What runs at once from the start of container `starting` on.
fn at_once(grants: &[Grant], containers: &[EntryContainer<'_>], starting: usize) -> Grant {
    let mut sum = Grant::new();
    let stage = containers.get(starting).map_or(Stage::App, |c| c.stage);
    for (k, (grant, container)) in grants.iter().zip(containers).enumerate() {
        let runs = match (stage, container.stage) {
            (Stage::App, Stage::App | Stage::Sidecar) => true,
            (Stage::App, Stage::Init) => false,
            (Stage::Init | Stage::Sidecar, Stage::Sidecar) => k <= starting,
            (Stage::Init | Stage::Sidecar, _) => k == starting,
        };
        if runs {
            add(&mut sum, grant);
        }
    }
    sum
}

/// The pod's cap per region from the start of the container named
/// `starting` on (when unknown: HAMi's count, the most any phase may have);
/// every region of the pod's grants has a value.
pub(crate) fn cap(
    grants: &[Grant],
    containers: &[EntryContainer<'_>],
    starting: Option<&str>,
) -> Grant {
    let count = hami_count(grants, containers);
    let now = match starting.and_then(|name| containers.iter().position(|c| c.name == name)) {
        Some(k) => at_once(grants, containers, k),
        None => count.clone(),
    };
    count
        .into_iter()
        .map(|(region, most)| {
            let bytes = now.get(&region).copied().unwrap_or(0).min(most);
            (region, bytes.max(FLOOR))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn grant(pairs: &[(&str, u64)]) -> Grant {
        pairs.iter().map(|(r, b)| ((*r).to_owned(), *b)).collect()
    }

    fn container(name: &str, stage: Stage) -> EntryContainer<'_> {
        EntryContainer { name, stage }
    }

    /// The RX 9070 XT (16 GiB): pod A's init container takes 12 GiB,
    /// its app 4 GiB; HAMi places pod B with 12 GiB once A's init succeeded.
    /// A's cap from its app on is 4 GiB, so the two caps fill the GPU and no
    /// more (the sum of A's grants, 16 GiB, left 28 GiB of caps).
    #[test]
    fn caps_on_a_16_gib_gpu_add_up_to_the_gpu() {
        let a = [grant(&[("g", 12 * GIB)]), grant(&[("g", 4 * GIB)])];
        let a_containers = [container("init", Stage::Init), container("app", Stage::App)];
        let during_init = cap(&a, &a_containers, Some("init"));
        assert_eq!(during_init, grant(&[("g", 12 * GIB)]));
        let a_app = cap(&a, &a_containers, Some("app"));
        assert_eq!(a_app, grant(&[("g", 4 * GIB)]));
        let b = [grant(&[("g", 12 * GIB)])];
        let b_cap = cap(&b, &[container("c", Stage::App)], Some("c"));
        assert_eq!(a_app["g"] + b_cap["g"], 16 * GIB, "at most the GPU");
    }

    /// A sidecar runs beside later init containers and the apps; HAMi counts
    /// it as an init peak only, so from the apps on the cap is HAMi's count.
    #[test]
    fn sidecars_count_while_they_run_and_never_above_hami() {
        let grants = [
            grant(&[("g", 2 * GIB)]),
            grant(&[("g", 3 * GIB), ("h", GIB)]),
            grant(&[("g", 5 * GIB)]),
            grant(&[("g", GIB)]),
        ];
        let containers = [
            container("side", Stage::Sidecar),
            container("init", Stage::Init),
            container("app-a", Stage::App),
            container("app-b", Stage::App),
        ];
        let count = hami_count(&grants, &containers);
        assert_eq!(count, grant(&[("g", 6 * GIB), ("h", GIB)]));
        let side = cap(&grants, &containers, Some("side"));
        assert_eq!(side, grant(&[("g", 2 * GIB), ("h", FLOOR)]));
        let init = cap(&grants, &containers, Some("init"));
        assert_eq!(init, grant(&[("g", 5 * GIB), ("h", GIB)]));
        // Apps 6 GiB + sidecar 2 GiB run at once; HAMi counts 6 GiB.
        let app = cap(&grants, &containers, Some("app-b"));
        assert_eq!(app, grant(&[("g", 6 * GIB), ("h", FLOOR)]));
        for starting in [
            None,
            Some("side"),
            Some("init"),
            Some("app-a"),
            Some("gone"),
        ] {
            let cap = cap(&grants, &containers, starting);
            for (region, bytes) in &cap {
                assert!(*bytes <= count[region].max(FLOOR), "{starting:?} {region}");
            }
        }
    }
}
