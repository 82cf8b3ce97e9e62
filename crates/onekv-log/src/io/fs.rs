//! [`FsDir`]: the real file system.

use super::{Dir, File};
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory on the local file system.
#[derive(Debug, Clone)]
pub struct FsDir {
    path: PathBuf,
}

impl FsDir {
    /// Uses the directory at `path`, creating it (and its parents) if it does not exist.
    pub fn create_all(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        fs::create_dir_all(&path)?;
        // The directory's own name must be durable too before anything in it is.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::File::open(parent)?.sync_all()?;
        }
        Ok(Self { path })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[derive(Debug)]
struct FsFile(fs::File);

impl Dir for FsDir {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.path)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn File>> {
        let file =
            fs::OpenOptions::new().read(true).write(true).create_new(true).open(self.path.join(name))?;
        Ok(Arc::new(FsFile(file)))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn File>> {
        let file = fs::OpenOptions::new().read(true).write(true).open(self.path.join(name))?;
        Ok(Arc::new(FsFile(file)))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.path.join(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let target = self.path.join(to);
        // POSIX rename would replace `to`; the trait promises never to, so a caller's bug cannot
        // destroy a segment. (Not atomic with the rename, but the log is the directory's only
        // writer.)
        if fs::symlink_metadata(&target).is_ok() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, to.to_string()));
        }
        fs::rename(self.path.join(from), target)
    }

    fn sync(&self) -> io::Result<()> {
        fs::File::open(&self.path)?.sync_all()
    }
}

impl File for FsFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}
