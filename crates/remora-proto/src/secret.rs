//! Files that hold secrets: the cluster key, a node's TLS private key, the
//! manager's store (region tokens and session secrets). Each is created
//! readable by its owner only from its first byte, and one that anyone
//! else can read or write is refused, as ssh refuses a private key that is
//! too open: a secret others could have copied is not a secret.

use std::io;
use std::path::{Path, PathBuf};

/// A secret file that users other than its owner can read or write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} has mode {mode:o}: users other than its owner can read or change it (chmod 600 it)")]
pub struct Exposed {
    /// The file.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// Refuses `path` if its group or others have any permission on it. A file
/// that cannot be examined passes: reading it next reports why.
pub fn check_private(path: &Path) -> Result<(), Exposed> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(Exposed {
                    path: path.to_path_buf(),
                    mode,
                });
            }
        }
    }
    Ok(())
}

/// Creates `path` empty and readable by its owner only, unless it exists.
pub fn create_private(path: &Path) -> io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        create_private(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(check_private(&p), Ok(()));
        for mode in [0o640, 0o604, 0o620, 0o644] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_private(&p).unwrap_err();
            assert_eq!(e.mode, mode);
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        // An existing file is left as it is.
        create_private(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644);
    }
}
