//! Files written whole or not at all: every file heapscope writes (an exported snapshot, a native trace, a PNG) is
//! written to a hidden sibling first and renamed over its path once complete, so that a failed write (a full disk, a
//! size limit, a bug half way) leaves neither a truncated file nor a lost one where the path named an older file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The hidden sibling `path` is written to before it is renamed: `.NAME.partial` in the same folder (a rename within a
/// folder replaces the file at once).
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] for a path that names no file (`/`, `..`).
pub fn partial_path(path: &Path) -> io::Result<PathBuf> {
    let name =
        path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names a folder, not a file"))?;
    let mut partial = std::ffi::OsString::from(".");
    partial.push(name);
    partial.push(".partial");
    Ok(path.with_file_name(partial))
}

/// Writes the file at `path` through `write`, whole or not at all: `write` fills a new file at [`partial_path`], which
/// is then renamed to `path`; on any failure the partial file is removed and `path` is as it was. A link is followed
/// (the file it names is replaced, beside it); what is not a file (`/dev/null`, a FIFO, `/dev/stdout`) is written in
/// place, as it holds nothing to keep and must not be replaced; a folder is an error.
///
/// # Errors
/// What `write` returns, or the I/O error of creating, flushing or renaming the file (the caller names `path`).
pub fn write_whole<E: From<io::Error>>(path: &Path, write: impl FnOnce(&mut File) -> Result<(), E>) -> Result<(), E> {
    let path = match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "a folder, not a file").into());
        }
        Ok(metadata) if !metadata.is_file() => {
            let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
            return write(&mut file);
        }
        Ok(_) => std::fs::canonicalize(path)?,
        Err(_) => path.to_path_buf(),
    };
    let path = path.as_path();
    let partial = partial_path(path)?;
    let mut file = create_partial(&partial)?;
    let written = write(&mut file).and_then(|()| file.sync_all().map_err(E::from));
    drop(file);
    match written.and_then(|()| std::fs::rename(&partial, path).map_err(E::from)) {
        Ok(()) => Ok(()),
        Err(error) => {
            // Best effort: the error that matters is the write's.
            let _ = std::fs::remove_file(&partial);
            Err(error)
        }
    }
}

/// A new, empty file at `partial`. What is there already (a partial file a killed run left) goes first, and the file
/// is created anew, never opened through what was there: a link or a second name of another file (the recording
/// read) would otherwise be written through and truncate it.
fn create_partial(partial: &Path) -> io::Result<File> {
    match std::fs::symlink_metadata(partial) {
        Ok(metadata) if metadata.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a folder is in the way at {}, where the file is written first", partial.display()),
            ));
        }
        // The link or name goes, not what it names.
        Ok(_) => std::fs::remove_file(partial)?,
        Err(_) => {}
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(partial)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_failed_write_leaves_the_file_as_it_was_and_no_partial_one() {
        let dir = std::env::temp_dir().join(format!("heapscope-whole-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.pickle");
        std::fs::write(&path, b"older").unwrap();
        let failed: io::Result<()> = write_whole(&path, |file| {
            file.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert_eq!(failed.unwrap_err().to_string(), "disk full");
        assert_eq!(std::fs::read(&path).unwrap(), b"older");
        assert!(!partial_path(&path).unwrap().exists());
        // A write that completes replaces the file.
        write_whole(&path, |file| file.write_all(b"newer")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"newer");
        assert!(!partial_path(&path).unwrap().exists());
        // A link is followed: the file it names is replaced, the link stays.
        let link = dir.join("link.pickle");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        write_whole(&link, |file| file.write_all(b"linked")).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&path).unwrap(), b"linked");
        // A partial file in the way (a killed run's, or planted: a link to another file, a second name of one) goes;
        // the file it named is left as it was. A folder in the way is named.
        let other = dir.join("recording.csv");
        std::fs::write(&other, b"a,1,4096\n").unwrap();
        let partial = partial_path(&path).unwrap();
        std::fs::hard_link(&other, &partial).unwrap();
        write_whole(&path, |file| file.write_all(b"through a second name")).unwrap();
        std::os::unix::fs::symlink(&other, &partial).unwrap();
        write_whole(&path, |file| file.write_all(b"through a link")).unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"a,1,4096\n");
        assert_eq!(std::fs::read(&path).unwrap(), b"through a link");
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
        std::fs::create_dir(&partial).unwrap();
        let blocked: io::Result<()> = write_whole(&path, |_| Ok(()));
        assert!(blocked.unwrap_err().to_string().starts_with("a folder is in the way at "));
        std::fs::remove_dir(&partial).unwrap();
        // What is not a file is written in place, never replaced.
        write_whole(Path::new("/dev/null"), |file| file.write_all(b"gone")).unwrap();
        assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
        let folder: io::Result<()> = write_whole(&dir, |_| Ok(()));
        assert_eq!(folder.unwrap_err().kind(), io::ErrorKind::IsADirectory);
        // A path that names no file is refused before anything is written.
        let nothing: io::Result<()> = write_whole(Path::new("/nonexistent-heapscope/.."), |_| Ok(()));
        assert!(nothing.is_err());
        std::fs::remove_dir_all(dir).ok();
    }
}
