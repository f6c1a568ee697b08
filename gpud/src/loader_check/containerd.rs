//! containerd's content store as an [`super::ImageSource`] (to be written).
