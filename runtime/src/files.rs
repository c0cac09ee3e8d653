//! Files that hold a secret (a private key, a token, a kubeconfig with a
//! token in it), written so that only their owner may read them: mode
//! 0600 from the first byte, whether or not a file was there before, and
//! replaced whole, so a reader never sees half of one.

use std::io::Write as _;
use std::path::Path;

/// Writes `contents` to `path`, readable and writable by its owner only.
///
/// The bytes go into a new file beside `path` (made 0600, so they are never
/// readable by others, even for a moment) that is then renamed over it: a
/// file left by an earlier run with a looser mode is replaced, not
/// reopened, and a reader sees the old contents or the new, never a part.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".{}.partial", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&partial)?;
        // A partial file left by a crash keeps its mode on open.
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions())
            & 0o777
    }

    #[test]
    fn a_secret_is_private_new_or_replacing_a_readable_file() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.key");
        write_private(&new, b"key").unwrap();
        assert_eq!(
            (std::fs::read(&new).unwrap(), mode(&new)),
            (b"key".to_vec(), 0o600)
        );

        let old = dir.path().join("old.token");
        std::fs::write(&old, "old").unwrap();
        std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        write_private(&old, b"new").unwrap();
        assert_eq!(
            (std::fs::read(&old).unwrap(), mode(&old)),
            (b"new".to_vec(), 0o600)
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no partial file left behind"
        );
    }
}
