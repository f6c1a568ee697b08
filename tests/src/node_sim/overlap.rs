//! The report's overlap check: which containers were given the same CUs of
//! one device while they ran at the same time.
//!
//! [`crate::grants`] decides from what each container was given, and who
//! runs beside whom within a pod. Across pods it counts every pair, which
//! holds while nothing ends; but an init container that completed held its
//! CUs only until then, and HAMi gives them to later pods once every init
//! container of its pod succeeded (`docs/hami-protocol.md` §4.2). So each
//! hold carries when its container ran, as far as node-sim saw it
//! ([`Span`]), and two holds whose spans are known to be apart never
//! overlap. A sidecar (an init container with `restartPolicy: Always`)
//! never ends and runs beside its pod's app containers.

use super::report::PodReport;
use crate::grants::{Held, Overlap, overlap_with};

/// When a container ran, as far as node-sim saw it, in Unix nanoseconds.
/// The default, nothing known, runs at the same time as everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// When the runtime created it; `None`: not known.
    pub from: Option<u64>,
    /// A time by which it had ended (an init container whose pod's next
    /// container was created); `None`: it runs on, or it is not known.
    pub ended_by: Option<u64>,
}

impl Span {
    /// Whether one of the two had ended by the time the other was created.
    pub fn apart(&self, other: &Self) -> bool {
        let before = |a: &Self, b: &Self| matches!((a.ended_by, b.from), (Some(end), Some(start)) if end <= start);
        before(self, other) || before(other, self)
    }
}

/// One container's hold on one device, with when it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub held: Held,
    pub span: Span,
}

/// Every overlapping pair among `held` whose containers ran at the same
/// time, in order (at most one per hold, the earliest).
pub fn overlaps(held: &[Timed]) -> Vec<Overlap> {
    (0..held.len())
        .filter_map(|i| {
            let new = &held[i];
            held[..i]
                .iter()
                .filter(|old| !old.span.apart(&new.span))
                .find_map(|old| overlap_with(&new.held, std::slice::from_ref(&old.held)))
        })
        .collect()
}

/// The overlaps among the containers of `pods`, as the report words them.
pub fn of_pods(pods: &[PodReport]) -> Vec<String> {
    let held: Vec<Timed> = pods.iter().flat_map(PodReport::timed_holds).collect();
    overlaps(&held).iter().map(ToString::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::parse_id_list;

    fn timed(pod: &str, container: &str, init: bool, cus: &str, span: Span) -> Timed {
        Timed {
            held: Held {
                pod: pod.into(),
                container: container.into(),
                init,
                device: "n/G".into(),
                cus: Some(parse_id_list(cus).unwrap()),
            },
            span,
        }
    }

    const fn span(from: Option<u64>, ended_by: Option<u64>) -> Span {
        Span { from, ended_by }
    }

    #[test]
    fn a_finished_init_container_overlaps_nothing_created_after_it_ended() {
        let init = timed("a", "prep", true, "0-37", span(Some(10), Some(20)));
        let later = timed("b", "main", false, "0-37", span(Some(30), None));
        assert!(overlaps(&[init.clone(), later.clone()]).is_empty());
        let during = timed("b", "main", false, "0-37", span(Some(15), None));
        assert_eq!(
            overlaps(&[init.clone(), during]).len(),
            1,
            "created before it ended"
        );
        let running = timed("a", "prep", true, "0-37", span(Some(10), None));
        assert_eq!(
            overlaps(&[running, later.clone()]).len(),
            1,
            "still running"
        );
        let unknown = timed("b", "main", false, "0-37", Span::default());
        assert_eq!(
            overlaps(&[init, unknown]).len(),
            1,
            "nothing known: concurrent"
        );
        let apps = timed("c", "main", false, "30-40", span(Some(40), None));
        let found = overlaps(&[later, apps]);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].to_string().contains("both hold 30-37"),
            "{}",
            found[0]
        );
    }
}
