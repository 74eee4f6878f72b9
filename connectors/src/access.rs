//! Who may read each file a connector keeps ([`receipts::model::ConnectorAccess`]), computed
//! at every run from where the files live, apart from their content:
//! - **POSIX** (a folder, `access.from = posix`): the owner when its mode lets it read, the
//!   owning group when the group may read (through the ACL's mask when there is one), and
//!   every named `user:` and `group:` entry of the file's access ACL that may read through
//!   the mask, each mapped through the system's user and group names ([`SystemNames`]). A
//!   file anyone may read (`o+r`), and one whose readers no name maps, takes the dataset's
//!   default.
//! - **Rules** (a git repository's `access.file`, read at the run's commit): one rule per
//!   line, a glob over the source key and its readers; the last rule that matches decides
//!   ([`Rules`]).
//! - Anything no rule or file system names takes `access.readers`, else the dataset's
//!   default.
//!
//! ## Invariants
//! - The readers are a pure function of what was read (mode, ACL, names, rules): the same
//!   file read twice gives the same list, sorted, so an unchanged file records no change.
//! - A rules file that does not parse fails the run before anything changes: no guess is
//!   ever made about who may read.

use std::collections::HashMap;

use globset::{Glob, GlobSet, GlobSetBuilder};
use receipts::access::SourceAccess;

/// Read permission in a mode triplet or an ACL entry.
const READ: u32 = 4;

/// A file's owner, group, mode bits and access ACL, as the listing read them from the open
/// file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Posix {
    /// Owner's user id.
    pub uid: u32,
    /// Owning group's id.
    pub gid: u32,
    /// Mode bits (`0o640`, ...).
    pub mode: u32,
    /// The access ACL's entries (`system.posix_acl_access`); empty when the file has none.
    pub acl: Vec<AclEntry>,
}

/// What an ACL entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclTag {
    /// The owner (`user::`).
    UserObj,
    /// A named user (`user:<name>:`).
    User,
    /// The owning group (`group::`).
    GroupObj,
    /// A named group (`group:<name>:`).
    Group,
    /// The most any named entry or the owning group may have (`mask::`).
    Mask,
    /// Everyone else (`other::`).
    Other,
}

/// One entry of an access ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    /// What it names.
    pub tag: AclTag,
    /// `rwx` as bits (4, 2, 1).
    pub perm: u32,
    /// The user or group id of a named entry.
    pub id: u32,
}

/// Parses the kernel's `system.posix_acl_access` value: a little-endian version (2), then
/// 8-byte entries (tag, permissions, id).
pub fn parse_acl(bytes: &[u8]) -> Result<Vec<AclEntry>, String> {
    let (head, entries) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| "an ACL shorter than its header".to_owned())?;
    if u32::from_le_bytes(*head) != 2 {
        return Err(format!("ACL version {}", u32::from_le_bytes(*head)));
    }
    if entries.len() % 8 != 0 {
        return Err(format!("an ACL of {} bytes", bytes.len()));
    }
    entries
        .chunks_exact(8)
        .map(|entry| {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let perm = u16::from_le_bytes([entry[2], entry[3]]);
            let id = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
            let tag = match tag {
                0x01 => AclTag::UserObj,
                0x02 => AclTag::User,
                0x04 => AclTag::GroupObj,
                0x08 => AclTag::Group,
                0x10 => AclTag::Mask,
                0x20 => AclTag::Other,
                other => return Err(format!("ACL tag {other:#x}")),
            };
            Ok(AclEntry {
                tag,
                perm: u32::from(perm),
                id,
            })
        })
        .collect()
}

/// User and group names by id.
pub trait Names {
    /// The user's name, if the system knows one.
    fn user(&mut self, uid: u32) -> Option<String>;
    /// The group's name, if the system knows one.
    fn group(&mut self, gid: u32) -> Option<String>;
}

/// The system's names (`getpwuid_r`, `getgrgid_r`: `/etc/passwd`, `/etc/group` and whatever
/// else NSS is configured with), each id looked up once per run.
#[derive(Debug, Default)]
pub struct SystemNames {
    users: HashMap<u32, Option<String>>,
    groups: HashMap<u32, Option<String>>,
}

impl Names for SystemNames {
    fn user(&mut self, uid: u32) -> Option<String> {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|user| user.name)
            })
            .clone()
    }

    fn group(&mut self, gid: u32) -> Option<String> {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                    .ok()
                    .flatten()
                    .map(|group| group.name)
            })
            .clone()
    }
}

