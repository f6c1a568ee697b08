//! Rendering the inventory for people (a table) and for scripts (JSON).
//!
//! The JSON is a contract: `{"gpus":[{"bdf","rocr_uuid","unique_id","gfx",
//! "compute_units","cus_per_wgp","vram_bytes","numa_node","market_name",
//! "amdsmi_uuid","derived_uuid","compute_partition","partitions":[{"index",
//! "kfd_node","render_minor","bdf","compute_units","vram_bytes"}]}]}` at
//! least; fields are only ever added.

use std::io::{self, Write};

use crate::inventory::{Gpu, Inventory};

/// Writes the inventory as pretty JSON followed by a newline.
///
/// # Errors
/// When `out` fails.
pub fn write_json(inventory: &Inventory, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, inventory)?;
    writeln!(out)
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Writes a table: one line per GPU, one indented line per partition of a
/// partitioned GPU, then AMD SMI's state and any warnings.
///
/// # Errors
/// When `out` fails.
pub fn write_table(inventory: &Inventory, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{:<13} {:<8} {:>5} {:>4} {:>9} {:>4} {:<5} {:>5}  {:<21} NAME",
        "GPU", "GFX", "CUS", "WGP", "VRAM", "NUMA", "MODE", "PARTS", "ROCR UUID"
    )?;
    for gpu in &inventory.gpus {
        write_gpu(gpu, out)?;
    }
    if inventory.gpus.is_empty() {
        writeln!(out, "(no AMD GPU found)")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "AMD SMI: {}: {}",
        inventory.amdsmi.state, inventory.amdsmi.detail
    )?;
    if let Some(generation) = inventory.generation_id {
        writeln!(out, "KFD generation: {generation}")?;
    }
    for warning in &inventory.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    Ok(())
}

fn write_gpu(gpu: &Gpu, out: &mut dyn Write) -> io::Result<()> {
    let dash = || "-".to_owned();
    writeln!(
        out,
        "{:<13} {:<8} {:>5} {:>4} {:>9} {:>4} {:<5} {:>5}  {:<21} {}",
        gpu.bdf.to_string(),
        gpu.gfx.map_or_else(dash, |g| g.to_string()),
        gpu.compute_units,
        gpu.cus_per_wgp,
        gib(gpu.vram_bytes),
        gpu.numa_node.map_or_else(dash, |n| n.to_string()),
        gpu.compute_partition.clone().unwrap_or_else(dash),
        gpu.partitions.len(),
        gpu.rocr_uuid.clone().unwrap_or_else(dash),
        gpu.market_name.as_deref().unwrap_or("-"),
    )?;
    if gpu.partitions.len() > 1 {
        for part in &gpu.partitions {
            writeln!(
                out,
                "  [{}] {:<13} {:>5} CUs {:>9}  kfd node {:<3} render {}",
                part.index,
                part.bdf.to_string(),
                part.compute_units,
                gib(part.vram_bytes),
                part.kfd_node,
                part.render_minor.map_or_else(dash, |m| m.to_string()),
            )?;
        }
    }
    Ok(())
}

#[allow(clippy::cast_precision_loss)] // display only: GiB with one decimal
fn gib(bytes: u64) -> String {
    if bytes == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}GiB", bytes as f64 / GIB)
    }
}
