//! The replay itself: CRIU's recursion with every local of every frame
//! kept in [`State`], so that a state can be compared with an earlier one.

use super::{
    CRIU_STEP_LIMIT, CrashCause, Lost, Run, Stop,
    device::{self, DeviceCrash, Maps, Members, NewMaps},
    list::{Crash, Cursor, Links, POISON},
    printbuf,
};
use crate::restore_check::pairing::Pairing;

/// How a replay ends early.
#[derive(Debug)]
pub(super) enum End {
    Crash(CrashCause),
    Loop,
    TooLarge,
}

impl From<Crash> for End {
    fn from(_: Crash) -> Self {
        Self::Crash(CrashCause::Poisoned)
    }
}

/// One frame of CRIU's recursion, with everything its locals hold.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Frame {
    /// `match_xgmi_groups` matching checkpoint hive `src`.
    Group { src: usize, walk: Cursor },
    /// `map_devices` matching checkpoint GPU `src`; `pushed` while a pair is
    /// in the maps.
    Devices {
        src: usize,
        walk: Cursor,
        pushed: Option<NewMaps>,
    },
}

/// Everything the rest of the replay depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    stack: Vec<Frame>,
    src_nodes: Links,
    dst_nodes: Links,
    src_groups: Links,
    dst_groups: Links,
    maps: Maps,
    /// How far past `p2pgroup_to_str`'s buffer start names have written
    /// (see [`printbuf`]).
    written: usize,
}

