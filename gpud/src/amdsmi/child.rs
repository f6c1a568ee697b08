//! The probe proper, run inside the `amdsmi-probe` child (docs/amd-hardware.md §1.3, §4).
//!
//! Load, version, init and enumeration failures fail the whole probe; every other non-SUCCESS
//! status becomes a [`CallError`] and leaves its field `None`.

use std::{path::PathBuf, thread::sleep, time::Duration};

use tracing::{debug, info, info_span, warn};

use super::{
    LIB_DIR_ENV, LibrarySource, decode,
    dynlib::{CallFail, Filled, Handle, Library, Session},
    layout::{self, Family, Layout},
    locate,
    report::{AmdSmiReport, CallError, LibVersion, ProbeFailure, ProcessEntry, ProcessorInfo},
    status::{self, status_name},
};

/// `AMDSMI_INIT_AMD_GPUS`.
const INIT_AMD_GPUS: u64 = 2;
/// `AMD_GPU` in `processor_type_t`.
const PROCESSOR_AMD_GPU: u32 = 1;
/// `AMDSMI_MEM_TYPE_VRAM`.
const MEM_TYPE_VRAM: u32 = 0;
/// Waits before each BUSY retry.
const BUSY_BACKOFF: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
];
/// Sanity caps on counts the library reports.
const MAX_HANDLES: u32 = 4096;
const MAX_PROCESSES: u32 = 16384;
/// Spare process-list entries for processes that appear between count and fill.
const PROCESS_SLACK: u32 = 8;

/// Runs the probe for `source`; reads `AMDSMI_LIB_DIR` for searches.
pub fn run(source: &LibrarySource) -> Result<AmdSmiReport, ProbeFailure> {
    let env_dir = std::env::var_os(LIB_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let (lib, library) = locate::open(source, env_dir.as_deref())?;
    let span = info_span!("amdsmi_probe", library = %library);
    let _entered = span.enter();
    let (version, layout, session) = detect(&lib, &library)?;
    info!(layout = layout.name(), ?version, "AMD SMI version detected");
    let (processors, mut errors) = {
        let found = enumerate(&session, &library, layout.family())?;
        let mut probe = Prober {
            session: &session,
            layout,
            errors: Vec::new(),
        };
        let mut processors = Vec::new();
        for f in &found {
            if probe.is_gpu(f) {
                processors.push(probe.processor(f));
            }
        }
        (processors, probe.errors)
    };
    let shut = session.shut_down();
    if shut != status::SUCCESS {
        errors.push(call_error("amdsmi_shut_down", None, shut, layout.family()));
    }
    info!(
        processors = processors.len(),
        errors = errors.len(),
        "AMD SMI probe finished"
    );
    let layout = layout.name().to_owned();
    Ok(AmdSmiReport {
        library,
        version,
        layout,
        processors,
        errors,
        profile_switch: None,
        usage: None,
    })
}

pub(super) fn status_failure(
    call: &str,
    device: Option<String>,
    code: u32,
    family: Option<Family>,
) -> ProbeFailure {
    ProbeFailure::Status {
        call: call.to_owned(),
        device,
        status: code,
        name: status_name(code, family),
    }
}

fn call_error(call: &str, device: Option<&str>, code: u32, family: Family) -> CallError {
    CallError {
        call: call.to_owned(),
        device: device.map(str::to_owned),
        status: code,
        status_name: status_name(code, Some(family)),
    }
}

fn init<'l>(lib: &'l Library, family: Option<Family>) -> Result<Session<'l>, ProbeFailure> {
    lib.init(INIT_AMD_GPUS)
        .map_err(|code| status_failure("amdsmi_init", None, code, family))
}

