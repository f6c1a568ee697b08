use std::process::ExitCode;

fn main() -> ExitCode {
    gpud::loader_check_main(std::env::args_os())
}
