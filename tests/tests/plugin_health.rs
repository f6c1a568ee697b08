//! GPU health end to end on a fake host root: amd-gpud's health pulse finds a
//! removed render node, the plugin carries the transition to ListAndWatch and
//! to the register annotation together and reports it as one Node Event, and
//! back again when the node returns; a GPU whose KFD node vanishes is carried
//! as missing. amd-gpud runs with a 1 s pulse and N = M = 2; amd-gpud's bounds
//! are asserted in pulses (its `HealthChecks` counter), the plugin's in time
//! on top of them. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::world::{NODE, Setup, World, world_with};
use serde_json::Value;
use tests::{fixture, stack};

const FIXTURE: &str = "mi300x-8-spx";
const PULSE: Duration = Duration::from_secs(1);
/// `--unhealthy-after` and `--healthy-after`.
const N: u64 = 2;
const M: u64 = 2;
/// Time for a transition to travel from amd-gpud to kubelet and the API
/// server (D-Bus signal, inventory read, ListAndWatch and a PATCH), on top of
/// the pulses; generous for a loaded machine.
const DELIVERY: Duration = Duration::from_secs(2);

#[test]
fn a_broken_gpu_leaves_service_and_comes_back_without_flapping() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(150), scenario());
}

async fn scenario() {
    let gpud_args = [
        "--health-pulse",
        "1",
        "--unhealthy-after",
        "2",
        "--healthy-after",
        "2",
        // Probation over after a few pulses: the scenario starts right away.
        "--health-half-life",
        "1",
    ];
    let w = world_with(&Setup {
        fixture: FIXTURE,
        devices: 80,
        gpud_args: &gpud_args,
        plugin_args: &[],
        prepare: &|_| {},
    })
    .await;
    let spec = fixture::named(FIXTURE).unwrap();
    let layout = fixture::Layout::new(&spec);
    let node = layout.nodes_of_gpu(0).next().unwrap();
    let (bdf, id) = (spec.gpus[0].bdf(), id_of(&w, &spec.gpus[0].bdf()));
    let render = w
        .root()
        .join(format!("dev/dri/renderD{}", node.render_minor));
    tokio::time::sleep(PULSE * 3).await; // a few clean pulses

    // The render node goes away: out within N + 1 pulses.
    let (pulses, start) = (checks(&w), Instant::now());
    std::fs::remove_file(&render).unwrap();
    let taken = pulses_until(&w, &bdf, "Unhealthy").await - pulses;
    assert!(taken <= N + 1, "unhealthy after {taken} pulses");
    wait_health(&w, &id, false).await;
    let elapsed = start.elapsed();
    assert!(
        elapsed <= PULSE * 3 + DELIVERY,
        "unhealthy after {elapsed:?}"
    );
    let others = w.registered();
    assert!(
        others
            .iter()
            .filter(|d| d["id"] != id.as_str())
            .all(healthy),
        "only the broken GPU: {others:?}"
    );
    let reason = gpu_property(&w, &bdf, "HealthReason");
    let node_name = format!("renderD{}", node.render_minor);
    assert!(reason.contains(&node_name), "{reason}");

    // It comes back: healthy again within M + 1 pulses.
    let (pulses, start) = (checks(&w), Instant::now());
    std::fs::write(&render, "").unwrap();
    let taken = pulses_until(&w, &bdf, "Healthy").await - pulses;
    assert!(taken <= M + 1, "healthy after {taken} pulses");
    wait_health(&w, &id, true).await;
    let elapsed = start.elapsed();
    assert!(elapsed <= PULSE * 3 + DELIVERY, "healthy after {elapsed:?}");

    // One Event per transition, naming the GPU and its PCI address.
    for reason in ["AMDGPUUnhealthy", "AMDGPURecovered"] {
        let events = wait_events(&w, reason, &bdf, 1).await;
        assert_eq!(events[0]["regarding"]["kind"], "Node");
        assert_eq!(events[0]["regarding"]["name"], NODE);
        let note = events[0]["note"].as_str().unwrap();
        assert!(note.contains(&id) && note.contains(&bdf), "{note}");
    }
    assert_eq!(
        stack::node_property(&w.bus, "HealthTransitions").unwrap(),
        "4"
    );
    missing(&w, &spec, &layout).await;
}

