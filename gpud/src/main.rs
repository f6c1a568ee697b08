use std::process::ExitCode;

fn main() -> ExitCode {
    gpud::main(std::env::args_os())
}
