//! The commands that start the servers under test: the limit server (this
//! bench binary), the release posbridge and the peer's start script.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use crate::{LIMIT_SERVER, LedgerChoice, Settings, limit, load};

/// The limit server of `kind` on `addr`, producing to `topic`.
pub(crate) fn limit_command(
    settings: &Settings,
    addr: SocketAddr,
    topic: &str,
    kind: limit::LimitKind,
) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("bench binary"));
    command
        .arg(LIMIT_SERVER)
        .arg(addr.to_string())
        .arg(&settings.brokers)
        .arg(topic)
        .arg(kind.as_str())
        .args(settings.librdkafka.iter().map(|(k, v)| format!("{k}={v}")));
    command
}

/// The peer's start script on `addr` and the limit's sale topic (posbridge's
/// layout, compacted: the peer keys its records, see [`Dialect::Peer`]).
/// The script must `exec` its server, so that the child whose CPU and RSS
/// the bench reads is the server itself; it inherits the bench's CPUs and
/// environment (its own settings included), not `POSBRIDGE_BENCH_LIBRDKAFKA`.
pub(crate) fn camel_command(
    settings: &Settings,
    script: &Path,
    addr: SocketAddr,
    topic: &str,
) -> Command {
    let mut command = Command::new(script);
    command
        .arg(addr.port().to_string())
        .arg(&settings.brokers)
        .arg(topic);
    command
}

/// The release posbridge, `serve` with its defaults but for the listener,
/// broker, topic prefix, ledger and the bench's secret; its files in `dir`.
/// Its topics are its own (named after `dir`): on topics an earlier server
/// wrote, a new ledger would be filled from them first, and every
/// repetition would start on more state than the one before.
pub(crate) fn posbridge_command(
    settings: &Settings,
    addr: SocketAddr,
    run: &str,
    ledger: &LedgerChoice,
    dir: &Path,
    binary: &Path,
) -> Command {
    std::fs::create_dir_all(dir).expect("posbridge dir");
    let mut name = dir.file_name().expect("named dir").to_string_lossy();
    // A filled Redis ledger is one for the whole run (it cannot be copied
    // as the embedded file is): its topics are too, so each repetition
    // restarts on them, not on topics it never cached (which the ledger
    // would rightly forget whole first).
    if let LedgerChoice::Redis {
        prefix: Some(filled),
        ..
    } = ledger
    {
        name = filled.trim_end_matches([':', '.']).replace(':', "-").into();
    }
    let ledger = match ledger {
        LedgerChoice::Redis { url, prefix } => {
            let unique = format!("{run}.{name}:");
            let prefix = prefix.clone().unwrap_or(unique);
            format!("backend = \"redis\"\nredis_url = \"{url}\"\nredis_prefix = \"{prefix}\"")
        }
        LedgerChoice::Embedded(prepared) => {
            let path = dir.join("ledger.redb");
            if let Some(prepared) = prepared {
                std::fs::copy(prepared, &path).expect("copy the prepared ledger");
            }
            format!("path = \"{}\"", path.display())
        }
    };
    let librdkafka: String = settings
        .librdkafka
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    let text = format!(
        "[server]\nlisten = \"{addr}\"\n\
         [kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{run}.{name}.\"\npartitions = {}\n\
         [kafka.librdkafka]\n{librdkafka}\
         [ledger]\n{ledger}\n\
         [receiptroller.sources.main]\nsecrets = [\"{}\"]\n",
        settings.brokers,
        settings.partitions,
        load::SECRET,
    );
    let path = dir.join("posbridge.toml");
    std::fs::write(&path, text).expect("posbridge config");
    let mut command = Command::new(binary);
    command.arg("serve").arg("--config").arg(path);
    command
}
