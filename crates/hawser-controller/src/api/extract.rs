//! The API's extractors: `axum`'s JSON body, path and query extractors with rejections in the
//! API's error shape (`ApiError`), so a malformed request gets the same JSON errors as every
//! other failure. A file apart from the router so that handlers in any folder use these
//! without importing the router that calls them.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::constants::MAX_BODY_BYTES;
use crate::errors::ControllerError;

/// `axum::Json` whose rejections are JSON `ApiError`s: 400 for anything malformed (syntax,
/// wrong types, unknown fields, missing content type), 413 past the body limit.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ControllerError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ControllerError {
    let status = r.status().as_u16();
    if status == 413 {
        return ControllerError::BadBody {
            status,
            message: format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        };
    }
    let message = match r {
        JsonRejection::MissingJsonContentType(_) => {
            "expected a JSON body with Content-Type: application/json".to_string()
        }
        other => other.body_text(),
    };
    ControllerError::BadBody {
        status: 400,
        message,
    }
}

/// `axum::extract::Path` with JSON rejections.
pub struct ApiPath<T>(pub T);

/// The query string, with errors in the API's shape.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ControllerError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(ControllerError::BadBody {
                status: 400,
                message: r.body_text(),
            }),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ControllerError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(r) => Err(path_rejection(r)),
        }
    }
}

fn path_rejection(r: PathRejection) -> ControllerError {
    ControllerError::BadBody {
        status: 400,
        message: r.body_text(),
    }
}
