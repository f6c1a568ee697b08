//! CRIU's XGMI groups as `topology_determine_iolinks` builds them
//! (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c:840-897),
//! list pointer by list pointer.
//!
//! Every node, CPU or GPU, in walking order; each of its valid links in
//! order; an XGMI link whose target links back with XGMI puts the node's
//! group together: the group is the first one holding a node with the same
//! `gpu_id` (`sys_get_p2pgroup_with_gpu_id`, so every CPU, `gpu_id` 0,
//! finds the group of the first CPU in one), or a new one the node starts;
//! the peer is appended unless a member has its `gpu_id`. Each node has one
//! `listm_p2pgroup`, so a peer already in another group is relinked into
//! this one: the group it came from now runs into this group's ring and
//! never comes back to its head. A walk of that group then never ends:
//! looking up a `gpu_id` it does not reach spins for ever in
//! `topology_determine_iolinks`, and printing it (`p2pgroup_to_str`, from
//! `topology_print` right after) writes without end past its buffer.
//! A group head met in such a walk is read as a node (`container_of`): its
//! `gpu_id` is the 4 bytes 116 bytes before the group on the heap, which
//! the code does not tell; it is taken as no node's. When it is 0 (it is
//! for the checkpoint side in CRIU's own unit-test build, and not for the
//! local side), a CPU's lookup stops there, and CRIU crashes printing the
//! group instead of spinning: it does not restore either way.

use crate::restore_check::model::{LinkKind, Side};

/// What `topology_determine_iolinks` and `topology_print` make of one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Groups {
    /// The groups, in creation order, as lists of node indices (members in
    /// list order).
    Lists(Vec<Vec<usize>>),
    /// Node `node` joined a second group; printing the first never ends.
    Relinked { node: usize },
    /// Looking up `gpu_id` in a group whose list no longer comes back to its
    /// head: `topology_determine_iolinks` never returns.
    Spins { gpu_id: u32 },
}

/// Entries `0..n` are the nodes' `listm_p2pgroup`, `n + g` group `g`'s head.
struct Lists {
    n: usize,
    next: Vec<usize>,
    prev: Vec<usize>,
    heads: usize,
}

impl Lists {
    fn head(&self, g: usize) -> usize {
        self.n + g
    }

    fn new_group(&mut self) -> usize {
        let h = self.next.len();
        self.next.push(h);
        self.prev.push(h);
        self.heads += 1;
        self.heads - 1
    }

    /// `list_add_tail(e, head)`, whatever `e` was linked into before.
    fn add_tail(&mut self, e: usize, g: usize) {
        let h = self.head(g);
        let last = self.prev[h];
        self.prev[h] = e;
        self.next[e] = h;
        self.prev[e] = last;
        self.next[last] = e;
    }

    /// Walks group `g` for a member with `gpu_id`: `Some(found)`, or `None`
    /// when the walk never reaches the head again (CRIU spins).
    fn holds(&self, side: &Side<'_>, g: usize, gpu_id: u32) -> Option<bool> {
        let h = self.head(g);
        let mut e = self.next[h];
        for _ in 0..=self.next.len() {
            if e == h {
                return Some(false);
            }
            if side
                .topo
                .nodes
                .get(e)
                .is_some_and(|node| node.gpu_id == gpu_id)
            {
                return Some(true);
            }
            e = self.next[e];
        }
        None
    }

    /// The members of group `g`, or `None` when its walk never ends.
    fn members(&self, g: usize) -> Option<Vec<usize>> {
        let h = self.head(g);
        let mut out = Vec::new();
        let mut e = self.next[h];
        while e != h {
            if e >= self.n || out.len() > self.n {
                return None;
            }
            out.push(e);
            e = self.next[e];
        }
        Some(out)
    }
}

