//! Parsing a command line the same way in both of the crate's binaries.

use std::{ffi::OsString, process::ExitCode};

/// `args` parsed as a `T`, or the exit code after clap printed why not:
/// 0 for `--help` and `--version` (not errors; clap knows which is which),
/// 2 for a bad command line.
pub(crate) fn parse<T: clap::Parser>(
    args: impl IntoIterator<Item = OsString>,
) -> Result<T, ExitCode> {
    T::try_parse_from(args).map_err(|err| {
        let _ = err.print();
        if err.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    })
}
