use std::process::ExitCode;

fn main() -> ExitCode {
    gpud::cli::main(std::env::args_os())
}
