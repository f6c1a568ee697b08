//! Helpers shared by the integration tests of this crate.
#![allow(dead_code)] // each test file uses its own subset
#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

pub mod cluster;
pub mod examples;
pub mod memcg;
pub mod real_node;
pub mod world;

use std::{
    ffi::OsString,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpud::{
    HostPaths,
    testing::amdsmi::{AmdSmiConfig, LibrarySource},
    testing::inventory::Inventory,
};
use serde_json::Value;

/// The `fake-node` binary; `fake-node gpud ...` is amd-gpud's command line.
pub fn fake_node_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fake-node"))
}

/// A real KFD capture `<captures>/<name>`, when present
/// ([`tests::fixture::captures_dir`]).
pub fn shared_capture(name: &str) -> Option<PathBuf> {
    let dir = tests::fixture::captures_dir().join(name);
    dir.is_dir().then(|| dir.canonicalize().ok()).flatten()
}

/// Every capture folder in [`tests::fixture::captures_dir`].
pub fn shared_captures() -> Vec<String> {
    let dir = tests::fixture::captures_dir();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("nodes").is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// AMD SMI through the fake library driven by `fixture`, probed by a child
/// `fake-node gpud amdsmi-probe`.
pub fn fake_amdsmi(fixture: &Path, timeout: Duration) -> AmdSmiConfig {
    let abi = tests::fake_amdsmi::fixture_abi(fixture).unwrap_or_else(|| "7.0".into());
    AmdSmiConfig {
        library: LibrarySource::Path(tests::fake_amdsmi::library_for(&abi).to_path_buf()),
        helper: vec![fake_node_exe().into_os_string(), OsString::from("gpud")],
        timeout,
        child_env: vec![(
            OsString::from("FAKE_AMDSMI_FIXTURE"),
            fixture.as_os_str().to_owned(),
        )],
    }
}

/// AMD SMI switched off.
pub fn no_amdsmi() -> AmdSmiConfig {
    AmdSmiConfig {
        library: LibrarySource::Disabled,
        helper: Vec::new(),
        timeout: Duration::from_secs(1),
        child_env: Vec::new(),
    }
}

/// The inventory of the host root `root`.
pub fn inventory(root: &Path, amdsmi: &AmdSmiConfig) -> Inventory {
    gpud::testing::cli::inventory_with(&HostPaths::under(root), amdsmi).expect("inventory")
}

/// The inventory as JSON with machine-specific paths replaced, for snapshots.
pub fn redacted(inventory: &Inventory, replace: &[(&Path, &str)]) -> Value {
    let mut text = serde_json::to_string_pretty(inventory).expect("serialise");
    for (path, with) in replace {
        text = text.replace(&path.display().to_string(), with);
    }
    let lib = tests::fake_amdsmi::library().display().to_string();
    text = text.replace(&lib, "<fake libamd_smi.so>");
    let mut value = serde_json::from_str(&text).expect("reparse");
    compact(&mut value);
    value
}

/// Replaces each partition's restore io-link list by its length, to keep
/// snapshots of CPX nodes (63 links per partition) readable.
pub fn compact(value: &mut Value) {
    let Some(gpus) = value["gpus"].as_array_mut() else {
        return;
    };
    for gpu in gpus {
        let Some(parts) = gpu["partitions"].as_array_mut() else {
            continue;
        };
        for part in parts {
            let n = part["restore"]["io_links"].as_array().map_or(0, Vec::len);
            part["restore"]["io_links"] = Value::from(n);
        }
    }
}

/// Runs `cmd` to completion within `limit`, killing it otherwise.
pub fn run_with_timeout(mut cmd: Command, limit: Duration) -> (i32, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out.join().expect("join").expect("read stdout"),
        err.join().expect("join").expect("read stderr"),
    )
}

/// `amd-gpud inspect --host-root ROOT --amdsmi none --json`, as a process.
pub fn inspect_cli_json(root: &Path) -> Value {
    let mut cmd = Command::new(fake_node_exe());
    cmd.args([
        "gpud",
        "inspect",
        "--amdsmi",
        "none",
        "--json",
        "--host-root",
    ])
    .arg(root);
    let (code, stdout, stderr) = run_with_timeout(cmd, Duration::from_secs(60));
    assert_eq!(code, 0, "inspect failed: {stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("inspect printed no JSON ({e}): {stdout}"))
}

/// Whether `dbus-daemon` is installed (the stack's private bus); says so when not.
pub fn have_dbus() -> bool {
    let found = std::process::Command::new("dbus-daemon")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        eprintln!("skipping: dbus-daemon is not installed");
    }
    found
}

/// Whether the bus tests can run here (root, for the shipped policy and
/// setpriv); makes sure the plugin's system user exists. Prints why not.
pub fn can_run_bus_tests() -> bool {
    if tests::bus::effective_uid().is_ok_and(|uid| uid == 0) {
        tests::bus::ensure_plugin_user().unwrap();
        true
    } else {
        eprintln!("skipping: needs root for the shipped bus policy");
        false
    }
}

/// The builder fixture `name` with DRM/PCI sysfs and no AMD SMI, on tmpfs.
pub fn build_fixture(name: &str) -> tempfile::TempDir {
    build_fixture_with(name, None)
}

/// As [`build_fixture`], with the fake AMD SMI's fixture for ABI `amdsmi_abi`.
pub fn build_fixture_with(name: &str, amdsmi_abi: Option<&str>) -> tempfile::TempDir {
    let root = tests::fixture::scratch_dir().unwrap();
    let spec = tests::fixture::named(name).unwrap();
    let options = tests::fixture::BuildOptions {
        drm: true,
        amdsmi_abi: amdsmi_abi.map(str::to_owned),
    };
    tests::fixture::build(&spec, root.path(), &options).unwrap();
    root
}

/// Runs `body` on a fresh two-thread runtime, failing the test after `limit`.
pub fn run_async<F: std::future::Future<Output = ()>>(limit: Duration, body: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(limit, body)
            .await
            .expect("test timed out");
    });
}

/// `--sandbox required` where this kernel enforces the whole landlock
/// sandbox (the end-to-end tests then prove the plugin works inside it),
/// else `best-effort`.
pub fn sandbox_mode() -> &'static str {
    if plugin::testing::sandbox::probe() == plugin::testing::sandbox::Enforcement::Full {
        "required"
    } else {
        eprintln!("landlock is not fully available here: the plugin runs best-effort");
        "best-effort"
    }
}