pub(super) struct Replay<'p, 'a> {
    pairing: &'p Pairing<'a>,
    members: &'p Members,
    /// Each side's XGMI groups as lists of members.
    groups: [&'p [Vec<usize>]; 2],
    st: State,
    /// The longest list name printed: (members, bytes).
    pub(super) longest_list: (usize, usize),
    /// Brent's saved state, and the steps since it was saved.
    saved: Option<State>,
    power: u64,
    since: u64,
    steps: u64,
    failed_hive: Option<usize>,
}

impl<'p, 'a> Replay<'p, 'a> {
    pub(super) fn new(
        pairing: &'p Pairing<'a>,
        members: &'p Members,
        groups: [&'p [Vec<usize>]; 2],
        written: usize,
    ) -> Self {
        Self {
            pairing,
            members,
            groups,
            longest_list: (0, 0),
            st: State {
                stack: Vec::new(),
                src_nodes: Links::new(members.src.len()),
                dst_nodes: Links::new(members.dst.len()),
                src_groups: Links::new(groups[0].len()),
                dst_groups: Links::new(groups[1].len()),
                maps: Maps {
                    src_cpus_from: pairing.src_len(),
                    dst_cpus_from: pairing.dst_len(),
                    ..Maps::default()
                },
                written,
            },
            saved: None,
            power: 1,
            since: 0,
            steps: 0,
            failed_hive: None,
        }
    }

    /// One step; a state seen before means CRIU never returns.
    fn tick(&mut self) -> Result<(), End> {
        self.steps += 1;
        if self.steps > CRIU_STEP_LIMIT {
            return Err(End::TooLarge);
        }
        if self.saved.as_ref() == Some(&self.st) {
            return Err(End::Loop);
        }
        self.since += 1;
        if self.since >= self.power {
            self.saved = Some(self.st.clone());
            self.power = self.power.saturating_mul(2);
            self.since = 0;
        }
        Ok(())
    }

    pub(super) fn steps(&self) -> u64 {
        self.steps
    }

    pub(super) fn phases(&mut self) -> Result<Run, End> {
        let [src_hives, dst_hives] = self.groups;
        if !src_hives.is_empty() {
            // Groups are listed in the order they were found (sys_add_group
            // appends).
            for g in 0..src_hives.len() {
                self.st.src_groups.add_tail(g)?;
            }
            for g in 0..dst_hives.len() {
                self.st.dst_groups.add_tail(g)?;
            }
            if !self.match_groups()? {
                let (n, m) = (self.pairing.src_len(), self.pairing.dst_len());
                let cpus = src_hives.iter().flatten().any(|&s| s >= n)
                    || dst_hives.iter().flatten().any(|&d| d >= m);
                return Ok(Run::Refused(Stop::Hives {
                    hive: self.failed_hive.unwrap_or(0),
                    stuck: !self.st.maps.gpus.is_empty(),
                    cpus,
                }));
            }
        }
        // topology.c:1426: the walk of src_sys->nodes.
        self.lost(printbuf::SRC_NODES_LOST, Lost::SrcNodes)?;
        // topology.c:1428, :1433: the GPUs left, each list built by
        // prepending in walking order.
        self.st.src_nodes.init();
        for s in 0..self.pairing.src_len() {
            if !self.st.maps.has_src(s) {
                self.st.src_nodes.add(s)?;
            }
        }
        self.st.dst_nodes.init();
        for d in 0..self.pairing.dst_len() {
            if !self.st.maps.has_dst(d) {
                self.st.dst_nodes.add(d)?;
            }
        }
        if !self.map_devices()? {
            return Ok(Run::Refused(Stop::Remaining));
        }
        let maps = &self.st.maps;
        if let Some(slot) = (0..self.pairing.src_len()).find(|&s| !maps.has_src(s)) {
            return Ok(Run::Refused(Stop::Unmapped { slot }));
        }
        let n = self.pairing.src_len();
        let mut pairs: Vec<(usize, usize)> =
            maps.gpus.iter().copied().filter(|&(s, _)| s < n).collect();
        pairs.sort_unstable();
        Ok(Run::Restorable(pairs))
    }

    /// `match_xgmi_groups`.
    fn match_groups(&mut self) -> Result<bool, End> {
        // topology.c:1281: list_empty(&src_sys->xgmi_groups).
        self.lost(printbuf::SRC_GROUPS_LOST, Lost::SrcGroups)?;
        if self.st.src_groups.is_empty() {
            return Ok(true);
        }
        let g = self.st.src_groups.first();
        self.st.src_groups.del(g)?;
        let walk = Cursor::start(&self.st.dst_groups)?;
        self.st.stack.push(Frame::Group { src: g, walk });
        let found = self.walk_groups(g)?;
        self.st.stack.pop();
        if !found {
            self.failed_hive.get_or_insert(g);
            self.st.src_groups.add_tail(g)?;
        }
        Ok(found)
    }

    fn walk_groups(&mut self, g: usize) -> Result<bool, End> {
        loop {
            let Some(j) = self.walk().current(&self.st.dst_groups) else {
                return Ok(false);
            };
            // The size check compares num_nodes, which nothing ever sets:
            // it never skips a hive.
            self.tick()?;
            self.fill(g, j)?;
            if self.map_devices()? {
                self.st.dst_groups.del(j)?;
                if self.match_groups()? {
                    return Ok(true);
                }
                self.st.dst_groups.add(j)?;
            }
            self.advance(true)?;
        }
    }

    /// The member lists of one hive try, front to back.
    fn fill(&mut self, g: usize, j: usize) -> Result<(), End> {
        self.st.src_nodes.init();
        for &s in &self.groups[0][g] {
            self.st.src_nodes.add_tail(s)?;
        }
        self.st.dst_nodes.init();
        for &d in &self.groups[1][j] {
            self.st.dst_nodes.add_tail(d)?;
        }
        Ok(())
    }

    /// `map_devices` on the current lists.
    fn map_devices(&mut self) -> Result<bool, End> {
        if self.st.src_nodes.is_empty() {
            return Ok(true);
        }
        self.list_names()?;
        let s = self.st.src_nodes.first();
        self.st.src_nodes.del(s)?;
        let walk = Cursor::start(&self.st.dst_nodes)?;
        self.st.stack.push(Frame::Devices {
            src: s,
            walk,
            pushed: None,
        });
        let exit = self.walk_devices(s)?;
        self.st.stack.pop();
        match exit {
            Exit::Mapped => Ok(true),
            Exit::PushRefused => Ok(false),
            Exit::Exhausted => {
                self.st.src_nodes.add(s)?;
                Ok(false)
            }
        }
    }

    fn walk_devices(&mut self, s: usize) -> Result<Exit, End> {
        loop {
            let Some(d) = self.walk().current(&self.st.dst_nodes) else {
                return Ok(Exit::Exhausted);
            };
            if d == POISON {
                return Err(End::Crash(CrashCause::Poisoned));
            }
            self.tick()?;
            let cpu_maps_lost = self.st.written >= printbuf::CPU_MAPS_LOST;
            let fits = device::map_device(
                self.pairing,
                self.members,
                &self.st.maps,
                (s, d),
                cpu_maps_lost,
            )
            .map_err(|e| self.device_crash(e))?;
            if let Some(new) = fits {
                self.st.dst_nodes.del(d)?;
                // maps_push walks maps->cpu_maps only for new CPU pairs,
                // maps->gpu_maps always.
                if !new.cpus.is_empty() {
                    self.lost(printbuf::CPU_MAPS_LOST, Lost::CpuMaps)?;
                }
                self.lost(printbuf::GPU_MAPS_LOST, Lost::GpuMaps)?;
                if !self.st.maps.push(&new) {
                    return Ok(Exit::PushRefused);
                }
                self.set_pushed(Some(new.clone()));
                if self.map_devices()? {
                    return Ok(Exit::Mapped);
                }
                self.st.dst_nodes.add(d)?;
                self.st.maps.pop(&new);
                self.set_pushed(None);
            }
            self.advance(false)?;
        }
    }

    fn walk(&self) -> Cursor {
        match self.st.stack.last() {
            Some(Frame::Group { walk, .. } | Frame::Devices { walk, .. }) => *walk,
            None => Cursor {
                pos: POISON,
                next: POISON,
            },
        }
    }

    /// The innermost loop's `pos = n, n = n->next`, over the group lists or
    /// the GPU lists.
    fn advance(&mut self, groups: bool) -> Result<(), End> {
        let State {
            stack,
            dst_nodes,
            dst_groups,
            ..
        } = &mut self.st;
        let links = if groups { dst_groups } else { dst_nodes };
        match stack.last_mut() {
            Some(Frame::Group { walk, .. } | Frame::Devices { walk, .. }) => {
                walk.advance(links)?;
            }
            None => {}
        }
        Ok(())
    }

    fn set_pushed(&mut self, new: Option<NewMaps>) {
        if let Some(Frame::Devices { pushed, .. }) = self.st.stack.last_mut() {
            *pushed = new;
        }
    }

    fn device_crash(&self, crash: DeviceCrash) -> End {
        match crash {
            DeviceCrash::NullLink { src } => End::Crash(CrashCause::MissingNode {
                checkpoint_node: self.pairing.src.topo.nodes[self.members.src[src]].id,
            }),
            DeviceCrash::CpuMaps => self.lost_crash(Lost::CpuMaps),
        }
    }

    /// CRIU walks a list whose head text covers once names wrote to `at`.
    fn lost(&self, at: usize, what: Lost) -> Result<(), End> {
        if self.st.written >= at {
            return Err(self.lost_crash(what));
        }
        Ok(())
    }

    fn lost_crash(&self, what: Lost) -> End {
        let (gpus, bytes) = self.longest_list;
        End::Crash(CrashCause::ListName { gpus, bytes, what })
    }

    /// The debug lines `map_devices` prints name both lists into
    /// `mapping_list_to_str`'s buffer, and on past it ([`printbuf`]).
    fn list_names(&mut self) -> Result<(), End> {
        for (links, side, members) in [
            (&self.st.src_nodes, &self.pairing.src, &self.members.src),
            (&self.st.dst_nodes, &self.pairing.dst, &self.members.dst),
        ] {
            let (mut gpus, mut bytes, mut e) = (0, 1, links.first());
            while e != links.head() {
                let Some(&node) = members.get(e) else {
                    return Err(End::Crash(CrashCause::Poisoned));
                };
                gpus += 1;
                bytes += printbuf::printed_id_len(side.topo.nodes[node].gpu_id);
                e = links.next(e)?;
            }
            if bytes > self.longest_list.1 {
                self.longest_list = (gpus, bytes);
            }
            self.st.written = self.st.written.max(printbuf::LIST_BUFFER + bytes);
        }
        Ok(())
    }
}

/// How one `map_devices` call ends.
enum Exit {
    Mapped,
    /// `maps_push` refused: CRIU returns at once, its GPUs off both lists.
    PushRefused,
    Exhausted,
}
