//! What a pod asks HAMi for (docs/hami-protocol.md §4.1): per container, the limits
//! `amd.com/gpu` (count), `amd.com/gpucores` (percent, absent = 100) and
//! `amd.com/gpumem` (MiB, absent = the whole device), init containers first;
//! and the pod's selection annotations (§3.1): GPU type and UUID filters and
//! `hami.io/gpu-scheduler-policy`.

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity,
};

use super::order::DeviceOrder;

/// The count resource.
pub const GPU: &str = "amd.com/gpu";
/// Percent of each GPU's CUs.
pub const GPU_CORES: &str = "amd.com/gpucores";
/// MiB of VRAM per GPU.
pub const GPU_MEM: &str = "amd.com/gpumem";
/// `amd.com/use-gputype`, `amd.com/nouse-gputype`: comma-separated substrings of `type`.
pub const USE_TYPE: &str = "amd.com/use-gputype";
pub const NOUSE_TYPE: &str = "amd.com/nouse-gputype";
/// `amd.com/use-gpu-uuid`, `amd.com/nouse-gpu-uuid`: comma-separated ids.
pub const USE_UUID: &str = "amd.com/use-gpu-uuid";
pub const NOUSE_UUID: &str = "amd.com/nouse-gpu-uuid";
/// Comma-separated: `binpack`, `spread`, `mutex`, `numa`.
pub const GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";

/// One container's AMD request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    pub container: String,
    /// An init container (HAMi lists them first).
    pub init: bool,
    /// GPUs.
    pub nums: u32,
    /// MiB per GPU; `None`: the whole device.
    pub mem_mib: Option<u32>,
    /// Percent of each GPU's CUs, 1-100.
    pub cores_pct: u32,
}

/// A request HAMi (or its webhook, or the API server) would not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("container {container}: {resource} {value:?} is not a whole number")]
    NotInteger {
        container: String,
        resource: &'static str,
        value: String,
    },
    #[error(
        "container {container}: {GPU_CORES} {value} is outside 1-100 (HAMi's webhook denies the pod)"
    )]
    CoresOutOfRange { container: String, value: i128 },
    #[error("container {container}: {GPU} {value} is outside 1-2147483647")]
    CountOutOfRange { container: String, value: i128 },
    #[error(
        "container {container}: {GPU_MEM} {value:?} is {mib} MiB, outside 0-2147483647: HAMi \
         logs \"amd device memory request is out of range\" and drops the container's whole AMD \
         request (write MiB as a plain number)"
    )]
    MemoryDropped {
        container: String,
        value: String,
        mib: i128,
    },
}

/// How HAMi orders and filters the devices for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPolicy {
    /// Least used GPUs first (HAMi's default `--gpu-scheduler-policy`).
    #[default]
    Spread,
    /// Most used GPUs first.
    Binpack,
}

impl GpuPolicy {
    /// The value of `--gpu-scheduler-policy`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spread => "spread",
            Self::Binpack => "binpack",
        }
    }
}

/// The pod's annotations that steer device selection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// How the devices are sorted, from the policy string.
    pub order: DeviceOrder,
    /// `mutex` among the policies: only GPUs no one uses.
    pub mutex: bool,
    pub use_types: Vec<String>,
    pub nouse_types: Vec<String>,
    pub use_uuids: Vec<String>,
    pub nouse_uuids: Vec<String>,
}

impl Selection {
    /// The pod's selection: its `hami.io/gpu-scheduler-policy`, or HAMi's
    /// configured `default` when it carries none.
    pub fn of(pod: &Pod, default: GpuPolicy) -> Self {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let list = |key: &str| -> Vec<String> {
            annotations
                .get(key)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let policy = annotations
            .get(GPU_POLICY)
            .map_or(default.name(), String::as_str);
        Self {
            order: DeviceOrder::of(policy),
            mutex: policy.split(',').any(|p| p.trim() == "mutex"),
            use_types: list(USE_TYPE),
            nouse_types: list(NOUSE_TYPE),
            use_uuids: list(USE_UUID),
            nouse_uuids: list(NOUSE_UUID),
        }
    }

    /// `amd.com/use-gputype` / `nouse-gputype`: case-insensitive substrings.
    pub fn type_ok(&self, device_type: &str) -> bool {
        let lower = device_type.to_lowercase();
        let matches = |t: &String| lower.contains(&t.to_lowercase());
        (self.use_types.is_empty() || self.use_types.iter().any(matches))
            && !self.nouse_types.iter().any(matches)
    }

    /// `amd.com/use-gpu-uuid` / `nouse-gpu-uuid`: exact ids.
    pub fn uuid_ok(&self, id: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.iter().any(|u| u == id))
            && !self.nouse_uuids.iter().any(|u| u == id)
    }
}

