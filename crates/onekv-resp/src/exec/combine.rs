//! The read-modify-write combiner: per key, while one compare-and-swap is in flight, later commands
//! queue, and the next swap applies them all in arrival order (see the parent module's docs). Also
//! the node's memory of short values after a swap, so the next read-modify-write of a key can try
//! its swap without reading first.

use onekv_client::ClientError;
use std::time::Duration;

use rand::Rng as _;

use super::{Outcome, RespContext};
use crate::protocol::Reply;

/// Compare-and-swap attempts of one read-modify-write command before it reports contention.
pub(super) const RMW_MAX_ATTEMPTS: u32 = 32;
/// Values this short are remembered after a successful swap, so the next read-modify-write of the
/// key (a counter, typically) can try its swap without reading first. A stale memory costs one
/// failed swap, which returns the current value: never a wrong result.
const REMEMBERED_VALUE_BYTES: usize = 32;
/// Most remembered values; the memory is cleared when it is full.
const REMEMBERED_VALUES: usize = 65_536;

/// What a read-modify-write decides from the value it found.
pub(super) enum Change {
    /// Swap in this value (`None`: delete) and answer this.
    Write(Option<Vec<u8>>, Reply),
    /// Write nothing and answer this.
    Keep(Reply),
}

/// A read-modify-write's decision: a pure function of the value found (it may run several times).
pub(super) type Decide = Box<dyn FnMut(Option<&[u8]>) -> Outcome<Change> + Send>;

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
    answer: tokio::sync::oneshot::Sender<Outcome>,
}

impl RespContext {
    /// Runs `decide` on `key`'s value and swaps in its choice, combined with the other
    /// read-modify-writes of the key that this node has in flight (see the module docs).
    pub(super) async fn read_modify_write(
        &self,
        key: &[u8],
        decide: impl FnMut(Option<&[u8]>) -> Outcome<Change> + Send + 'static,
    ) -> Outcome {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let pending = Pending { decide: Box::new(decide), answer };
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
        // A remembered value is a guess: only a successful swap confirms it. Answers that write
        // nothing are only given from a value really read.
        let mut guessed = true;
        let mut current = self.remembered(key);
        if current.is_none() {
            current = client.get(key).await?;
            guessed = false;
        }
        for attempt in 0..RMW_MAX_ATTEMPTS {
            let mut value = current.clone();
            let mut writes = false;
            let mut answers = Vec::with_capacity(batch.len());
            for pending in batch.iter_mut() {
                answers.push(match (pending.decide)(value.as_deref()) {
                    Ok(Change::Write(new, answer)) => {
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
                current = client.get(key).await?;
                guessed = false;
                continue;
            }
            current = match client.cas(key, current.as_deref(), value.as_deref()).await {
                Ok(outcome) if outcome.swapped => {
                    self.remember(key, value.as_deref());
                    return Ok(answers);
                }
                Ok(outcome) => outcome.current,
                // An attempt did not swap and its answer was lost: nothing was written; read again.
                Err(ClientError::NotApplied(_)) => client.get(key).await?,
                Err(error) => return Err(error.into()),
            };
            guessed = false;
            self.forget(key);
            if attempt >= 2 {
                // Another node's clients are changing the key too: spread the retries out.
                let millis = rand::rng().random_range(1..=2u64 << attempt.min(5));
                tokio::time::sleep(Duration::from_millis(millis)).await;
            }
        }
        Err(Reply::err(format!(
            "onekv: the key changed under {RMW_MAX_ATTEMPTS} compare-and-swap attempts in a row; try again"
        )))
    }

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
            let panicked = context.read_modify_write(b"k", |_| panic!("a decision that panics")).await;
            assert!(panicked.is_err());
            // The next command on the key gets a driver of its own and an answer (here an error:
            // nothing listens at the endpoint), instead of queueing forever.
            let next = tokio::time::timeout(
                Duration::from_secs(10),
                context.read_modify_write(b"k", |_| Ok(Change::Keep(Reply::ok()))),
            )
            .await
            .expect("the key is not wedged");
            assert!(next.is_err());
            assert!(context.shared.combining.lock().unwrap().is_empty());
        });
    }
}
