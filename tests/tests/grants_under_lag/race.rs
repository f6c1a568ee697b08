//! Concurrent binds, as HAMi v2.10.0 makes them (docs/hami-protocol.md §3.8):
//! HAMi takes the node lock for a pod with an AMD app container and, before
//! that pod's Binding, binds a pod whose AMD request is in init containers
//! only, without the lock; kubelet admits that pod at once, then the lock
//! owner once it is bound. Or a lock whose owner is gone is left on the node
//! while such a pod is bound (HAMi takes it over only after 5 minutes).

use serde_json::json;
use tests::apiserver::Kind;

use super::{Driver, LOCK, Shape, unix_now};

/// How far HAMi gets with a pod before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduled {
    /// Filter and Bind, the Binding made.
    Bound,
    /// Filter and Bind up to the node lock, the Binding not made yet.
    Locked,
}

impl Driver<'_> {
    /// One race: the lock held by an unbound app pod, or by a pod that is
    /// gone; an init-only pod bound and admitted meanwhile; then the owner
    /// bound and admitted.
    pub async fn admit_racing(&mut self, round: usize) {
        self.stats.races += 1;
        let owner = if self.rng.chance(30) {
            self.stale_lock();
            None
        } else {
            let shape = Shape::random_app(&mut self.rng);
            self.place(Some(shape), Scheduled::Locked)
        };
        if let Some((name, placement)) = self.place(Some(Shape::InitOnly), Scheduled::Bound) {
            self.admit_placed(&name, &placement, round).await;
        }
        if let Some((name, placement)) = owner {
            self.node.hami.complete_binding(&self.session.api, &name);
            self.admit_placed(&name, &placement, round).await;
            self.wait_unlocked(&name, round).await;
        }
    }

    /// A node lock naming a pod that no longer exists.
    fn stale_lock(&mut self) {
        let api = &self.session.api;
        let mut node = api.get(Kind::Node, "", &self.node.name).unwrap();
        let when = tests::apiserver::rfc3339(unix_now());
        let owner = format!("{when},default,gone-{}", self.serial);
        node["metadata"]["annotations"][LOCK] = json!(owner);
        api.put_node(node);
        self.stats.stale_locks += 1;
    }
}