/// A reader's name from a system name, when it is one cairn accepts.
fn reader(kind: &str, name: Option<String>) -> Option<String> {
    let reader = format!("{kind}:{}", name?);
    SourceAccess {
        readers: vec![reader.clone()],
    }
    .checked()
    .ok()
    .map(|_| reader)
}

/// The readers a file's owner, group, mode and ACL give it: `None` when anyone may read it,
/// or when no reader maps to a name (the dataset's default then applies).
pub fn posix_readers(posix: &Posix, names: &mut dyn Names) -> Option<Vec<String>> {
    let other = posix
        .acl
        .iter()
        .find(|entry| entry.tag == AclTag::Other)
        .map_or(posix.mode & 0o7, |entry| entry.perm);
    if other & READ != 0 {
        return None;
    }
    let mut readers = Vec::new();
    if (posix.mode >> 6) & READ != 0 {
        readers.extend(reader("user", names.user(posix.uid)));
    }
    let extended = posix
        .acl
        .iter()
        .any(|entry| matches!(entry.tag, AclTag::User | AclTag::Group | AclTag::Mask));
    if extended {
        // With an ACL, the mode's group bits are the mask; the owning group has its own entry.
        let mask = posix
            .acl
            .iter()
            .find(|entry| entry.tag == AclTag::Mask)
            .map_or(0o7, |entry| entry.perm);
        for entry in &posix.acl {
            if entry.perm & mask & READ == 0 {
                continue;
            }
            match entry.tag {
                AclTag::User => readers.extend(reader("user", names.user(entry.id))),
                AclTag::GroupObj => readers.extend(reader("group", names.group(posix.gid))),
                AclTag::Group => readers.extend(reader("group", names.group(entry.id))),
                AclTag::UserObj | AclTag::Mask | AclTag::Other => {}
            }
        }
    } else if (posix.mode >> 3) & READ != 0 {
        readers.extend(reader("group", names.group(posix.gid)));
    }
    if readers.is_empty() {
        return None;
    }
    readers.sort_unstable();
    readers.dedup();
    Some(readers)
}

/// A rules file: globs over the source key, each with its readers; the last that matches
/// decides.
///
/// ```text
/// # comments and blank lines are ignored
/// **            group:eng
/// hr/**         group:hr user:alice
/// public/**     default      # the dataset's default
/// drafts/**     nobody       # no one but tokens that read whole datasets
/// ```
#[derive(Debug, Clone)]
pub struct Rules {
    globs: GlobSet,
    readers: Vec<Option<Vec<String>>>,
}

/// Most rules one file holds.
pub const MAX_RULES: usize = 1000;

