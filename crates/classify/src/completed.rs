//! What a stormguard future does when polled after it completed.

/// Panics, naming `future` (e.g. `"throttle ResponseFuture"`): what every stormguard future does
/// when it is polled again after it returned `Ready`, as a future may (tokio's `JoinHandle` does
/// too). One message for all of them, so that the panic says which layer's future it was.
#[cold]
#[track_caller]
pub fn polled_after_completion(future: &str) -> ! {
    panic!("stormguard's {future} polled after it completed")
}
