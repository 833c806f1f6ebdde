//! An open store file that can be closed and opened again. After one I/O
//! error (a full disk) redb refuses every later write with "Previous I/O
//! error occurred" until its handle is closed and the file opened anew, so
//! the ledger and the spool both reopen their file once writes fail.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::StoreFileError;

/// How long a reopen waits for reads in progress to let go of the old
/// handle, and for the file's lock to be free once they have.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// The open handle of a store file (`T` holds the redb `Database`).
pub struct Reopenable<T> {
    /// `None` only while it is being reopened.
    slot: RwLock<Option<Arc<T>>>,
}

/// Why a reopen failed.
#[derive(Debug)]
pub enum ReopenError<E> {
    /// Reads held the old handle past the wait; it stays in use.
    Busy,
    /// The file could not be opened again.
    Open(E),
}

impl<T> Reopenable<T> {
    /// The handle of a file just opened.
    pub fn new(opened: T) -> Self {
        Reopenable {
            slot: RwLock::new(Some(Arc::new(opened))),
        }
    }

    /// The handle, or `None` while it is being reopened (or after a
    /// reopen that could not open the file).
    pub fn get(&self) -> Option<Arc<T>> {
        self.slot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Closes the handle once nothing reads through it and opens the file
    /// again with `open`. Blocking: it waits up to two seconds for reads to
    /// end, then for the file's lock (a read that just ended may hold it a
    /// moment longer), seen through `held`.
    ///
    /// # Errors
    /// [`ReopenError::Busy`] when reads keep the old handle (it is kept);
    /// [`ReopenError::Open`] with `open`'s error (then no handle is left
    /// and the next reopen tries again).
    pub fn reopen<E>(
        &self,
        open: impl Fn() -> Result<T, E>,
        held: impl Fn(&E) -> bool,
    ) -> Result<(), ReopenError<E>> {
        let mut slot = self.slot.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut old) = slot.take() {
            // The file admits one handle: wait for reads in progress to end.
            let deadline = Instant::now() + RELEASE_WAIT;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(opened) => break drop(opened),
                    Err(in_use) if Instant::now() < deadline => {
                        old = in_use;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(in_use) => {
                        *slot = Some(in_use);
                        return Err(ReopenError::Busy);
                    }
                }
            }
        }
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            match open() {
                Ok(opened) => {
                    *slot = Some(Arc::new(opened));
                    return Ok(());
                }
                Err(error) if held(&error) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => return Err(ReopenError::Open(error)),
            }
        }
    }
}

/// Whether `error` says the file is held (by this process's closing handle,
/// during a reopen): the `held` of [`Reopenable::reopen`].
pub fn is_held(error: &StoreFileError) -> bool {
    matches!(error, StoreFileError::Held { .. })
}
