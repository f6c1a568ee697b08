//! The seven `KFD_*_CHECK` options of CRIU's amdgpu plugin, read the way the
//! plugin reads its environment at restore.
//!
//! Every option defaults to on. Exactly `0` or `NO` in any case turns one off;
//! exactly `1` or `YES` in any case turns it on; any other value (`false`,
//! `off`, the empty string, ` 0`) is ignored by CRIU with a log line and the
//! option stays on. An unknown variable name is not something CRIU would see
//! as an option at all, so it is refused here as a likely typo.

use std::fmt;

use serde::{Serialize, Serializer, ser::SerializeMap};

/// One of the options that relax a restore check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// `fw_version`: checkpoint ≤ local.
    FwVersion,
    /// `sdma_fw_version`: checkpoint ≤ local.
    SdmaFwVersion,
    /// `caches_count`: checkpoint ≤ local.
    CachesCount,
    /// `num_gws`: checkpoint ≤ local.
    NumGws,
    /// VRAM size: checkpoint ≤ local.
    VramSize,
    /// `capability`: equal, all 32 bits.
    Capability,
    /// GPUs that shared a CPU (NUMA node) must share one after the restore,
    /// and GPUs on different CPUs must land on different CPUs.
    Numa,
}

impl Check {
    /// Every option.
    pub const ALL: [Check; 7] = [
        Self::FwVersion,
        Self::SdmaFwVersion,
        Self::CachesCount,
        Self::NumGws,
        Self::VramSize,
        Self::Capability,
        Self::Numa,
    ];

    /// The environment variable CRIU reads.
    pub fn env_name(self) -> &'static str {
        match self {
            Self::FwVersion => "KFD_FW_VER_CHECK",
            Self::SdmaFwVersion => "KFD_SDMA_FW_VER_CHECK",
            Self::CachesCount => "KFD_CACHES_COUNT_CHECK",
            Self::NumGws => "KFD_NUM_GWS_CHECK",
            Self::VramSize => "KFD_VRAM_SIZE_CHECK",
            Self::Capability => "KFD_CAPABILITY_CHECK",
            Self::Numa => "KFD_NUMA_CHECK",
        }
    }

    /// The option named `name`, exactly as CRIU spells it.
    pub fn from_env_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.env_name() == name)
    }

    fn index(self) -> usize {
        match self {
            Self::FwVersion => 0,
            Self::SdmaFwVersion => 1,
            Self::CachesCount => 2,
            Self::NumGws => 3,
            Self::VramSize => 4,
            Self::Capability => 5,
            Self::Numa => 6,
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.env_name())
    }
}

/// Variables CRIU's plugin reads that change nothing about the checks.
const OTHER_PLUGIN_VARIABLES: &[&str] = &["KFD_MAX_BUFFER_SIZE"];

/// A `NAME=VALUE` the options could not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("{text:?} is not NAME=VALUE")]
    NotAnAssignment { text: String },
    #[error("{name:?} is not an option of CRIU's amdgpu plugin (known: {known})")]
    UnknownName { name: String, known: String },
}

/// What the seven options are set to, and what happened to each value given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    enabled: [bool; 7],
    /// Values CRIU would ignore or that change nothing, each explained.
    pub notes: Vec<String>,
}

impl Default for Options {
    /// Every check on, as at a restore with none of the variables set.
    fn default() -> Self {
        Self {
            enabled: [true; 7],
            notes: Vec::new(),
        }
    }
}

/// How CRIU reads one boolean variable: `Some` when it takes the value.
fn criu_bool(value: &str) -> Option<bool> {
    if value == "0" || value.eq_ignore_ascii_case("no") {
        Some(false)
    } else if value == "1" || value.eq_ignore_ascii_case("yes") {
        Some(true)
    } else {
        None
    }
}

impl Options {
    /// Whether `check` is enforced.
    pub fn is_on(&self, check: Check) -> bool {
        self.enabled[check.index()]
    }

