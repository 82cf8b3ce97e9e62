//! The read-modify-write combiner: per key, while one compare-and-swap is in flight, later commands
//! queue, and the next swap applies them all in arrival order (see the parent module's docs). Also
//! the node's memory of short values after a swap, so the next read-modify-write of a key can try
//! its swap without reading first.

use onekv_client::{ClientError, Expiry};
use std::time::Duration;

use rand::Rng as _;

use super::{Outcome, RespContext};
use crate::protocol::Reply;

/// Compare-and-swap attempts of one read-modify-write command (or `EXEC`) before it reports
/// contention. From the third on, each waits a random pause of up to 64 ms first, so this many
/// attempts take a few seconds at most: within the client's own retry budget (10 s), and enough
/// that a node's commands lose only rarely to a stream of swaps from the shard leader's node.
pub(super) const RMW_MAX_ATTEMPTS: u32 = 128;
/// Values this short are remembered after a successful swap, so the next read-modify-write of the
/// key (a counter, typically) can try its swap without reading first. A stale memory costs one
/// failed swap, which returns the current value: never a wrong result.
const REMEMBERED_VALUE_BYTES: usize = 32;
/// Most remembered values; the memory is cleared when it is full.
const REMEMBERED_VALUES: usize = 65_536;

/// What a read-modify-write decides from the value it found.
pub(super) enum Change {
    /// Swap in this value (`None`: delete) with this expiry and answer this. Commands that change
    /// a value in place (INCR, APPEND, ...) keep the key's expiry ([`Expiry::Keep`]), as in Redis.
    Write(Option<Vec<u8>>, Expiry, Reply),
    /// Write nothing and answer this.
    Keep(Reply),
}

/// A read-modify-write's decision: a pure function of the value found and its expiry time (ms
/// since the Unix epoch; `None`: none) (it may run several times). The expiry is only known to
/// the decisions that ask for it ([`RespContext::read_modify_write`]'s `needs_expiry`); the others
/// get `None`.
pub(super) type Decide = Box<dyn FnMut(Option<&[u8]>, Option<u64>) -> Outcome<Change> + Send>;

/// Should a key's driver panic, takes the key out of the map (answering its queue with an error, as
/// the dropped senders do), so later commands on the key start a new driver instead of queueing
/// behind a dead one forever.
struct UnwedgeOnPanic<'a> {
    context: &'a RespContext,
    key: &'a [u8],
}

impl Drop for UnwedgeOnPanic<'_> {
    fn drop(&mut self) {
        // Only on a panic: after a normal return the key may already belong to a new driver.
        if std::thread::panicking() {
            let shared = &self.context.shared;
            shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(self.key);
        }
    }
}

/// A read-modify-write waiting for its key's next compare-and-swap.
pub(super) struct Pending {
    decide: Decide,
    /// The decision reads the key's expiry (EXPIRE, PERSIST, GETEX).
    needs_expiry: bool,
    answer: tokio::sync::oneshot::Sender<Outcome>,
}

impl RespContext {
    /// Runs `decide` on `key`'s value (and its expiry, if `needs_expiry`) and swaps in its choice,
    /// combined with the other read-modify-writes of the key that this node has in flight (see
    /// the module docs).
    pub(super) async fn read_modify_write(
        &self,
        key: &[u8],
        needs_expiry: bool,
        decide: impl FnMut(Option<&[u8]>, Option<u64>) -> Outcome<Change> + Send + 'static,
    ) -> Outcome {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let pending = Pending { decide: Box::new(decide), needs_expiry, answer };
        let start_driver = {
            let mut combining = self.shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match combining.get_mut(key) {
                Some(queue) => {
                    queue.push(pending);
                    false
                }
                None => {
                    combining.insert(key.to_vec(), vec![pending]);
                    true
                }
            }
        };
        if start_driver {
            // Its own task, so the key's queue keeps moving whatever happens to this connection.
            let context = self.clone();
            let key = key.to_vec();
            tokio::spawn(async move { context.drive(key).await });
        }
        answered.await.unwrap_or_else(|_| Err(Reply::err("onekv: the read-modify-write was dropped")))
    }

    /// Runs the queued read-modify-writes of `key`, one batch per compare-and-swap, until none is
    /// left; then the key leaves the map, and the next command starts a new driver.
    async fn drive(&self, key: Vec<u8>) {
        let _unwedge = UnwedgeOnPanic { context: self, key: &key };
        loop {
            let batch = {
                let mut combining =
                    self.shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let queue = combining.get_mut(&key).map(std::mem::take).unwrap_or_default();
                if queue.is_empty() {
                    combining.remove(&key);
                    return;
                }
                queue
            };
            self.run_batch(&key, batch).await;
        }
    }

