//! A sources directory (`sources_dir`): one file per source, named
//! `{provider}.{source}.toml`, holding exactly what a
//! `[{provider}.sources.{source}]` table of the main file holds. A mounted
//! ConfigMap or Secret fits it: its keys are the files, and names that
//! start with `.` (Kubernetes' `..data` link and its timestamped
//! directories) are not sources.
//!
//! Reading the directory is plain data work: each file is parsed and checked
//! alone (what [`SourceConfig::problems`] checks); a file that does not
//! parse or check is refused with its path and the reason, and never stops
//! the others. What needs the providers (secrets against their scheme, the
//! `api` table) and what needs every source at once (a name or an account
//! taken twice) is checked where the sources are assembled (`app::sources`).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::SourceConfig;
use crate::domain::event::ProviderKind;

/// The extension of a source file.
pub const EXTENSION: &str = "toml";

/// One source file that parsed and checked.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its provider, from its name.
    pub provider: ProviderKind,
    /// Its source name (the `{source}` in its URL), from its name.
    pub name: String,
    /// What it holds.
    pub config: SourceConfig,
    /// A digest of its bytes: a file read again unchanged keeps the source
    /// as it runs.
    pub digest: [u8; 32],
}

impl SourceFile {
    /// The source it holds, as the main file's sources are seen.
    pub fn entry(&self) -> super::SourceEntry<'_> {
        super::SourceEntry {
            provider: self.provider,
            name: &self.name,
            config: &self.config,
        }
    }
}

/// A file in the directory that is not taken, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Where it is.
    pub path: PathBuf,
    /// Its provider and source name, when its file name says them.
    pub source: Option<(ProviderKind, String)>,
    /// What is wrong, in the words `check-config` uses.
    pub reason: String,
}

/// What one read of the directory found, in file name order.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The files that parsed and checked.
    pub files: Vec<SourceFile>,
    /// The files refused.
    pub refused: Vec<Refusal>,
}

/// Why the directory itself could not be read (its files' own faults are
/// [`Refusal`]s).
#[derive(Debug, thiserror::Error)]
#[error("cannot read the sources directory {}: {source}", .path.display())]
pub struct DirError {
    /// The directory.
    pub path: PathBuf,
    /// What the system said.
    #[source]
    pub source: std::io::Error,
}

/// Reads every source file of `dir`. Blocks on the file system.
///
/// # Errors
/// [`DirError`] when the directory cannot be listed.
pub fn read_dir(dir: &Path) -> Result<Listing, DirError> {
    let unreadable = |source| DirError {
        path: dir.to_owned(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let named = path.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        // A link to a file counts (a ConfigMap's keys are links into `..data`).
        if !named.starts_with('.')
            && path.extension().is_some_and(|e| e == EXTENSION)
            && path.is_file()
        {
            paths.push(path);
        }
    }
    paths.sort();
    let mut listing = Listing::default();
    for path in paths {
        match read_file(&path) {
            Ok(file) => listing.files.push(file),
            Err(refusal) => listing.refused.push(refusal),
        }
    }
    Ok(listing)
}

/// The provider and source name a file's name gives, or why it gives none.
pub fn named(path: &Path) -> Result<(ProviderKind, String), String> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let Some((provider, name)) = stem.split_once('.') else {
        return Err(format!(
            "a source file is named {{provider}}.{{source}}.{EXTENSION} (mekari.shop-12.{EXTENSION})"
        ));
    };
    let Some(provider) = ProviderKind::parse(provider) else {
        let known: Vec<&str> = ProviderKind::ALL.iter().map(|p| p.as_str()).collect();
        return Err(format!(
            "`{provider}` is not a provider; a source file's name starts with one of {}",
            known.join(", ")
        ));
    };
    Ok((provider, name.to_owned()))
}

/// Reads and checks one file.
fn read_file(path: &Path) -> Result<SourceFile, Refusal> {
    let refused = |source: Option<(ProviderKind, String)>, reason: String| Refusal {
        path: path.to_owned(),
        source,
        reason,
    };
    let (provider, name) = named(path).map_err(|reason| refused(None, reason))?;
    let source = Some((provider, name.clone()));
    let bytes = std::fs::read(path).map_err(|e| refused(source.clone(), e.to_string()))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| refused(source.clone(), "is not UTF-8 text".to_owned()))?;
    let config = parse(text).map_err(|reason| refused(source.clone(), reason))?;
    let key = format!("{provider}.sources.{name}");
    let problems = config.problems(&key, &name);
    if !problems.is_empty() {
        let reason = problems
            .into_iter()
            .map(|(at, message)| format!("{at}: {message}"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(refused(source, reason));
    }
    Ok(SourceFile {
        path: path.to_owned(),
        provider,
        name,
        config,
        digest: Sha256::digest(&bytes).into(),
    })
}

/// A source table from TOML text, read as the main file's tables are.
/// Why not, without the file's values: the reason is shown on `/status`
/// and `/admin/sources`, and the file holds secrets.
fn parse(text: &str) -> Result<SourceConfig, String> {
    config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| without_values(&e.to_string()))
}