    /// Sets `check` directly (tests, callers that parsed already).
    #[must_use]
    pub fn with(mut self, check: Check, on: bool) -> Self {
        self.enabled[check.index()] = on;
        self
    }

    /// Applies one variable as CRIU would. A later value for the same name
    /// replaces an earlier one, as in an environment.
    ///
    /// # Errors
    /// [`OptionsError::UnknownName`] for a name CRIU's plugin does not read.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), OptionsError> {
        let Some(check) = Check::from_env_name(name) else {
            if OTHER_PLUGIN_VARIABLES.contains(&name) {
                self.notes
                    .push(format!("{name} does not affect the restore checks"));
                return Ok(());
            }
            let known: Vec<&str> = Check::ALL.iter().map(|c| c.env_name()).collect();
            return Err(OptionsError::UnknownName {
                name: name.to_owned(),
                known: known.join(", "),
            });
        };
        match criu_bool(value) {
            Some(on) => self.enabled[check.index()] = on,
            None => {
                self.enabled[check.index()] = true;
                self.notes.push(format!(
                    "{name}={value:?} is ignored by CRIU (it expects 0/1/YES/NO); the check stays on"
                ));
            }
        }
        Ok(())
    }

    /// Options from `NAME=VALUE` strings, in order.
    ///
    /// # Errors
    /// A string without `=`, or an unknown name.
    #[cfg(test)]
    pub fn from_assignments<S: AsRef<str>>(items: &[S]) -> Result<Self, OptionsError> {
        let mut options = Self::default();
        options.apply(items)?;
        Ok(options)
    }

    fn apply<S: AsRef<str>>(&mut self, items: &[S]) -> Result<(), OptionsError> {
        for item in items {
            let text = item.as_ref();
            let (name, value) =
                text.split_once('=')
                    .ok_or_else(|| OptionsError::NotAnAssignment {
                        text: text.to_owned(),
                    })?;
            self.set(name, value)?;
        }
        Ok(())
    }

    /// Options as CRIU would take them from `environment` (the variables of
    /// its own environment it reads: every `KFD_*_CHECK`, other names
    /// ignored, as CRIU ignores them), then `assignments` (`--env`), which
    /// win over the environment.
    ///
    /// # Errors
    /// As [`Options::from_assignments`], for the assignments.
    pub fn from_environment_then<S: AsRef<str>>(
        environment: impl IntoIterator<Item = (String, String)>,
        assignments: &[S],
    ) -> Result<Self, OptionsError> {
        let mut options = Self::default();
        for (name, value) in environment {
            if Check::from_env_name(&name).is_some() {
                options.set(&name, &value)?;
            }
        }
        options.apply(assignments)?;
        Ok(options)
    }

    /// Options from `(name, value)` pairs, in order.
    ///
    /// # Errors
    /// An unknown name.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, OptionsError> {
        let mut options = Self::default();
        for (name, value) in pairs {
            options.set(name, value)?;
        }
        Ok(options)
    }
}

