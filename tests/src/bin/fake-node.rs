//! `fake-node`: build a fake AMD GPU node (sysfs, dev, and a fake AMD SMI
//! fixture) and show what `amd-gpud inspect` makes of it.
//!
//! `fake-node mi300x-8-cpx` builds the node in a temporary directory and runs
//! the inspection in-process; `--out DIR` keeps the tree. `fake-node gpud ...`
//! runs amd-gpud's own command line (it is how the AMD SMI probe child
//! re-enters this binary), `fake-node plugin ...` amd-device-plugin's.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context, bail};
use clap::Parser;
use tests::fixture::{self, BuildOptions};

/// Build a fake AMD GPU node and inspect it with amd-gpud.
#[derive(Debug, Parser)]
#[command(name = "fake-node")]
struct Args {
    /// Which node to build (see --list).
    #[arg(default_value = "mi300x-8-cpx")]
    node: String,
    /// Keep the tree in DIR instead of a temporary directory.
    #[arg(long, env = "FAKE_NODE_OUT")]
    out: Option<PathBuf>,
    /// AMD SMI ABI the fake library mimics (6.2, 6.3, 6.4, 7.0, 7.13), or `none`.
    #[arg(long, default_value = "7.0")]
    amdsmi: String,
    /// Write only the KFD topology (no DRM, PCI or /dev entries).
    #[arg(long)]
    kfd_only: bool,
    /// Print the inventory as JSON.
    #[arg(long)]
    json: bool,
    /// List the nodes that can be built.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "gpud") {
        argv.remove(1);
        // The loader check's helper of `serve` is this executable (below),
        // unless the test names another.
        let named = std::env::var_os("GPUD_LOADER_CHECK_HELPER").is_some()
            || argv
                .iter()
                .any(|a| a.to_string_lossy().starts_with("--loader-check-helper"));
        if !named
            && argv.iter().any(|a| a == "serve")
            && let Ok(me) = std::env::current_exe()
        {
            argv.push("--loader-check-helper".into());
            argv.push(me.into_os_string());
        }
        return gpud::main(argv);
    }
    if argv.get(1).is_some_and(|a| a == "plugin") {
        argv.remove(1);
        return plugin::main(argv);
    }
    // `gpud serve` with AMD SMI re-enters its own executable to probe the
    // library in a child process.
    if argv
        .get(1)
        .is_some_and(|a| a == gpud::testing::amdsmi::PROBE_SUBCOMMAND)
    {
        return gpud::main(argv);
    }
    // Its loader check runs the helper binary, `amd-gpud-loader-check`,
    // whose two commands this executable stands in for (the helper re-enters
    // itself for the second).
    if argv.get(1).is_some_and(|a| {
        a == gpud::testing::loader_check::FETCH_SUBCOMMAND
            || a == gpud::testing::loader_check::INSPECT_SUBCOMMAND
    }) {
        return gpud::loader_check_main(argv);
    }
    match run(Args::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fake-node: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.list {
        for name in fixture::names() {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(spec) = fixture::named(&args.node) else {
        bail!(
            "unknown node {:?}; known: {}",
            args.node,
            fixture::names().join(", ")
        );
    };
    let temp;
    let root = if let Some(out) = &args.out {
        out.clone()
    } else {
        temp = fixture::scratch_dir().context("creating a temporary directory")?;
        temp.path().to_path_buf()
    };
    let with_amdsmi = args.amdsmi != "none";
    let options = BuildOptions {
        drm: !args.kfd_only,
        amdsmi_abi: with_amdsmi.then(|| args.amdsmi.clone()),
    };
    let node = fixture::build(&spec, &root, &options)
        .with_context(|| format!("building {} under {}", args.node, root.display()))?;
    eprintln!(
        "fake node {} built under {}",
        args.node,
        node.root.display()
    );
    inspect(&node, with_amdsmi, args.json)
}

fn inspect(node: &fixture::FakeNode, with_amdsmi: bool, json: bool) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("locating fake-node itself")?;
    let mut argv: Vec<OsString> = vec!["amd-gpud".into(), "inspect".into(), "--host-root".into()];
    argv.push(node.root.clone().into_os_string());
    argv.push("--amdsmi".into());
    let mut child_env = Vec::new();
    match (&node.amdsmi_fixture, with_amdsmi) {
        (Some(fixture), true) => {
            let abi = tests::fake_amdsmi::fixture_abi(fixture).unwrap_or_default();
            argv.push(tests::fake_amdsmi::library_for(&abi).as_os_str().to_owned());
            child_env.push((
                "FAKE_AMDSMI_FIXTURE".into(),
                fixture.clone().into_os_string(),
            ));
        }
        _ => argv.push("none".into()),
    }
    if json {
        argv.push("--json".into());
    }
    let cli = <gpud::testing::cli::Cli as Parser>::try_parse_from(argv)?;
    let gpud::testing::cli::Command::Inspect(inspect) = cli.command else {
        bail!("internal: inspect arguments did not parse as inspect");
    };
    let mut config = inspect
        .host
        .amdsmi_config(vec![exe.into_os_string(), "gpud".into()]);
    config.child_env = child_env;
    let inventory = gpud::testing::cli::inventory_with(&inspect.host.host_paths(), &config)?;
    let mut out = std::io::stdout().lock();
    if inspect.json {
        gpud::testing::inspect::write_json(&inventory, &mut out)?;
    } else {
        gpud::testing::inspect::write_table(&inventory, &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}
