use std::process::ExitCode;

fn main() -> ExitCode {
    plugin::main(std::env::args_os())
}
