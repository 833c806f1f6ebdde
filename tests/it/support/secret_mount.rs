//! A directory laid out as the kubelet mounts a Kubernetes Secret, and
//! updated as the kubelet updates it. The secret files' unit tests
//! (`src/adapters/secrets/tests.rs`) use this file too.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Each key a link `key -> ..data/key`; `..data` a link to the version
/// directory (`..v1`, `..v2`, …) that holds the files.
pub struct SecretMount {
    dir: PathBuf,
    version: u32,
}

impl SecretMount {
    /// Creates the mount at `dir` (which must not exist) with `keys`.
    pub fn new<V: AsRef<[u8]>>(dir: &Path, keys: &[(&str, V)]) -> SecretMount {
        std::fs::create_dir(dir).unwrap();
        let mut mount = SecretMount {
            dir: dir.to_owned(),
            version: 0,
        };
        mount.update(keys);
        mount
    }

    /// Where it is, for `secrets_dir`.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The kubelet's update: the new version written beside the old, `..data`
    /// swapped to it in one rename, links made for new keys, then the links
    /// of removed keys and the old version deleted.
    pub fn update<V: AsRef<[u8]>>(&mut self, keys: &[(&str, V)]) {
        let dir = &self.dir;
        let old = format!("..v{}", self.version);
        self.version += 1;
        let new = format!("..v{}", self.version);
        std::fs::create_dir(dir.join(&new)).unwrap();
        for (key, value) in keys {
            std::fs::write(dir.join(&new).join(key), value).unwrap();
        }
        symlink(&new, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        for (key, _) in keys {
            if std::fs::symlink_metadata(dir.join(key)).is_err() {
                symlink(Path::new("..data").join(key), dir.join(key)).unwrap();
            }
        }
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if !name.starts_with('.') && !keys.iter().any(|(key, _)| *key == name) {
                std::fs::remove_file(dir.join(name)).unwrap();
            }
        }
        if dir.join(&old).exists() {
            std::fs::remove_dir_all(dir.join(old)).unwrap();
        }
    }
}
