//! The report for people: per node the register annotation, per pod HAMi's
//! decision and what each container got, then the CU occupancy picture.

use std::{
    collections::HashMap,
    io::{self, Write},
};

use serde_json::Value;

use super::{
    picture::{DeviceOccupancy, FREE},
    report::{ContainerReport, NodeReport, PodReport, Report},
};

/// Above this many devices, idle ones are summarised.
const LIST_ALL: usize = 16;

/// Writes `report` as text.
///
/// # Errors
/// When `out` fails.
pub fn write_text(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "node-sim: {} node(s), {} pod(s); HAMi gpu-scheduler-policy {}, bus policy {}, {:.1} s",
        report.nodes.len(),
        report.pods.len(),
        report.gpu_policy,
        report.bus_policy,
        ms_to_s(report.elapsed_ms)
    )?;
    for node in &report.nodes {
        write_node(node, out)?;
    }
    for pod in &report.pods {
        let labels = report
            .nodes
            .iter()
            .find(|n| n.name == pod.node)
            .map(labels)
            .unwrap_or_default();
        write_pod(pod, &labels, out)?;
    }
    for node in &report.nodes {
        write_occupancy(node, &report.pods, out)?;
    }
    if !report.overlaps.is_empty() {
        writeln!(
            out,
            "\n━━ CU OVERLAP: the plugin gave the same CUs to containers that run together"
        )?;
        for overlap in &report.overlaps {
            writeln!(out, "  {overlap}")?;
        }
    }
    Ok(())
}

fn ms_to_s(ms: u64) -> f64 {
    // Display only.
    ms as f64 / 1000.0
}

fn labels(node: &NodeReport) -> HashMap<String, String> {
    node.occupancy
        .iter()
        .map(|d| (d.id.clone(), d.label.clone()))
        .collect()
}