impl Serialize for Options {
    /// `{"KFD_FW_VER_CHECK": true, ...}`: the effective value of each option.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(Check::ALL.len()))?;
        for check in Check::ALL {
            map.serialize_entry(check.env_name(), &self.is_on(check))?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_counts_as_for_criu_and_env_flags_win() {
        let env = [
            ("KFD_FW_VER_CHECK".to_owned(), "0".to_owned()),
            ("KFD_NUMA_CHECK".to_owned(), "0".to_owned()),
            ("KFD_SOMETHING_ELSE".to_owned(), "x".to_owned()),
            ("PATH".to_owned(), "/usr/bin".to_owned()),
        ];
        let o = Options::from_environment_then(env, &["KFD_NUMA_CHECK=1"]).unwrap();
        assert!(!o.is_on(Check::FwVersion), "from the environment");
        assert!(o.is_on(Check::Numa), "--env wins");
        assert!(o.notes.is_empty(), "{:?}", o.notes);
        let none: [(String, String); 0] = [];
        assert!(Options::from_environment_then(none, &["KFD_X"]).is_err());
    }

    #[test]
    fn every_option_defaults_to_on() {
        let o = Options::default();
        assert!(Check::ALL.iter().all(|c| o.is_on(*c)));
        let names: Vec<&str> = Check::ALL.iter().map(|c| c.env_name()).collect();
        assert_eq!(names.len(), 7);
        for c in Check::ALL {
            assert_eq!(Check::from_env_name(c.env_name()), Some(c));
        }
    }

    #[test]
    fn zero_and_no_in_any_case_turn_a_check_off() {
        for value in ["0", "NO", "no", "No", "nO"] {
            let o = Options::from_assignments(&[format!("KFD_FW_VER_CHECK={value}")]).unwrap();
            assert!(!o.is_on(Check::FwVersion), "{value}");
            assert!(o.notes.is_empty());
            assert!(o.is_on(Check::SdmaFwVersion));
        }
    }

    #[test]
    fn one_and_yes_turn_it_back_on_and_the_last_value_wins() {
        let o = Options::from_assignments(&["KFD_NUMA_CHECK=0", "KFD_NUMA_CHECK=yes"]).unwrap();
        assert!(o.is_on(Check::Numa));
        let o = Options::from_assignments(&["KFD_NUMA_CHECK=1", "KFD_NUMA_CHECK=NO"]).unwrap();
        assert!(!o.is_on(Check::Numa));
    }

    #[test]
    fn values_criu_ignores_keep_the_check_on_with_a_note() {
        for value in ["false", "off", "", " 0", "0 ", "00", "n", "disable", "No!"] {
            let o = Options::from_assignments(&[format!("KFD_CAPABILITY_CHECK={value}")]).unwrap();
            assert!(o.is_on(Check::Capability), "{value:?}");
            assert_eq!(o.notes.len(), 1, "{value:?}");
            assert!(o.notes[0].contains("ignored by CRIU"), "{}", o.notes[0]);
        }
        // An ignored value after a valid one resets to the default, like CRIU's
        // fresh start at each restore.
        let o = Options::from_pairs([("KFD_CAPABILITY_CHECK", "0"), ("KFD_CAPABILITY_CHECK", "x")])
            .unwrap();
        assert!(o.is_on(Check::Capability));
    }

    #[test]
    fn unknown_names_and_malformed_assignments_are_errors() {
        let err = Options::from_assignments(&["KFD_FW_VERSION_CHECK=0"]).unwrap_err();
        assert!(
            matches!(&err, OptionsError::UnknownName { name, .. } if name == "KFD_FW_VERSION_CHECK")
        );
        assert!(err.to_string().contains("KFD_FW_VER_CHECK"), "{err}");
        let err = Options::from_assignments(&["KFD_FW_VER_CHECK"]).unwrap_err();
        assert!(matches!(err, OptionsError::NotAnAssignment { .. }));
        // Names are case-sensitive, like getenv().
        assert!(Options::from_assignments(&["kfd_fw_ver_check=0"]).is_err());
    }

    #[test]
    fn the_buffer_size_variable_is_accepted_and_noted() {
        let o = Options::from_assignments(&["KFD_MAX_BUFFER_SIZE=1G"]).unwrap();
        assert_eq!(
            o,
            Options {
                notes: vec!["KFD_MAX_BUFFER_SIZE does not affect the restore checks".into()],
                ..Options::default()
            }
        );
    }

    #[test]
    fn serialises_the_effective_values() {
        let o = Options::default().with(Check::VramSize, false);
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["KFD_VRAM_SIZE_CHECK"], false);
        assert_eq!(json["KFD_NUMA_CHECK"], true);
        assert_eq!(json.as_object().unwrap().len(), 7);
    }
}
