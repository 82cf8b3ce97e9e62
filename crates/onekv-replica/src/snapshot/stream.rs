//! Streamed snapshots: the marker a Raft snapshot message carries instead of the state, the view
//! a leader serves in chunks ([`Served`]), and the chunks a follower has stored while it fetches
//! ([`Stagings`]).
//!
//! A leader's snapshot message holds no data, only [`STREAMED`]: the follower's node, seeing it,
//! fetches the state from the sender chunk by chunk (`fetch`) and stores each chunk in its log as
//! it arrives, then hands the message, now marked [`STAGED`], to its own loop, which installs the
//! stored chunks. The state sent is a consistent view of the leader's tree at the snapshot's
//! index, held (with a read pin, so the log GC keeps every value it points at) while any follower
//! keeps fetching it.
//!
//! Another replica than the leader may serve a follower a view of its own instead (made by
//! `SnapshotBuilder::serve_for`, served the same way).
//!
//! This module does not decide when a snapshot is needed (raft-rs) nor install one (`apply`).

use super::copies::{self, SentCopies};
use crate::pins::Pin;
use crate::records;
use crate::state::State;
use crate::{ChunkCursor, ChunkRequest, ReplicaError, SnapshotChunk};
use onekv_index::TreeSnapshot;
use onekv_log::Locator;
use raft::eraftpb::SnapshotMetadata;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The data of a snapshot message whose state is streamed. No snapshot-pairs data starts this
/// way (its first four bytes would be a key of 4 GiB).
pub(crate) const STREAMED: &[u8] = b"\xff\xff\xff\xffONEKV-STREAMED";

/// The data of the same message once the follower stored every chunk. Only a node's fetcher hands
/// one to its own loop; one arriving from a peer, or naming no complete staging, is dropped.
pub(crate) const STAGED: &[u8] = b"\xff\xff\xff\xffONEKV-STAGED";

/// A replica keeps serving a view this long after a follower last fetched a chunk from it (and
/// keeps the Raft entries that follow it), so a follower part-way through a long stream can finish:
/// longer than a chunk call may take (the transport's call timeout, 30 s).
pub(crate) const KEEP_WHILE_FETCHED: Duration = Duration::from_secs(60);

/// A follower keeps the chunks of a fetched snapshot this long for its loop to install (a
/// snapshot message may be refused for a while, by a replica rejoining after a wiped disk).
pub(crate) const KEEP_STAGED: Duration = Duration::from_secs(300);

/// Keys read from the view per page while a chunk is filled.
const PAGE: usize = 256;

