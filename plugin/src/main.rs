use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match plugin::run(plugin::Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("amd-device-plugin: {err:#}");
            ExitCode::FAILURE
        }
    }
}