/// A GPU whose KFD node disappears is published as missing and stays in the
/// device list and the annotation, unhealthy.
async fn missing(w: &World, spec: &fixture::NodeSpec, layout: &fixture::Layout) {
    let last = spec.gpus.len() - 1;
    let bdf = spec.gpus[last].bdf();
    let id = id_of(w, &bdf);
    let node = layout.nodes_of_gpu(last).next().unwrap().node;
    std::fs::remove_dir_all(w.root().join(format!("{}/nodes/{node}", fixture::TOPOLOGY))).unwrap();
    stack::rescan(&w.bus).unwrap();
    wait_health(w, &id, false).await;
    assert_eq!(gpu_property(w, &bdf, "Health"), "\"Missing\"");
    let carried = w.registered();
    assert_eq!(
        carried.len(),
        spec.gpus.len(),
        "still registered: {carried:?}"
    );
    let events = wait_events(w, "AMDGPUMissing", &bdf, 1).await;
    assert!(events[0]["note"].as_str().unwrap().contains(&id));
}

fn healthy(device: &Value) -> bool {
    device["health"].as_bool().unwrap_or(false)
}

/// The registered id of the GPU at `bdf`.
fn id_of(w: &World, bdf: &str) -> String {
    let devices = w.registered();
    let device = devices
        .iter()
        .find(|d| d["custominfo"]["pciBDF"] == bdf)
        .unwrap_or_else(|| panic!("{bdf} is not registered: {devices:?}"));
    device["id"].as_str().unwrap().to_owned()
}

/// amd-gpud's health rounds so far.
fn checks(w: &World) -> u64 {
    stack::node_property(&w.bus, "HealthChecks")
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls amd-gpud until the GPU at `bdf` shows `health`, then returns the
/// health rounds run so far: read just after the change, an upper bound of
/// the round that made it.
async fn pulses_until(w: &World, bdf: &str, health: &str) -> u64 {
    let want = format!("\"{health}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    while gpu_property(w, bdf, "Health") != want {
        assert!(Instant::now() < deadline, "{bdf} never {health}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    checks(w)
}

/// A property of the GPU object at `bdf`, as busctl prints its value.
fn gpu_property(w: &World, bdf: &str, name: &str) -> String {
    let path = format!("/io/hami/AmdGpu1/gpu/{}", bdf.replace([':', '.'], "_"));
    let args = [
        "get-property",
        "io.hami.AmdGpu1",
        path.as_str(),
        "io.hami.AmdGpu1.Gpu",
        name,
    ];
    let out = tests::bus::busctl(&w.bus, 0, &args).unwrap();
    assert!(out.success(), "{}", out.stderr);
    let value = out.stdout.trim();
    value.split_once(' ').map_or(value, |(_, v)| v).to_owned()
}

/// Waits until every kubelet device of GPU `id` and its annotation entry
/// both say `healthy`.
async fn wait_health(w: &World, id: &str, healthy: bool) {
    let want = if healthy { "Healthy" } else { "Unhealthy" };
    let prefix = format!("{id}#");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let slots: Vec<_> = w
            .kubelet
            .devices()
            .into_iter()
            .filter(|d| d.id.starts_with(&prefix))
            .collect();
        let listed = !slots.is_empty() && slots.iter().all(|d| d.health == want);
        let annotated = w
            .registered()
            .iter()
            .any(|d| d["id"] == id && d["health"].as_bool().unwrap_or(false) == healthy);
        if listed && annotated {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} not {want}: kubelet {listed}, annotation {annotated}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for `count` Events `reason` about the GPU at `bdf`, then checks
/// there are no more: one per transition, not repeated.
async fn wait_events(w: &World, reason: &str, bdf: &str, count: usize) -> Vec<Value> {
    let matching = || {
        w.api
            .events()
            .into_iter()
            .filter(|e| {
                e["reason"] == reason && e["note"].as_str().is_some_and(|n| n.contains(bdf))
            })
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while matching().len() < count {
        assert!(Instant::now() < deadline, "no {reason} Event for {bdf}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // a duplicate would be here by now
    let events = matching();
    assert_eq!(events.len(), count, "{reason}: {events:?}");
    for event in &events {
        let repeats = event["series"]["count"].as_u64().unwrap_or(1);
        assert_eq!(repeats, 1, "{reason} sent again: {event}");
    }
    events
}
