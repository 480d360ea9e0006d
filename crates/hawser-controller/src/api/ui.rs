//! The dashboard (`/ui`): a page built from `ui/` (Preact, bundled with esbuild; `make ui`)
//! and embedded in the binary, so it works with no internet access and no files beside the
//! controller. The page itself is public; everything it shows it reads from the REST API with
//! the admin token the user types in (kept in the tab's sessionStorage only).
//!
//! The headers forbid what an XSS would need: scripts and styles from this origin only (no
//! inline script, no eval), no framing, no referrer, no MIME sniffing.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../../../ui/dist/index.html");
const APP_JS: &str = include_str!("../../../../ui/dist/app.js");
const APP_CSS: &str = include_str!("../../../../ui/dist/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; form-action 'self'; \
                   base-uri 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The dashboard's routes, merged beside the API's (outside its token guard).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { file("text/css; charset=utf-8", APP_CSS) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_page_loads_only_its_own_files() {
        assert!(INDEX.contains(r#"src="app.js""#) && INDEX.contains(r#"href="app.css""#));
        assert!(
            !INDEX.contains("http://") && !INDEX.contains("https://"),
            "no CDN"
        );
        assert!(APP_JS.len() > 1000 && APP_CSS.len() > 100);
    }
}
