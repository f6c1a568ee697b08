//! `amd-device-plugin`: the Kubernetes face of the stack.
//!
//! It talks to kubelet (crate `proto`) and to `amd-gpud` over D-Bus (crate
//! `ipc`). The kubelet server, HAMi's annotation protocol and the sandbox are
//! built on top of this skeleton.

use clap::Parser;

/// Command line of `amd-device-plugin`.
#[derive(Debug, Parser)]
#[command(name = "amd-device-plugin", version, about)]
pub struct Cli {
    /// D-Bus name of the privileged daemon to talk to.
    #[arg(long, env = "AMDGPU_DP_GPUD_NAME", default_value = ipc::BUS_NAME)]
    pub gpud_name: String,
}

/// Runs the plugin with parsed arguments.
///
/// # Errors
/// Always, for now: the kubelet server is not built yet, and the binary says
/// so instead of pretending to serve.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    anyhow::bail!(
        "amd-device-plugin cannot serve yet: the kubelet server ({} API) is not built; \
         it would talk to {}",
        proto::DEVICE_PLUGIN_VERSION,
        cli.gpud_name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_pretend_to_serve() {
        let cli = Cli::parse_from(["amd-device-plugin"]);
        let err = run(&cli).unwrap_err().to_string();
        assert!(err.contains("not built"), "{err}");
        assert_eq!(cli.gpud_name, "io.hami.AmdGpu1");
    }
}
