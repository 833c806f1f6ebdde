//! The text of a caught panic, for the log line or error that reports it.

use std::any::Any;

/// What a panic was raised with: its message, or a placeholder when the
/// payload is not text.
pub fn message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("no message")
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_kinds_of_panic_text_are_read() {
        let owned = std::panic::catch_unwind(|| panic!("{}", String::from("owned"))).unwrap_err();
        let fixed = std::panic::catch_unwind(|| panic!("fixed")).unwrap_err();
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7)).unwrap_err();
        assert_eq!(super::message(owned.as_ref()), "owned");
        assert_eq!(super::message(fixed.as_ref()), "fixed");
        assert_eq!(super::message(other.as_ref()), "no message");
    }
}
