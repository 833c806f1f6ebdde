//! What `--api-fault` makes ReceiptRoller's simulated API do wrong: the ways
//! a flaky platform or a careless provider answers, which the real API does
//! not show on demand. Only the kinds live here; the answers are built by
//! the API handlers (`api::receiptroller`).

/// One way the Transactions API or the webhook API misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiFault {
    /// Every page answers the first page's items with `total_pages` 10⁹.
    EndlessPages,
    /// A page holds 100 times the items asked for (the first page's, repeated).
    OversizedPage,
    /// A page's body is padded to 200 MB (valid JSON, streamed).
    OversizedBody,
    /// A page's body stops halfway through its `Content-Length`.
    CutShort,
    /// A page's body comes one byte every 100 ms, past any sane timeout.
    Drip,
    /// Switching the webhook on is answered 307 to another host (this API
    /// as `localhost`), which answers anything 200 without switching it on.
    ResumeRedirect,
    /// Switching the webhook on is answered 200 `active: true`, but it stays off.
    ResumeUnconfirmed,
}
