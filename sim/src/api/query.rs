//! Query parameters of the simulated list APIs: paging, time windows and
//! required fields, checked the same way for both providers.
//!
//! A bad parameter is answered 400 through [`ApiError`].

use std::collections::HashMap;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::api::error::ApiError;

/// Query parameters as received (already percent-decoded).
pub type Params = HashMap<String, String>;

/// `page` (from 1) and `per_page` (1..=`max`), with defaults.
///
/// # Errors
/// 400 when either is not a positive integer or `per_page` is too large.
pub fn paging(
    params: &Params,
    default_per_page: usize,
    max: usize,
) -> Result<(usize, usize), ApiError> {
    let number = |name: &str, default: usize| match params.get(name) {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ApiError::bad_request(format!("{name} must be a positive integer"))),
    };
    let page = number("page", 1)?;
    let per_page = number("per_page", default_per_page)?;
    if per_page > max {
        return Err(ApiError::bad_request(format!(
            "per_page must be at most {max}"
        )));
    }
    Ok((page, per_page))
}

/// One page of `items` and the page count (at least 1, so page 1 always exists).
pub fn page<T>(items: Vec<T>, page: usize, per_page: usize) -> (Vec<T>, usize) {
    let total_pages = items.len().div_ceil(per_page).max(1);
    let start = (page - 1).saturating_mul(per_page);
    let items = items.into_iter().skip(start).take(per_page).collect();
    (items, total_pages)
}

/// An optional RFC 3339 time parameter. A `+` left unencoded in the query
/// arrives as a space; it is read back as the `+` of an offset.
///
/// # Errors
/// 400 when present but not RFC 3339.
pub fn time_param(params: &Params, name: &str) -> Result<Option<OffsetDateTime>, ApiError> {
    let Some(text) = params.get(name) else {
        return Ok(None);
    };
    OffsetDateTime::parse(&text.replace(' ', "+"), &Rfc3339)
        .map(Some)
        .map_err(|_| ApiError::bad_request(format!("{name} is not an RFC 3339 time: {text}")))
}

/// A required text parameter.
///
/// # Errors
/// 400 when absent or empty.
pub fn required<'a>(params: &'a Params, name: &str) -> Result<&'a str, ApiError> {
    params
        .get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("{name} is required")))
}

/// Whether `at` is in `[from, to)`; an absent bound is open.
pub fn in_window(
    at: OffsetDateTime,
    from: Option<OffsetDateTime>,
    to: Option<OffsetDateTime>,
) -> bool {
    from.is_none_or(|from| at >= from) && to.is_none_or(|to| at < to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn pages_cover_every_item_once() {
        let items: Vec<u32> = (0..25).collect();
        assert_eq!(page(items.clone(), 1, 10), ((0..10).collect(), 3));
        assert_eq!(page(items.clone(), 3, 10), ((20..25).collect(), 3));
        assert_eq!(page(items, 4, 10), (vec![], 3));
        assert_eq!(page(Vec::<u32>::new(), 1, 10), (vec![], 1));
    }

    #[test]
    fn paging_parameters_are_checked() {
        assert_eq!(paging(&params(&[]), 50, 200).unwrap(), (1, 50));
        assert_eq!(
            paging(&params(&[("page", "2"), ("per_page", "7")]), 50, 200).unwrap(),
            (2, 7)
        );
        assert!(paging(&params(&[("page", "0")]), 50, 200).is_err());
        assert!(paging(&params(&[("per_page", "x")]), 50, 200).is_err());
        assert!(paging(&params(&[("per_page", "201")]), 50, 200).is_err());
    }

    #[test]
    fn windows_include_from_and_exclude_to() {
        let from = Some(datetime!(2026-11-29 10:00 UTC));
        let to = Some(datetime!(2026-11-29 11:00 UTC));
        assert!(in_window(datetime!(2026-11-29 10:00 UTC), from, to));
        assert!(!in_window(datetime!(2026-11-29 11:00 UTC), from, to));
        assert!(in_window(datetime!(2000-01-01 0:00 UTC), None, to));
    }

    #[test]
    fn an_unencoded_plus_in_an_offset_still_parses() {
        let p = params(&[("from", "2026-11-29T17:00:00 07:00")]);
        assert_eq!(
            time_param(&p, "from").unwrap(),
            Some(datetime!(2026-11-29 10:00 UTC))
        );
        assert!(time_param(&params(&[("from", "yesterday")]), "from").is_err());
        assert_eq!(time_param(&params(&[]), "from").unwrap(), None);
    }
}
