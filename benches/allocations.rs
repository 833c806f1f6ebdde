//! Heap allocations a delivery's body costs, counted exactly (dhat's
//! counting allocator), so that they repeat from run to run where times
//! scatter: the body read posbridge's way (parsed into a tree borrowing from
//! its bytes, normalized into the event, its content written canonically,
//! the guard's state hash), the event encoded (single-object Avro), and the
//! same bytes parsed into a `serde_json::Value` alone (what posbridge parsed
//! into before), into posbridge's tree alone, and only tokenized.
//!
//! dhat counts a block per allocation; a `realloc` that grows a block is
//! not counted again (callgrind, in `scripts/callgrind-allocs`, counts every
//! call to the allocator: its figures for the whole request run higher).
//!
//! Run with `cargo bench --bench allocations`. Prints figures.

use posbridge::adapters::encode::Encoder;
use posbridge::adapters::providers::{self, Json};
use posbridge::config::RegistryConfig;
use posbridge::domain::event::ProviderKind;
use posbridge::domain::guard::state_hash;
use serde::de::IgnoredAny;
use serde_json::Value;

#[path = "shared/sale.rs"]
mod sale;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Heap allocations one call of `work` makes.
fn allocations<T>(work: impl FnOnce() -> T) -> u64 {
    let before = dhat::HeapStats::get().total_blocks;
    drop(std::hint::black_box(work()));
    dhat::HeapStats::get().total_blocks - before
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("allocations bench: run it with `cargo bench --bench allocations`");
        return;
    }
    let encoder = Encoder::new(&RegistryConfig::default(), &[])
        .await
        .expect("the registry-less encoder needs nothing");
    let body = sale::body();
    let source = sale::source();
    let ctx = sale::context(&source, &body);
    let provider = providers::for_kind(ProviderKind::ReceiptRoller);
    let read = || {
        let json = Json::parse(&body).expect("json");
        let normalized = provider.normalize(&json, &ctx).expect("normalizes");
        let hash = state_hash(&normalized.event, &normalized.content);
        (normalized.event, hash)
    };
    // Counted from here: what the runtime and the encoder set up is not.
    let _profiler = dhat::Profiler::builder().testing().build();
    let (event, _) = read();
    println!("{} bytes a body; allocations a call:", body.len());
    println!(
        "  body read posbridge's way (parse, normalize, content, hash): {}",
        allocations(read)
    );
    println!(
        "  the event encoded: {}",
        allocations(|| encoder.encode("bench.sales", &event).expect("encodes"))
    );
    println!(
        "  parsed into serde_json::Value alone: {}",
        allocations(|| serde_json::from_slice::<Value>(&body).expect("json"))
    );
    println!(
        "  parsed into posbridge's tree alone: {}",
        allocations(|| Json::parse(&body).map(|_| ()).expect("json"))
    );
    println!(
        "  tokenized alone: {}",
        allocations(|| serde_json::from_slice::<IgnoredAny>(&body).expect("json"))
    );
}
