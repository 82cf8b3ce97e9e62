//! [`MemDir`]: files in memory, with a model of what a crash keeps.
//!
//! Each file remembers two versions of itself: what readers see now, and what is durable (the
//! state at its last `sync_data`). The directory likewise remembers which names were durable at its
//! last `sync`. [`MemDir::crash`] throws away everything not durable, except that, depending on the
//! [`CrashMode`], some unsynced bytes may survive: a torn prefix of what was written since the last
//! sync, or any mix of 512-byte sectors old and new (as a disk that writes back pages out of order
//! would leave them). Handles opened before a crash fail every operation afterwards, so a log that
//! was still running cannot scribble over the state a test reopens.

use super::{Dir, File};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const SECTOR: usize = 512;

/// What survives of unsynced writes when [`MemDir::crash`] runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CrashMode {
    /// Nothing that was not synced.
    LoseUnsynced,
    /// A random-length prefix of the bytes written since the last sync (a torn append).
    TornPrefix,
    /// Each unsynced sector independently old or new, and the length old or new.
    ScrambleSectors,
}

/// An in-memory directory; clones share the same files.
#[derive(Clone, Default)]
pub struct MemDir {
    state: Arc<Mutex<DirState>>,
}

impl std::fmt::Debug for MemDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        let files = state.names.iter().map(|(name, file)| (name, lock(&file.contents).data.len()));
        f.debug_map().entries(files).finish()
    }
}

#[derive(Default)]
struct DirState {
    names: BTreeMap<String, Arc<MemFile>>,
    durable_names: BTreeMap<String, Arc<MemFile>>,
}

#[derive(Default)]
struct MemFile {
    contents: Mutex<Contents>,
    /// Set by a crash: the process that held this handle is gone.
    dead: AtomicBool,
}

#[derive(Debug, Default, Clone)]
struct Contents {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Lowest offset that may differ between `data` and `durable`.
    dirty_from: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a test bug; the data is still consistent enough
    // to keep reporting on it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn crashed() -> io::Error {
    io::Error::other("simulated crash: this handle belongs to a process that is gone")
}

impl MemDir {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Simulates power loss: every name and byte not made durable is lost, except for what `mode`
    /// lets survive (chosen by a generator seeded with `seed`). Handles opened before fail from
    /// now on; open the directory again to see what survived.
    pub fn crash(&self, mode: CrashMode, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut state = lock(&self.state);
        let mut survivors = BTreeMap::new();
        for (name, file) in &state.durable_names {
            file.dead.store(true, Ordering::SeqCst);
            let contents = lock(&file.contents).clone();
            let data = after_crash(&contents, mode, &mut rng);
            let fresh = MemFile {
                contents: Mutex::new(Contents { durable: data.clone(), dirty_from: data.len(), data }),
                dead: AtomicBool::new(false),
            };
            survivors.insert(name.clone(), Arc::new(fresh));
        }
        for file in state.names.values() {
            file.dead.store(true, Ordering::SeqCst);
        }
        state.names = survivors.clone();
        state.durable_names = survivors;
    }

    /// A copy of a file's current contents (test helper).
    pub fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        let state = lock(&self.state);
        state.names.get(name).map(|f| lock(&f.contents).data.clone())
    }

    /// Replaces a file's contents, durably (test helper for corrupting bytes at rest).
    pub fn write_file(&self, name: &str, data: Vec<u8>) {
        let mut state = lock(&self.state);
        let file = Arc::new(MemFile {
            contents: Mutex::new(Contents { durable: data.clone(), dirty_from: data.len(), data }),
            dead: AtomicBool::new(false),
        });
        if let Some(old) = state.names.insert(name.to_string(), file.clone()) {
            old.dead.store(true, Ordering::SeqCst);
        }
        state.durable_names.insert(name.to_string(), file);
    }
}

fn after_crash(c: &Contents, mode: CrashMode, rng: &mut StdRng) -> Vec<u8> {
    let old = &c.durable;
    let new = &c.data;
    let from = c.dirty_from.min(old.len()).min(new.len());
    let new_byte = |i: usize| new.get(i).copied().unwrap_or(0);
    match mode {
        CrashMode::LoseUnsynced => old.clone(),
        CrashMode::TornPrefix => {
            let cut = rng.random_range(from..=new.len().max(from));
            let mut out = old.clone();
            if out.len() < cut {
                out.resize(cut, 0);
            }
            for (i, b) in out.iter_mut().enumerate().take(cut).skip(from) {
                *b = new_byte(i);
            }
            out
        }
        CrashMode::ScrambleSectors => {
            let len = if rng.random_bool(0.5) { old.len() } else { new.len() };
            let mut out = old.clone();
            out.resize(len, 0);
            let mut start = from - from % SECTOR;
            while start < len {
                let end = (start + SECTOR).min(len);
                if rng.random_bool(0.5) {
                    for (i, b) in out.iter_mut().enumerate().take(end).skip(start.max(from)) {
                        *b = new_byte(i);
                    }
                }
                start = end;
            }
            out
        }
    }
}

