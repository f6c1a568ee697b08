//! What a GPU is called, with or without AMD SMI: the product name from
//! libdrm's `amdgpu.ids` ([`super::product_names`]), the UUID from sysfs
//! ([`super::smi_uuid`]), and the one line that tells an operator where
//! both come from when AMD SMI is not in use.

use super::{AmdSmiSummary, Gpu, Inventory, product_names::ProductNames};
use crate::hostpaths::HostPaths;

/// Names every GPU `amdgpu.ids` knows; returns what was read, as the
/// inventory reports it (`None`: no file). Problems with the file are
/// warnings naming it, logged once per process.
pub(super) fn name_gpus(
    gpus: &mut [Gpu],
    paths: &HostPaths,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let names = match ProductNames::load(&paths.amdgpu_ids) {
        Ok(Some(names)) => names,
        Ok(None) => return None,
        Err(err) => {
            warn_once(&err.to_string());
            warnings.push(format!(
                "{err}; product names from AMD SMI or the gfx target"
            ));
            return None;
        }
    };
    for gpu in gpus.iter_mut() {
        let Ok(device_id) = u16::try_from(gpu.device_id) else {
            continue;
        };
        if let Some(name) = names.lookup(device_id, gpu.revision) {
            gpu.market_name = Some(name.to_owned());
        }
    }
    Some(format!(
        "{} (version {}, {} entries)",
        names.path.display(),
        names.version,
        names.len()
    ))
}

fn warn_once(message: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| tracing::warn!("{message}"));
}

/// The line to log at start when AMD SMI is not in use: where the published
/// IDs and the product names come from. `None` when AMD SMI is loaded.
pub fn without_amdsmi(
    summary: &AmdSmiSummary,
    inventory: &Inventory,
    paths: &HostPaths,
) -> Option<String> {
    if summary.state == "loaded" {
        return None;
    }
    let names = inventory.product_names.as_ref().map_or_else(
        || {
            let tried: Vec<String> = paths
                .amdgpu_ids
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!(
                "no usable libdrm amdgpu.ids ({}): types fall back to `AMD <gfx>`",
                tried.join(", ")
            )
        },
        |read| format!("product names from libdrm's {read}"),
    );
    let unnamed = inventory
        .gpus
        .iter()
        .filter(|g| g.market_name.is_none())
        .map(|g| g.bdf.to_string())
        .collect::<Vec<_>>();
    let unnamed = if unnamed.is_empty() {
        String::new()
    } else {
        format!(" (none for {})", unnamed.join(", "))
    };
    Some(format!(
        "AMD SMI not in use ({}: {}): GPUs are published under AMD SMI's UUID computed from \
         sysfs (PCI unique_id and device id, as AMD SMI 6.2 to 7.12 derives it), IDs already \
         recorded in {} are kept; {names}{unnamed}. Install AMD SMI (libamd_smi) for partition \
         profiles and usage",
        summary.state,
        summary.detail,
        paths.state.join(crate::published_ids::FILE_NAME).display(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::mi300x_gpu;

    #[test]
    fn a_gpu_is_named_by_device_and_revision() {
        let dir = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(dir.path());
        let mut gpus = vec![mi300x_gpu()];
        let mut warnings = Vec::new();
        assert_eq!(name_gpus(&mut gpus, &paths, &mut warnings), None);
        assert!(
            warnings.is_empty(),
            "a missing file is no problem: {warnings:?}"
        );
        let ids = &paths.amdgpu_ids[1];
        std::fs::create_dir_all(ids.parent().unwrap()).unwrap();
        std::fs::write(ids, "1.0.0\n74A1,\t00,\tAMD Instinct MI300X\n").unwrap();
        let read = name_gpus(&mut gpus, &paths, &mut warnings).unwrap();
        assert!(read.contains("opt/amdgpu/share/libdrm/amdgpu.ids (version 1.0.0, 1 entries)"));
        assert_eq!(gpus[0].market_name.as_deref(), Some("AMD Instinct MI300X"));

        std::fs::write(ids, "74A1,\t00,\tAMD Instinct MI300X\n").unwrap();
        gpus[0].market_name = None;
        assert_eq!(name_gpus(&mut gpus, &paths, &mut warnings), None);
        assert_eq!(gpus[0].market_name, None);
        assert!(
            warnings[0].contains(&ids.display().to_string()),
            "{warnings:?}"
        );
    }

    #[test]
    fn the_start_line_says_where_ids_and_names_come_from() {
        let paths = HostPaths::under("/h");
        let mut inventory = crate::inventory::tests::inventory_of(vec![mi300x_gpu()]);
        let loaded = AmdSmiSummary::new("loaded", "lib".into());
        assert_eq!(without_amdsmi(&loaded, &inventory, &paths), None);
        let off = AmdSmiSummary::new("disabled", "AMD SMI switched off".into());
        let line = without_amdsmi(&off, &inventory, &paths).unwrap();
        assert!(line.contains("disabled: AMD SMI switched off"), "{line}");
        assert!(
            line.contains("/h/var/lib/amd-gpud/published-ids.json"),
            "{line}"
        );
        assert!(line.contains("/h/usr/share/libdrm/amdgpu.ids"), "{line}");
        assert!(line.contains("none for 0000:05:00.0"), "{line}");
        inventory.product_names =
            Some("/h/usr/share/libdrm/amdgpu.ids (version 1.0.0, 9 entries)".into());
        inventory.gpus[0].market_name = Some("AMD Instinct MI300X".into());
        let line = without_amdsmi(&off, &inventory, &paths).unwrap();
        assert!(
            line.contains("product names from libdrm's /h/usr/share"),
            "{line}"
        );
        assert!(!line.contains("none for"), "{line}");
    }
}
