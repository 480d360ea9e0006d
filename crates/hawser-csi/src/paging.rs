//! Pages of a List RPC (ListVolumes, ListSnapshots). A token is the last name of the previous
//! page, so an entry deleted between two pages does not shift the next one, and a token the
//! driver never gave is refused (ABORTED, as the CSI spec asks).

use tonic::Status;

const TOKEN_PREFIX: &str = "after:";

/// One page of `items` after `starting_token`, at most `max_entries` long (0: all), sorted by
/// `name`; and the token of the next page, empty on the last one.
pub fn page<T>(
    mut items: Vec<T>,
    name: impl Fn(&T) -> &str,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<T>, String), Status> {
    let max = usize::try_from(max_entries)
        .map_err(|_| Status::invalid_argument(format!("max_entries {max_entries} is negative")))?;
    let after = match starting_token {
        "" => None,
        t => Some(t.strip_prefix(TOKEN_PREFIX).ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {t:?} is not one this driver gave; list again from the start"
            ))
        })?),
    };
    items.sort_by(|a, b| name(a).cmp(name(b)));
    items.retain(|i| after.is_none_or(|a| name(i) > a));
    let len = if max == 0 {
        items.len()
    } else {
        max.min(items.len())
    };
    let next = if len < items.len() {
        items[..len]
            .last()
            .map(|last| format!("{TOKEN_PREFIX}{}", name(last)))
            .unwrap_or_default()
    } else {
        String::new()
    };
    items.truncate(len);
    Ok((items, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pages_follow_their_tokens_and_survive_deletions() {
        let all = names(&["c", "a", "e", "b", "d"]);
        let (p1, t1) = page(all.clone(), |s| s, 2, "").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p1, names(&["a", "b"]));
        // "c" deleted between the pages: the next page still starts after "b".
        let fewer: Vec<String> = all.into_iter().filter(|s| s != "c").collect();
        let (p2, t2) = page(fewer.clone(), |s| s, 0, &t1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p2, t2.as_str()), (names(&["d", "e"]), ""));
        let (p3, t3) = page(fewer, |s| s, 4, "").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p3.len(), t3.as_str()), (4, ""));
    }

    #[test]
    fn bad_tokens_and_sizes_are_refused() {
        let e = page(names(&["a"]), |s| s, 0, "x").err().map(|s| s.code());
        assert_eq!(e, Some(tonic::Code::Aborted));
        let e = page(names(&["a"]), |s| s, -1, "").err().map(|s| s.code());
        assert_eq!(e, Some(tonic::Code::InvalidArgument));
    }
}