/// The groups CRIU builds for `side`.
pub(crate) fn build(side: &Side<'_>) -> Groups {
    let n = side.topo.nodes.len();
    let mut lists = Lists {
        n,
        next: vec![0; n],
        prev: vec![0; n],
        heads: 0,
    };
    let mut linked = vec![false; n];
    let mut relinked = None;
    for node in 0..n {
        let gpu_id = side.topo.nodes[node].gpu_id;
        for link in &side.links[node] {
            let Some(peer) = link.target else { continue };
            if link.kind != LinkKind::Xgmi || !link.bidirectional {
                continue;
            }
            let mut group = None;
            for g in 0..lists.heads {
                match lists.holds(side, g, gpu_id) {
                    None => return Groups::Spins { gpu_id },
                    Some(true) => {
                        group = Some(g);
                        break;
                    }
                    Some(false) => {}
                }
            }
            let g = group.unwrap_or_else(|| {
                let g = lists.new_group();
                lists.add_tail(node, g);
                linked[node] = true;
                g
            });
            let peer_id = side.topo.nodes[peer].gpu_id;
            match lists.holds(side, g, peer_id) {
                None => return Groups::Spins { gpu_id: peer_id },
                Some(true) => {}
                Some(false) => {
                    if linked[peer] {
                        relinked.get_or_insert(peer);
                    }
                    lists.add_tail(peer, g);
                    linked[peer] = true;
                }
            }
        }
    }
    let all: Option<Vec<Vec<usize>>> = (0..lists.heads).map(|g| lists.members(g)).collect();
    match (all, relinked) {
        (Some(groups), _) => Groups::Lists(groups),
        (None, node) => Groups::Relinked {
            node: node.unwrap_or(0),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore_check::model::{GpuProps, Link, Location, Node, Topo};

    fn node(id: u32, gpu_id: u32, xgmi: &[u32]) -> Node {
        Node {
            id,
            gpu_id,
            props: GpuProps::default(),
            links: xgmi
                .iter()
                .map(|&to| Link {
                    kind: LinkKind::Xgmi,
                    to,
                })
                .collect(),
            location: Location::default(),
        }
    }

    #[test]
    fn a_full_hive_is_one_list_in_link_order() {
        let topo = Topo {
            nodes: vec![
                node(1, 0x11, &[2, 3]),
                node(2, 0x22, &[1, 3]),
                node(3, 0x33, &[1, 2]),
            ],
        };
        assert_eq!(build(&Side::new(&topo)), Groups::Lists(vec![vec![0, 1, 2]]));
    }

    #[test]
    fn cpus_share_one_group_by_their_gpu_id_of_zero() {
        // CPU 0 -- GPU 2, CPU 1 -- GPU 3: CPU 1 finds CPU 0's group (gpu_id
        // 0 is there) and is never added itself; GPU 3 joins that group.
        let topo = Topo {
            nodes: vec![
                node(0, 0, &[2]),
                node(1, 0, &[3]),
                node(2, 0x22, &[0]),
                node(3, 0x33, &[1]),
            ],
        };
        assert_eq!(build(&Side::new(&topo)), Groups::Lists(vec![vec![0, 2, 3]]));
    }

    #[test]
    fn a_peer_of_two_groups_breaks_the_first() {
        // A -- C and B -- C, A and B unlinked: A starts {A, C}, B starts
        // {B} and relinks C into it. C's own walk finds the first group
        // and A and B through it; printing the first group never ends.
        let topo = Topo {
            nodes: vec![
                node(1, 0x11, &[3]),
                node(2, 0x22, &[3]),
                node(3, 0x33, &[1, 2]),
            ],
        };
        assert_eq!(build(&Side::new(&topo)), Groups::Relinked { node: 2 });
        // A fourth node D -- C after them looks its gpu_id up in the first
        // group, whose walk runs round the second group's ring for ever.
        let mut topo = topo;
        topo.nodes[2].links.push(Link {
            kind: LinkKind::Xgmi,
            to: 4,
        });
        topo.nodes.push(node(4, 0x44, &[3]));
        assert_eq!(build(&Side::new(&topo)), Groups::Spins { gpu_id: 0x44 });
        // In the order C, A, B the same links make one group.
        let topo = Topo {
            nodes: vec![
                node(3, 0x33, &[1, 2]),
                node(1, 0x11, &[3]),
                node(2, 0x22, &[3]),
            ],
        };
        assert_eq!(build(&Side::new(&topo)), Groups::Lists(vec![vec![0, 1, 2]]));
    }
}