/// §1.3: version first (initialising and retrying on NOT_INIT), then layout, then init.
pub(super) fn detect<'l>(
    lib: &'l Library,
    library: &str,
) -> Result<(LibVersion, Layout, Session<'l>), ProbeFailure> {
    let mut session = None;
    let mut raw = lib.lib_version();
    if raw.status == status::NOT_INIT {
        debug!("amdsmi_get_lib_version needs init first (6.2/6.3 behaviour)");
        session = Some(init(lib, None)?);
        raw = lib.lib_version();
    }
    if raw.status != status::SUCCESS {
        return Err(status_failure(
            "amdsmi_get_lib_version",
            None,
            raw.status,
            None,
        ));
    }
    let (version, by_version) = layout::decode_version(&raw.bytes, raw.build).map_err(|word| {
        ProbeFailure::UnknownVersion {
            library: library.to_owned(),
            word,
        }
    })?;
    let layout = layout::refine(by_version, |symbol| lib.has(symbol));
    if layout != by_version {
        warn!(
            from = by_version.name(),
            to = layout.name(),
            "the library's version word and its exported symbols disagree; decoding by the symbols"
        );
    }
    let session = match session {
        Some(session) => session,
        None => init(lib, Some(layout.family()))?,
    };
    Ok((version, layout, session))
}

/// Total time one probe may spend waiting on BUSY: a GPU that stays busy
/// (a partition switch, a wedged lock) must not make a 64-partition node's
/// probe take 64 times the backoff.
const BUSY_BUDGET: Duration = Duration::from_secs(2);

thread_local! {
    static BUSY_BUDGET_LEFT: std::cell::Cell<Duration> = const { std::cell::Cell::new(BUSY_BUDGET) };
}

/// Retries BUSY three times with 50/100/200 ms backoff, while the probe's
/// BUSY budget lasts; after that a BUSY is returned at once.
pub(super) fn retry_busy<T>(mut call: impl FnMut() -> Result<T, CallFail>) -> Result<T, CallFail> {
    for delay in BUSY_BACKOFF {
        match call() {
            Err(CallFail::Status(status::BUSY)) => {
                let left = BUSY_BUDGET_LEFT.get();
                if left < delay {
                    return Err(CallFail::Status(status::BUSY));
                }
                BUSY_BUDGET_LEFT.set(left - delay);
                sleep(delay);
            }
            other => return other,
        }
    }
    call()
}

/// A processor handle with its place in the enumeration.
pub(super) struct Found<'s> {
    pub(super) socket: u32,
    pub(super) index: u32,
    pub(super) handle: Handle<'s>,
}

/// Sockets, then processors per socket (§4.1).
pub(super) fn enumerate<'s>(
    session: &'s Session<'_>,
    library: &str,
    family: Family,
) -> Result<Vec<Found<'s>>, ProbeFailure> {
    let fail = |call: &str, device: Option<String>, why: CallFail| match why {
        CallFail::Status(code) => status_failure(call, device, code, Some(family)),
        CallFail::Missing(symbol) => ProbeFailure::MissingSymbol {
            library: library.to_owned(),
            symbol: symbol.to_owned(),
        },
    };
    let sockets = count_then_fill(|cap| session.socket_handles(cap))
        .map_err(|why| fail("amdsmi_get_socket_handles", None, why))?;
    let mut found = Vec::new();
    for (socket, socket_handle) in (0u32..).zip(sockets) {
        let processors = count_then_fill(|cap| session.processor_handles(socket_handle, cap))
            .map_err(|why| {
                fail(
                    "amdsmi_get_processor_handles",
                    Some(format!("socket {socket}")),
                    why,
                )
            })?;
        let handles = (0u32..).zip(processors);
        found.extend(handles.map(|(index, handle)| Found {
            socket,
            index,
            handle,
        }));
    }
    Ok(found)
}

/// §4.1 count-then-fill, retrying once with a bigger buffer on INVAL / OUT_OF_RESOURCES.
fn count_then_fill<'s>(
    call: impl Fn(u32) -> Result<Filled<Vec<Handle<'s>>>, CallFail>,
) -> Result<Vec<Handle<'s>>, CallFail> {
    let as_result = |filled: Filled<Vec<Handle<'s>>>| match filled.status {
        status::SUCCESS => Ok(filled),
        code => Err(CallFail::Status(code)),
    };
    let counted = retry_busy(|| call(0).and_then(as_result))?;
    if counted.count == 0 {
        return Ok(Vec::new());
    }
    let capacity = counted.count.min(MAX_HANDLES);
    let filled = retry_busy(|| call(capacity))?;
    let filled = match filled.status {
        status::INVAL | status::OUT_OF_RESOURCES => {
            let bigger = filled
                .count
                .max(capacity)
                .saturating_mul(2)
                .min(MAX_HANDLES);
            debug!(capacity, bigger, "handle list too small; retrying once");
            retry_busy(|| call(bigger).and_then(as_result))?
        }
        _ => as_result(filled)?,
    };
    Ok(filled.items)
}

