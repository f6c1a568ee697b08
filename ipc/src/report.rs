//! An error and its causes on one line, each cause said once: what both
//! binaries print when they stop on an error.
//!
//! Many errors of ours put their cause in their own message ("cannot bind
//! the plugin socket X: {source}") and also return it from `source()`, so
//! printing the whole chain (anyhow's `{:#}`) said the same cause two to
//! four times. A cause whose text the line already holds is left out; a
//! cause that adds something (an anyhow context's inner error, say) is
//! appended after ": ".

use std::error::Error;

/// `err`, then each cause in turn that the line does not already say.
#[must_use]
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use std::{fmt, io};

    use super::*;

    /// A layer that says `what`, and its cause too when `repeats`.
    #[derive(Debug)]
    struct Layer {
        what: &'static str,
        repeats: bool,
        cause: Box<dyn Error + 'static>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.repeats {
                write!(f, "{}: {}", self.what, self.cause)
            } else {
                f.write_str(self.what)
            }
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(self.cause.as_ref())
        }
    }

    fn layer(what: &'static str, repeats: bool, cause: impl Error + 'static) -> Layer {
        Layer {
            what,
            repeats,
            cause: Box::new(cause),
        }
    }

    fn enoent(what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{what}: No such file or directory (os error 2)"),
        )
    }

    #[test]
    fn a_cause_each_layer_already_says_is_said_once() {
        // The plugin's exit after the kubelet-restart race, as it was printed:
        // "...: removing stale socket X: No such file ... (os error 2)" twice.
        let bind = layer(
            "cannot bind the plugin socket /k/amd.sock",
            true,
            enoent("removing stale socket /k/amd.sock"),
        );
        assert_eq!(
            one_line(&bind),
            "cannot bind the plugin socket /k/amd.sock: removing stale socket \
             /k/amd.sock: No such file or directory (os error 2)"
        );
        let three = layer(
            "the first inventory read failed",
            true,
            layer(
                "reading the inventory",
                true,
                enoent("no KFD topology at /s"),
            ),
        );
        assert_eq!(
            one_line(&three),
            "the first inventory read failed: reading the inventory: no KFD \
             topology at /s: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn causes_a_layer_does_not_say_are_all_kept_in_order() {
        let quiet = layer(
            "starting the bus",
            false,
            layer("connecting", false, enoent("/run/dbus/system_bus_socket")),
        );
        assert_eq!(
            one_line(&quiet),
            "starting the bus: connecting: /run/dbus/system_bus_socket: No such \
             file or directory (os error 2)"
        );
        let mixed = layer(
            "serving",
            false,
            layer("cannot listen on 127.0.0.1:9400", true, enoent("bind")),
        );
        assert_eq!(
            one_line(&mixed),
            "serving: cannot listen on 127.0.0.1:9400: bind: No such file or \
             directory (os error 2)"
        );
    }
}
