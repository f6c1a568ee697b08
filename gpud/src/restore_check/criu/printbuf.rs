//! Where CRIU's names of hives and search lists land when they outgrow
//! their 200-byte static buffers, in the amdgpu plugin as its Makefile
//! builds it on x86-64 (checkpoint-restore/criu:plugins/amdgpu/Makefile:
//! `-g` and no `-O`, the sources linked in the order `amdgpu_plugin.c`,
//! `amdgpu_plugin_drm.c`, `amdgpu_plugin_dmabuf.c`,
//! `amdgpu_plugin_topology.c`, `amdgpu_plugin_util.c`, ...).
//!
//! `sprintf` writes on past the buffer, and the names are printed whatever
//! the log level (`pr_debug` is a call; its arguments are evaluated). GCC
//! 12 at `-O0` aligns both buffers to 32 and puts them in `.bss` in source
//! order, and `amdgpu_plugin_util.c`'s four globals next, in source order
//! (checked by compiling the two files). Offsets from the start of
//! `amdgpu_plugin_topology.c`'s `.bss`:
//!
//! | bytes | what |
//! | --- | --- |
//! | 0-199 | `p2pgroup_to_str`'s buffer (hive names) |
//! | 200-223 | padding |
//! | 224-423 | `mapping_list_to_str`'s buffer (search lists) |
//! | 424-447 | padding |
//! | 448-495 | `src_topology` (`parsed`, `num_nodes`, `nodes`, `xgmi_groups`) |
//! | 512-559 | `dest_topology` |
//! | 576-623 | `checkpoint_maps` |
//! | 640-687 | `restore_maps` (`cpu_maps`, `gpu_maps`, two tails) |
//!
//! Each buffer is written from its start before it is read, so text in the
//! other buffer or the padding changes nothing; nor does text in
//! `src_topology.parsed` and `num_nodes` (bytes 448-455), which the restore
//! never reads after `devinfo_to_topology`. Past byte 455 the text replaces
//! list heads: a pointer all of whose 8 bytes are text is not canonical,
//! and the next walk of that list faults. A pointer partly replaced points
//! somewhere unknown: CRIU's outcome then cannot be told.

/// Where `p2pgroup_to_str`'s buffer starts.
pub(crate) const HIVE_BUFFER: usize = 0;
/// Where `mapping_list_to_str`'s buffer starts.
pub(crate) const LIST_BUFFER: usize = 224;
/// Writes ending at or before this change nothing the restore reads.
pub(crate) const HARMLESS_END: usize = 456;
/// `src_topology.nodes.next` is all text (walked at topology.c:1392 and
/// :1426).
pub(crate) const SRC_NODES_LOST: usize = 464;
/// `src_topology.xgmi_groups.next` is all text (walked by the recursive
/// `match_xgmi_groups`, topology.c:1281, :1292).
pub(crate) const SRC_GROUPS_LOST: usize = 488;
/// `dest_topology.nodes.next` is all text (walked by the local side's
/// `topology_determine_iolinks`, topology.c:845).
pub(crate) const DST_NODES_LOST: usize = 528;
/// `restore_maps.cpu_maps.next` is all text (walked by `map_device` under
/// the NUMA check and by `maps_push` when there are CPU pairs).
pub(crate) const CPU_MAPS_LOST: usize = 648;
/// `restore_maps.gpu_maps.next` is all text (walked by every `maps_push`).
pub(crate) const GPU_MAPS_LOST: usize = 664;

/// Bytes `"0x%04X "` prints for `gpu_id`.
pub(crate) fn printed_id_len(gpu_id: u32) -> usize {
    let digits = (32 - gpu_id.leading_zeros()).div_ceil(4).max(4);
    usize::try_from(digits).unwrap_or(8) + 3
}

/// What `p2pgroup_to_str` writes for a hive of `gpu_ids`, its NUL
/// included: `"type:XGMI:"` and each member.
pub(crate) fn hive_name_len(gpu_ids: impl Iterator<Item = u32>) -> usize {
    "type:XGMI:".len() + gpu_ids.map(printed_id_len).sum::<usize>() + 1
}

/// The size of both buffers.
pub(crate) const PRINT_BUFFER: usize = 200;

/// What the bytes up to `end` overwrite, for a note.
pub(crate) fn landing(end: usize) -> &'static str {
    match end {
        0..=LIST_BUFFER => "in padding",
        225..=448 => {
            "in padding and the other name buffer, which is written afresh before each use"
        }
        449..=HARMLESS_END => {
            "in padding, the other name buffer and src_topology's parsed flag and node count, \
             which the restore no longer reads"
        }
        _ => "over the list heads of the plugin's topologies and GPU maps",
    }
}

/// A name `bytes` long written at `at` overflows; its note.
pub(crate) fn note(what: &str, bytes: usize, at: usize) -> Option<String> {
    if bytes <= PRINT_BUFFER {
        return None;
    }
    let end = at + bytes;
    let effect = if end <= HARMLESS_END {
        "this changes nothing the restore reads, so CRIU goes on as if the buffer were larger"
            .to_owned()
    } else {
        format!(
            "what CRIU does next depends on pointers it partly overwrote: the outcome below \
             assumes they still hold, and may not be CRIU's (end at byte {end})"
        )
    };
    Some(format!(
        "{what} takes {bytes} bytes and CRIU writes it into a 200-byte static buffer: the \
         {} bytes past it land {} ({effect}); x86-64, the plugin built as its Makefile builds it",
        bytes - PRINT_BUFFER,
        landing(end)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_7_bytes_a_member_and_the_buffer_overflows_from_28() {
        // "type:XGMI:" (10) + 7 per 16-bit id + NUL: 27 fit in 200 bytes.
        assert_eq!(hive_name_len((0..27).map(|i| 0x1000 + i)), 200);
        assert_eq!(hive_name_len((0..28).map(|i| 0x1000 + i)), 207);
        assert_eq!(printed_id_len(0x12), 7, "%04X pads to four digits");
        assert_eq!(printed_id_len(0), 7, "a CPU member prints 0x0000");
        assert_eq!(printed_id_len(0x1_2345), 8);
    }

    #[test]
    fn thirty_two_members_overflow_harmlessly_and_sixty_three_do_not() {
        // A hive of 32: 235 bytes from 0; its search list: 225 from 224,
        // the NUL on src_topology.parsed (byte 448).
        assert_eq!(hive_name_len((0..32).map(|i| 0x1000 + i)), 235);
        const { assert!(LIST_BUFFER + 1 + 32 * 7 <= HARMLESS_END) };
        let n = note("x", 225, LIST_BUFFER).unwrap();
        assert!(n.contains("changes nothing"), "{n}");
        // 63: the list (442 bytes) covers restore_maps' heads.
        const { assert!(LIST_BUFFER + 1 + 63 * 7 >= GPU_MAPS_LOST) };
        assert!(note("x", 200, 0).is_none());
    }
}