/// Per-device getters, collecting non-fatal errors.
struct Prober<'s, 'l> {
    session: &'s Session<'l>,
    layout: Layout,
    errors: Vec<CallError>,
}

impl<'s> Prober<'s, '_> {
    /// Runs `call` (with BUSY retries); records a failure status as a [`CallError`].
    fn get<T>(
        &mut self,
        name: &str,
        device: &str,
        call: impl FnMut() -> Result<T, CallFail>,
    ) -> Option<T> {
        match retry_busy(call) {
            Ok(value) => Some(value),
            Err(CallFail::Missing(symbol)) => {
                debug!(symbol, "not exported by this library version");
                None
            }
            Err(CallFail::Status(code)) => {
                let error = call_error(name, Some(device), code, self.layout.family());
                let text = self.session.library().status_text(code).unwrap_or_default();
                let status_name = &error.status_name;
                warn!(
                    call = name,
                    device,
                    status = code,
                    status_name,
                    text,
                    "AMD SMI call failed"
                );
                self.errors.push(error);
                None
            }
        }
    }

    /// Whether `found` is an AMD GPU; one whose type cannot be read is kept (init asked for
    /// GPUs only) and the failure recorded.
    fn is_gpu(&mut self, found: &Found<'s>) -> bool {
        let (s, h) = (self.session, found.handle);
        let device = format!("socket {} processor {}", found.socket, found.index);
        match self.get("amdsmi_get_processor_type", &device, || s.processor_type(h)) {
            Some(PROCESSOR_AMD_GPU) | None => true,
            Some(other) => {
                debug!(device, processor_type = other, "skipping non-GPU processor");
                false
            }
        }
    }

    fn processor(&mut self, found: &Found<'s>) -> ProcessorInfo {
        let (s, h) = (self.session, found.handle);
        let mut info = ProcessorInfo {
            socket_index: found.socket,
            processor_index: found.index,
            ..ProcessorInfo::default()
        };
        let anonymous = format!("socket {} processor {}", found.socket, found.index);
        info.bdf = self
            .get("amdsmi_get_gpu_device_bdf", &anonymous, || s.device_bdf(h))
            .map(layout::format_bdf);
        let base = info.bdf.clone().unwrap_or(anonymous);
        let bdf_id = self.get("amdsmi_get_gpu_bdf_id", &base, || s.bdf_id(h));
        let kfd = self.get("amdsmi_get_gpu_kfd_info", &base, || {
            s.kfd_info(h).map(|b| decode::kfd_info(&b))
        });
        info.kfd_id = kfd.map(|k| k.kfd_id);
        info.kfd_node = kfd.map(|k| k.node_id);
        info.partition_id = kfd
            .map(|k| k.current_partition_id)
            .or(bdf_id.map(layout::bdf_id_partition));
        let device = match info.partition_id {
            Some(p) => format!("{base} partition {p}"),
            None => base,
        };
        self.identity(&mut info, h, &device);
        self.partitions(&mut info, h, &device);
        info.processes = self.processes(h, &device);
        info
    }

    fn identity(&mut self, info: &mut ProcessorInfo, h: Handle<'s>, device: &str) {
        let (s, layout) = (self.session, self.layout);
        info.uuid = self.get("amdsmi_get_gpu_device_uuid", device, || s.device_uuid(h));
        let asic = self.get("amdsmi_get_gpu_asic_info", device, || s.asic_info(h));
        if let Some((market_name, asic)) = asic.map(|b| decode::asic_info(layout, &b)) {
            info.market_name = Some(market_name).filter(|n| !n.is_empty());
            info.asic = Some(asic);
        }
        info.vram_total_bytes = self.get("amdsmi_get_gpu_memory_total", device, || {
            s.memory_total(h, MEM_TYPE_VRAM)
        });
        info.enumeration = self
            .get("amdsmi_get_gpu_enumeration_info", device, || {
                s.enumeration_info(h)
            })
            .map(|b| decode::enumeration_info(&b));
    }

    fn partitions(&mut self, info: &mut ProcessorInfo, h: Handle<'s>, device: &str) {
        let s = self.session;
        info.compute_partition = self.get("amdsmi_get_gpu_compute_partition", device, || {
            s.compute_partition(h)
        });
        info.memory_partition = self.get("amdsmi_get_gpu_memory_partition", device, || {
            s.memory_partition(h)
        });
        // The profile getters describe the whole GPU and answer only on partition 0 (§4.8).
        if info.partition_id.is_some_and(|p| p != 0) {
            return;
        }
        let profile = self
            .get(
                "amdsmi_get_gpu_accelerator_partition_profile",
                device,
                || s.partition_profile(h),
            )
            .map(|(bytes, ids)| decode::partition_profile(&bytes, &ids));
        let config = self.get(
            "amdsmi_get_gpu_accelerator_partition_profile_config",
            device,
            || s.profile_config(h),
        );
        info.partition_profile = profile.map(|mut p| {
            p.xcc_per_partition = config
                .as_deref()
                .and_then(|c| decode::xcc_per_partition(c, p.profile_index));
            p
        });
        info.profile_config = config.map(|c| decode::profile_config(&c));
    }

    /// §4.10: count with capacity 0, fill, and retry once bigger on OUT_OF_RESOURCES.
    fn processes(&mut self, h: Handle<'s>, device: &str) -> Option<Vec<ProcessEntry>> {
        const CALL: &str = "amdsmi_get_gpu_process_list";
        let (s, layout) = (self.session, self.layout);
        let stride = layout.proc_stride();
        let attempt = |capacity: u32, short_ok: bool| {
            let filled = s.process_list(h, capacity, stride)?;
            match filled.status {
                status::SUCCESS => Ok(filled),
                status::OUT_OF_RESOURCES if short_ok => Ok(filled),
                code => Err(CallFail::Status(code)),
            }
        };
        let counted = self.get(CALL, device, || attempt(0, true))?;
        if counted.count == 0 {
            return Some(Vec::new());
        }
        let mut capacity = counted
            .count
            .saturating_add(PROCESS_SLACK)
            .min(MAX_PROCESSES);
        let mut filled = self.get(CALL, device, || attempt(capacity, true))?;
        if filled.status == status::OUT_OF_RESOURCES {
            capacity = filled
                .count
                .max(capacity)
                .saturating_mul(2)
                .min(MAX_PROCESSES);
            debug!(device, capacity, "process list grew; retrying once");
            filled = self.get(CALL, device, || attempt(capacity, false))?;
        }
        Some(decode::processes(
            layout,
            &filled.items,
            filled.count.min(capacity),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, time::Instant};

    use super::*;

    #[test]
    fn busy_is_retried_three_times_with_backoff() {
        let calls = Cell::new(0);
        let start = Instant::now();
        let r: Result<u32, CallFail> = retry_busy(|| {
            calls.set(calls.get() + 1);
            Err(CallFail::Status(status::BUSY))
        });
        assert_eq!(r, Err(CallFail::Status(status::BUSY)));
        assert_eq!(calls.get(), 4);
        assert!(start.elapsed() >= Duration::from_millis(350));
    }

    #[test]
    fn busy_then_success() {
        let calls = Cell::new(0);
        let r = retry_busy(|| {
            calls.set(calls.get() + 1);
            if calls.get() < 3 {
                Err(CallFail::Status(status::BUSY))
            } else {
                Ok(7)
            }
        });
        assert_eq!(r, Ok(7));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn other_failures_are_not_retried() {
        let calls = Cell::new(0);
        let r: Result<(), CallFail> = retry_busy(|| {
            calls.set(calls.get() + 1);
            Err(CallFail::Status(2))
        });
        assert_eq!(r, Err(CallFail::Status(2)));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn call_errors_use_the_family_numbering() {
        let e = call_error(
            "amdsmi_get_gpu_process_list",
            Some("0000:05:00.0 partition 0"),
            39,
            Family::V7,
        );
        assert_eq!(e.status_name, "MORE_DATA");
        assert_eq!(e.device.as_deref(), Some("0000:05:00.0 partition 0"));
        let f = status_failure("amdsmi_init", None, 18, None);
        assert_eq!(
            f,
            ProbeFailure::Status {
                call: "amdsmi_init".into(),
                device: None,
                status: 18,
                name: "INIT_ERROR".into()
            }
        );
    }
}
