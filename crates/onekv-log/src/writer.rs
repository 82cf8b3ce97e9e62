//! Group commit: one thread turns everyone's queued appends into one write and one fsync.
//!
//! Appenders put a request (their records and a completion) in the queue and wake the writer. The
//! writer takes everything queued, up to `max_write_bytes`, assigns positions, frames the records
//! into one buffer, writes it with one positional write, fsyncs, publishes the new durable end, and
//! only then runs each request's completion with its locators. While it is in `fsync`, new requests
//! pile up and go out together in the next round: the more appenders, the more records per fsync.
//!
//! A segment is rolled inside a round when the next record would not fit: what is buffered for the
//! old segment is written and fsynced first (and the file cut to it, if it was a recycled one), then
//! the new segment is created or a kept file reused (its header fsynced, its name fsynced into the
//! directory). So a segment is complete on disk before its successor
//! exists, which is what lets recovery treat every segment but the last as sealed.
//!
//! On any write or fsync error the writer stops: the failed round and everything queued are
//! completed with the error, and the log refuses further appends. An fsync is never retried (after a
//! failed fsync the kernel may have dropped the dirty pages, and a second fsync would report
//! success for data that is gone).

use crate::log::{Segment, Shared};
use crate::record::{self, RECORD_HEADER_LEN, RecordKind};
use crate::recovery::create_segment;
use crate::recycle::seal;
use crate::segment::{self, SEGMENT_HEADER_LEN};
use crate::{Locator, LogError, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// What an appender learns when its records are durable (or will never be).
pub(crate) type Completion = Box<dyn FnOnce(Result<Vec<Locator>>) + Send>;

pub(crate) struct Request {
    pub records: Vec<(RecordKind, Vec<u8>)>,
    pub framed_len: u64,
    pub done: Completion,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub requests: VecDeque<Request>,
    pub queued_bytes: u64,
    pub closing: bool,
    /// Set once by the first failure; every later append gets it back.
    pub failed: Option<Arc<LogError>>,
}

pub(crate) fn run(shared: Arc<Shared>, mut active: Arc<Segment>) {
    let mut buf = Vec::with_capacity(1 << 20);
    loop {
        let batch = {
            let mut queue = shared.lock_queue();
            while queue.requests.is_empty() && !queue.closing {
                queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            if queue.requests.is_empty() {
                return;
            }
            if let Some(cause) = queue.failed.clone() {
                // Something else (a directory sync during reclamation) already failed.
                drop(queue);
                stop(&shared, cause, Vec::new());
                return;
            }
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(next) = queue.requests.front() {
                if !batch.is_empty() && bytes + next.framed_len > shared.config.max_write_bytes {
                    break;
                }
                bytes += next.framed_len;
                batch.push(queue.requests.pop_front().expect("front exists"));
            }
            queue.queued_bytes -= bytes;
            shared.space.notify_all();
            batch
        };
        match write_round(&shared, &mut active, &batch, &mut buf) {
            Ok(locators) => {
                for (request, locators) in batch.into_iter().zip(locators) {
                    complete(request.done, Ok(locators));
                }
            }
            Err(err) => {
                stop(&shared, Arc::new(err), batch);
                return;
            }
        }
    }
}

/// Records `cause` as the log's failure (unless one is recorded already) and fails `batch` and
/// everything still queued with it.
fn stop(shared: &Shared, cause: Arc<LogError>, batch: Vec<Request>) {
    let (cause, queued) = {
        let mut queue = shared.lock_queue();
        let cause = queue.failed.get_or_insert(cause).clone();
        queue.queued_bytes = 0;
        shared.space.notify_all();
        (cause, std::mem::take(&mut queue.requests))
    };
    for request in batch.into_iter().chain(queued) {
        complete(request.done, Err(LogError::Failed { cause: cause.clone() }));
    }
}

/// Runs a caller's completion. A panic in it is the caller's bug (reported by the panic hook); it
/// must not take the writer down with it, or every later append would wait forever.
fn complete(done: Completion, result: Result<Vec<Locator>>) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result)));
}

/// Writes one round's records, fsyncs them, and returns the locators per request.
fn write_round(
    shared: &Shared,
    active: &mut Arc<Segment>,
    batch: &[Request],
    buf: &mut Vec<u8>,
) -> Result<Vec<Vec<Locator>>> {
    let segment_size = shared.config.segment_size_bytes;
    let mut write_start = active.durable_len();
    buf.clear();
    let mut all = Vec::with_capacity(batch.len());
    let (mut records, mut payload_bytes) = (0u64, 0u64);
    for request in batch {
        let mut locators = Vec::with_capacity(request.records.len());
        for (kind, payload) in &request.records {
            let framed = (RECORD_HEADER_LEN + payload.len()) as u64;
            let end = write_start + buf.len() as u64;
            if end + framed > segment_size && end > SEGMENT_HEADER_LEN as u64 {
                // A roll syncs the directory; after a failed directory sync (in reclamation) that
                // would be a retried fsync.
                if let Some(cause) = shared.lock_queue().failed.clone() {
                    return Err(LogError::Failed { cause });
                }
                flush(shared, active, write_start, buf)?;
                seal(active, &shared.counters)?;
                let base = active.base + end;
                let file = match shared.free.reuse(&*shared.dir, base, &shared.counters)? {
                    Some(file) => file,
                    None => create_segment(&*shared.dir, base, &shared.counters)?,
                };
                let next =
                    Arc::new(Segment::new(base, file, SEGMENT_HEADER_LEN as u64, segment::salt_for(base)));
                shared.add_segment(next.clone());
                *active = next;
                write_start = SEGMENT_HEADER_LEN as u64;
            }
            let position = active.base + write_start + buf.len() as u64;
            // Offsets within a segment fit in u32: segment_size_bytes is at most 1 GiB.
            let batch_offset = u32::try_from(buf.len()).expect("a write stays within one segment");
            record::encode(buf, active.place(position), batch_offset, *kind, payload);
            locators.push(Locator::new(position + RECORD_HEADER_LEN as u64, payload.len() as u64));
            records += 1;
            payload_bytes += payload.len() as u64;
        }
        all.push(locators);
    }
    flush(shared, active, write_start, buf)?;
    shared.counters.appended(records, payload_bytes);
    Ok(all)
}

/// Writes `buf` at `offset` of the active segment, fsyncs, and publishes the new durable end.
fn flush(shared: &Shared, active: &Segment, offset: u64, buf: &mut Vec<u8>) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let name = active.name();
    active
        .file
        .write_all_at(buf, offset)
        .map_err(|e| LogError::io(format!("writing {} bytes to {name} at offset {offset}", buf.len()), e))?;
    shared.counters.wrote(buf.len() as u64);
    let start = Instant::now();
    active.file.sync_data().map_err(|e| LogError::io(format!("syncing {name}"), e))?;
    shared.counters.synced(buf.len() as u64, start.elapsed());
    active.set_durable_len(offset + buf.len() as u64);
    buf.clear();
    Ok(())
}
