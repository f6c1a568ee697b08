//! One container's answer to kubelet (docs/hami-protocol.md §5.2): `/dev/kfd` and
//! each GPU's card and render nodes, `ROCR_VISIBLE_DEVICES`, `HSA_CU_MASK`
//! for CU slices, per-GPU memory limits, and the memory hook (`LD_AUDIT` and
//! its read-only mount) only when something is sliced: a whole-GPU request
//! gets neither and works with any image.

use std::{collections::HashMap, ops::Range, path::Path};

use ipc::types::PartitionInfo;
use proto::v1beta1::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};

use super::{
    AllocateConfig,
    error::{ResponseError, SliceError},
    reuse::Reuse,
};
use crate::{
    cu::{CuBitmap, CuError, GpuSlice, render_env, smallest_share},
    hami::ContainerDevice,
    inventory::Device,
};

/// amd-gpud's CDI kind.
pub(crate) const CDI_KIND: &str = "amd.com/gpu";

/// Where the hook is seen inside the container.
pub(crate) const HOOK_IN_CONTAINER: &str = "/usr/local/vgpu/libamvgpu.so";
const HOOK_FILE: &str = "libamvgpu.so";
const MIB: u64 = 1024 * 1024;

/// What one GPU of the container gets.
#[derive(Debug, Clone)]
pub(crate) struct Slice {
    pub(crate) id: String,
    pub(crate) env: GpuSlice,
    /// The CUs the pod holds for it: the slice, or every CU of a whole GPU.
    pub(crate) claimed: Vec<Range<u32>>,
    pub(crate) card_minor: Option<u32>,
    pub(crate) render_minor: Option<u32>,
    /// The device's name in amd-gpud's CDI spec (its partition's PCI address).
    pub(crate) cdi_name: Option<String>,
}

impl Slice {
    fn sliced(&self) -> bool {
        self.env.cus.is_some() || self.env.memory_mib.is_some()
    }
}

/// Chooses the slice of `gpu` for `device` and claims its CUs in `maps`
/// (the pod's spare init-container CUs first, see [`Reuse`]).
///
/// # Errors
/// When the CUs cannot be had (the message says why and the smallest share).
pub(crate) fn slice(
    gpu: &Device,
    parts: &[PartitionInfo],
    device: &ContainerDevice,
    maps: &mut HashMap<String, CuBitmap>,
    reuse: &mut Reuse,
) -> Result<Slice, SliceError> {
    let map = maps
        .get_mut(&device.uuid)
        .ok_or_else(|| SliceError::NoCuState {
            gpu: device.uuid.clone(),
        })?;
    // A compute partition is allocated whole, whatever share of it HAMi
    // granted: no CU mask and no memory hook (the partition is the slice;
    // docs/hami-protocol.md §1.6). Its VRAM cap still follows the grant.
    let whole_cus = device.usedcores >= gpu.compute_units || gpu.is_partition();
    // A whole GPU is claimed whole too: HAMi's usage count can miss a pod
    // (docs/hami-protocol.md §4.2), so neither side may take the other's CUs.
    let claimed = if whole_cus && gpu.compute_units == 0 {
        Vec::new()
    } else if whole_cus {
        reuse
            .choose(map, gpu.compute_units, 1)
            .map_err(|e| match e {
                CuError::NotEnoughFree {
                    gpu: ref id, free, ..
                } => SliceError::WholeNotFree {
                    gpu: id.clone(),
                    free,
                    total: gpu.compute_units,
                    source: e,
                },
                other => SliceError::Cu(other),
            })?
    } else {
        reuse.choose(
            map,
            smallest_share(device.usedcores, gpu.cus_per_wgp),
            gpu.cus_per_wgp,
        )?
    };
    let vram_mib = gpu.vram_bytes / MIB;
    let memory = u64::from(device.usedmem);
    let first = parts.first();
    Ok(Slice {
        id: device.uuid.clone(),
        env: GpuSlice {
            rocr_uuid: Some(gpu.rocr_uuid.clone()).filter(|u| !u.is_empty()),
            kfd_node: first.map_or(0, |p| p.kfd_node),
            cu_count: gpu.compute_units,
            cus_per_wgp: gpu.cus_per_wgp,
            cus: (!whole_cus).then(|| claimed.clone()),
            memory_mib: (!gpu.is_partition() && memory > 0 && memory < vram_mib).then_some(memory),
        },
        claimed,
        card_minor: first.and_then(|p| u32::try_from(p.card_minor).ok()),
        render_minor: first.map(|p| p.render_minor).filter(|m| *m > 0),
        cdi_name: first.map(|p| p.bdf.clone()),
    })
}

