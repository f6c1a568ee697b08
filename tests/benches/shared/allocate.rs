//! What the two Allocate benches (`allocate`, against the fake API server,
//! and `allocate_real`, against the real one) share: the plugin's command
//! line, the GPUs it registered, HAMi's annotations on a bound pod, and the
//! percentiles they report.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use tests::hami_emulator::{Grant, encode};

/// A placeholder memory hook under `root` (slices are refused without
/// one); its directory.
pub fn hook_dir(root: &Path) -> std::io::Result<PathBuf> {
    let dir = root.join("usr/local/vgpu");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("libamvgpu.so"), b"placeholder")?;
    Ok(dir)
}

/// The plugin's arguments: the API server of `kubeconfig`, `node`, the
/// hook in `hook`, warnings only.
pub fn plugin_args(kubeconfig: &Path, node: &str, hook: &Path) -> [String; 8] {
    [
        "--kube",
        &kubeconfig.display().to_string(),
        "--node-name",
        node,
        "--hook-path",
        &hook.display().to_string(),
        "--log",
        "warn",
    ]
    .map(str::to_owned)
}

/// (id, type) of every device in a register annotation's `value`.
pub fn gpus_of(value: &str) -> Option<Vec<(String, String)>> {
    let devices: Vec<Value> = serde_json::from_str(value).ok()?;
    let field = |d: &Value, k: &str| d[k].as_str().unwrap_or_default().to_owned();
    Some(
        devices
            .iter()
            .map(|d| (field(d, "id"), field(d, "type")))
            .collect(),
    )
}

/// HAMi's annotations after Filter and Bind of admission `i` on `node`:
/// `cus` CUs and 12 GiB of `gpu` for one container.
pub fn hami_annotations(node: &str, gpu: &(String, String), i: usize, cus: u32) -> Value {
    let entry = encode(&[vec![Grant {
        id: gpu.0.clone(),
        device_type: gpu.1.clone(),
        mem_mib: 12_288,
        cus,
    }]]);
    json!({
        "hami.io/vgpu-node": node,
        "hami.io/vgpu-time": i.to_string(),
        "hami.io/amd-devices-to-allocate": entry,
        "hami.io/amd-devices-allocated": entry,
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": i.to_string(),
    })
}

fn percentile(times: &mut [Duration], p: usize) -> Duration {
    times.sort_unstable();
    times[(times.len() * p / 100).min(times.len() - 1)]
}

/// The 50th and 99th percentiles of `times`.
pub fn p50_p99(times: &[Duration]) -> (Duration, Duration) {
    let mut times = times.to_vec();
    (percentile(&mut times, 50), percentile(&mut times, 99))
}

/// `d` in milliseconds, two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