/// The AMD requests of `pod`, init containers first; containers without
/// `amd.com/gpu` (or with 0) ask for nothing and are left out, and so are
/// those whose request HAMi drops ([`Requests::dropped`]).
///
/// # Errors
/// On the first request HAMi's webhook or the API server would refuse.
pub fn requests(pod: &Pod) -> Result<Vec<ContainerRequest>, RequestError> {
    requests_of(pod).map(|r| r.kept)
}

/// A pod's AMD requests as HAMi v2.10.0 reads them
/// (`pkg/device/amd/device.go`, `GenerateResourceRequests`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requests {
    /// The requests HAMi places, init containers first.
    pub kept: Vec<ContainerRequest>,
    /// Requests HAMi logs as out of range and drops: a count or memory
    /// limit that is not a whole number in 1 (0 for memory) to 2^31 - 1,
    /// such as `amd.com/gpumem: 16Gi`. Kubelet still allocates the
    /// container's `amd.com/gpu`, and no device annotation names it.
    pub dropped: Vec<RequestError>,
}

impl RequestError {
    /// Whether HAMi drops the container's request (rather than its webhook
    /// denying the pod).
    pub fn dropped(&self) -> bool {
        match self {
            Self::CountOutOfRange { .. } | Self::MemoryDropped { .. } => true,
            Self::NotInteger { resource, .. } => *resource != GPU_CORES,
            Self::CoresOutOfRange { .. } => false,
        }
    }
}

/// [`requests`] with the dropped ones.
///
/// # Errors
/// As [`requests`].
pub fn requests_of(pod: &Pod) -> Result<Requests, RequestError> {
    let Some(spec) = &pod.spec else {
        return Ok(Requests::default());
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    let app = spec.containers.iter().map(|c| (c, false));
    let mut out = Requests::default();
    for (container, is_init) in init.chain(app) {
        match container_request(container, is_init) {
            Ok(Some(request)) => out.kept.push(request),
            Ok(None) => {}
            Err(err) if err.dropped() => out.dropped.push(err),
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}

/// Whether HAMi's webhook hands `pod` to HAMi's scheduler: a container
/// limits `amd.com/gpu`, `gpumem` or `gpucores` (`MutateAdmission`).
pub fn routed_to_hami(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| {
            let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
            limits.is_some_and(|l| [GPU, GPU_MEM, GPU_CORES].iter().any(|k| l.contains_key(*k)))
        })
}

fn container_request(
    container: &Container,
    init: bool,
) -> Result<Option<ContainerRequest>, RequestError> {
    let limits = container
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    let name = &container.name;
    let value = |resource: &'static str| -> Result<Option<(i128, String)>, RequestError> {
        let Some(Quantity(text)) = limits.get(resource) else {
            return Ok(None);
        };
        let n = quantity_value(text).ok_or_else(|| RequestError::NotInteger {
            container: name.clone(),
            resource,
            value: text.clone(),
        })?;
        Ok(Some((n, text.clone())))
    };
    let nums = match value(GPU)? {
        None | Some((0, _)) => return Ok(None),
        Some((n, _)) => u32::try_from(n)
            .ok()
            .filter(|n| i32::try_from(*n).is_ok())
            .ok_or_else(|| RequestError::CountOutOfRange {
                container: name.clone(),
                value: n,
            })?,
    };
    let cores_pct = match value(GPU_CORES)? {
        None => 100,
        Some((n, _)) => u32::try_from(n)
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| RequestError::CoresOutOfRange {
                container: name.clone(),
                value: n,
            })?,
    };
    let mem_mib = match value(GPU_MEM)? {
        None | Some((0, _)) => None,
        Some((n, text)) => Some(
            u32::try_from(n)
                .ok()
                .filter(|m| i32::try_from(*m).is_ok())
                .ok_or_else(|| RequestError::MemoryDropped {
                    container: name.clone(),
                    value: text,
                    mib: n,
                })?,
        ),
    };
    Ok(Some(ContainerRequest {
        container: name.clone(),
        init,
        nums,
        mem_mib,
        cores_pct,
    }))
}

