//! The cluster's member list: which nodes belong to the cluster and where to reach them, at an
//! epoch that grows by one with every change.
//!
//! The list is what peers and clients use to turn a node id into an address; which shards a node
//! holds is each shard's own Raft membership, not this. Agreeing on a list is the servers' job (they
//! keep it under a reserved key, changed by compare-and-swap through that key's shard); this module
//! owns only the rules a list obeys and its encoding:
//!
//! ```text
//! offset  size  field
//!      0     4  magic "OKVN"
//!      4     2  format version (u16, = 1)
//!      6     8  epoch (u64, ≥ 1)
//!     14     4  member count N (u32, 1..=MAX_MEMBERS)
//!      …        N members, ids strictly ascending: id (u64), address length L (u16), L bytes UTF-8
//!    end−4   4  CRC-32C of every byte before it (u32)
//! ```
//! All integers little endian.

/// Keys that belong to onekv itself: clients may read them, never write them.
pub const SYSTEM_PREFIX: &[u8] = b"\xffonekv/";
/// The key holding the cluster's agreed member list (absent until its first change).
pub const MEMBERS_KEY: &[u8] = b"\xffonekv/members";

/// Largest number of members a cluster may have.
pub const MAX_MEMBERS: usize = 256;
/// Longest member address, in bytes (`host:port`).
pub const MAX_ADDRESS_BYTES: usize = 255;

const MAGIC: [u8; 4] = *b"OKVN";
const FORMAT_VERSION: u16 = 1;
const HEADER: usize = 18;
const CHECKSUM: usize = 4;

/// One member: a node id and the `host:port` its peers and clients reach it at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The node's id (non-zero).
    pub id: u64,
    /// `host:port`.
    pub address: String,
}

/// The cluster's members at one epoch, sorted by id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberList {
    /// Grows by one with every change; the first list is epoch 1.
    pub epoch: u64,
    members: Vec<Member>,
}

/// Why a member list is not valid, or could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemberListError {
    /// No member.
    #[error("a member list needs at least one member")]
    Empty,
    #[error("{0} members, over the limit of {MAX_MEMBERS}")]
    /// More than [`MAX_MEMBERS`].
    TooMany(usize),
    /// Epoch 0.
    #[error("epoch 0 is invalid (epochs start at 1)")]
    ZeroEpoch,
    #[error("node id 0 is reserved and cannot be a member")]
    /// Node id 0.
    ZeroId,
    #[error("node {0} is listed more than once")]
    /// An id listed twice.
    DuplicateId(u64),
    #[error("address {address:?} is given to nodes {first} and {second}")]
    /// Two members with one address.
    DuplicateAddress {
        /// The address.
        address: String,
        /// The first node with it.
        first: u64,
        /// The second.
        second: u64,
    },
    #[error("node {id}'s address is empty or longer than {MAX_ADDRESS_BYTES} bytes")]
    /// An empty or too long address.
    BadAddress {
        /// The node.
        id: u64,
    },
    #[error("encoded member list truncated at offset {0}")]
    /// The encoding ends early.
    Truncated(usize),
    #[error("not an encoded member list (magic {0:02x?})")]
    /// Not a member list.
    BadMagic([u8; 4]),
    #[error("unsupported member list format version {0} (this release reads {FORMAT_VERSION})")]
    /// A format version this release does not read.
    UnsupportedVersion(u16),
    #[error("member list checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    /// The CRC-32C does not match.
    ChecksumMismatch {
        /// In the encoding.
        stored: u32,
        /// Of the bytes.
        computed: u32,
    },
    #[error("member list ids not strictly ascending at node {0}")]
    /// Ids out of order.
    NotSorted(u64),
    #[error("a member's address is not UTF-8")]
    /// An address that is not UTF-8.
    NotUtf8,
    #[error("{0} unexpected bytes after the last member")]
    /// Bytes after the last member.
    TrailingBytes(usize),
}

impl MemberList {
    /// A list of `members` (any order) at `epoch`, checked: at least one and at most
    /// [`MAX_MEMBERS`], ids non-zero and distinct, addresses non-empty, at most
    /// [`MAX_ADDRESS_BYTES`] and distinct.
    pub fn new(epoch: u64, mut members: Vec<Member>) -> Result<MemberList, MemberListError> {
        members.sort_by_key(|member| member.id);
        let list = MemberList { epoch, members };
        list.validate()?;
        Ok(list)
    }

    /// The members, by ascending id.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The address of node `id`, if it is a member.
    pub fn address(&self, id: u64) -> Option<&str> {
        self.members.iter().find(|member| member.id == id).map(|member| member.address.as_str())
    }

    /// Whether node `id` is a member.
    pub fn contains(&self, id: u64) -> bool {
        self.address(id).is_some()
    }

    /// The same members but for `member`'s entry (added, or its address changed), one epoch on.
    pub fn with(&self, member: Member) -> Result<MemberList, MemberListError> {
        let mut members: Vec<Member> = self.members.iter().filter(|m| m.id != member.id).cloned().collect();
        members.push(member);
        MemberList::new(self.epoch + 1, members)
    }