/// A view of one shard's state at one applied index, served in chunks to followers: by the
/// shard's leader (the view its snapshot message names) or by another replica a follower asked
/// instead ([`ChunkRequest::any_view`]).
pub(crate) struct Served {
    pub index: u64,
    /// The view's index, the term of its entry and the members as of it.
    pub metadata: SnapshotMetadata,
    state: Arc<State>,
    /// Held while the view is served: the log GC keeps every value the view points at.
    _pin: Pin,
    view: TreeSnapshot,
    /// The request-id window as of the view, as snapshot pairs' values (computed once, shared by
    /// the chunk requests that read it).
    window: Mutex<Option<Arc<Vec<Vec<u8>>>>>,
    /// The copies of values sent so far under which keys, so that keys sharing a copy are sent as
    /// references to the first (to followers that take them).
    copies: SentCopies,
    /// When each follower last fetched a chunk.
    fetches: Mutex<HashMap<u64, Instant>>,
    /// Why a chunk could not be read (a damaged value): the view is not served again.
    failure: Mutex<Option<String>>,
    created: Instant,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Served {
    /// A view to serve; `asked_by` is the follower it is made for (counted as fetching from it,
    /// so it is kept until that follower's first chunk request).
    pub fn new(
        state: Arc<State>,
        pin: Pin,
        view: TreeSnapshot,
        metadata: SnapshotMetadata,
        asked_by: Option<u64>,
    ) -> Self {
        let now = Instant::now();
        Served {
            copies: SentCopies::new(state.dedup.clone(), state.copies_budget.clone()),
            index: metadata.index,
            metadata,
            state,
            _pin: pin,
            view,
            window: Mutex::new(None),
            fetches: Mutex::new(asked_by.into_iter().map(|id| (id, now)).collect()),
            failure: Mutex::new(None),
            created: now,
        }
    }

    /// Whether `follower` (any follower, for `None`) fetched a chunk at or after `since`.
    pub fn fetched_since(&self, follower: Option<u64>, since: Instant) -> bool {
        let fetches = lock(&self.fetches);
        match follower {
            Some(id) => fetches.get(&id).is_some_and(|at| *at >= since),
            None => fetches.values().any(|at| *at >= since),
        }
    }

    /// Whether a follower other than `asker` fetched a chunk at or after `since`.
    pub fn fetched_by_others_since(&self, asker: u64, since: Instant) -> bool {
        lock(&self.fetches).iter().any(|(id, at)| *id != asker && *at >= since)
    }

    /// Whether nobody fetched from this view for [`KEEP_WHILE_FETCHED`] before `now` (nor was it
    /// made within that time): its pin would keep the log GC from reclaiming anything.
    pub fn idle(&self, now: Instant) -> bool {
        let Some(since) = now.checked_sub(KEEP_WHILE_FETCHED) else { return false };
        self.created < since && !self.fetched_since(None, since)
    }

    /// Why this view cannot be served, if it cannot.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    /// The chunk `request` asks for: pairs from its cursor on, until about `max_bytes` (always at
    /// least one pair when any is left), user keys first and then the request-id window. After a
    /// failure (a damaged value) the view answers nothing more: the leader serves a new one.
    pub fn chunk(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        if let Some(error) = self.failure() {
            return Err(ReplicaError::Dropped(format!("this snapshot cannot be served: {error}")));
        }
        let chunk = self.read_chunk(request);
        match &chunk {
            // A damaged value fails every later fetch of this view too: serve a new one (after
            // the repair). Other errors (a cursor that is no key) are the request's.
            Err(error @ ReplicaError::Corrupt { .. }) => {
                tracing::warn!(index = self.index, %error, "a snapshot chunk cannot be read; serving a new view later");
                *lock(&self.failure) = Some(error.to_string());
            }
            Err(_) => {}
            // Only progress keeps the view alive: a follower failing at the same chunk for ever
            // must not pin the log.
            Ok(_) => {
                lock(&self.fetches).insert(request.from, Instant::now());
            }
        }
        chunk
    }

    fn read_chunk(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        let (low, high) = crate::SNAPSHOT_CHUNK_BYTES_RANGE;
        let max_bytes = (request.max_bytes as usize).clamp(low, high);
        let mut pairs = Vec::new();
        let mut window_from = 0;
        match &request.cursor {
            ChunkCursor::Window(at) => window_from = *at as usize,
            ChunkCursor::Start | ChunkCursor::AfterKey(_) => {
                let mut after = match &request.cursor {
                    ChunkCursor::AfterKey(key) => Some(key.clone()),
                    _ => None,
                };
                loop {
                    let start = after.clone().unwrap_or_default();
                    let (page, more) = self
                        .view
                        .range(&start, None, PAGE + 1, false)
                        .map_err(|e| crate::state::storage(format!("snapshot view scan: {e}")))?;
                    let mut last = None;
                    for (key, stored) in page.iter().filter(|(key, _)| after.as_ref().is_none_or(|a| key > a))
                    {
                        if request.references {
                            copies::push_pair(&mut pairs, &self.copies, key, stored, || {
                                self.state.resolve(key, stored)
                            })?;
                        } else {
                            let value = self.state.resolve(key, stored)?;
                            let expiry = onekv_index::stored_expiry(stored);
                            records::push_expiring_pair(&mut pairs, key, expiry, &value);
                        }
                        last = Some(key.clone());
                        if pairs.len() >= max_bytes {
                            return Ok(SnapshotChunk {
                                pairs,
                                next: Some(ChunkCursor::AfterKey(key.clone())),
                                view: None,
                            });
                        }
                    }
                    match last {
                        Some(key) if more || page.len() > PAGE => after = Some(key),
                        _ => break,
                    }
                }
            }
        }
        let window = self.window()?;
        for (at, pair) in window.iter().enumerate().skip(window_from) {
            records::push_snapshot_pair(&mut pairs, b"", pair);
            if pairs.len() >= max_bytes && at + 1 < window.len() {
                let next = Some(ChunkCursor::Window(at as u32 + 1));
                return Ok(SnapshotChunk { pairs, next, view: None });
            }
        }
        Ok(SnapshotChunk { pairs, next: None, view: None })
    }

    fn window(&self) -> Result<Arc<Vec<Vec<u8>>>, ReplicaError> {
        let mut window = lock(&self.window);
        if let Some(window) = &*window {
            return Ok(window.clone());
        }
        let ids = crate::requests::ids_per_pair(records::chunk_bytes(
            self.state.raft_log.config().max_record_bytes,
        ));
        let pairs = Arc::new(crate::requests::snapshot_pairs(&self.view, ids)?);
        *window = Some(pairs.clone());
        Ok(pairs)
    }
}

/// The chunks of the snapshots a follower's shard is fetching or has fetched and not yet
/// installed, by snapshot index: at most one in progress, and the complete ones its loop has not
/// taken yet.
#[derive(Default)]
pub(crate) struct Stagings {
    by_index: BTreeMap<u64, Staged>,
}

struct Staged {
    /// The log's end when the first chunk was about to be written: the shard's recovery point
    /// stays at or below it until the snapshot is installed or dropped, so a recovery finds every
    /// chunk and the log GC reclaims none.
    first_position: u64,
    chunks: Vec<Locator>,
    bytes: u64,
    /// Where the next chunk starts, and who sent the last one.
    next: ChunkCursor,
    sender: u64,
    /// The view's metadata when another replica than the leader serves it (the leader's
    /// snapshot message names another index).
    view: Option<SnapshotMetadata>,
    /// When a fetch last worked on it.
    touched: Instant,
    complete_at: Option<Instant>,
    /// The keys stored so far with a value a reference may name, to check references against.
    referable: Referable,
}

/// Fingerprints of the keys a staging stored with values a later reference may name, bounded by
/// [`MAX_REFERABLE_KEYS`]; past it, the rest of the snapshot is asked for without references.
/// (A fingerprint only checks a peer's references: an honest sender names only keys it sent.)
#[derive(Default)]
struct Referable {
    keys: HashSet<u128>,
    full: bool,
}

/// Keys a staging remembers for checking references (about 20 bytes each).
pub(crate) const MAX_REFERABLE_KEYS: usize = 1 << 20;

fn key_fingerprint(key: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key)
}

