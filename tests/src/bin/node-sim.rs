//! `node-sim`: the node side of AMD GPU sharing on a fake node. It starts a
//! private D-Bus, amd-gpud (with the fake AMD SMI), the plugin, a fake
//! kubelet and a fake API server, places the example pods as HAMi would,
//! admits them as kubelet would, and prints what HAMi sees and what each
//! container gets. See `node-sim --help` and `examples/README.md`.
//!
//! `node-sim gpud ...` runs amd-gpud's command line and `node-sim plugin ...`
//! the plugin's: that is how the simulator starts them (and how amd-gpud's
//! AMD SMI probe, `node-sim amdsmi-probe ...`, re-enters it).
//!
//! Exit status: 0 when every pod HAMi placed was admitted and its containers
//! started (pods that do not fit are part of the report), 2 when one failed
//! admission or a container's PreStartContainer failed, 3 when two containers
//! that run together were given the same CUs, 1 on an error, 130 when
//! interrupted.

use std::{ffi::OsString, io::Write, process::ExitCode};

use anyhow::Context;
use clap::Parser;
use tests::node_sim::{Options, Run, render};

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    match argv.get(1).and_then(|a| a.to_str()) {
        Some("gpud") => {
            argv.remove(1);
            return gpud::main(argv);
        }
        Some("plugin") => {
            argv.remove(1);
            return plugin::main(argv);
        }
        Some(gpud::testing::amdsmi::PROBE_SUBCOMMAND) => return gpud::main(argv),
        _ => {}
    }
    match run(&Options::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("node-sim: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(options: &Options) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("locating node-sim itself")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let sim = tokio::select! {
            sim = Run::start(options, exe) => sim?,
            why = stop_signal() => {
                eprintln!("node-sim: {why}; stopping everything it started");
                return Ok(ExitCode::from(130));
            }
        };
        print(options, &sim)?;
        if options.keep_running {
            keep_running(options, &sim)?;
            let why = tokio::select! {
                why = stop_signal() => why,
                () = sim.follow_new_pods() => "stopped following pods",
            };
            eprintln!("node-sim: {why}; stopping everything it started");
        }
        let started = sim
            .report()
            .pods
            .iter()
            .all(|p| !p.scheduled || p.started());
        let overlaps = sim.report().overlaps.clone();
        drop(sim);
        for overlap in &overlaps {
            eprintln!("node-sim: CU OVERLAP: {overlap}");
        }
        Ok(if !overlaps.is_empty() {
            ExitCode::from(3)
        } else if started {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        })
    })
}

fn print(options: &Options, sim: &Run) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if options.json {
        serde_json::to_writer_pretty(&mut out, sim.report()).context("writing the report")?;
        writeln!(out)?;
    } else {
        render::write_text(sim.report(), &mut out).context("writing the report")?;
    }
    out.flush()?;
    Ok(())
}

/// How to look at what keeps running (on stderr with `--json`).
fn keep_running(options: &Options, sim: &Run) -> anyhow::Result<()> {
    let text = sim.how_to_look();
    if options.json {
        eprint!("{text}");
    } else {
        print!("{text}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

/// The first of Ctrl-C and SIGTERM.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "interrupted",
            _ = term.recv() => "terminated",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "interrupted"
        }
    }
}