impl Rules {
    /// Parses a rules file; an error names the line.
    pub fn parse(text: &str) -> Result<Rules, String> {
        let mut builder = GlobSetBuilder::new();
        let mut readers = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split_once('#').map_or(line, |(rule, _)| rule).trim();
            if line.is_empty() {
                continue;
            }
            if readers.len() == MAX_RULES {
                return Err(format!("more than {MAX_RULES} rules"));
            }
            let at = |message: String| format!("line {}: {message}", number + 1);
            let mut words = line.split_whitespace();
            let glob = words.next().unwrap_or_default();
            let glob = Glob::new(glob).map_err(|error| at(format!("`{glob}`: {error}")))?;
            let named: Vec<String> = words.map(str::to_owned).collect();
            let rule = match named.as_slice() {
                [] => return Err(at("a glob needs readers, `default` or `nobody`".into())),
                [word] if word == "default" => None,
                [word] if word == "nobody" => Some(Vec::new()),
                _ => Some(
                    SourceAccess { readers: named }
                        .checked()
                        .map_err(|error| at(error.public_message()))?,
                ),
            };
            builder.add(glob);
            readers.push(rule);
        }
        let globs = builder.build().map_err(|error| error.to_string())?;
        Ok(Rules { globs, readers })
    }

    /// What the last rule matching `key` says: `Some(readers)` (`Some(None)`: the dataset's
    /// default), or `None` when no rule matches.
    pub fn readers(&self, key: &str) -> Option<Option<Vec<String>>> {
        let last = self.globs.matches(key).into_iter().max()?;
        self.readers.get(last).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names from a table (the system's own are tested where `useradd` can make them).
    struct Table;

    impl Names for Table {
        fn user(&mut self, uid: u32) -> Option<String> {
            match uid {
                0 => Some("root".into()),
                1001 => Some("alice".into()),
                1002 => Some("bob".into()),
                1003 => Some("svc$".into()),
                _ => None,
            }
        }
        fn group(&mut self, gid: u32) -> Option<String> {
            match gid {
                2001 => Some("eng".into()),
                2002 => Some("hr".into()),
                _ => None,
            }
        }
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut bytes = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            bytes.extend(tag.to_le_bytes());
            bytes.extend(perm.to_le_bytes());
            bytes.extend(id.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn mode_bits_name_the_owner_and_the_group() {
        let file = |mode| Posix {
            uid: 1001,
            gid: 2001,
            mode,
            acl: Vec::new(),
        };
        let readers = |mode| posix_readers(&file(mode), &mut Table);
        assert_eq!(
            readers(0o640),
            Some(vec!["group:eng".into(), "user:alice".into()])
        );
        assert_eq!(readers(0o600), Some(vec!["user:alice".into()]));
        assert_eq!(readers(0o060), Some(vec!["group:eng".into()]));
        assert_eq!(readers(0o644), None, "anyone may read it");
        assert_eq!(
            readers(0o000),
            None,
            "no reader maps: the dataset's default"
        );
        let unnamed = Posix {
            uid: 4242,
            gid: 4242,
            mode: 0o640,
            acl: Vec::new(),
        };
        assert_eq!(posix_readers(&unnamed, &mut Table), None);
        let odd_name = Posix {
            uid: 1003,
            gid: 2002,
            mode: 0o640,
            acl: Vec::new(),
        };
        assert_eq!(
            posix_readers(&odd_name, &mut Table),
            Some(vec!["group:hr".into()]),
            "a name cairn cannot hold is left out"
        );
    }

    #[test]
    fn acl_entries_read_through_the_mask() {
        // user::rw- user:bob:r-- group::r-- group:hr:r-- mask::r-- other::---
        let bytes = acl(&[
            (0x01, 6, u32::MAX),
            (0x02, 4, 1002),
            (0x04, 4, u32::MAX),
            (0x08, 4, 2002),
            (0x10, 4, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        let entries = parse_acl(&bytes).expect("an ACL");
        let file = Posix {
            uid: 1001,
            gid: 2001,
            mode: 0o640,
            acl: entries.clone(),
        };
        assert_eq!(
            posix_readers(&file, &mut Table),
            Some(vec![
                "group:eng".into(),
                "group:hr".into(),
                "user:alice".into(),
                "user:bob".into()
            ])
        );
        // `chmod g-r` sets the mask to `---`: the named entries and the group lose reading.
        let mut masked = entries;
        for entry in &mut masked {
            if entry.tag == AclTag::Mask {
                entry.perm = 0;
            }
        }
        let file = Posix {
            mode: 0o600,
            acl: masked,
            ..file
        };
        assert_eq!(
            posix_readers(&file, &mut Table),
            Some(vec!["user:alice".into()])
        );
        for bad in [
            &b"\x02\x00"[..],
            &acl(&[(0x40, 4, 0)]),
            &b"\x01\x00\x00\x00"[..],
        ] {
            assert!(parse_acl(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_acl(&bytes[..bytes.len() - 1]).map_err(|e| e.contains("bytes")),
            Err(true)
        );
    }

    #[test]
    fn the_last_matching_rule_decides() {
        let rules = Rules::parse(
            "# rules\n\
             **          group:eng\n\
             hr/**       group:hr user:alice   # HR only\n\
             hr/public.md default\n\
             drafts/*    nobody\n",
        )
        .expect("rules");
        assert_eq!(
            rules.readers("guide.md"),
            Some(Some(vec!["group:eng".into()]))
        );
        assert_eq!(
            rules.readers("hr/pay.md"),
            Some(Some(vec!["group:hr".into(), "user:alice".into()]))
        );
        assert_eq!(rules.readers("hr/public.md"), Some(None));
        assert_eq!(rules.readers("drafts/x.md"), Some(Some(Vec::new())));
        assert_eq!(
            Rules::parse("docs/** group:eng")
                .expect("rules")
                .readers("a.md"),
            None
        );
        for (bad, line) in [
            ("** group:eng\nhr/**\n", "line 2"),
            ("\n\n[ group:eng\n", "line 3"),
            ("** alice\n", "line 1"),
        ] {
            let error = Rules::parse(bad).expect_err(bad);
            assert!(error.starts_with(line), "{error}");
        }
    }
}
