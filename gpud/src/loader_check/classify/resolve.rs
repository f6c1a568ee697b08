//! Path resolution inside an image's merged tree, bounded in work and time.
//!
//! A path is walked one component at a time, the way Linux's path walk does
//! it: the path so far is kept as one string that grows by a component and
//! shrinks back on `..` or a symlink, so each step costs one tree lookup and
//! no copy of the path (the walk used to rebuild the whole path at every
//! component, the square of the depth: issue 38, F1). A walk takes at most
//! [`MAX_WALK`] components, symlink targets included, and stops at the
//! inspection's deadline.

use std::{cell::Cell, time::Instant};

use super::Command;
use crate::loader_check::layers::{FileSummary, Node, Tree, normalize};

/// Symlinks followed in one walk: Linux's `MAXSYMLINKS`.
pub(crate) const MAX_HOPS: u32 = 40;
/// Path components one walk may take, those of the symlink targets it
/// follows included. An argv0 is at most `MAX_COMPONENTS` (256) deep and
/// real symlinks point a few components away; 4096 leaves room for a chain
/// of [`MAX_HOPS`] links of 100 components each, and bounds a walk at 4096
/// tree lookups however the links are made.
pub(crate) const MAX_WALK: usize = 4096;
/// No path of the tree is longer (`layers` drops longer names), so a
/// longer path needs no lookup: nothing is there.
const LONGEST_KEPT: usize = crate::loader_check::layers::MAX_PATH + 1;

/// Why a path did not lead to a regular file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("{0} is not in the image")]
    Missing(String),
    #[error("{0}: more than {MAX_HOPS} symlinks (a loop?)")]
    Loop(String),
    #[error("{0}: resolving it takes more than {MAX_WALK} path components (MAX_WALK)")]
    TooLong(String),
    #[error("{0} is not a regular file")]
    NotFile(String),
    #[error("{0}: a path component is not a directory")]
    NotDir(String),
    #[error("the inspection's deadline passed while resolving paths")]
    OutOfTime,
}

/// The start of `path`, for an error message.
fn excerpt(path: &str) -> String {
    const KEEP: usize = 128;
    if path.len() <= KEEP {
        return path.to_owned();
    }
    let mut end = KEEP;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... ({} bytes)",
        path.get(..end).unwrap_or_default(),
        path.len()
    )
}

/// Walks paths of one tree until a deadline.
pub(crate) struct Walk<'t> {
    pub(crate) tree: &'t Tree,
    deadline: Instant,
    expired: Cell<bool>,
}

impl<'t> Walk<'t> {
    pub(crate) fn new(tree: &'t Tree, deadline: Instant) -> Self {
        Self {
            tree,
            deadline,
            expired: Cell::new(false),
        }
    }

    /// Whether the deadline was found passed by any step of this walk.
    pub(crate) fn expired(&self) -> bool {
        self.expired.get()
    }

    /// `Err` once the deadline has passed (and from then on).
    pub(crate) fn on_time(&self) -> Result<(), ResolveError> {
        if self.expired.get() || Instant::now() >= self.deadline {
            self.expired.set(true);
            return Err(ResolveError::OutOfTime);
        }
        Ok(())
    }

    fn lookup(&self, path: &str) -> Option<&'t Node> {
        if path.len() > LONGEST_KEPT {
            return None;
        }
        self.tree.get(path)
    }

    /// Follows `start` (absolute) through the tree's symlinks and hard
    /// links: the final path and what is there (`None`: nothing).
    fn resolve(&self, start: &str) -> Result<(String, Option<&'t Node>), ResolveError> {
        let (here, mut hops) = self.walk(start)?;
        let mut path = if here.is_empty() {
            "/".to_owned()
        } else {
            here
        };
        let mut node = if path == "/" {
            Some(&Node::Dir)
        } else {
            self.lookup(&path)
        };
        while let Some(Node::Hardlink(to)) = node {
            hops += 1;
            if hops > MAX_HOPS {
                return Err(ResolveError::Loop(excerpt(start)));
            }
            path.clone_from(to);
            node = self.lookup(&path);
        }
        Ok((path, node))
    }

    /// The components of `start` walked through the symlinks: the path
    /// reached (empty for the root) and the links followed.
    fn walk(&self, start: &str) -> Result<(String, u32), ResolveError> {
        let mut todo: Vec<&str> = start.split('/').rev().collect();
        let mut here = String::new();
        // Where `here` ended before each of its components.
        let mut marks: Vec<usize> = Vec::new();
        let (mut hops, mut walked) = (0, 0);
        while let Some(c) = todo.pop() {
            walked += 1;
            if walked > MAX_WALK {
                return Err(ResolveError::TooLong(excerpt(start)));
            }
            self.on_time()?;
            match c {
                "" | "." => continue,
                ".." => {
                    here.truncate(marks.pop().unwrap_or(0));
                    continue;
                }
                _ => {
                    marks.push(here.len());
                    here.push('/');
                    here.push_str(c);
                }
            }
            match self.lookup(&here) {
                Some(Node::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(ResolveError::Loop(excerpt(start)));
                    }
                    here.truncate(marks.pop().unwrap_or(0));
                    if target.starts_with('/') {
                        here.clear();
                        marks.clear();
                    }
                    todo.extend(target.split('/').rev());
                }
                None | Some(Node::Dir) => {}
                Some(_) if todo.iter().any(|c| !c.is_empty() && *c != ".") => {
                    return Err(ResolveError::NotDir(excerpt(&here)));
                }
                Some(_) => {}
            }
        }
        Ok((here, hops))
    }

    /// The regular file at `path`: its final path and summary.
    pub(crate) fn find_file(&self, path: &str) -> Result<(String, &'t FileSummary), ResolveError> {
        match self.resolve(path)? {
            (real, Some(Node::File(f))) => Ok((real, f)),
            (real, None) => Err(ResolveError::Missing(real)),
            (real, Some(_)) => Err(ResolveError::NotFile(real)),
        }
    }

    /// Where `argv0` is, as `execvp` finds it: the path looked up (before
    /// symlinks are followed).
    pub(crate) fn locate(&self, cmd: &Command, argv0: &str) -> Result<String, ResolveError> {
        if argv0.contains('/') {
            return Ok(absolute(&cmd.working_dir, argv0));
        }
        for dir in cmd.path.split(':') {
            self.on_time()?;
            let dir = if dir.is_empty() { "." } else { dir };
            let candidate = absolute(&absolute(&cmd.working_dir, dir), argv0);
            match self.find_file(&candidate) {
                Ok(_) => return Ok(candidate),
                Err(ResolveError::OutOfTime) => return Err(ResolveError::OutOfTime),
                Err(_) => {}
            }
        }
        Err(ResolveError::Missing(format!(
            "{argv0} (in PATH {})",
            excerpt(&cmd.path)
        )))
    }
}

/// `rel` made absolute against the directory `dir`.
pub(crate) fn absolute(dir: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        return rel.to_owned();
    }
    normalize(&format!("{dir}/{rel}")).unwrap_or_else(|| "/".to_owned())
}
