//! The image analysis (to be written): manifest, config, layers, ELF.
