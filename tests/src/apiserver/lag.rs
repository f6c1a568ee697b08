//! The lag knob: how late each watch event goes out, as from a loaded API
//! server whose watch cache lags behind its writes.

use std::time::Duration;

use crate::rng::Rng;

/// How late watch events go out: `fixed` plus a uniformly random part of at
/// most `random`, per event (never before an earlier event of the same
/// watch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchDelay {
    pub fixed: Duration,
    pub random: Duration,
}

/// The knob's setting and the generator of its random parts.
#[derive(Debug)]
pub(crate) struct Lag {
    delay: WatchDelay,
    rng: Rng,
}

impl Lag {
    pub(crate) fn new(delay: WatchDelay, seed: u64) -> Self {
        Self {
            delay,
            rng: Rng::new(seed),
        }
    }

    /// The delay of the next event.
    pub(crate) fn next(&mut self) -> Duration {
        if self.delay.random.is_zero() {
            return self.delay.fixed;
        }
        let nanos = u64::try_from(self.delay.random.as_nanos()).unwrap_or(u64::MAX);
        self.delay.fixed + Duration::from_nanos(self.rng.below(nanos.saturating_add(1)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Pod;
    use kube::{
        Client, ResourceExt,
        api::{Api, PostParams, WatchEvent, WatchParams},
    };
    use serde_json::json;

    use super::*;
    use crate::apiserver::FakeApiServer;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("a pod")
    }

    #[test]
    fn delays_stay_within_the_setting() {
        let fixed = Duration::from_millis(5);
        let mut lag = Lag::new(
            WatchDelay {
                fixed,
                random: Duration::from_millis(10),
            },
            3,
        );
        for _ in 0..1000 {
            let d = lag.next();
            assert!(
                d >= fixed && d <= fixed + Duration::from_millis(10),
                "{d:?}"
            );
        }
        assert_eq!(Lag::new(WatchDelay::default(), 3).next(), Duration::ZERO);
    }

    #[tokio::test]
    async fn watch_events_come_late_and_in_order_but_reads_do_not() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let server = FakeApiServer::start().expect("server");
            let fixed = Duration::from_millis(300);
            let delay = WatchDelay {
                fixed,
                random: Duration::from_millis(200),
            };
            server.set_watch_delay(delay, 42);
            let client = Client::try_from(server.client_config()).expect("a kube client");
            let pods: Api<Pod> = Api::default_namespaced(client);
            let params = WatchParams::default().timeout(10);
            let mut events = pods.watch(&params, "0").await.expect("watch").boxed();
            let names: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
            let created = std::time::Instant::now();
            for name in &names {
                pods.create(&PostParams::default(), &pod(name))
                    .await
                    .expect("create");
            }
            let read = pods.get("p4").await.expect("a read is not delayed");
            assert_eq!(read.name_any(), "p4");
            let early = tokio::time::timeout(Duration::from_millis(100), events.try_next()).await;
            assert!(early.is_err(), "an event came before the fixed delay");
            let mut seen = Vec::new();
            while seen.len() < names.len() {
                match events.try_next().await.expect("event") {
                    Some(WatchEvent::Added(p)) => seen.push(p.name_any()),
                    other => panic!("expected ADDED, got {other:?}"),
                }
            }
            assert!(created.elapsed() >= fixed);
            assert_eq!(seen, names, "delays never reorder a watch");
        })
        .await
        .expect("the test timed out");
    }
}