impl Dir for MemDir {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(lock(&self.state).names.keys().cloned().collect())
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn File>> {
        let mut state = lock(&self.state);
        if state.names.contains_key(name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, name.to_string()));
        }
        let file = Arc::new(MemFile::default());
        state.names.insert(name.to_string(), file.clone());
        Ok(file)
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn File>> {
        let state = lock(&self.state);
        match state.names.get(name) {
            Some(file) => Ok(file.clone()),
            None => Err(io::Error::new(io::ErrorKind::NotFound, name.to_string())),
        }
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut state = lock(&self.state);
        match state.names.remove(name) {
            Some(_) => Ok(()),
            None => Err(io::Error::new(io::ErrorKind::NotFound, name.to_string())),
        }
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut state = lock(&self.state);
        if state.names.contains_key(to) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, to.to_string()));
        }
        let file = state
            .names
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_string()))?;
        state.names.insert(to.to_string(), file);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.durable_names = state.names.clone();
        Ok(())
    }
}

impl std::fmt::Debug for MemFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemFile({} bytes)", lock(&self.contents).data.len())
    }
}

impl MemFile {
    fn live(&self) -> io::Result<MutexGuard<'_, Contents>> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(crashed());
        }
        Ok(lock(&self.contents))
    }
}

impl File for MemFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let c = self.live()?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| c.data.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut c = self.live()?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = start + buf.len();
        if c.data.len() < end {
            c.data.resize(end, 0);
        }
        c.data[start..end].copy_from_slice(buf);
        c.dirty_from = c.dirty_from.min(start);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut c = self.live()?;
        let from = c.dirty_from.min(c.durable.len()).min(c.data.len());
        c.durable.truncate(from);
        let tail = c.data[from..].to_vec();
        c.durable.extend_from_slice(&tail);
        c.dirty_from = c.data.len();
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.live()?.data.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut c = self.live()?;
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        c.data.resize(len, 0);
        c.dirty_from = c.dirty_from.min(len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_synced_bytes_and_names_only() {
        let dir = MemDir::new();
        let a = dir.create("a").unwrap();
        a.write_all_at(b"durable", 0).unwrap();
        a.sync_data().unwrap();
        dir.sync().unwrap();
        a.write_all_at(b"-lost", 7).unwrap();
        dir.create("b").unwrap();
        dir.crash(CrashMode::LoseUnsynced, 1);
        assert_eq!(dir.list().unwrap(), vec!["a".to_string()]);
        assert_eq!(dir.read_file("a").unwrap(), b"durable");
        assert!(a.size().is_err(), "old handles are dead after a crash");
    }

    #[test]
    fn torn_prefix_keeps_synced_bytes_and_a_prefix_of_the_rest() {
        for seed in 0..50 {
            let dir = MemDir::new();
            let f = dir.create("f").unwrap();
            dir.sync().unwrap();
            f.write_all_at(&[1; 100], 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(&[2; 1000], 100).unwrap();
            dir.crash(CrashMode::TornPrefix, seed);
            let data = dir.read_file("f").unwrap();
            assert!(data.len() >= 100 && data.len() <= 1100);
            assert!(data[..100].iter().all(|&b| b == 1));
            assert!(data[100..].iter().all(|&b| b == 2));
        }
    }

    #[test]
    fn scramble_never_touches_synced_bytes() {
        for seed in 0..50 {
            let dir = MemDir::new();
            let f = dir.create("f").unwrap();
            dir.sync().unwrap();
            f.write_all_at(&[1; 700], 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(&[2; 3000], 700).unwrap();
            dir.crash(CrashMode::ScrambleSectors, seed);
            let data = dir.read_file("f").unwrap();
            assert!(data.len() == 700 || data.len() == 3700);
            assert!(data[..700].iter().all(|&b| b == 1));
            assert!(data[700..].iter().all(|&b| b == 2 || b == 0));
        }
    }
}