/// The integer value of a Kubernetes quantity (`4096`, `4Ki`, `2k`, `1e3`,
/// `1500m` = 1.5 is not whole); `None` when malformed or not whole.
pub fn quantity_value(text: &str) -> Option<i128> {
    let text = text.trim();
    let (sign, body) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let digits_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits_end);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let scale = 10_i128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let parse = |s: &str| {
        if s.is_empty() {
            Some(0)
        } else {
            s.parse::<i128>().ok()
        }
    };
    let mantissa = parse(whole)?
        .checked_mul(scale)?
        .checked_add(parse(frac)?)?;
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (10_i128.pow(12), 1),
        "P" => (10_i128.pow(15), 1),
        "E" => (10_i128.pow(18), 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exp => {
            let e: u32 = exp.strip_prefix(['e', 'E']).and_then(|e| e.parse().ok())?;
            (10_i128.checked_pow(e)?, 1)
        }
    };
    let numerator = mantissa.checked_mul(mul)?;
    let denominator = scale.checked_mul(div)?;
    (numerator % denominator == 0).then(|| sign * (numerator / denominator))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::hami_emulator::order::SortKey;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn with_limits(limits: serde_json::Value) -> Pod {
        pod(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}),
        )
    }

    #[test]
    fn quantities() {
        let cases = [
            ("4096", Some(4096)),
            ("4Ki", Some(4096)),
            ("2k", Some(2000)),
            ("1e3", Some(1000)),
            ("1.5k", Some(1500)),
            ("1500m", None),
            ("2000m", Some(2)),
            ("16Gi", Some(17_179_869_184)),
            ("-1", Some(-1)),
            ("abc", None),
            ("", None),
            ("1x", None),
        ];
        for (text, want) in cases {
            assert_eq!(quantity_value(text), want, "{text}");
        }
    }

    #[test]
    fn defaults_and_init_first() {
        let p = pod(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"amd.com/gpu": 1}}}],
                "containers": [
                    {"name": "cpu"},
                    {"name": "a", "resources": {"limits": {"amd.com/gpu": "2",
                        "amd.com/gpucores": "25", "amd.com/gpumem": "4096"}}},
                ]}}),
        );
        let got = requests(&p).unwrap();
        assert_eq!(
            got,
            [
                ContainerRequest {
                    container: "i".into(),
                    init: true,
                    nums: 1,
                    mem_mib: None,
                    cores_pct: 100
                },
                ContainerRequest {
                    container: "a".into(),
                    init: false,
                    nums: 2,
                    mem_mib: Some(4096),
                    cores_pct: 25
                },
            ]
        );
    }

    #[test]
    fn refusals() {
        let err = requests(&with_limits(
            json!({"amd.com/gpu": 1, "amd.com/gpucores": 101}),
        ));
        assert!(matches!(
            err,
            Err(RequestError::CoresOutOfRange { value: 101, .. })
        ));
        let err = requests(&with_limits(
            json!({"amd.com/gpu": 1, "amd.com/gpucores": "0.5"}),
        ));
        assert!(matches!(err, Err(RequestError::NotInteger { .. })));
        assert_eq!(
            requests(&with_limits(json!({"amd.com/gpu": 0}))).unwrap(),
            []
        );
    }

    /// HAMi v2.10.0 on `amd.com/gpumem: 16Gi`: "amd device memory request is
    /// out of range", the request dropped, the pod still HAMi's to bind.
    #[test]
    fn hami_v2_10_drops_an_out_of_range_request() {
        let p = with_limits(json!({"amd.com/gpu": 1, "amd.com/gpumem": "16Gi"}));
        let got = requests_of(&p).unwrap();
        assert!(got.kept.is_empty());
        let [e @ RequestError::MemoryDropped { .. }] = got.dropped.as_slice() else {
            panic!("{got:?}")
        };
        assert!(e.to_string().contains("17179869184 MiB"), "{e}");
        assert!(routed_to_hami(&p));
        let half = requests_of(&with_limits(json!({"amd.com/gpu": "0.5"}))).unwrap();
        assert!(matches!(
            half.dropped.as_slice(),
            [RequestError::NotInteger { .. }]
        ));
    }

    /// `amd.com/gpucores` or `gpumem` without `amd.com/gpu`: HAMi's webhook
    /// routes the pod to HAMi, which places no device.
    #[test]
    fn hami_v2_10_takes_cores_or_memory_without_a_count() {
        for limits in [
            json!({"amd.com/gpucores": 50}),
            json!({"amd.com/gpumem": 1024}),
        ] {
            let p = with_limits(limits);
            assert_eq!(requests_of(&p).unwrap(), Requests::default());
            assert!(routed_to_hami(&p));
        }
        assert!(!routed_to_hami(&with_limits(json!({"cpu": 1}))));
    }

    #[test]
    fn selection_from_annotations() {
        let p = pod(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p",
            "annotations": {GPU_POLICY: "binpack,mutex", USE_TYPE: "mi300", NOUSE_UUID: "b, c"}}}),
        );
        let s = Selection::of(&p, GpuPolicy::Spread);
        assert_eq!(
            (&s.order, s.mutex),
            (&DeviceOrder::Chain(vec![SortKey::Binpack]), true)
        );
        assert!(s.type_ok("AMD Instinct MI300X") && !s.type_ok("AMD Radeon RX 9070 XT"));
        assert!(s.uuid_ok("a") && !s.uuid_ok("c"));
        let plain = pod(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}));
        let s = Selection::of(&plain, GpuPolicy::Binpack);
        assert_eq!((s.order, s.mutex), (DeviceOrder::Binpack, false));
        let alone = pod(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": {GPU_POLICY: "mutex"}}}));
        let s = Selection::of(&alone, GpuPolicy::Binpack);
        assert_eq!((s.order, s.mutex), (DeviceOrder::Mutex, true));
    }
}
