//! Tests of AMD SMI's place in `GetUsage`: which figure wins, when the
//! probe child is (not) started, and what a failed probe leaves behind.

use std::ffi::OsString;

use super::*;

fn sysfs_use(bdf: &str) -> GpuUse {
    GpuUse {
        bdf: bdf.to_owned(),
        vram_used_bytes: 9 << 30,
        busy_percent: 63,
        temperature_millicelsius: 51_000,
        power_microwatts: 150_000_000,
        source: "sysfs".to_owned(),
    }
}

fn usage(bdf: &str, busy: Option<u32>, vram: Option<u64>) -> GpuUsage {
    GpuUsage {
        bdf: bdf.to_owned(),
        gfx_activity_percent: busy,
        vram_used_bytes: vram,
    }
}

/// A helper running `script` under `/bin/sh`, its arguments in `$@`.
fn helper(script: &str) -> AmdSmiConfig {
    AmdSmiConfig {
        library: LibrarySource::Path("/opt/rocm/lib/libamd_smi.so.26".into()),
        helper: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()],
        timeout: Duration::from_secs(30),
        child_env: Vec::<(OsString, OsString)>::new(),
    }
}

async fn wait(rx: Pending) -> Result<Vec<GpuUsage>, String> {
    tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the probe thread answers")
        .expect("the probe thread does not die")
        .map_err(|e| e.to_string())
}

#[test]
fn amdsmi_figures_win_where_it_has_them() {
    let figures = by_gpu(&[
        usage("0000:05:00.0", Some(17), Some(5000 << 20)),
        usage("0000:06:00.0", None, Some(1 << 30)),
        usage("0000:07:00.0", Some(3), None),
        usage("0000:08:00.0", None, None),
        usage("not an address", Some(1), Some(1)),
    ]);
    assert_eq!(figures.len(), 3, "{figures:?}");
    let mut gpus: Vec<GpuUse> = [
        "0000:05:00.0",
        "0000:06:00.0",
        "0000:07:00.0",
        "0000:08:00.0",
    ]
    .into_iter()
    .map(sysfs_use)
    .collect();
    merge(&mut gpus, &figures);
    let got: Vec<(i64, i64, &str)> = gpus
        .iter()
        .map(|g| (g.vram_used_bytes, g.busy_percent, g.source.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (5000 << 20, 17, "amdsmi"),
            (1 << 30, 63, "amdsmi-vram"),
            (9 << 30, 3, "amdsmi-busy"),
            (9 << 30, 63, "sysfs"),
        ]
    );
    assert!(gpus.iter().all(|g| g.temperature_millicelsius == 51_000));
}

#[test]
fn disabled_amdsmi_never_starts_a_probe() {
    let cfg = AmdSmiConfig {
        library: LibrarySource::Disabled,
        // A helper that would fail the test if it ran.
        helper: vec!["/nonexistent/amd-gpud".into()],
        timeout: Duration::from_secs(1),
        child_env: Vec::new(),
    };
    let smi = SmiUsage::new(cfg);
    assert!(smi.start(Instant::now()).is_none());
    assert!(!smi.probing.load(Ordering::Acquire));
}

#[tokio::test]
async fn the_probe_asks_for_usage_and_its_list_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let args = tmp.path().join("args");
    let answer = r#"{"outcome":"ok","report":{"library":"x","version":{"year":null,"major":26,"minor":0,"release":0,"build":null},"layout":"7.0","processors":[],"errors":[],"usage":[{"bdf":"0000:05:00.0","gfx_activity_percent":17,"vram_used_bytes":5242880000}]}}"#;
    let script = format!("echo \"$@\" > '{}'; echo '{answer}'", args.display());
    let smi = SmiUsage::new(helper(&script));
    let rx = smi.start(Instant::now()).expect("a probe starts");
    let figures = smi.finish(Instant::now(), wait(rx).await);
    let bdf: PciAddress = "0000:05:00.0".parse().unwrap();
    assert_eq!(
        figures.get(&bdf),
        Some(&Figures {
            busy_percent: Some(17),
            vram_used_bytes: Some(5_242_880_000),
        })
    );
    let argv = std::fs::read_to_string(&args).unwrap();
    assert!(argv.trim_end().ends_with("--usage"), "{argv}");
    assert!(
        smi.start(Instant::now()).is_some(),
        "no pause after a success"
    );
}

#[tokio::test]
async fn a_late_probe_is_killed_and_pauses_amdsmi() {
    let smi = SmiUsage::new(helper("exec sleep 60"));
    let start = Instant::now();
    let rx = smi.start(start).expect("a probe starts");
    assert!(smi.start(start).is_none(), "one probe at a time");
    let result = wait(rx).await;
    assert!(
        result.as_ref().is_err_and(|e| e.contains("did not finish")),
        "{result:?}"
    );
    assert!(start.elapsed() < PROBE_TIMEOUT + Duration::from_secs(3));
    assert!(smi.finish(Instant::now(), result).is_empty());
    let now = Instant::now();
    assert!(smi.start(now).is_none(), "paused after a failure");
    let until = smi.quiet_until.lock().unwrap().expect("a pause");
    assert!(until > now && until <= now + RETRY_AFTER, "for RETRY_AFTER");
}
