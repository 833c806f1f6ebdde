//! A store file that cannot be used set aside: renamed to
//! `<path>.damaged-<unix seconds>` beside it, kept for a look (and, for the
//! spool, read for what can be salvaged), so that posbridge opens a new
//! file at the path and serves. Each store counts the set-aside files
//! beside it in `posbridge_store_files_set_aside{store}` from start-up on;
//! the alert on it fires until an operator has looked and removed them.

use std::path::{Path, PathBuf};

use crate::observe::telemetry;

/// What comes after the file's name in a set-aside file's name.
const SUFFIX: &str = ".damaged-";

/// Renames `path` to `<path>.damaged-<unix seconds>` (with `-2`, `-3`, …
/// after it should that name be taken) and returns the new name.
///
/// # Errors
/// The rename failed (then the file is where it was).
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let seconds = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut aside = with_suffix(path, &format!("{SUFFIX}{seconds}"));
    let mut next = 2;
    while aside.exists() {
        aside = with_suffix(path, &format!("{SUFFIX}{seconds}-{next}"));
        next += 1;
    }
    std::fs::rename(path, &aside)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The rename is durable with its directory; a failed sync leaves it
        // done in memory, which is all the new file at `path` needs.
        let _ = std::fs::File::open(dir).and_then(|dir| dir.sync_all());
    }
    Ok(aside)
}

/// Sets `posbridge_store_files_set_aside{store}` to the number of files
/// set aside beside `path`.
pub fn count_set_aside(store: &'static str, path: &Path) {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let prefix = format!(
        "{}{SUFFIX}",
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    let count = std::fs::read_dir(dir).map_or(0, |files| {
        files
            .filter_map(Result::ok)
            .filter(|file| file.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    });
    metrics::gauge!(telemetry::STORE_FILES_SET_ASIDE, telemetry::STORE => store).set(count as f64);
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_set_aside_keeps_its_bytes_under_a_new_name_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        std::fs::write(&path, b"first").unwrap();
        let first = set_aside(&path).unwrap();
        std::fs::write(&path, b"second").unwrap();
        let second = set_aside(&path).unwrap();
        assert_ne!(first, second, "a second set aside the same second");
        assert!(!path.exists());
        assert_eq!(std::fs::read(&first).unwrap(), b"first");
        assert_eq!(std::fs::read(&second).unwrap(), b"second");
        assert!(
            first
                .to_string_lossy()
                .starts_with(&format!("{}.damaged-", path.display())),
            "{}",
            first.display()
        );

        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || count_set_aside("ledger", &path));
        assert_eq!(
            telemetry::rendered(&recorder, telemetry::STORE_FILES_SET_ASIDE),
            "posbridge_store_files_set_aside{store=\"ledger\"} 2"
        );
    }
}