    /// The same members but node `id`, one epoch on.
    pub fn without(&self, id: u64) -> Result<MemberList, MemberListError> {
        let members = self.members.iter().filter(|m| m.id != id).cloned().collect();
        MemberList::new(self.epoch + 1, members)
    }

    fn validate(&self) -> Result<(), MemberListError> {
        if self.epoch == 0 {
            return Err(MemberListError::ZeroEpoch);
        }
        if self.members.is_empty() {
            return Err(MemberListError::Empty);
        }
        if self.members.len() > MAX_MEMBERS {
            return Err(MemberListError::TooMany(self.members.len()));
        }
        let mut addresses = std::collections::HashMap::new();
        for (i, member) in self.members.iter().enumerate() {
            if member.id == 0 {
                return Err(MemberListError::ZeroId);
            }
            if i > 0 && self.members[i - 1].id >= member.id {
                return Err(if self.members[i - 1].id == member.id {
                    MemberListError::DuplicateId(member.id)
                } else {
                    MemberListError::NotSorted(member.id)
                });
            }
            if member.address.is_empty() || member.address.len() > MAX_ADDRESS_BYTES {
                return Err(MemberListError::BadAddress { id: member.id });
            }
            if let Some(first) = addresses.insert(member.address.as_str(), member.id) {
                return Err(MemberListError::DuplicateAddress {
                    address: member.address.clone(),
                    first,
                    second: member.id,
                });
            }
        }
        Ok(())
    }

    /// The list's binary encoding (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + CHECKSUM + self.members.len() * 32);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&u32::try_from(self.members.len()).unwrap_or(u32::MAX).to_le_bytes());
        for member in &self.members {
            out.extend_from_slice(&member.id.to_le_bytes());
            out.extend_from_slice(&u16::try_from(member.address.len()).unwrap_or(u16::MAX).to_le_bytes());
            out.extend_from_slice(member.address.as_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks an encoded list. Never panics; allocates no more than the input justifies.
    pub fn decode(bytes: &[u8]) -> Result<MemberList, MemberListError> {
        if bytes.len() < HEADER + CHECKSUM {
            return Err(MemberListError::Truncated(bytes.len()));
        }
        let magic: [u8; 4] = bytes[..4].try_into().unwrap_or_default();
        if magic != MAGIC {
            return Err(MemberListError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != FORMAT_VERSION {
            return Err(MemberListError::UnsupportedVersion(version));
        }
        let (body, tail) = bytes.split_at(bytes.len() - CHECKSUM);
        let stored = u32::from_le_bytes(tail.try_into().unwrap_or_default());
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(MemberListError::ChecksumMismatch { stored, computed });
        }
        let mut at = 6;
        let mut take = |n: usize| -> Result<&[u8], MemberListError> {
            let slice = body.get(at..at + n).ok_or(MemberListError::Truncated(at))?;
            at += n;
            Ok(slice)
        };
        let epoch = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        let count = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
        if count > MAX_MEMBERS {
            return Err(MemberListError::TooMany(count));
        }
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let id = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
            let len = usize::from(u16::from_le_bytes(take(2)?.try_into().unwrap_or_default()));
            let address = std::str::from_utf8(take(len)?).map_err(|_| MemberListError::NotUtf8)?;
            members.push(Member { id, address: address.to_string() });
        }
        if at != body.len() {
            return Err(MemberListError::TrailingBytes(body.len() - at));
        }
        let list = MemberList { epoch, members };
        list.validate()?;
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, address: &str) -> Member {
        Member { id, address: address.to_string() }
    }

    fn three() -> MemberList {
        MemberList::new(1, vec![member(3, "h:3"), member(1, "h:1"), member(2, "h:2")]).unwrap()
    }

    #[test]
    fn a_list_round_trips_through_its_encoding_sorted_by_id() {
        let list = three();
        assert_eq!(list.members().iter().map(|m| m.id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(MemberList::decode(&list.encode()), Ok(list));
    }

    #[test]
    fn every_damaged_or_cut_encoding_is_refused() {
        let bytes = three().encode();
        for cut in 0..bytes.len() {
            assert!(MemberList::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(MemberList::decode(&damaged).is_err(), "byte {at} flipped");
        }
    }

    #[test]
    fn adding_and_removing_advance_the_epoch_and_keep_the_rules() {
        let list = three();
        let grown = list.with(member(4, "h:4")).unwrap();
        assert_eq!((grown.epoch, grown.members().len()), (2, 4));
        assert_eq!(grown.address(4), Some("h:4"));
        let shrunk = grown.without(2).unwrap();
        assert_eq!((shrunk.epoch, shrunk.contains(2)), (3, false));
        assert_eq!(
            list.with(member(5, "h:1")),
            Err(MemberListError::DuplicateAddress { address: "h:1".into(), first: 1, second: 5 })
        );
        assert_eq!(
            MemberList::new(1, vec![member(1, "a"), member(1, "b")]),
            Err(MemberListError::DuplicateId(1))
        );
        assert_eq!(MemberList::new(1, vec![member(0, "a")]), Err(MemberListError::ZeroId));
        assert_eq!(MemberList::new(0, vec![member(1, "a")]), Err(MemberListError::ZeroEpoch));
        assert_eq!(MemberList::new(1, vec![member(1, "a")]).unwrap().without(1), Err(MemberListError::Empty));
    }
}