fn write_node(node: &NodeReport, out: &mut dyn Write) -> io::Result<()> {
    let amdsmi = node
        .amdsmi
        .as_ref()
        .map_or("sysfs only".to_owned(), |abi| format!("fake AMD SMI {abi}"));
    writeln!(
        out,
        "\n━━ node {}: fake {}, plugin in {} mode, amd-gpud with {amdsmi}, {} kubelet devices",
        node.name,
        node.fixture,
        node.mode.as_str(),
        node.kubelet_devices
    )?;
    if let Some(url) = &node.monitor {
        writeln!(out, "monitor (HAMi's vGPU series): {url}")?;
    }
    writeln!(out, "hami.io/node-amd-register (what HAMi reads):")?;
    let devices = node
        .register
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let w = devices
        .iter()
        .map(|d| text(&d["id"]).len())
        .max()
        .unwrap_or(2);
    writeln!(
        out,
        "  {:<7} {:<w$} {:<24} {:>5} {:>7} {:>7} {:>4} {:<6} {:<4} pciBDF",
        "dev", "id", "type", "count", "devmem", "devcore", "numa", "health", "mode"
    )?;
    let shown = if devices.len() > LIST_ALL {
        8
    } else {
        devices.len()
    };
    for (d, occ) in devices.iter().zip(&node.occupancy).take(shown) {
        writeln!(
            out,
            "  {:<7} {:<w$} {:<24} {:>5} {:>7} {:>7} {:>4} {:<6} {:<4} {}",
            occ.label,
            text(&d["id"]),
            text(&d["type"]),
            text(&d["count"]),
            text(&d["devmem"]),
            text(&d["devcore"]),
            text(&d["numa"]),
            d["health"].as_bool().unwrap_or(false),
            text(&d["mode"]),
            text(&d["custominfo"]["pciBDF"]),
        )?;
    }
    if devices.len() > shown {
        writeln!(
            out,
            "  … {} more (--json has them all)",
            devices.len() - shown
        )?;
    }
    Ok(())
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn write_pod(
    pod: &PodReport,
    labels: &HashMap<String, String>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let letter = pod.letter.map(|l| format!(" [{l}]")).unwrap_or_default();
    writeln!(
        out,
        "\n━━ pod {}{letter} ({}) on {}",
        pod.name, pod.file, pod.node
    )?;
    if let Some(d) = &pod.description {
        writeln!(out, "  {d}")?;
    }
    if !pod.scheduled {
        writeln!(
            out,
            "  NOT SCHEDULED: {}",
            pod.summary.as_deref().unwrap_or("?")
        )?;
        for r in &pod.rejections {
            let label = labels.get(&r.id).map_or(r.id.as_str(), String::as_str);
            writeln!(out, "    {}", r.message.replace(&r.id, label))?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "  bind-phase {}",
        pod.bind_phase.as_deref().unwrap_or("(none)")
    )?;
    if let Some(v) = &pod.devices_allocated {
        writeln!(out, "  hami.io/amd-devices-allocated {v}")?;
    }
    if let Some(v) = &pod.cu_allocated {
        writeln!(out, "  hami.io/amd-cu-allocated     {v}")?;
    }
    if !pod.containers.is_empty() {
        writeln!(out, "  {}", super::vram::describe(pod))?;
    }
    for c in &pod.containers {
        write_container(c, labels, out)?;
    }
    Ok(())
}

fn write_container(
    c: &ContainerReport,
    labels: &HashMap<String, String>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mem = c
        .request
        .mem_mib
        .map_or("whole VRAM".to_owned(), |m| format!("{m} MiB"));
    let kind = if c.init {
        "init container"
    } else {
        "container"
    };
    writeln!(
        out,
        "  {kind} {}: asks {} GPU(s), {} % CUs, {mem}",
        c.name, c.request.gpus, c.request.cores_percent
    )?;
    let label = |id: &str| labels.get(id).cloned().unwrap_or_else(|| id.to_owned());
    for (i, g) in c.grants.iter().enumerate() {
        let got = match c.gpus.get(i) {
            None => "-".to_owned(),
            Some(gpu) => {
                let cus = match (&gpu.cu_ranges, gpu.cu_count) {
                    (Some(r), Some(n)) => format!("CUs {r} ({n})"),
                    _ => "all CUs (no mask)".to_owned(),
                };
                let vram = gpu.vram_limit_mib.map_or("no VRAM limit".to_owned(), |m| {
                    format!("VRAM limit {m} MiB")
                });
                format!("{cus}, {vram}")
            }
        };
        writeln!(
            out,
            "    {:<7} HAMi: {} CUs, {} MiB  →  {got}",
            label(&g.id),
            g.cus,
            g.mem_mib
        )?;
    }
    if let Some(err) = &c.error {
        return writeln!(out, "    FAILED: {err}");
    }
    writeln!(out, "    kubelet ids  {}", c.kubelet_ids.join(", "))?;
    for (i, (k, v)) in c.envs.iter().enumerate() {
        let head = if i == 0 { "env" } else { "" };
        writeln!(out, "    {head:<12} {k}={v}")?;
    }
    let devices: Vec<String> = c
        .devices
        .iter()
        .map(|d| format!("{} ({})", d.container_path, d.permissions))
        .collect();
    writeln!(out, "    {:<12} {}", "devices", devices.join(", "))?;
    for m in &c.mounts {
        let ro = if m.read_only { "ro" } else { "rw" };
        writeln!(
            out,
            "    {:<12} {} ← {} ({ro})",
            "mount", m.container_path, m.host_path
        )?;
    }
    if !c.cdi_devices.is_empty() {
        writeln!(out, "    {:<12} {}", "CDI", c.cdi_devices.join(", "))?;
    }
    match (&c.start_error, &c.pre_start) {
        (Some(err), _) => writeln!(out, "    NOT STARTED: {err}")?,
        (None, Some(p)) => writeln!(out, "    {:<12} {p}", "PreStart")?,
        (None, None) => {}
    }
    Ok(())
}

fn write_occupancy(node: &NodeReport, pods: &[PodReport], out: &mut dyn Write) -> io::Result<()> {
    let per = node.occupancy.first().map_or(1, |d| d.cus_per_cell);
    writeln!(
        out,
        "\n━━ CU occupancy on {} (one cell = {per} CU{}, {FREE} free)",
        node.name,
        if per == 1 { "" } else { "s" }
    )?;
    let busy = |d: &&DeviceOccupancy| !d.holders.is_empty();
    let many = node.occupancy.len() > LIST_ALL;
    let width = node
        .occupancy
        .iter()
        .map(|d| d.bar.chars().count())
        .max()
        .unwrap_or(0);
    for d in node.occupancy.iter().filter(|d| !many || busy(d)) {
        let who: Vec<String> = d
            .holders
            .iter()
            .map(|h| format!("{} {}", h.letter.unwrap_or('?'), h.pod))
            .collect();
        let cus = format!("{}/{} CUs", d.used_cus, d.devcore);
        let mem = format!(
            "{:.1}/{:.1} GiB",
            gib(d.used_mem_mib),
            gib(i64::from(d.devmem))
        );
        let slots = format!("{}/{} slots", d.slots_used, d.count);
        let line = format!(
            "  {:<7} {:<width$}  {cus:>11}  {mem:>15}  {slots:>11}  {}",
            d.label,
            d.bar,
            who.join(", ")
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    let idle = node
        .occupancy
        .iter()
        .filter(|d| d.holders.is_empty())
        .count();
    if many && idle > 0 {
        writeln!(out, "  … {idle} idle devices not shown")?;
    }
    let legend: Vec<String> = pods
        .iter()
        .filter(|p| p.node == node.name)
        .filter_map(|p| p.letter.map(|l| format!("{l} {}", p.name)))
        .collect();
    if !legend.is_empty() {
        writeln!(out, "  pods: {}", legend.join(", "))?;
    }
    Ok(())
}

fn gib(mib: i64) -> f64 {
    // Display only.
    mib as f64 / 1024.0
}
