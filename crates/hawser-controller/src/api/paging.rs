//! Pages of a list route: `?limit=N` returns at most N items in name order, and a
//! `Link: <…&after=LAST>; rel="next"` header while more follow; `?after=NAME` starts after that
//! name. The cursor is a name, not an offset, so an item created or deleted between two pages
//! neither repeats nor hides another one. A list asked without either is whole, in the order
//! the route documents, as before paging existed (old clients, and the CLI's small tables).

use std::ops::Range;

use axum::http::{header, HeaderMap, HeaderValue, Uri};
use serde::Deserialize;

use crate::errors::ControllerError;

/// The largest page: a reply of this many volumes is a few MiB of JSON.
pub const MAX_PAGE: usize = 10_000;

/// `?limit=&after=`, for a route that takes nothing else (`deny_unknown_fields`, so a
/// misspelt parameter is refused rather than ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub limit: Option<usize>,
    pub after: Option<String>,
}

/// One page of `items`, by `name`, and the headers that point at the next one.
pub fn page<T>(
    items: Vec<T>,
    name: impl Fn(&T) -> String,
    q: &PageQuery,
    uri: &Uri,
) -> Result<(HeaderMap, Vec<T>), ControllerError> {
    if q.limit.is_none() && q.after.is_none() {
        return Ok((HeaderMap::new(), items));
    }
    let mut items: Vec<(String, T)> = items.into_iter().map(|i| (name(&i), i)).collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let (headers, range) = window(&items, |(n, _)| n.as_str(), q, uri)?;
    let page = items.into_iter().skip(range.start).take(range.len());
    Ok((headers, page.map(|(_, i)| i).collect()))
}

/// Which part of `sorted` (in `name` order) one page holds, and the headers that point at
/// the next one: a page of a list already in name order (the volume records' copy) costs
/// the page, not a copy and a sort of the list.
pub fn window<T>(
    sorted: &[T],
    name: impl Fn(&T) -> &str,
    q: &PageQuery,
    uri: &Uri,
) -> Result<(HeaderMap, Range<usize>), ControllerError> {
    let (limit, after) = (q.limit, q.after.as_deref());
    let mut headers = HeaderMap::new();
    if limit.is_none() && after.is_none() {
        return Ok((headers, 0..sorted.len()));
    }
    let limit = match limit {
        None => MAX_PAGE,
        Some(n) if (1..=MAX_PAGE).contains(&n) => n,
        Some(n) => {
            return Err(ControllerError::InvalidArgument {
                message: format!("limit {n} is out of range: give 1 to {MAX_PAGE}"),
            })
        }
    };
    let start = after.map_or(0, |after| sorted.partition_point(|i| name(i) <= after));
    let end = sorted.len().min(start + limit);
    if end < sorted.len() {
        if let Some(last) = end.checked_sub(1).and_then(|i| sorted.get(i)) {
            let link = format!("<{}>; rel=\"next\"", next_uri(uri, name(last)));
            // A name is percent-encoded, so the header value is ASCII; were it not, the page
            // would still be right and only the link missing.
            if let Ok(v) = HeaderValue::from_str(&link) {
                headers.insert(header::LINK, v);
            }
        }
    }
    Ok((headers, start..end))
}

/// `uri` with its `after` replaced by `last`, every other parameter kept.
fn next_uri(uri: &Uri, last: &str) -> String {
    let pairs = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .filter(|(k, _)| k != "after")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect::<Vec<_>>();
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &pairs {
        q.append_pair(k, v);
    }
    q.append_pair("after", last);
    format!("{}?{}", uri.path(), q.finish())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pages_follow_the_link_to_the_end_in_name_order() {
        let all = names(&["c", "a", "e", "b", "d"]);
        let mut uri: Uri = "/v1/volumes?limit=2".parse().unwrap();
        let mut seen = Vec::new();
        loop {
            let q = form_urlencoded::parse(uri.query().unwrap().as_bytes())
                .into_owned()
                .collect::<std::collections::HashMap<_, _>>();
            let q = PageQuery {
                limit: q.get("limit").map(|l| l.parse().unwrap()),
                after: q.get("after").cloned(),
            };
            let (h, p) = page(all.clone(), String::clone, &q, &uri).unwrap();
            seen.extend(p);
            let Some(link) = h.get(header::LINK) else {
                break;
            };
            let link = link.to_str().unwrap();
            let target = link.trim_start_matches('<').split('>').next().unwrap();
            uri = target.parse().unwrap();
        }
        assert_eq!(seen, names(&["a", "b", "c", "d", "e"]));
    }

    #[test]
    fn an_unpaged_list_is_whole_and_in_its_own_order() {
        let all = names(&["c", "a", "b"]);
        let q = PageQuery::default();
        let (h, p) = page(all.clone(), String::clone, &q, &"/v1/x".parse().unwrap()).unwrap();
        assert_eq!(p, all);
        assert!(h.is_empty());
    }

    #[test]
    fn the_link_keeps_other_parameters_and_encodes_the_name() {
        let uri: Uri = "/v1/backups?volume=v1&limit=1&after=x".parse().unwrap();
        let q = |after: &str| PageQuery {
            limit: Some(1),
            after: Some(after.to_string()),
        };
        let (h, p) = page(names(&["y", "z w"]), String::clone, &q("x"), &uri).unwrap();
        assert_eq!(p, names(&["y"]));
        assert_eq!(
            h.get(header::LINK).unwrap(),
            "</v1/backups?volume=v1&limit=1&after=y>; rel=\"next\""
        );
        let (h, p) = page(names(&["y", "z w"]), String::clone, &q("y"), &uri).unwrap();
        assert_eq!(p, names(&["z w"]));
        assert!(h.get(header::LINK).is_none(), "the last page has no link");
    }

    #[test]
    fn a_window_of_a_sorted_list_starts_after_a_name_it_may_not_hold() {
        let sorted = names(&["a", "b", "d", "e"]);
        let uri: Uri = "/v1/volumes?limit=2".parse().unwrap();
        let q = |after: Option<&str>| PageQuery {
            limit: Some(2),
            after: after.map(str::to_string),
        };
        let (h, r) = window(&sorted, String::as_str, &q(None), &uri).unwrap();
        assert_eq!(r, 0..2);
        assert_eq!(
            h.get(header::LINK).unwrap(),
            "</v1/volumes?limit=2&after=b>; rel=\"next\""
        );
        // "c" was deleted between two pages: the next starts at "d".
        let (h, r) = window(&sorted, String::as_str, &q(Some("c")), &uri).unwrap();
        assert_eq!((r, h.get(header::LINK)), (2..4, None));
        let (h, r) = window(&sorted, String::as_str, &q(Some("z")), &uri).unwrap();
        assert_eq!((r, h.get(header::LINK)), (4..4, None));
    }

    #[test]
    fn a_limit_out_of_range_is_refused_with_the_range() {
        for bad in [0, MAX_PAGE + 1] {
            let q = PageQuery {
                limit: Some(bad),
                after: None,
            };
            let e = page(names(&["a"]), String::clone, &q, &"/v1/x".parse().unwrap()).unwrap_err();
            assert!(e.to_string().contains("give 1 to"), "{e}");
        }
    }
}
