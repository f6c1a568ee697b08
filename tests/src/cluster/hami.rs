//! HAMi's scheduler in front of the real cluster, deployed the way HAMi's
//! chart deploys it (`Project-HAMi/HAMi:charts/hami/templates/scheduler/`):
//! a second kube-scheduler whose one profile is `hami-scheduler` and whose
//! extender (filter and bind over HTTP, `nodeCacheCapable`, the AMD
//! resources managed and ignored by kube-scheduler itself) is HAMi's
//! scheduler. The extender is a HAMi scheduler binary the user has
//! ([`Extender::Binary`]: the project never builds or ships HAMi) or one
//! already serving at a URL ([`Extender::Url`]).
//!
//! HAMi's mutating webhook is not run: the pods node-sim creates carry
//! `schedulerName: hami-scheduler`, which is what the webhook sets.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{ADMIN_TOKEN, RealCluster};
use crate::{
    hami_emulator::SCHEDULER_NAME,
    stack::{Process, free_port, http_get},
};

/// How long HAMi's scheduler gets to answer `/healthz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where HAMi's scheduler serves.
#[derive(Debug, Clone)]
pub struct HamiEndpoints {
    /// The extender's URL prefix (filter and bind).
    pub extender: String,
    /// Its Prometheus metrics, when node-sim started it: every node HAMi
    /// has registered is a `node` label of `hami_gpu_memory_limit_bytes`.
    pub metrics: Option<std::net::SocketAddr>,
}

impl HamiEndpoints {
    /// Whether HAMi's scheduler has registered node `name` (its devices
    /// appear in its metrics); `true` when that cannot be told.
    pub fn knows_node(&self, name: &str) -> bool {
        let Some(metrics) = self.metrics else {
            return true;
        };
        http_get(metrics, "/metrics").is_ok_and(|(code, body)| {
            code == 200
                && body.lines().any(|l| {
                    l.starts_with("hami_gpu_memory_limit_bytes")
                        && l.contains(&format!("node=\"{name}\""))
                })
        })
    }
}

/// What serves HAMi's filter and bind.
#[derive(Debug, Clone)]
pub enum Extender {
    /// A HAMi scheduler binary (`cmd/scheduler` of Project-HAMi/HAMi),
    /// started with the chart's arguments and the AMD device config.
    Binary(PathBuf),
    /// An extender already serving at this URL prefix.
    Url(String),
}

/// The device config HAMi's chart writes for AMD (`device-configmap.yaml`).
const DEVICE_CONFIG: &str = "amd:\n  resourceCountName: \"amd.com/gpu\"\n  \
     resourceCoreName: \"amd.com/gpucores\"\n  resourceMemoryName: \"amd.com/gpumem\"\n";

/// The KubeSchedulerConfiguration of HAMi's chart (`configmap.yaml`), with
/// the webhook off (plain HTTP to the extender).
fn scheduler_config(kubeconfig: &Path, url: &str) -> String {
    let managed: String = ["amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"]
        .iter()
        .map(|r| format!("  - name: {r}\n    ignoredByScheduler: true\n"))
        .collect();
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
         clientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\n\
         profiles:\n- schedulerName: {SCHEDULER_NAME}\nextenders:\n- urlPrefix: \"{url}\"\n  \
         enableHTTPS: false\n  filterVerb: filter\n  bindVerb: bind\n  nodeCacheCapable: true\n  \
         weight: 1\n  httpTimeout: 30s\n  managedResources:\n{managed}",
        kubeconfig.display()
    )
}

impl RealCluster {
    /// Starts HAMi's scheduler as its chart deploys it: `extender` and a
    /// kube-scheduler named `hami-scheduler` that calls it; returns the
    /// extender's endpoints once both run.
    ///
    /// # Errors
    /// When a process cannot be started, or HAMi's scheduler does not
    /// answer `/healthz` in time (its log is in the message).
    pub fn start_hami(&mut self, extender: &Extender) -> io::Result<HamiEndpoints> {
        let kubeconfig = self.kubeconfig("admin", ADMIN_TOKEN)?;
        let endpoints = match extender {
            Extender::Url(url) => HamiEndpoints {
                extender: url.clone(),
                metrics: None,
            },
            Extender::Binary(path) => self.start_hami_binary(path, &kubeconfig)?,
        };
        let config = self.dir.path().join("hami-kube-scheduler.yaml");
        fs::write(&config, scheduler_config(&kubeconfig, &endpoints.extender))?;
        let args = vec![
            "--config".to_owned(),
            config.display().to_string(),
            "--secure-port".to_owned(),
            "0".to_owned(),
            "-v=2".to_owned(),
        ];
        let exe = self.bin.join("kube-scheduler");
        let process = spawn_logged(
            &exe,
            &self.dir.path().join("hami-kube-scheduler.log"),
            &args,
            &[],
        )?;
        self.processes
            .insert(0, ("hami-kube-scheduler".into(), process));
        Ok(endpoints)
    }

    /// Starts the HAMi scheduler binary at `path` on a free loopback port
    /// and waits for its `/healthz`; where it serves.
    fn start_hami_binary(&mut self, path: &Path, kubeconfig: &Path) -> io::Result<HamiEndpoints> {
        let device_config = self.dir.path().join("hami-device-config.yaml");
        fs::write(&device_config, DEVICE_CONFIG)?;
        let (port, metrics) = (free_port()?, free_port()?);
        let args = vec![
            format!("--http_bind=127.0.0.1:{port}"),
            format!("--scheduler-name={SCHEDULER_NAME}"),
            format!("--metrics-bind-address=127.0.0.1:{metrics}"),
            "--node-scheduler-policy=binpack".to_owned(),
            "--gpu-scheduler-policy=spread".to_owned(),
            format!("--device-config-file={}", device_config.display()),
            "--leader-elect=false".to_owned(),
            "-v=4".to_owned(),
        ];
        let log = self.dir.path().join("hami-scheduler.log");
        let env = [("KUBECONFIG", kubeconfig.as_os_str())];
        let process = spawn_logged(path, &log, &args, &env)?;
        self.processes.insert(0, ("hami-scheduler".into(), process));
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let start = Instant::now();
        while !http_get(address, "/healthz").is_ok_and(|(code, _)| code == 200) {
            self.check_running()?;
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.failure("hami-scheduler", "not answering /healthz"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(HamiEndpoints {
            extender: format!("http://{address}"),
            metrics: Some(std::net::SocketAddr::from(([127, 0, 0, 1], metrics))),
        })
    }
}

/// `exe` with `args` and `env`, its output appended to `log`.
fn spawn_logged(
    exe: &Path,
    log: &Path,
    args: &[String],
    env: &[(&str, &std::ffi::OsStr)],
) -> io::Result<Process> {
    let out = File::create(log)?;
    let child = Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(|e| io::Error::other(format!("starting {}: {e}", exe.display())))?;
    Ok(Process(child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_the_charts() {
        let text = scheduler_config(Path::new("/k"), "http://127.0.0.1:9");
        for line in [
            "- schedulerName: hami-scheduler",
            "- urlPrefix: \"http://127.0.0.1:9\"",
            "  filterVerb: filter",
            "  bindVerb: bind",
            "  nodeCacheCapable: true",
            "  - name: amd.com/gpumem\n    ignoredByScheduler: true",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }
}
