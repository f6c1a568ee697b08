//! End-to-end scenarios through the exported functions. The library state and
//! the environment variable are process-global, so everything runs in one
//! test, step by step.

use std::{
    ffi::{CStr, c_void},
    path::PathBuf,
    ptr,
};

use serde_json::{Value, json};

use super::*;
use crate::{gpu::*, status::*};

fn u32_at(bytes: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap())
}

fn processor(bdf: &str, partition_id: u32, busy: bool) -> Value {
    let processes = if busy {
        json!([{"pid": 4242, "name": "python3", "mem_bytes": 1, "vram_bytes": 2}])
    } else {
        json!([])
    };
    json!({
        "bdf": bdf, "partition_id": partition_id, "kfd_id": 53862 + partition_id, "kfd_node": 2 + partition_id,
        "uuid": "a1ff74a1-0000-1000-80f4-e3a7c0ffee01", "market_name": "AMD Instinct MI300X",
        "vendor_id": 4098, "device_id": 29857, "rev_id": 0, "asic_serial": "0xE3A7C0FFEE01F431",
        "num_compute_units": 38, "vram_total_bytes": 206_158_430_208_u64,
        "compute_partition": "CPX", "memory_partition": "NPS1",
        "drm_render": 128, "drm_card": 0, "hsa_id": 2, "hip_id": 0, "hip_uuid": "GPU-e3a7c0ffee01f431",
        "profile": { "profile_type": "CPX", "num_partitions": 2, "memory_caps": ["NPS1", "NPS4"],
                     "profile_index": 1, "partition_ids": [0, 1], "xcc_per_partition": 4 },
        "profile_config": { "default_profile_index": 0, "profiles": [
            { "profile_type": "SPX", "num_partitions": 1, "memory_caps": ["NPS1"], "profile_index": 0, "xcc_per_partition": 8 },
            { "profile_type": "CPX", "num_partitions": 2, "memory_caps": ["NPS1", "NPS4"], "profile_index": 1, "xcc_per_partition": 4 }
        ] },
        "processes": processes
    })
}

/// Socket 0: one busy GPU with two partitions; socket 1: one idle GPU.
fn fixture(abi: &str, root: bool, faults: Value) -> Value {
    json!({
        "abi": abi, "root": root, "faults": faults,
        "sockets": [
            { "processors": [processor("0000:05:00.0", 0, true), processor("0000:05:00.0", 1, false)] },
            { "processors": [processor("0000:15:00.0", 0, false)] }
        ]
    })
}

fn use_fixture(value: Option<&Value>) {
    let path: PathBuf =
        std::env::temp_dir().join(format!("fake-amdsmi-{}.json", std::process::id()));
    match value {
        Some(v) => {
            std::fs::write(&path, v.to_string()).unwrap();
            // SAFETY: only this test reads or writes the environment.
            unsafe { std::env::set_var(state::FIXTURE_ENV, &path) };
        }
        // SAFETY: as above.
        None => unsafe { std::env::remove_var(state::FIXTURE_ENV) },
    }
}