/// Where a fetch starts: the cursor to ask from and the number of its first chunk record.
pub(crate) type Resume = (ChunkCursor, u32);

impl Stagings {
    /// Starts or resumes storing the chunks of the snapshot at `index` from `sender`. An
    /// unfinished staging of the same index is resumed where it stopped (every replica's state
    /// at one index is the same, so a chunk after a key follows on whoever sends it; a position
    /// in the request-id window only with the same sender, whose cut of the window it is). Any
    /// other unfinished one is dropped: a shard fetches one snapshot at a time. `None` if the
    /// staging of `index` is complete already (nothing to fetch; it is kept as it is).
    pub fn begin(
        &mut self,
        index: u64,
        sender: u64,
        first_position: u64,
        now: Instant,
        view: Option<SnapshotMetadata>,
    ) -> Option<Resume> {
        if let Some(staged) = self.by_index.get_mut(&index) {
            if staged.complete_at.is_some() {
                return None;
            }
            if staged.sender == sender || !matches!(staged.next, ChunkCursor::Window(_)) {
                staged.touched = now;
                staged.sender = sender;
                staged.view = staged.view.take().or(view);
                return Some((staged.next.clone(), staged.chunks.len() as u32));
            }
        }
        self.by_index.retain(|_, staged| staged.complete_at.is_some());
        let staged = Staged {
            first_position,
            chunks: Vec::new(),
            bytes: 0,
            next: ChunkCursor::Start,
            sender,
            view,
            touched: now,
            complete_at: None,
            referable: Referable::default(),
        };
        self.by_index.insert(index, staged);
        Some((ChunkCursor::Start, 0))
    }

