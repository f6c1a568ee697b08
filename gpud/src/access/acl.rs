//! POSIX access ACLs in the kernel's extended-attribute form
//! (`system.posix_acl_access`): a little-endian `u32` version (2), then
//! entries of `u16` tag, `u16` permissions and `u32` id, sorted by tag and,
//! for named users and groups, by id. Written with `lsetxattr`, so a
//! symlink is never followed.

use std::{io, path::Path};

use rustix::fs::XattrFlags;

const XATTR: &str = "system.posix_acl_access";
const VERSION: u32 = 2;
const UNDEFINED_ID: u32 = u32::MAX;

/// Entry tags (`ACL_USER_OBJ` ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u16)]
pub enum Tag {
    UserObj = 0x01,
    User = 0x02,
    GroupObj = 0x04,
    Group = 0x08,
    Mask = 0x10,
    Other = 0x20,
}

impl Tag {
    fn from_u16(value: u16) -> Option<Self> {
        [
            Self::UserObj,
            Self::User,
            Self::GroupObj,
            Self::Group,
            Self::Mask,
            Self::Other,
        ]
        .into_iter()
        .find(|t| *t as u16 == value)
    }
}

/// One ACL entry; `perm` is `rwx` as bits 4, 2, 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u16,
    pub id: u32,
}

/// A whole access ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

impl Acl {
    /// The minimal ACL equivalent to permission bits `mode`.
    pub fn from_mode(mode: u32) -> Self {
        let bits = |shift: u32| u16::try_from((mode >> shift) & 7).unwrap_or(0);
        Self(vec![
            Entry {
                tag: Tag::UserObj,
                perm: bits(6),
                id: UNDEFINED_ID,
            },
            Entry {
                tag: Tag::GroupObj,
                perm: bits(3),
                id: UNDEFINED_ID,
            },
            Entry {
                tag: Tag::Other,
                perm: bits(0),
                id: UNDEFINED_ID,
            },
        ])
    }

    /// Decodes the xattr value.
    ///
    /// # Errors
    /// A wrong version, a length that is not whole entries, an unknown tag.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (head, body) = bytes.split_at_checked(4).ok_or("shorter than its header")?;
        let version = u32::from_le_bytes(head.try_into().map_err(|_| "bad header")?);
        if version != VERSION {
            return Err(format!("version {version}, not {VERSION}"));
        }
        if body.len() % 8 != 0 {
            return Err(format!(
                "{} bytes of entries, not a multiple of 8",
                body.len()
            ));
        }
        body.chunks_exact(8)
            .map(|c| {
                let tag = u16::from_le_bytes([c[0], c[1]]);
                Ok(Entry {
                    tag: Tag::from_u16(tag).ok_or(format!("unknown tag {tag:#x}"))?,
                    perm: u16::from_le_bytes([c[2], c[3]]),
                    id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Self)
    }

    /// The xattr value, entries sorted as the kernel wants them.
    pub fn encode(&self) -> Vec<u8> {
        let mut entries = self.0.clone();
        entries.sort_by_key(|e| (e.tag, e.id));
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in entries {
            out.extend_from_slice(&(e.tag as u16).to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// The permissions named user `uid` effectively has (0 without an entry).
    pub fn user_perm(&self, uid: u32) -> u16 {
        let mask = self
            .0
            .iter()
            .find(|e| e.tag == Tag::Mask)
            .map_or(7, |e| e.perm);
        self.0
            .iter()
            .find(|e| e.tag == Tag::User && e.id == uid)
            .map_or(0, |e| e.perm & mask)
    }

    /// Gives named user `uid` at least `perm`, widening the mask to cover
    /// every named entry and the owning group (as `setfacl -m` does).
    pub fn grant_user(&mut self, uid: u32, perm: u16) {
        match self
            .0
            .iter_mut()
            .find(|e| e.tag == Tag::User && e.id == uid)
        {
            Some(e) => e.perm |= perm,
            None => self.0.push(Entry {
                tag: Tag::User,
                perm,
                id: uid,
            }),
        }
        let mask = self
            .0
            .iter()
            .filter(|e| matches!(e.tag, Tag::User | Tag::GroupObj | Tag::Group))
            .fold(0, |m, e| m | e.perm);
        self.0.retain(|e| e.tag != Tag::Mask);
        self.0.push(Entry {
            tag: Tag::Mask,
            perm: mask,
            id: UNDEFINED_ID,
        });
    }
}

/// The access ACL of `path` (from its mode when it has none).
///
/// # Errors
/// When the path cannot be read or its ACL does not decode.
pub fn read(path: &Path, mode: u32) -> io::Result<Acl> {
    let mut buf = vec![0_u8; 1024];
    match rustix::fs::lgetxattr(path, XATTR, &mut buf) {
        Ok(n) => Acl::decode(buf.get(..n).unwrap_or_default()).map_err(io::Error::other),
        Err(e) if e == rustix::io::Errno::NODATA => Ok(Acl::from_mode(mode)),
        Err(e) => Err(e.into()),
    }
}

/// Writes `acl` as the access ACL of `path`, not following a symlink.
///
/// # Errors
/// The `lsetxattr` error (`EOPNOTSUPP` on a file system without ACLs).
pub fn write(path: &Path, acl: &Acl) -> io::Result<()> {
    Ok(rustix::fs::lsetxattr(
        path,
        XATTR,
        &acl.encode(),
        XattrFlags::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_user_is_added_with_a_mask_and_round_trips() {
        let mut acl = Acl::from_mode(0o750);
        assert_eq!(acl.user_perm(60700), 0);
        acl.grant_user(60700, 7);
        assert_eq!(acl.user_perm(60700), 7);
        let decoded = Acl::decode(&acl.encode()).unwrap();
        let tags: Vec<Tag> = decoded.0.iter().map(|e| e.tag).collect();
        assert_eq!(
            tags,
            [
                Tag::UserObj,
                Tag::User,
                Tag::GroupObj,
                Tag::Mask,
                Tag::Other
            ]
        );
        assert_eq!(decoded.user_perm(60700), 7);
        // Granting again changes nothing.
        let mut again = decoded.clone();
        again.grant_user(60700, 7);
        assert_eq!(again.encode(), acl.encode());
    }

    #[test]
    fn a_narrow_mask_limits_the_effective_permissions() {
        let mut acl = Acl::from_mode(0o755);
        acl.0.push(Entry {
            tag: Tag::User,
            perm: 7,
            id: 1,
        });
        acl.0.push(Entry {
            tag: Tag::Mask,
            perm: 5,
            id: UNDEFINED_ID,
        });
        assert_eq!(acl.user_perm(1), 5);
        assert!(Acl::decode(&[2, 0, 0, 0, 1]).is_err());
        assert!(Acl::decode(&[3, 0, 0, 0]).is_err());
    }
}
