//! Secrets from files: what a source's `secrets_files` and `secrets_dir`
//! hold, read at start-up and again while serving whenever they change
//! (`watch.rs`), so a secret rotates without a restart.
//!
//! Each non-empty line of a file is one secret (surrounding whitespace and
//! the final newline are not part of it). A Kubernetes Secret mounted as a
//! volume is a directory whose files are symbolic links into `..data`,
//! itself a link to a timestamped directory that the kubelet swaps in one
//! rename on every update: read through the links, a directory shows the
//! whole old Secret or the whole new one, never half of each. Names that
//! start with `.` (`..data` and the timestamped directories) are not keys,
//! and a link whose target is gone is a key being taken out (the kubelet
//! removes the link just after the swap), so both are passed over.

mod watch;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::SourceConfig;
use crate::domain::secret::Secret;
use crate::domain::verify::SchemeName;
use crate::domain::verify::SecretError;

pub use watch::{ReloadRequest, SecretFiles};

/// Where a secret was found, for messages and config key paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `secrets[i]` in the configuration.
    Inline(usize),
    /// The file `secrets_files[i]`.
    File(usize, PathBuf),
    /// A file of `secrets_dir`.
    Dir(PathBuf),
}

impl Origin {
    /// The key path under the source: `secrets[0]`, `secrets_files[1]`, `secrets_dir`.
    pub fn key(&self) -> String {
        match self {
            Origin::Inline(i) => format!("secrets[{i}]"),
            Origin::File(i, _) => format!("secrets_files[{i}]"),
            Origin::Dir(_) => "secrets_dir".to_owned(),
        }
    }
}

/// By its key, not its path: the path is a value of the source's table,
/// and a source file's values are not repeated (its refusals are shown on
/// `/status`). A file of `secrets_dir` is named by its name there.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Inline(_) | Origin::File(..) => f.write_str(&self.key()),
            Origin::Dir(path) => {
                let name = path.file_name().unwrap_or_default();
                write!(f, "{} (its file {})", self.key(), name.display())
            }
        }
    }
}

/// One secret and where it came from.
#[derive(Debug, Clone)]
pub struct Found {
    /// Where it was read.
    pub origin: Origin,
    /// The secret.
    pub secret: Secret,
}

/// Why a source's secret files could not be read. The secrets in use stay.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A file could not be read (missing, no permission, not text).
    #[error("cannot read {origin}: {source}")]
    File {
        /// Which file.
        origin: Origin,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// `secrets_dir` could not be listed.
    #[error("cannot list secrets_dir: {source}")]
    Dir {
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// Every file read, and none held a secret: an empty set would refuse
    /// every delivery, which no rotation means to do.
    #[error("the secret files hold no secret")]
    Empty,
}

impl ReadError {
    /// The key path under the source that the problem is at.
    pub fn key(&self) -> String {
        match self {
            ReadError::File { origin, .. } => origin.key(),
            ReadError::Dir { .. } => "secrets_dir".to_owned(),
            ReadError::Empty => "secrets".to_owned(),
        }
    }
}

/// Why a source's secrets cannot be put in use.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The files could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A secret does not fit the source's signature scheme.
    #[error("{origin}: {source}")]
    Unfit {
        /// Where it was read.
        origin: Origin,
        /// What is wrong with it.
        #[source]
        source: SecretError,
    },
}

impl LoadError {
    /// The key path under the source that the problem is at.
    pub fn key(&self) -> String {
        match self {
            LoadError::Read(error) => error.key(),
            LoadError::Unfit { origin, .. } => origin.key(),
        }
    }
}

/// Every secret of a source: its `secrets`, then each of its
/// `secrets_files`, then the files of its `secrets_dir` by name; each
/// secret once, where it was first found.
///
/// # Errors
/// A [`ReadError`] when a file or the directory cannot be read, or when the
/// files hold no secret and the configuration none either.
pub fn read(source: &SourceConfig) -> Result<Vec<Found>, ReadError> {
    let mut found = Vec::new();
    let mut add = |origin: Origin, secret: &str| {
        if !found.iter().any(|f: &Found| f.secret.expose() == secret) {
            found.push(Found {
                origin,
                secret: Secret::new(secret.to_owned()),
            });
        }
    };
    for (i, secret) in source.secrets.0.iter().enumerate() {
        add(Origin::Inline(i), secret.expose());
    }
    for (i, path) in source.secrets_files.iter().enumerate() {
        let origin = Origin::File(i, path.clone());
        let text = std::fs::read_to_string(path).map_err(|source| ReadError::File {
            origin: origin.clone(),
            source,
        })?;
        for line in lines(&text) {
            add(origin.clone(), line);
        }
    }
    if let Some(dir) = &source.secrets_dir {
        for path in keys_in(dir)? {
            let origin = Origin::Dir(path.clone());
            match std::fs::read_to_string(&path) {
                Ok(text) => lines(&text).for_each(|line| add(origin.clone(), line)),
                // Listed a moment ago, gone now, or a link to nothing: a key
                // being taken out, not a file that cannot be read.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(ReadError::File { origin, source }),
            }
        }
    }
    if found.is_empty() && source.reads_secret_files() {
        return Err(ReadError::Empty);
    }
    Ok(found)
}

/// The secrets of `found`, in its order: what a [`crate::domain::verify::Verifier`]
/// is built from or given.
pub fn secrets_of(found: &[Found]) -> Vec<Secret> {
    found.iter().map(|f| f.secret.clone()).collect()
}

/// A secret of `found` the verifier refused (by its index), named by where
/// it was read. [`load`] checked each against the scheme already, so the
/// verifier refusing one means the two disagree.
pub fn unfit(found: &[Found], (index, source): (usize, SecretError)) -> LoadError {
    LoadError::Unfit {
        origin: found[index].origin.clone(),
        source,
    }
}

/// Reads a source's secrets and checks each against its scheme.
///
/// # Errors
/// A [`LoadError`]: the first file that cannot be read or secret that does not fit.
pub fn load(source: &SourceConfig, scheme: SchemeName) -> Result<Vec<Found>, LoadError> {
    let found = read(source)?;
    if let Some((origin, source)) = found
        .iter()
        .find_map(|f| Some((f.origin.clone(), scheme.key(f.secret.expose()).err()?)))
    {
        return Err(LoadError::Unfit { origin, source });
    }
    Ok(found)
}

/// The files of `dir` that may be keys, by name: not those whose names
/// start with `.`, nor directories (a link is followed to see which it is).
fn keys_in(dir: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let listed = |source| ReadError::Dir { source };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listed)? {
        let entry = entry.map_err(listed)?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        if !path.is_dir() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(str::trim).filter(|line| !line.is_empty())
}

#[cfg(test)]
pub(crate) mod tests;