    /// Whether an unfinished staging of `index` holds chunks already (a fetch of it resumes
    /// there).
    pub fn has_progress(&self, index: u64) -> bool {
        self.by_index
            .get(&index)
            .is_some_and(|staged| staged.complete_at.is_none() && !staged.chunks.is_empty())
    }

    /// The latest staging at `index` or later of a view another replica than the leader served:
    /// its metadata, its sender and whether it is complete.
    pub fn with_view_at_least(&self, index: u64) -> Option<(SnapshotMetadata, u64, bool)> {
        self.by_index
            .range(index..)
            .rev()
            .find_map(|(_, staged)| Some((staged.view.clone()?, staged.sender, staged.complete_at.is_some())))
    }

    /// Records the stored records of one chunk (all of them: a chunk cut into several records is
    /// recorded whole or not at all), where the next chunk starts, and the chunk's keys a later
    /// reference may name; false if that staging is gone.
    pub fn push(
        &mut self,
        index: u64,
        records: &[Locator],
        next: ChunkCursor,
        now: Instant,
        referable: &[&[u8]],
    ) -> bool {
        match self.by_index.get_mut(&index) {
            Some(staged) if staged.complete_at.is_none() => {
                staged.bytes += records.iter().map(|l| l.len).sum::<u64>();
                staged.chunks.extend_from_slice(records);
                staged.next = next;
                staged.touched = now;
                for key in referable {
                    if staged.referable.keys.len() >= MAX_REFERABLE_KEYS {
                        staged.referable.full = true;
                        break;
                    }
                    staged.referable.keys.insert(key_fingerprint(key));
                }
                true
            }
            _ => false,
        }
    }

    /// Whether the unfinished staging at `index` stored `key` with a value a reference may name.
    pub fn holds_value_of(&self, index: u64, key: &[u8]) -> bool {
        self.by_index.get(&index).is_some_and(|staged| {
            staged.complete_at.is_none() && staged.referable.keys.contains(&key_fingerprint(key))
        })
    }

    /// Whether the next chunks of the staging at `index` may carry references: until it stops
    /// remembering keys.
    pub fn takes_references(&self, index: u64) -> bool {
        self.by_index.get(&index).is_none_or(|staged| !staged.referable.full)
    }

    /// Marks the staging at `index` complete: every chunk is durable.
    pub fn complete(&mut self, index: u64, now: Instant) -> bool {
        match self.by_index.get_mut(&index) {
            Some(staged) if staged.complete_at.is_none() => {
                staged.complete_at = Some(now);
                staged.referable = Referable::default();
                true
            }
            _ => false,
        }
    }

    pub fn is_complete(&self, index: u64) -> bool {
        self.by_index.get(&index).is_some_and(|staged| staged.complete_at.is_some())
    }

    /// Takes the complete staging at `index` for installing (loop only), and drops the complete
    /// ones below it, which nothing will install any more.
    pub fn take_complete(&mut self, index: u64) -> Option<Vec<Locator>> {
        if !self.is_complete(index) {
            return None;
        }
        let staged = self.by_index.remove(&index)?;
        self.by_index.retain(|at, staged| *at > index || staged.complete_at.is_none());
        Some(staged.chunks)
    }