/// A parser's message without what it quotes of the file: the excerpt
/// lines (`2 | secrets = …`) dropped, quoted values replaced by `"…"`.
fn without_values(message: &str) -> String {
    let kept: Vec<&str> = message
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !line.starts_with('|')
                && line
                    .split_once('|')
                    .is_none_or(|(number, _)| number.trim().parse::<u32>().is_err())
        })
        .collect();
    let mut out = String::new();
    for (n, part) in kept.join(" ").split('"').enumerate() {
        if n % 2 == 1 {
            out.push_str("\"…\"");
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn each_file_is_a_source_and_a_bad_one_is_refused_alone() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "mekari.shop-1.toml",
            "secrets = [\"s1\"]\naccount = \"acc-1\"\n",
        );
        write(
            dir.path(),
            "receiptroller.store_2.toml",
            "secrets = [\"s2\"]\non_broker_unavailable = \"spool\"\n",
        );
        write(dir.path(), "mekari.no-secret.toml", "account = \"acc-3\"\n");
        write(dir.path(), "mekari.typo.toml", "secret = [\"s\"]\n");
        write(dir.path(), "square.shop.toml", "secrets = [\"s\"]\n");
        write(dir.path(), "shop.toml", "secrets = [\"s\"]\n");
        write(dir.path(), "mekari.bad name.toml", "secrets = [\"s\"]\n");
        // Not sources: another extension, a hidden file, a directory.
        write(dir.path(), "README.md", "the sources");
        write(dir.path(), ".mekari.hidden.toml", "secrets = [\"s\"]\n");
        std::fs::create_dir(dir.path().join("..data")).unwrap();

        let listing = read_dir(dir.path()).unwrap();
        let taken: Vec<(ProviderKind, &str)> = listing
            .files
            .iter()
            .map(|f| (f.provider, f.name.as_str()))
            .collect();
        assert_eq!(
            taken,
            [
                (ProviderKind::Mekari, "shop-1"),
                (ProviderKind::ReceiptRoller, "store_2")
            ]
        );
        assert_eq!(listing.files[0].config.account.as_deref(), Some("acc-1"));
        let reason = |file: &str| {
            listing
                .refused
                .iter()
                .find(|r| r.path == dir.path().join(file))
                .map(|r| r.reason.clone())
                .unwrap_or_else(|| panic!("{file} not refused: {listing:?}"))
        };
        assert!(
            reason("mekari.no-secret.toml").starts_with("mekari.sources.no-secret.secrets: "),
            "{}",
            reason("mekari.no-secret.toml")
        );
        assert!(reason("mekari.typo.toml").contains("unknown field `secret`"));
        assert!(reason("square.shop.toml").contains("`square` is not a provider"));
        assert!(reason("shop.toml").contains("{provider}.{source}.toml"));
        assert!(reason("mekari.bad name.toml").contains("source names go into URLs"));
        assert_eq!(listing.refused.len(), 5, "{listing:?}");
    }

    /// A refusal is shown on `/status`: it never quotes the file's values.
    #[test]
    fn a_refusal_quotes_no_value_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "mekari.a.toml",
            "secrets = [\"s-1-long-enough\"]\ntolerance_secs = \"the-secret-value\"\n",
        );
        write(
            dir.path(),
            "mekari.b.toml",
            "secrets = [\"the-secret-value\"\n",
        );
        write(
            dir.path(),
            "mekari.c.toml",
            "secrets = [\"the-secret-value\"]\nsecret = 1\n",
        );
        let listing = read_dir(dir.path()).unwrap();
        assert_eq!(listing.refused.len(), 3, "{listing:?}");
        for refusal in &listing.refused {
            assert!(!refusal.reason.contains("the-secret"), "{refusal:?}");
            assert!(!refusal.reason.is_empty());
        }
    }

    #[test]
    fn a_file_read_again_unchanged_has_the_same_digest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "mekari.a.toml", "secrets = [\"s1\"]\n");
        let first = read_dir(dir.path()).unwrap().files[0].digest;
        assert_eq!(read_dir(dir.path()).unwrap().files[0].digest, first);
        write(dir.path(), "mekari.a.toml", "secrets = [\"s2\"]\n");
        assert_ne!(read_dir(dir.path()).unwrap().files[0].digest, first);
    }

    #[test]
    fn a_missing_directory_is_said_with_its_path() {
        let error = read_dir(Path::new("/nonexistent/sources")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/sources"));
    }
}