fn sockets() -> Vec<*mut c_void> {
    let mut count = 0;
    // SAFETY: valid pointers; a NULL list asks for the count.
    let rc = unsafe { amdsmi_get_socket_handles(&mut count, ptr::null_mut()) };
    assert_eq!(rc, SUCCESS);
    let mut list = vec![ptr::null_mut(); count as usize];
    // SAFETY: `list` holds `count` handles.
    let rc = unsafe { amdsmi_get_socket_handles(&mut count, list.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    list
}

fn processors(socket: *mut c_void) -> Vec<*mut c_void> {
    let mut list = vec![ptr::null_mut(); 8];
    let mut count = 8;
    // SAFETY: `list` holds 8 handles.
    let rc = unsafe { amdsmi_get_processor_handles(socket, &mut count, list.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    list.truncate(count as usize);
    list
}

fn compute_partition(h: *mut c_void) -> (u32, String) {
    let mut buf = [0u8; 16];
    // SAFETY: 16-byte buffer.
    let rc = unsafe { amdsmi_get_gpu_compute_partition(h, buf.as_mut_ptr().cast(), 16) };
    (
        rc,
        CStr::from_bytes_until_nul(&buf)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned(),
    )
}

fn without_fixture() {
    use_fixture(None);
    assert_eq!(amdsmi_init(2), INIT_ERROR);
    let mut count = 0;
    // SAFETY: valid pointer.
    let rc = unsafe { amdsmi_get_socket_handles(&mut count, ptr::null_mut()) };
    assert_eq!(rc, INIT_ERROR);
    let mut text = ptr::null();
    // SAFETY: valid out pointer.
    let rc = unsafe { amdsmi_status_code_to_string(BUSY, &mut text) };
    assert_eq!(rc, SUCCESS);
    // SAFETY: the library returned a static C string.
    let rc = unsafe { CStr::from_ptr(text) };
    assert_eq!(rc, c"AMDSMI_STATUS_BUSY: Processor busy");
    // SAFETY: valid out pointer.
    let rc = unsafe { amdsmi_status_code_to_string(777, &mut text) };
    assert_eq!(rc, UNKNOWN_ERROR);
    // SAFETY: as above.
    let rc = unsafe { CStr::from_ptr(text) };
    assert_eq!(rc, c"An unknown error occurred");
}

fn abi_6_2() {
    use_fixture(Some(&fixture("6.2", true, json!({}))));
    let mut version = [0u8; 24];
    // SAFETY: 24-byte buffer.
    let rc = unsafe { amdsmi_get_lib_version(version.as_mut_ptr()) };
    assert_eq!(rc, NOT_INIT);
    assert_eq!(amdsmi_init(2), SUCCESS);
    assert_eq!(amdsmi_init(2), SUCCESS, "6.x init is idempotent");
    // SAFETY: 24-byte buffer.
    let rc = unsafe { amdsmi_get_lib_version(version.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!([0, 4, 8].map(|o| u32_at(&version, o)), [24, 6, 2]);
    let build = ptr::with_exposed_provenance::<std::ffi::c_char>(
        usize::try_from(u64_at(&version, 16)).unwrap(),
    );
    // SAFETY: `build` points at a static C string of the library.
    let rc = unsafe { CStr::from_ptr(build) };
    assert_eq!(rc, c"24.6.2.0");

    let s = sockets();
    assert_eq!(s.len(), 2);
    let busy = processors(s[0]);
    let idle = processors(s[1]);
    assert_eq!((busy.len(), idle.len()), (2, 1));
    let mut asic = vec![0xAAu8; 1024];
    // SAFETY: buffer larger than any layout.
    let rc = unsafe { amdsmi_get_gpu_asic_info(busy[0], asic.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(u64_at(&asic, 328), 29857);
    assert_eq!(asic[448], 0xAA, "nothing written past 448 bytes");
    let mut kfd = [0u8; 64];
    // SAFETY: 64-byte buffer.
    let rc = unsafe { amdsmi_get_gpu_kfd_info(busy[0], kfd.as_mut_ptr()) };
    assert_eq!(rc, NOT_SUPPORTED);

    let mut procs = vec![0xAAu8; 2048];
    let mut max = 4;
    // SAFETY: 2048 bytes hold 4 entries of 224 bytes.
    let rc = unsafe { amdsmi_get_gpu_process_list(busy[0], &mut max, procs.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(max, 1);
    assert_eq!(u32_at(&procs, 32), 4242);
    assert_eq!(procs[224], 0xAA, "stride 224");

    assert_eq!(
        amdsmi_set_gpu_compute_partition(busy[1], 2),
        BUSY,
        "same socket lists processes"
    );
    assert_eq!(
        amdsmi_set_gpu_compute_partition(idle[0], 6),
        SETTING_UNAVAILABLE
    );
    assert_eq!(amdsmi_set_gpu_compute_partition(idle[0], 2), SUCCESS);
    assert_eq!(
        compute_partition(idle[0]),
        (SUCCESS, "SPX".to_owned()),
        "2 is SPX on 6.2"
    );

    assert_eq!(amdsmi_shut_down(), SUCCESS);
    assert_eq!(compute_partition(idle[0]).0, NOT_INIT);
    assert_eq!(amdsmi_init(2), SUCCESS);
    assert_eq!(
        compute_partition(idle[0]).0,
        INVAL,
        "handle from before shut_down"
    );
    let fresh = processors(sockets()[1]);
    assert_eq!(
        compute_partition(fresh[0]),
        (SUCCESS, "SPX".to_owned()),
        "mode survives re-init"
    );
    assert_eq!(amdsmi_shut_down(), SUCCESS);
}

fn handles_and_ids(s: &[*mut c_void]) {
    let mut one = [ptr::null_mut(); 1];
    let mut count = 1;
    // SAFETY: `one` holds 1 handle.
    let rc = unsafe { amdsmi_get_socket_handles(&mut count, one.as_mut_ptr()) };
    assert_eq!(rc, OUT_OF_RESOURCES);
    assert_eq!((count, one[0]), (1, s[0]));
    let mut count = 0;
    // SAFETY: a socket handle is not a processor handle.
    let rc = unsafe { amdsmi_get_processor_handles(ptr::null_mut(), &mut count, ptr::null_mut()) };
    assert_eq!(rc, INVAL);
    let p = processors(s[0]);
    let mut kind = 0;
    // SAFETY: valid out pointer.
    let rc = unsafe { amdsmi_get_processor_type(p[1], &mut kind) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(kind, 1);
    // SAFETY: valid out pointer; a socket handle is not a processor.
    let rc = unsafe { amdsmi_get_processor_type(s[0], &mut kind) };
    assert_eq!(rc, INVAL);
    let (mut bdf, mut id) = (0, 0);
    // SAFETY: valid out pointers.
    let rc = unsafe { amdsmi_get_gpu_device_bdf(p[1], &mut bdf) };
    assert_eq!(rc, SUCCESS);
    // SAFETY: as above.
    let rc = unsafe { amdsmi_get_gpu_bdf_id(p[1], &mut id) };
    assert_eq!(rc, SUCCESS);
    assert_eq!((bdf, id), (0x0500, (1 << 28) | 0x0500));
    let mut found = ptr::null_mut();
    // SAFETY: valid out pointer.
    let rc = unsafe { amdsmi_get_processor_handle_from_bdf(0x0500, &mut found) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(found, p[0]);
    // SAFETY: as above.
    let rc = unsafe { amdsmi_get_processor_handle_from_bdf(0x0600, &mut found) };
    assert_eq!(rc, NOT_FOUND);
    let mut len = 10;
    let mut uuid = [0u8; 64];
    // SAFETY: `uuid` holds 64 bytes, more than `len`.
    let rc = unsafe { amdsmi_get_gpu_device_uuid(p[0], &mut len, uuid.as_mut_ptr().cast()) };
    assert_eq!(rc, INVAL);
    assert_eq!(len, 38);
    // SAFETY: as above.
    let rc = unsafe { amdsmi_get_gpu_device_uuid(p[0], &mut len, uuid.as_mut_ptr().cast()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(
        CStr::from_bytes_until_nul(&uuid).unwrap(),
        c"a1ff74a1-0000-1000-80f4-e3a7c0ffee01"
    );
}

fn profiles(s: &[*mut c_void]) {
    let p = processors(s[0]);
    let mut profile = vec![0u8; 1152];
    let mut ids = [0xFFFF_FFFFu32; 8];
    // SAFETY: 1152 bytes and 8 ids.
    let rc = unsafe {
        amdsmi_get_gpu_accelerator_partition_profile(p[1], profile.as_mut_ptr(), ids.as_mut_ptr())
    };
    assert_eq!((rc, ids[0], ids[1]), (NOT_SUPPORTED, 1, 0xFFFF_FFFF));
    // SAFETY: as above.
    let rc = unsafe {
        amdsmi_get_gpu_accelerator_partition_profile(p[0], profile.as_mut_ptr(), ids.as_mut_ptr())
    };
    assert_eq!((rc, ids[0], ids[1], ids[2]), (SUCCESS, 0, 1, 0xFFFF_FFFF));
    assert_eq!(
        [0, 4, 8, 12, 16, 20, 148].map(|o| u32_at(&profile, o)),
        [5, 2, 5, 1, 1, 1, 1]
    );
    let mut config = vec![0u8; 39168];
    // SAFETY: 39168 bytes.
    let rc =
        unsafe { amdsmi_get_gpu_accelerator_partition_profile_config(p[0], config.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(
        [0, 4, 8 + 64, 8 + 64 + 8].map(|o| u32_at(&config, o)),
        [2, 2, 1, 4]
    );
    assert_eq!(amdsmi_set_gpu_accelerator_partition_profile(p[0], 0), BUSY);
    let idle = processors(s[1]);
    assert_eq!(
        amdsmi_set_gpu_accelerator_partition_profile(idle[0], 9),
        INVAL
    );
    assert_eq!(
        amdsmi_set_gpu_accelerator_partition_profile(idle[0], 0),
        SUCCESS
    );
    assert_eq!(compute_partition(idle[0]).1, "SPX");
}

fn abi_7_0() {
    let faults = json!({"amdsmi_get_gpu_memory_partition": "BUSY", "amdsmi_get_gpu_vram_info": 7});
    use_fixture(Some(&fixture("7.0", true, faults)));
    let mut version = [0u8; 24];
    // SAFETY: 24-byte buffer; works before init from 6.4 on.
    let rc = unsafe { amdsmi_get_lib_version(version.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!([0, 4, 8].map(|o| u32_at(&version, o)), [26, 0, 0]);
    assert_eq!(amdsmi_init(2), SUCCESS);
    assert_eq!(amdsmi_init(2), SUCCESS);
    assert_eq!(amdsmi_shut_down(), SUCCESS);
    let s = sockets(); // still initialized: 7.x counts inits
    let p = processors(s[0]);
    let mut buf = [0u8; 16];
    // SAFETY: 16-byte buffer.
    let rc = unsafe { amdsmi_get_gpu_memory_partition(p[0], buf.as_mut_ptr().cast(), 16) };
    assert_eq!(rc, BUSY);
    // SAFETY: 3 bytes are too few for "CPX\0".
    let rc = unsafe { amdsmi_get_gpu_compute_partition(p[0], buf.as_mut_ptr().cast(), 3) };
    assert_eq!(rc, INSUFFICIENT_SIZE);
    let mut info = vec![0xAAu8; 300];
    // SAFETY: 300 bytes.
    let rc = unsafe { amdsmi_get_gpu_enumeration_info(p[1], info.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!((u32_at(&info, 0), info[271], info[272]), (128, 0, 0xAA));
    let mut procs = vec![0u8; 704];
    let mut max = 0;
    // SAFETY: capacity 0 asks for the count.
    let rc = unsafe { amdsmi_get_gpu_process_list(p[0], &mut max, procs.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(max, 1);
    handles_and_ids(&s);
    profiles(&s);
    assert_eq!(amdsmi_shut_down(), SUCCESS);
    let mut count = 0;
    // SAFETY: valid pointer.
    let rc = unsafe { amdsmi_get_socket_handles(&mut count, ptr::null_mut()) };
    assert_eq!(rc, NOT_INIT);
}

fn not_root_6_4() {
    use_fixture(Some(&fixture("6.4", false, json!({}))));
    assert_eq!(amdsmi_init(2), SUCCESS);
    let p = processors(sockets()[1]);
    let mut config = vec![0u8; 39168];
    // SAFETY: 39168 bytes.
    let rc =
        unsafe { amdsmi_get_gpu_accelerator_partition_profile_config(p[0], config.as_mut_ptr()) };
    assert_eq!(rc, NO_PERM);
    assert_eq!(amdsmi_set_gpu_compute_partition(p[0], 1), NO_PERM);
    assert_eq!(
        amdsmi_set_gpu_accelerator_partition_profile(p[0], 0),
        NO_PERM
    );
    let mut procs = vec![0u8; 704];
    let mut max = 1;
    // SAFETY: 704 bytes hold one entry.
    let rc = unsafe { amdsmi_get_gpu_process_list(p[0], &mut max, procs.as_mut_ptr()) };
    assert_eq!(rc, SUCCESS);
    assert_eq!(max, 0);
    assert_eq!(amdsmi_shut_down(), SUCCESS);
    use_fixture(Some(&json!({"abi": "6.4", "sockets": [{"processors": [
        {"bdf": "0000:05:00.0", "processes": [{"pid": 1}, {"pid": 2}, {"pid": 3}]}]}]})));
    assert_eq!(amdsmi_init(2), SUCCESS);
    let p = processors(sockets()[0]);
    let mut procs = vec![0xAAu8; 704 * 3];
    let mut max = 2;
    // SAFETY: the buffer holds 3 entries, we announce 2.
    let rc = unsafe { amdsmi_get_gpu_process_list(p[0], &mut max, procs.as_mut_ptr()) };
    assert_eq!(rc, OUT_OF_RESOURCES);
    assert_eq!(
        (
            max,
            u32_at(&procs, 256),
            u32_at(&procs, 704 + 256),
            procs[1408]
        ),
        (3, 1, 2, 0xAA)
    );
    let mut asic = [0u8; 896];
    // SAFETY: 896 bytes.
    let rc = unsafe { amdsmi_get_gpu_asic_info(p[0], asic.as_mut_ptr()) };
    assert_eq!(rc, NOT_SUPPORTED);
    assert_eq!(amdsmi_shut_down(), SUCCESS);
}

#[test]
fn scenarios_through_the_exported_symbols() {
    without_fixture();
    abi_6_2();
    abi_7_0();
    not_root_6_4();
    use_fixture(Some(&json!({"abi": "9.9"})));
    assert_eq!(amdsmi_init(2), INIT_ERROR);
    use_fixture(None);
}
