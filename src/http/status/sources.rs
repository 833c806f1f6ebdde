//! What `/admin/sources` and the status page show of the sources: where
//! each came from, when it was read, why a file is refused. Never a secret.

use std::path::PathBuf;

use time::OffsetDateTime;

use crate::domain::event::ProviderKind;

/// Where a source's settings come from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A table of the main file.
    MainFile,
    /// A file of the sources directory.
    File {
        /// The file.
        path: PathBuf,
    },
}

/// One source.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SourceView {
    /// Its provider.
    pub provider: ProviderKind,
    /// Its name, the `{source}` in its URL.
    pub name: String,
    /// Its merchant account, part of its record keys.
    pub account: Option<String>,
    /// Where its settings come from.
    pub origin: Origin,
    /// Whether it takes deliveries now (a refused file's source that never
    /// checked does not).
    pub serving: bool,
    /// When its settings in use were read (the main file's: at start).
    #[serde(with = "time::serde::rfc3339::option")]
    pub loaded_at: Option<OffsetDateTime>,
    /// Why its file is refused now, when it is (its last good settings, if
    /// any, stay in use).
    pub refused: Option<String>,
}

/// A file of the sources directory refused without a source of its own to
/// show it under (named wrongly, or named like a main-file source, which
/// is not the file's), or the directory itself unreadable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RefusedFile {
    /// The file (or the directory).
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// Every source and every refused file.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SourcesReport {
    /// By provider and name.
    pub sources: Vec<SourceView>,
    /// The files refused without a directory source to show them under.
    pub refused_files: Vec<RefusedFile>,
}

impl SourcesReport {
    /// Every file refused now, with or without a source name.
    pub fn refused(self) -> Vec<RefusedFile> {
        self.sources
            .into_iter()
            .filter_map(|source| match (source.origin, source.refused) {
                (Origin::File { path }, Some(reason)) => Some(RefusedFile { path, reason }),
                _ => None,
            })
            .chain(self.refused_files)
            .collect()
    }
}