fn device(host: String, container: String) -> DeviceSpec {
    DeviceSpec {
        container_path: container,
        host_path: host,
        permissions: "rw".to_owned(),
    }
}

/// The container response for `slices`, in annotation order; `staged`: the
/// container's hook directory when the loader check is on.
///
/// # Errors
/// When the environment would not be valid for ROCr.
pub(crate) fn build(
    slices: &[Slice],
    config: &AllocateConfig,
    staged: Option<&Path>,
) -> Result<ContainerAllocateResponse, ResponseError> {
    let dev = |rel: &str| {
        (
            config.dev_dir.join(rel).display().to_string(),
            format!("/dev/{rel}"),
        )
    };
    let (host, container) = dev("kfd");
    let mut devices = vec![device(host, container)];
    for s in slices {
        for rel in [
            s.card_minor.map(|m| format!("dri/card{m}")),
            s.render_minor.map(|m| format!("dri/renderD{m}")),
        ]
        .into_iter()
        .flatten()
        {
            let (host, container) = dev(&rel);
            devices.push(device(host, container));
        }
    }
    let gpus: Vec<GpuSlice> = slices.iter().map(|s| s.env.clone()).collect();
    let env = render_env(&gpus)?;
    let mut envs: HashMap<String, String> = env.vars.into_iter().collect();
    let mut mounts = Vec::new();
    if slices.iter().any(Slice::sliced) {
        let hook = config.hook_dir.join(HOOK_FILE);
        if !hook.is_file() {
            return Err(ResponseError::HookMissing { hook });
        }
        envs.insert("LD_AUDIT".to_owned(), HOOK_IN_CONTAINER.to_owned());
        if config.hip_log_level > 0 {
            let level = config.hip_log_level.to_string();
            envs.insert("LIBHIP_LOG_LEVEL".to_owned(), level);
        }
        mounts.push(match staged {
            // The directory, so that what amd-gpud puts in it (or not)
            // before CreateContainer is what the container sees.
            Some(dir) => Mount {
                container_path: crate::loader::HOOK_DIR_IN_CONTAINER.to_owned(),
                host_path: dir.display().to_string(),
                read_only: true,
            },
            None => Mount {
                container_path: HOOK_IN_CONTAINER.to_owned(),
                host_path: hook.display().to_string(),
                read_only: true,
            },
        });
    }
    let (devices, cdi_devices) = if config.cdi {
        // The runtime injects /dev/kfd and each device's nodes from the spec.
        let names = slices
            .iter()
            .filter_map(|s| s.cdi_name.as_ref())
            .map(|n| CdiDevice {
                name: format!("{CDI_KIND}={n}"),
            })
            .collect();
        (Vec::new(), names)
    } else {
        (devices, Vec::new())
    };
    Ok(ContainerAllocateResponse {
        envs,
        mounts,
        devices,
        annotations: HashMap::new(),
        cdi_devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(cus: Option<Vec<Range<u32>>>) -> Slice {
        Slice {
            id: "GPU-A".into(),
            env: GpuSlice {
                rocr_uuid: Some("GPU-0123456789abcdef".into()),
                kfd_node: 2,
                cu_count: 304,
                cus_per_wgp: 1,
                cus,
                memory_mib: None,
            },
            claimed: Vec::new(),
            card_minor: Some(0),
            render_minor: Some(128),
            cdi_name: None,
        }
    }

    fn config(hook_dir: &Path, hip_log_level: u8) -> AllocateConfig {
        AllocateConfig {
            dev_dir: "/dev".into(),
            hook_dir: hook_dir.to_owned(),
            resource_name: "amd.com/gpu".into(),
            cdi: false,
            pod_resources: None,
            annotations_protected: false,
            staged_hooks: None,
            hip_log_level,
            split_count: 0,
        }
    }

    /// The Go chart's `hipLogLevel`: `LIBHIP_LOG_LEVEL` for the containers
    /// that load the hook, and only when set.
    #[test]
    fn the_hook_log_level_goes_with_the_hook() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HOOK_FILE), b"hook").unwrap();
        let level = |slices: &[Slice], level| {
            let answer = build(slices, &config(dir.path(), level), None).unwrap();
            answer.envs.get("LIBHIP_LOG_LEVEL").cloned()
        };
        let sliced = [slice(Some(std::iter::once(0..76).collect()))];
        assert_eq!(level(&sliced, 3).as_deref(), Some("3"));
        assert_eq!(level(&sliced, 0), None, "0 keeps the hook's default");
        assert_eq!(level(&[slice(None)], 4), None, "no hook, no level");
    }
}