    /// One batch: decide every command in order from the value found, swap the first value for the
    /// last, answer each. On a failed swap, decide again from the value it returned.
    async fn run_batch(&self, key: &[u8], mut batch: Vec<Pending>) {
        let answers = self.combined_swap(key, &mut batch).await;
        match answers {
            Ok(answers) => {
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let _ = pending.answer.send(answer);
                }
            }
            Err(error) => {
                for pending in batch {
                    let _ = pending.answer.send(Err(error.clone()));
                }
            }
        }
    }

    async fn combined_swap(&self, key: &[u8], batch: &mut [Pending]) -> Outcome<Vec<Outcome>> {
        let client = &self.shared.client;
        let needs_expiry = batch.iter().any(|pending| pending.needs_expiry);
        // A remembered value is a guess: only a successful swap confirms it. Answers that write
        // nothing are only given from a value really read. A remembered value has no expiry, so
        // a batch that needs one reads.
        let mut guessed = true;
        let mut current = if needs_expiry { None } else { self.remembered(key) };
        // The key's expiry, when read (a failed swap returns the value alone).
        let mut expiry: Option<Option<u64>> = None;
        if current.is_none() {
            (current, expiry) = read_with_expiry(client, key).await?;
            guessed = false;
        }
        for attempt in 0..RMW_MAX_ATTEMPTS {
            if needs_expiry && expiry.is_none() {
                (current, expiry) = read_with_expiry(client, key).await?;
            }
            let mut value = current.clone();
            let mut expires_at = expiry.flatten();
            let mut new_expiry = Expiry::Keep;
            let mut writes = false;
            let mut answers = Vec::with_capacity(batch.len());
            for pending in batch.iter_mut() {
                answers.push(match (pending.decide)(value.as_deref(), expires_at) {
                    Ok(Change::Write(new, next_expiry, answer)) => {
                        // A delete drops the expiry: a later write in the batch that keeps the
                        // expiry keeps none.
                        let next_expiry = if new.is_none() { Expiry::Never } else { next_expiry };
                        if next_expiry != Expiry::Keep {
                            new_expiry = next_expiry;
                            expires_at = super::expiry::expires_at(next_expiry, super::expiry::now_ms());
                        }
                        value = new;
                        writes = true;
                        Ok(answer)
                    }
                    Ok(Change::Keep(answer)) => Ok(answer),
                    Err(error) => Err(error),
                });
            }
            if !writes {
                if !guessed {
                    return Ok(answers);
                }
                self.forget(key);
                (current, expiry) = read_with_expiry(client, key).await?;
                guessed = false;
                continue;
            }
            current =
                match client.cas_with_expiry(key, current.as_deref(), value.as_deref(), new_expiry).await {
                    Ok(outcome) if outcome.swapped => {
                        self.remember(key, value.as_deref());
                        return Ok(answers);
                    }
                    Ok(outcome) => outcome.current,
                    // An attempt did not swap and its answer was lost: nothing was written; read again.
                    Err(ClientError::NotApplied(_)) => client.get(key).await?,
                    Err(error) => return Err(error.into()),
                };
            expiry = None;
            guessed = false;
            self.forget(key);
            if attempt >= 2 {
                // Another node's clients are changing the key too: spread the retries out, then
                // read again, since the value the failed swap returned is older than the pause (a
                // swap from it would lose to every write made meanwhile).
                let millis = rand::rng().random_range(1..=2u64 << attempt.min(5));
                tokio::time::sleep(Duration::from_millis(millis)).await;
                (current, expiry) = read_with_expiry(client, key).await?;
            }
        }
        Err(Reply::err(format!(
            "onekv: the key changed under {RMW_MAX_ATTEMPTS} compare-and-swap attempts in a row; try again"
        )))
    }

    /// The remembered value of `key`, if any (a guess: see [`RespContext::remember`]).
    pub(super) fn remembered(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).cloned()
    }

    pub(super) fn remember(&self, key: &[u8], value: Option<&[u8]>) {
        let mut remembered = self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match value {
            Some(value) if value.len() <= REMEMBERED_VALUE_BYTES => {
                if remembered.len() >= REMEMBERED_VALUES {
                    remembered.clear();
                }
                remembered.insert(key.to_vec(), value.to_vec());
            }
            _ => {
                remembered.remove(key);
            }
        }
    }

    pub(super) fn forget(&self, key: &[u8]) {
        self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
    }

    /// Forgets every remembered value (after FLUSHALL).
    pub(super) fn forget_all(&self) {
        self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }
}

/// A linearizable read of `key`'s value and expiry: `(value, Some(expiry))`, the expiry known.
async fn read_with_expiry(
    client: &onekv_client::Client,
    key: &[u8],
) -> Result<(Option<Vec<u8>>, Option<Option<u64>>), ClientError> {
    Ok(match client.get_with_expiry(key).await? {
        Some((value, expiry)) => (Some(value), Some(expiry)),
        None => (None, Some(None)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::RespSettings;
    use std::time::Duration;

    #[test]
    fn a_panicking_driver_does_not_wedge_its_key() {
        let mut settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into());
        settings.client_options.max_attempts = 1;
        let context = RespContext::new(settings).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            // A remembered value lets the decision run before any network call.
            context.remember(b"k", Some(b"1"));
            let panicked =
                context.read_modify_write(b"k", false, |_, _| panic!("a decision that panics")).await;
            assert!(panicked.is_err());
            // The next command on the key gets a driver of its own and an answer (here an error:
            // nothing listens at the endpoint), instead of queueing forever.
            let next = tokio::time::timeout(
                Duration::from_secs(10),
                context.read_modify_write(b"k", false, |_, _| Ok(Change::Keep(Reply::ok()))),
            )
            .await
            .expect("the key is not wedged");
            assert!(next.is_err());
            assert!(context.shared.combining.lock().unwrap().is_empty());
        });
    }
}
