//! `GET /v1/replicas/held`: the replicas this node holds (id, volume, failed), for the
//! controller's reconcile round, which looks for orphans and failed replicas every 5 s.
//!
//! Why a route of its own, with a tag. The round used to read `/v1/status`, which reads
//! every replica's metadata and disk usage and ships them: with 6,700 replicas on a node
//! that was about 2.7 MB per node every 5 s to build, send and decode, for three fields
//! (issue 44). This answer is built from memory, and it carries an `ETag`, a digest of its
//! own bytes; a request whose `If-None-Match` names the current tag gets `304 Not Modified`
//! and no body, so an idle cluster's rounds move a few hundred bytes.
//!
//! Why a digest and not a counter of changes: a counter is right only if every path that
//! changes the set (create, delete, trash, a replica failing, a pool opening) bumps it, and
//! only within one run of the agent. The digest is right by construction: the same tag means
//! the same list (the list is sorted, and 128 bits of SHA-256 do not collide by chance), also
//! across restarts and upgrades.

use axum::http::header::{CONTENT_TYPE, ETAG};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hawser_api::agent::HeldReplica;

/// The answer to a request that sent `if_none_match`, when the node holds `held`
/// (`NodeStorage::held`; the handler is `admin_api`'s).
pub fn answer(held: &[HeldReplica], if_none_match: Option<&HeaderValue>) -> Response {
    let body = match serde_json::to_vec(held) {
        Ok(b) => b,
        Err(e) => {
            let message = format!("cannot encode the replica list: {e}");
            return (StatusCode::INTERNAL_SERVER_ERROR, message).into_response();
        }
    };
    let json = HeaderValue::from_static("application/json");
    // Without a tag (it cannot fail to encode, but if it did) the list goes untagged, and the
    // controller keeps nothing to compare: never a 304 that a shared stand-in tag would give.
    let Some(tag) = tag(&body) else {
        return (StatusCode::OK, [(CONTENT_TYPE, json)], body).into_response();
    };
    if if_none_match.is_some_and(|v| v.as_bytes() == tag.as_bytes()) {
        return (StatusCode::NOT_MODIFIED, [(ETAG, tag)]).into_response();
    }
    (StatusCode::OK, [(CONTENT_TYPE, json), (ETAG, tag)], body).into_response()
}

/// A strong entity tag: the first 128 bits of the body's SHA-256, in hex, quoted.
fn tag(body: &[u8]) -> Option<HeaderValue> {
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    HeaderValue::from_str(&format!("\"{hex}\"")).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn held(ids: &[(&str, bool)]) -> Vec<HeldReplica> {
        ids.iter()
            .map(|(id, failed)| HeldReplica {
                replica_id: (*id).into(),
                volume: "v".into(),
                failed: *failed,
            })
            .collect()
    }

    fn etag(r: &Response) -> HeaderValue {
        r.headers().get(ETAG).unwrap().clone()
    }

    #[test]
    fn the_same_list_is_not_sent_again_and_any_change_is() {
        let first = answer(&held(&[("a", false), ("b", false)]), None);
        assert_eq!(first.status(), StatusCode::OK);
        let t = etag(&first);

        let again = answer(&held(&[("a", false), ("b", false)]), Some(&t));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(etag(&again), t);

        // A replica gone, one more, one failing, and a stale or garbled tag: the list.
        for changed in [
            held(&[("a", false)]),
            held(&[("a", false), ("b", false), ("c", false)]),
            held(&[("a", false), ("b", true)]),
        ] {
            let r = answer(&changed, Some(&t));
            assert_eq!(r.status(), StatusCode::OK);
            assert_ne!(etag(&r), t);
        }
        let garbled = HeaderValue::from_static("\"not a tag\"");
        let r = answer(&held(&[("a", false), ("b", false)]), Some(&garbled));
        assert_eq!(r.status(), StatusCode::OK);
    }
}