    /// Drops the complete staging at `index` (loop only: Raft did not take its snapshot).
    pub fn drop_complete(&mut self, index: u64) {
        if self.is_complete(index) {
            self.by_index.remove(&index);
        }
    }

    /// Drops complete stagings nobody installed within `after` (loop only: their message was lost
    /// on the way to the loop, or they were superseded) and unfinished ones no fetch worked on
    /// within `after` (nothing resumed them).
    /// `pending` is the index of a snapshot Raft took and the loop has yet to install: kept.
    pub fn expire(&mut self, now: Instant, after: Duration, pending: Option<u64>) {
        self.by_index.retain(|index, staged| {
            Some(*index) == pending
                || now.saturating_duration_since(staged.complete_at.unwrap_or(staged.touched)) < after
        });
    }

    /// The lowest log position a staging's chunks may be at: the shard's recovery point must not
    /// pass it.
    pub fn hold_back(&self) -> Option<u64> {
        self.by_index.values().map(|staged| staged.first_position).min()
    }

    /// What is staged, for status.
    pub fn describe(&self) -> Option<String> {
        let parts: Vec<String> = self
            .by_index
            .iter()
            .map(|(index, staged)| {
                format!(
                    "{} a snapshot at index {index}: {} chunks, {} bytes",
                    if staged.complete_at.is_some() { "fetched" } else { "fetching" },
                    staged.chunks.len(),
                    staged.bytes
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locator(position: u64, len: u64) -> Locator {
        Locator { position, len }
    }

    #[test]
    fn markers_are_not_snapshot_pairs() {
        for marker in [STREAMED, STAGED] {
            assert!(records::SnapshotPairs::new(marker).next().unwrap().is_err());
        }
    }

    #[test]
    fn a_new_staging_drops_an_unfinished_one_but_not_a_complete_one() {
        let now = Instant::now();
        let key = |k: &[u8]| ChunkCursor::AfterKey(k.to_vec());
        let mut s = Stagings::default();
        assert_eq!(s.begin(10, 1, 100, now, None), Some((ChunkCursor::Start, 0)));
        assert!(s.push(10, &[locator(100, 5)], key(b"a"), now, &[]));
        assert!(s.complete(10, now));
        assert!(
            !s.push(10, &[locator(200, 5)], key(b"b"), now, &[]),
            "a complete staging takes no more chunks"
        );
        assert_eq!(s.begin(10, 2, 999, now, None), None, "a complete staging is not fetched again");
        assert!(s.is_complete(10));
        s.begin(20, 1, 300, now, None);
        assert!(s.push(20, &[locator(300, 5), locator(310, 5)], key(b"a"), now, &[]));
        s.begin(30, 1, 400, now, None);
        assert!(!s.push(20, &[locator(350, 5)], key(b"b"), now, &[]), "the unfinished staging was dropped");
        assert!(s.is_complete(10));
        assert_eq!(s.hold_back(), Some(100));
        assert_eq!(s.take_complete(10), Some(vec![locator(100, 5)]));
        assert_eq!(s.hold_back(), Some(400));
        s.expire(now + KEEP_STAGED, KEEP_STAGED, None);
        assert_eq!(s.hold_back(), None, "an unfinished staging nobody resumed expires");
    }

    #[test]
    fn a_fetch_of_the_same_index_resumes_where_the_last_one_stopped() {
        let now = Instant::now();
        let mut s = Stagings::default();
        s.begin(10, 1, 100, now, None);
        assert!(s.push(
            10,
            &[locator(100, 5), locator(105, 5)],
            ChunkCursor::AfterKey(b"k".to_vec()),
            now,
            &[]
        ));
        // Another sender of the same index goes on after the same key, numbering on.
        assert_eq!(s.begin(10, 2, 999, now, None), Some((ChunkCursor::AfterKey(b"k".to_vec()), 2)));
        assert_eq!(s.hold_back(), Some(100), "the first chunk's position still holds");
        assert!(s.push(10, &[locator(110, 5)], ChunkCursor::Window(3), now, &[]));
        // Inside the request-id window, only the same sender's cut goes on.
        assert_eq!(s.begin(10, 2, 999, now, None), Some((ChunkCursor::Window(3), 3)));
        assert_eq!(s.begin(10, 1, 500, now, None), Some((ChunkCursor::Start, 0)));
        assert_eq!(s.hold_back(), Some(500));
    }

    #[test]
    fn installing_drops_older_complete_stagings_and_expiry_drops_forgotten_ones() {
        let now = Instant::now();
        let mut s = Stagings::default();
        s.begin(10, 1, 100, now, None);
        s.complete(10, now);
        s.begin(20, 1, 200, now, None);
        s.complete(20, now);
        assert!(s.take_complete(20).is_some());
        assert!(!s.is_complete(10));
        s.begin(30, 1, 300, now, None);
        s.complete(30, now);
        s.expire(now + Duration::from_secs(1), Duration::from_secs(2), None);
        assert!(s.is_complete(30));
        s.expire(now + Duration::from_secs(3), Duration::from_secs(2), Some(30));
        assert!(s.is_complete(30), "Raft took it: the loop installs it next");
        s.expire(now + Duration::from_secs(3), Duration::from_secs(2), None);
        assert!(!s.is_complete(30));
        assert_eq!(s.hold_back(), None);
    }

    #[test]
    fn a_view_served_by_another_replica_is_found_again_by_the_leaders_lower_index() {
        let now = Instant::now();
        let view = |index| SnapshotMetadata { index, term: 2, ..Default::default() };
        let mut s = Stagings::default();
        s.begin(10, 1, 100, now, None);
        assert!(!s.has_progress(10));
        assert!(s.push(10, &[locator(100, 5)], ChunkCursor::AfterKey(b"a".to_vec()), now, &[]));
        assert!(s.has_progress(10));
        assert_eq!(s.with_view_at_least(10), None, "the leader's own view has no metadata of its own");
        // Another replica's view at 12 replaces the unfinished one at 10.
        s.begin(12, 3, 200, now, Some(view(12)));
        assert!(!s.has_progress(10));
        assert_eq!(s.with_view_at_least(10), Some((view(12), 3, false)));
        assert_eq!(s.with_view_at_least(13), None);
        s.complete(12, now);
        assert_eq!(s.with_view_at_least(11), Some((view(12), 3, true)));
    }

    #[test]
    fn a_staging_remembers_the_keys_references_may_name_up_to_a_bound() {
        let now = Instant::now();
        let key = |k: &[u8]| ChunkCursor::AfterKey(k.to_vec());
        let mut s = Stagings::default();
        s.begin(10, 1, 100, now, None);
        assert!(s.takes_references(10));
        assert!(s.push(10, &[locator(100, 5)], key(b"b"), now, &[b"a", b"b"]));
        assert!(s.holds_value_of(10, b"a") && s.holds_value_of(10, b"b"));
        assert!(!s.holds_value_of(10, b"c") && !s.holds_value_of(11, b"a"));
        // Past the bound, the rest of the snapshot comes without references.
        let many: Vec<Vec<u8>> = (0..MAX_REFERABLE_KEYS as u64).map(|n| n.to_be_bytes().to_vec()).collect();
        let many: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        assert!(s.push(10, &[locator(105, 5)], key(b"c"), now, &many));
        assert!(!s.takes_references(10));
        assert!(s.takes_references(11), "a staging not begun takes them");
        // Once complete, nothing is remembered (the install does not check again).
        s.complete(10, now);
        assert!(!s.holds_value_of(10, b"a"));
    }
}
