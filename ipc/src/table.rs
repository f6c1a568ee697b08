//! How a property table expands. Each D-Bus object interface whose
//! properties are a snapshot (`GpuInfo`, `PartitionInfo`) is declared
//! once, as a table macro (`gpu_properties!`, `partition_properties!`,
//! beside those types): one
//! entry per property, with its doc (served in the introspection), the Rust
//! field and type, the wire type when it differs (`as HashMap<..>`: the
//! field is collected into it and back), the D-Bus name, and `[newer]` for
//! a property an older amd-gpud lacks. Invoked with a mode, a table expands
//! to:
//!
//! - `info`: the struct, `PROPERTY_NAMES`, `to_properties` (the values as
//!   served, for `PropertiesChanged`) and `from_properties` (a `GetAll`
//!   answer decoded, for `proxy::read_gpu` and `read_partition`);
//! - `proxy`: the client proxy trait (`#[zbus::proxy]`);
//! - `serve Object view`: the `#[zbus::interface]` impl of a daemon's
//!   `Object`, each getter serving `self.view.<field>`.

use std::collections::HashMap;

use zbus::zvariant::OwnedValue;

use crate::ApiError;

/// Reads property `name` of type `T` out of a `GetAll` answer.
pub(crate) fn take<T>(props: &mut HashMap<String, OwnedValue>, name: &str) -> Result<T, ApiError>
where
    T: TryFrom<OwnedValue>,
    T::Error: std::fmt::Display,
{
    let value = props
        .remove(name)
        .ok_or_else(|| ApiError::Failed(format!("property {name} is missing")))?;
    T::try_from(value).map_err(|e| ApiError::Failed(format!("property {name}: {e}")))
}

/// As [`take`], for a property an older amd-gpud does not have: absent is
/// the default, mistyped is still an error.
pub(crate) fn take_newer<T>(
    props: &mut HashMap<String, OwnedValue>,
    name: &str,
) -> Result<T, ApiError>
where
    T: TryFrom<OwnedValue> + Default,
    T::Error: std::fmt::Display,
{
    if props.contains_key(name) {
        take(props, name)
    } else {
        Ok(T::default())
    }
}

/// The expansion of a property table (see the module's doc). Not for use
/// but through a table macro.
#[doc(hidden)]
#[macro_export]
macro_rules! __properties {
    // Each entry normalized to `{ [docs] field [type] [wire] [to wire]
    // [from wire] "Name" [flag] }`.
    (@norm $mode:tt $head:tt [$($done:tt)*]
        $(#[doc = $doc:tt])* $field:ident: $ty:ty as $wire:ty = $name:tt $([$flag:ident])?,
        $($rest:tt)*
    ) => {
        $crate::__properties! { @norm $mode $head [$($done)* {
            [$(#[doc = $doc])*] $field [$ty] [$wire]
            [.clone().into_iter().collect::<$wire>()] [.into_iter().collect()]
            $name [$($flag)?]
        }] $($rest)* }
    };
    (@norm $mode:tt $head:tt [$($done:tt)*]
        $(#[doc = $doc:tt])* $field:ident: $ty:ty = $name:tt $([$flag:ident])?,
        $($rest:tt)*
    ) => {
        $crate::__properties! { @norm $mode $head [$($done)* {
            [$(#[doc = $doc])*] $field [$ty] [$ty] [.clone()] [] $name [$($flag)?]
        }] $($rest)* }
    };
    (@norm [$($mode:tt)*] $head:tt [$($done:tt)*]) => {
        $crate::__properties! { @$($mode)* $head $($done)* }
    };

    (@take [] $p:ident $name:tt $wire:ty) => { $crate::table::take::<$wire>(&mut $p, $name)? };
    (@take [newer] $p:ident $name:tt $wire:ty) => {
        $crate::table::take_newer::<$wire>(&mut $p, $name)?
    };

    (@info [$(#[doc = $sdoc:tt])* $info:ident $iface:tt $proxy:ident] $({
        [$(#[doc = $doc:tt])*] $field:ident [$ty:ty] [$wire:ty] [$($to:tt)*] [$($from:tt)*]
        $name:tt [$($flag:ident)?]
    })*) => {
        $(#[doc = $sdoc])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $info {
            $($(#[doc = $doc])* pub $field: $ty,)*
        }

        impl $info {
            /// The D-Bus name of every property, in `GetAll` order.
            pub const PROPERTY_NAMES: &'static [&'static str] = &[$($name),*];

            /// Every property with its wire name and value as served, in
            /// `GetAll` order (the inverse of `from_properties`).
            #[allow(clippy::clone_on_copy)]
            pub fn to_properties(&self) -> Vec<(&'static str, ::zbus::zvariant::Value<'static>)> {
                vec![$(($name, ::zbus::zvariant::Value::from(self.$field $($to)*))),*]
            }

            /// Decodes a `GetAll` answer of the interface.
            ///
            /// # Errors
            /// `ApiError::Failed` naming the property that is missing or
            /// mistyped.
            pub fn from_properties(
                mut p: ::std::collections::HashMap<String, ::zbus::zvariant::OwnedValue>,
            ) -> Result<Self, $crate::ApiError> {
                Ok(Self {
                    $($field: $crate::__properties!(@take [$($flag)?] p $name $wire) $($from)*,)*
                })
            }
        }
    };

    (@proxy [$(#[doc = $sdoc:tt])* $info:ident $iface:tt $proxy:ident] $({
        [$(#[doc = $doc:tt])*] $field:ident [$ty:ty] [$wire:ty] [$($to:tt)*] [$($from:tt)*]
        $name:tt [$($flag:ident)?]
    })*) => {
        #[doc = concat!("A ", stringify!($proxy), " object: `", $iface, "`.")]
        #[::zbus::proxy(interface = $iface, default_service = "io.hami.AmdGpu1")]
        pub trait $proxy {
            $(
                $(#[doc = $doc])*
                #[zbus(property, name = $name)]
                fn $field(&self) -> ::zbus::Result<$wire>;
            )*
        }
    };

    (@serve $object:ident $view:ident [$(#[doc = $sdoc:tt])* $info:ident $iface:tt $proxy:ident] $({
        [$(#[doc = $doc:tt])*] $field:ident [$ty:ty] [$wire:ty] [$($to:tt)*] [$($from:tt)*]
        $name:tt [$($flag:ident)?]
    })*) => {
        #[::zbus::interface(name = $iface)]
        impl $object {
            $(
                $(#[doc = $doc])*
                #[zbus(property, name = $name)]
                #[allow(clippy::clone_on_copy)]
                fn $field(&self) -> $wire {
                    self.$view.$field $($to)*
                }
            )*
        }
    };
}
