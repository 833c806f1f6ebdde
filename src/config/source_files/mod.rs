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
//! the others. A reason never repeats the file ([`super::redact`]): it is
//! shown on `/status` and logged, and the file holds secrets. What needs
//! the providers (secrets against their scheme, the `api` table) and what
//! needs every source at once (a name or an account taken twice) is
//! checked where the sources are assembled (`app::sources`).

mod parse;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::SourceConfig;
use super::redact::Held;
use crate::domain::event::ProviderKind;
use parse::parse;

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
    /// What of it a reason must not repeat.
    held: Held,
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

    /// This file refused for `reason`, which passes the one check every
    /// refusal passes: what the file holds is taken out of it ([`Held`]).
    pub fn refused(&self, reason: &str) -> Refusal {
        Refusal {
            path: self.path.clone(),
            source: Some((self.provider, self.name.clone())),
            reason: self.held.scrub(reason),
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

/// The keys a provider's `api` table takes (its settings' and their path
/// names), by provider: the providers know them, config does not.
pub type ApiKeys = fn(ProviderKind) -> Vec<&'static str>;

/// Reads every source file of `dir`. Blocks on the file system.
///
/// # Errors
/// [`DirError`] when the directory cannot be listed.
pub fn read_dir(dir: &Path, api_keys: ApiKeys) -> Result<Listing, DirError> {
    let unreadable = |source| DirError {
        path: dir.to_owned(),
        source,
    };
    let mut paths = Vec::new();
    let mut listing = Listing::default();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if hidden || path.extension().is_none_or(|e| e != EXTENSION) {
            continue;
        }
        match unread(&path) {
            None => paths.push(path),
            Some(reason) => listing.refused.push(Refusal {
                path,
                source: None,
                reason: reason.to_owned(),
            }),
        }
    }
    paths.sort();
    for path in paths {
        match read_file(&path, api_keys) {
            Ok(file) => listing.files.push(file),
            Err(refusal) => listing.refused.push(refusal),
        }
    }
    listing.refused.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

/// Why an entry named like a source file is not read, if it is not: it
/// is said (on `/status`, once in the log) rather than passed over, so a
/// link gone dangling is not mistaken for a removed source. A link to a
/// file counts (a ConfigMap's keys are links into `..data`).
fn unread(path: &Path) -> Option<&'static str> {
    if path.file_name().and_then(|n| n.to_str()).is_none() {
        return Some("its name is not UTF-8: a source's name goes into its URL");
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => None,
        Ok(meta) if meta.is_dir() => Some("is a directory, not a source file"),
        // Read, a FIFO would block the read until a writer came.
        Ok(_) => Some("is not a regular file (a FIFO, a socket or a device): not read"),
        Err(_) if path.is_symlink() => {
            Some("is a link that leads to no file (its target is missing, or links loop)")
        }
        Err(_) => Some("cannot be looked at (its permissions, or it went meanwhile)"),
    }
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

/// The most a source file may hold. One source's settings take a few
/// hundred bytes; a file far larger is a mistake (a log or an archive
/// named like a source), and is refused without being read whole, so it
/// costs neither memory nor the time of the reads of every other file.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A file's bytes, at most [`MAX_FILE_BYTES`]; why not, when it is larger
/// or cannot be read.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let too_large = || {
        format!(
            "is larger than {} KiB: a source file holds one source's settings",
            MAX_FILE_BYTES / 1024
        )
    };
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if file.metadata().map_err(|e| e.to_string())?.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    // Read through a bound too: the file may grow while it is read.
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Reads and checks one file.
fn read_file(path: &Path, api_keys: ApiKeys) -> Result<SourceFile, Refusal> {
    let refused = |source: Option<(ProviderKind, String)>, reason: String| Refusal {
        path: path.to_owned(),
        source,
        reason,
    };
    let (provider, name) = named(path).map_err(|reason| refused(None, reason))?;
    let source = Some((provider, name.clone()));
    let bytes = read_bounded(path).map_err(|reason| refused(source.clone(), reason))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| refused(source.clone(), "is not UTF-8 text".to_owned()))?;
    let table = format!("{provider}.sources.{name}");
    let (held, parsed) = parse(text, &table, &api_keys(provider));
    let config = parsed.map_err(|reason| refused(source.clone(), held.scrub(&reason)))?;
    let problems = config.problems(&table, &name);
    if !problems.is_empty() {
        let reason = problems
            .into_iter()
            .map(|(at, message)| format!("{at}: {message}"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(refused(source, held.scrub(&reason)));
    }
    Ok(SourceFile {
        path: path.to_owned(),
        provider,
        name,
        config,
        digest: Sha256::digest(&bytes).into(),
        held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::api_keys;

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
        write(dir.path(), "receiptroller..toml", "secrets = [\"s\"]\n");
        // A file far larger than settings: refused, never read whole.
        let mut big = String::from("secrets = [\"s-of-the-big-one\"]\n");
        while big.len() as u64 <= MAX_FILE_BYTES {
            big.push_str("# a comment line that makes the file too large to be settings\n");
        }
        write(dir.path(), "mekari.big.toml", &big);
        // Not sources: another extension, a hidden file, a directory.
        write(dir.path(), "README.md", "the sources");
        write(dir.path(), ".mekari.hidden.toml", "secrets = [\"s\"]\n");
        std::fs::create_dir(dir.path().join("..data")).unwrap();

        let listing = read_dir(dir.path(), api_keys).unwrap();
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
        assert_eq!(
            reason("mekari.typo.toml"),
            "mekari.sources.typo: line 1, column 1: a key it does not take"
        );
        assert!(reason("square.shop.toml").contains("`square` is not a provider"));
        assert!(reason("shop.toml").contains("{provider}.{source}.toml"));
        assert!(reason("mekari.bad name.toml").contains("source names go into URLs"));
        assert!(
            reason("receiptroller..toml").contains("at least one"),
            "an empty source name: {}",
            reason("receiptroller..toml")
        );
        assert!(reason("mekari.big.toml").contains("larger than 1024 KiB"));
        assert_eq!(listing.refused.len(), 7, "{listing:?}");
    }

    /// A refusal is shown on `/status`, `/admin/sources` and in the log:
    /// it names the key and the kind of problem, never a value of the file
    /// nor a key no setting has (a secret pasted in the wrong place).
    #[test]
    fn a_refusal_quotes_no_value_of_the_file() {
        let secrets = "secrets = [\"s-1-long-enough\"]\n";
        // (source, text after `secrets`, what the reason names)
        let cases = [
            (
                "type",
                "tolerance_secs = \"s3cr3t-type\"",
                "mekari.sources.type.tolerance_secs",
            ),
            ("key", "s3cr3t-as-key = 1", "line 2, column 1"),
            (
                "scheme",
                "scheme = \"s3cr3t-scheme\"",
                "mekari.sources.scheme.scheme",
            ),
            (
                "header",
                "header = \"s3cr3t header\"",
                "mekari.sources.header.header",
            ),
            (
                "quoted-header",
                "header = 'a\"s3cr3t-header'",
                "mekari.sources.quoted-header.header",
            ),
            (
                "literal",
                "tolerance_secs = 'a\"s3cr3t-literal'",
                "mekari.sources.literal.tolerance_secs",
            ),
            (
                "escaped",
                "tolerance_secs = \"a\\\"s3cr3t-escaped\"",
                "mekari.sources.escaped.tolerance_secs",
            ),
            (
                "account",
                "account = \"s3cr3t:account\"",
                "mekari.sources.account.account",
            ),
            (
                "prefix",
                "topic_prefix = \"s3cr3t prefix.\"",
                "mekari.sources.prefix.topic_prefix",
            ),
            (
                "mode",
                "on_broker_unavailable = \"s3cr3t-mode\"",
                "mekari.sources.mode.on_broker_unavailable",
            ),
            (
                "table",
                "[api]\nbase_url = 's3cr3t-api'\n[api]",
                "line 4, column 2",
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (source, text, _) in cases {
            write(
                dir.path(),
                &format!("mekari.{source}.toml"),
                &format!("{secrets}{text}\n"),
            );
        }
        write(
            dir.path(),
            "mekari.syntax.toml",
            "secrets = [\"s3cr3t-unclosed\"\n",
        );
        let listing = read_dir(dir.path(), api_keys).unwrap();
        assert_eq!(listing.refused.len(), cases.len() + 1, "{listing:?}");
        let reason = |source: &str| {
            let path = dir.path().join(format!("mekari.{source}.toml"));
            let refusal = listing.refused.iter().find(|r| r.path == path);
            refusal.map_or_else(|| panic!("{source} not refused"), |r| r.reason.clone())
        };
        let mut wrong = Vec::new();
        for (source, _, named) in cases.iter().chain([&("syntax", "", "line 1, column 29")]) {
            let reason = reason(source);
            if reason.contains("s3cr3t") || !reason.contains(named) {
                wrong.push(format!("{source}: {reason}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "quoted a value or named no key:\n{}",
            wrong.join("\n")
        );
    }

    /// A refusal made after the file was read (Kafka's answer to its
    /// topics, say) passes the same check.
    #[test]
    fn a_later_refusal_is_scrubbed_of_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "mekari.shop-1.toml",
            "secrets = [\"s3cr3t-signing\"]\ntopic_prefix = \"s3cr3t.\"\n",
        );
        let listing = read_dir(dir.path(), api_keys).unwrap();
        let refusal = listing.files[0].refused(
            "mekari.sources.shop-1.topic_prefix: topic s3cr3t.sales: denied; s3cr3t-signing",
        );
        assert_eq!(
            refusal.reason,
            "mekari.sources.shop-1.topic_prefix: topic …sales: denied; …"
        );
    }

    /// An entry named like a source file that is not
    /// one to read is said with why, never passed over without a word.
    #[test]
    fn entries_that_cannot_be_read_are_said() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::os::unix::fs::symlink(at("missing"), at("mekari.dangling.toml")).unwrap();
        std::os::unix::fs::symlink(at("mekari.loop-b.toml"), at("mekari.loop-a.toml")).unwrap();
        std::os::unix::fs::symlink(at("mekari.loop-a.toml"), at("mekari.loop-b.toml")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(at("mekari.fifo.toml"))
            .status()
            .unwrap();
        assert!(fifo.success());
        let odd = std::ffi::OsStr::from_bytes(b"mekari.caf\xe9.toml");
        std::fs::write(dir.path().join(odd), "secrets = [\"s1-long-enough\"]\n").unwrap();
        let listing = read_dir(dir.path(), api_keys).unwrap();
        let said: Vec<(PathBuf, &str)> = listing
            .refused
            .iter()
            .map(|r| (r.path.clone(), r.reason.as_str()))
            .collect();
        assert_eq!(listing.refused.len(), 5, "{said:?}");
        for (path, reason) in &said {
            let expected = match path.file_name().and_then(|n| n.to_str()) {
                Some("mekari.dangling.toml" | "mekari.loop-a.toml" | "mekari.loop-b.toml") => {
                    "a link that leads to no file"
                }
                Some("mekari.fifo.toml") => "not a regular file",
                _ => "not UTF-8",
            };
            assert!(reason.contains(expected), "{path:?}: {reason}");
        }
    }

    #[test]
    fn a_file_read_again_unchanged_has_the_same_digest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "mekari.a.toml", "secrets = [\"s1\"]\n");
        let first = read_dir(dir.path(), api_keys).unwrap().files[0].digest;
        assert_eq!(
            read_dir(dir.path(), api_keys).unwrap().files[0].digest,
            first
        );
        write(dir.path(), "mekari.a.toml", "secrets = [\"s2\"]\n");
        assert_ne!(
            read_dir(dir.path(), api_keys).unwrap().files[0].digest,
            first
        );
    }

    #[test]
    fn a_missing_directory_is_said_with_its_path() {
        let error = read_dir(Path::new("/nonexistent/sources"), api_keys).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/sources"));
    }
}
