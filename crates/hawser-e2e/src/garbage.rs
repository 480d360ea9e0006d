//! Garbage for the HTTP APIs (the controller's REST API, an agent's admin API), shared by
//! the tests that throw it at them in clear (`tests/bad_input.rs`) and inside TLS
//! (`tests/tls_garbage.rs`).

use std::ops::Range;

use rand::{Rng, RngCore};

/// Random bytes, as many as `len` picks.
pub fn random_bytes(rng: &mut impl RngCore, len: Range<usize>) -> Vec<u8> {
    let mut b = vec![0u8; rng.random_range(len)];
    rng.fill_bytes(&mut b);
    b
}

/// Garbage for an HTTP API: random bytes; a request line and headers with random parts (some
/// huge); a body announced longer than it is, or longer than any body may be; a request with
/// a made-up token and a random JSON-ish body. None carries a valid token.
pub fn http_garbage(rng: &mut impl RngCore) -> Vec<u8> {
    fn junk(rng: &mut impl RngCore, max: usize) -> Vec<u8> {
        random_bytes(rng, 0..max)
    }
    fn letters(rng: &mut impl RngCore, max: usize) -> Vec<u8> {
        junk(rng, max).iter().map(|b| b'a' + b % 26).collect()
    }
    let methods = ["GET", "PUT", "POST", "DELETE", "PATCH", "G\0T", ""];
    let paths = [
        "/v1/volumes",
        "/v1/nodes/n1",
        "/v1/replicas",
        "/v1/status",
        "/",
        "*",
    ];
    let mut v = Vec::new();
    match rng.random_range(0..4) {
        0 => return junk(rng, 4096),
        1 => {
            let m = methods[rng.random_range(0..methods.len())];
            let p = paths[rng.random_range(0..paths.len())];
            v.extend_from_slice(format!("{m} {p} HTTP/1.1\r\nhost: x\r\n").as_bytes());
            for _ in 0..rng.random_range(0..8) {
                v.extend_from_slice(b"x-");
                v.extend(letters(rng, 64));
                v.extend_from_slice(b": ");
                v.extend(letters(rng, 20_000));
                v.extend_from_slice(b"\r\n");
            }
            v.extend_from_slice(b"\r\n");
        }
        2 => {
            let announced = [10, 4096, 1 << 20, 10 << 20, u64::from(u32::MAX)];
            let n = announced[rng.random_range(0..announced.len())];
            v.extend_from_slice(
                format!("POST /v1/volumes HTTP/1.1\r\nhost: x\r\ncontent-length: {n}\r\n\r\n")
                    .as_bytes(),
            );
            v.extend(junk(rng, 8192));
        }
        _ => {
            let body = junk(rng, 2048);
            v.extend_from_slice(
                format!(
                    "PUT /v1/nodes/n1 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
                     content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    "0".repeat(64),
                    body.len() + 2
                )
                .as_bytes(),
            );
            v.push(b'{');
            v.extend(body);
            v.push(b'}');
        }
    }
    v
}
