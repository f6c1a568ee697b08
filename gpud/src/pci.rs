//! PCI addresses as KFD and sysfs spell them.

use std::{fmt, str::FromStr};

use serde::{Serialize, Serializer};

/// A PCI function address `dddd:bb:dd.f`. Orders as the bus does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a PCI address (expected dddd:bb:dd.f)")]
pub struct PciAddressError {
    pub text: String,
}

impl PciAddress {
    /// From KFD's `domain` and `location_id` (`bus << 8 | device << 3 | function`).
    /// Returns `None` when `location_id` has bits above the 16 a bus/devfn pair holds.
    pub fn from_kfd(domain: u64, location_id: u64) -> Option<Self> {
        let domain = u32::try_from(domain).ok()?;
        let location = u16::try_from(location_id).ok()?;
        let [bus, devfn] = location.to_be_bytes();
        Some(Self {
            domain,
            bus,
            device: devfn >> 3,
            function: devfn & 0x7,
        })
    }

    /// The same address with function 0: the physical device a partition belongs to.
    pub fn with_function(self, function: u8) -> Self {
        Self { function, ..self }
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || PciAddressError {
            text: text.to_owned(),
        };
        let (domain, rest) = text.split_once(':').ok_or_else(err)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(err)?;
        let (device, function) = rest.split_once('.').ok_or_else(err)?;
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| err());
        let narrow = |v: u32, max: u32| {
            if v > max {
                Err(err())
            } else {
                u8::try_from(v).map_err(|_| err())
            }
        };
        if domain.is_empty() || bus.len() != 2 || device.len() != 2 || function.len() != 1 {
            return Err(err());
        }
        Ok(Self {
            domain: hex(domain)?,
            bus: narrow(hex(bus)?, 0xff)?,
            device: narrow(hex(device)?, 0x1f)?,
            function: narrow(hex(function)?, 0x7)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_id_carries_bus_device_and_function() {
        let a = PciAddress::from_kfd(0, 1283).unwrap();
        assert_eq!(a.to_string(), "0000:05:00.3");
        assert_eq!(a.with_function(0).to_string(), "0000:05:00.0");
        let b = PciAddress::from_kfd(1, 0x19 << 8 | 2 << 3).unwrap();
        assert_eq!(b.to_string(), "0001:19:02.0");
        assert!(PciAddress::from_kfd(0, 70_000).is_none());
    }

    #[test]
    fn parses_what_it_prints_and_rejects_the_rest() {
        let a: PciAddress = "0000:c1:1f.7".parse().unwrap();
        assert_eq!(a.to_string(), "0000:c1:1f.7");
        for bad in [
            "",
            "0000:05:00",
            "0000:5:00.0",
            "0000:05:20.0",
            "0000:05:00.8",
            "zz:05:00.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }

    #[test]
    fn orders_by_domain_then_bus() {
        let mut v: Vec<PciAddress> = ["0001:01:00.0", "0000:85:00.0", "0000:05:00.0"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        v.sort();
        let s: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["0000:05:00.0", "0000:85:00.0", "0001:01:00.0"]);
    }
}
