//! The NBD frontend against real clients: nbdinfo, qemu-io, fio's nbd engine and nbdcopy,
//! over TCP and unix sockets. A test whose client binary is missing says so and returns.

use std::process::Output;
use std::sync::atomic::Ordering;

use crate::nbd_support::{have, within, MemDevice, TestServer, EXPORT};
use serde_json::Value;
use tokio::process::Command;

const MIB: u64 = 1024 * 1024;

async fn run(what: &str, cmd: &mut Command) -> Output {
    cmd.kill_on_drop(true);
    let out = within(what, cmd.output())
        .await
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let text = format!(
        "{what} exited with {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    out
}

fn skip(program: &str) -> bool {
    if have(program) {
        return false;
    }
    eprintln!("SKIPPED: `{program}` is not installed (the Makefile installs it)");
    true
}

/// Every write payload reached the device 4096-aligned, as the replicas' O_DIRECT requires.
fn assert_aligned_writes(server: &TestServer) {
    assert_eq!(server.device.misaligned_writes.load(Ordering::SeqCst), 0);
}

fn check_nbdinfo_export(json: &Value, size: u64) {
    let export = &json["exports"][0];
    assert_eq!(export["export-name"], EXPORT, "{json}");
    assert_eq!(export["export-size"], size, "{json}");
    assert_eq!(export["block_size_minimum"], 512, "{json}");
    assert_eq!(export["block_size_preferred"], 4096, "{json}");
    assert_eq!(export["block_size_maximum"], 32 * MIB, "{json}");
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], true, "{flag}: {json}");
    }
    assert_eq!(export["is_read_only"], false, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_sees_size_block_sizes_and_list() {
    if skip("nbdinfo") {
        return;
    }
    let size = 64 * MIB;
    let server = TestServer::start(MemDevice::new(size)).await;
    let list_unix = format!("nbd+unix:///?socket={}", server.unix.display());
    let list_tcp = format!("nbd://{}", server.tcp);
    for uri in [server.tcp_uri(), server.unix_uri()] {
        let out = run(
            "nbdinfo --json",
            Command::new("nbdinfo").args(["--json", &uri]),
        )
        .await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo prints JSON");
        check_nbdinfo_export(&json, size);
        assert_eq!(
            json["structured"], false,
            "structured replies must be refused: {json}"
        );
    }
    for uri in [list_tcp, list_unix] {
        let args = ["--list", "--json", &uri];
        let out = run("nbdinfo --list", Command::new("nbdinfo").args(args)).await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo prints JSON");
        let exports = json["exports"].as_array().expect("exports array");
        assert_eq!(exports.len(), 1, "{json}");
        check_nbdinfo_export(&json, size);
    }
    // nbdinfo reads a little to guess the content type, but never writes.
    assert_eq!(
        server.device.writes.load(Ordering::SeqCst),
        0,
        "nbdinfo wrote"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_write_read_zero_flush_discard() {
    if skip("qemu-io") {
        return;
    }
    let server = TestServer::start(MemDevice::new(64 * MIB)).await;
    let script = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -z 1M 64k",
        "read -P 0 1M 64k",
        "flush",
        "discard 2M 64k",
        "read -P 0 2M 64k",
        // An unaligned write: qemu must do read-modify-write within our 512-byte minimum.
        "write -P 0xcd 3145729 100",
        "read -P 0xcd 3145729 100",
    ];
    for uri in [server.tcp_uri(), server.unix_uri()] {
        let mut cmd = Command::new("qemu-io");
        cmd.args(["-f", "raw", &uri]);
        for step in script {
            cmd.args(["-c", step]);
        }
        let out = run("qemu-io", &mut cmd).await;
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        for bad in ["Pattern verification failed", "error", "failed", "Error"] {
            assert!(!text.contains(bad), "qemu-io reported {bad:?}:\n{text}");
        }
        // Every step printed its completion line.
        assert_eq!(text.matches(" ops; ").count(), script.len() - 1, "{text}");
    }
    assert!(server.device.snapshot(0, MIB).iter().all(|&b| b == 0xab));
    assert!(server.device.flushes.load(Ordering::SeqCst) >= 2);
    assert_aligned_writes(&server);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_randwrite_with_crc32c_verify() {
    if skip("fio") {
        return;
    }
    let device = MemDevice::with_latency(128 * MIB, std::time::Duration::from_millis(1));
    let server = TestServer::start(device).await;
    let uri = server.tcp_uri();
    let uri_arg = format!("--uri={uri}");
    let args = [
        "--name=hawser-nbd",
        "--ioengine=nbd",
        uri_arg.as_str(),
        "--rw=randwrite",
        "--bsrange=4k-128k",
        "--size=64M",
        "--iodepth=32",
        "--verify=crc32c",
        "--verify_fatal=1",
    ];
    let out = run("fio", Command::new("fio").args(args)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("err= 0"), "fio did not report err=0:\n{text}");
    // The verify pass read everything back (fio reports it as a read phase).
    assert!(text.contains("read: IOPS="), "fio did not verify:\n{text}");
    assert!(server.device.writes.load(Ordering::SeqCst) > 0);
    assert!(
        server.device.max_in_flight.load(Ordering::SeqCst) > 1,
        "no parallelism seen"
    );
    assert_aligned_writes(&server);
    server.shutdown().await;
}

async fn sha256(path: &std::path::Path) -> String {
    let out = run("sha256sum", Command::new("sha256sum").arg(path)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopy_roundtrip_preserves_sha256() {
    if skip("nbdcopy") || skip("sha256sum") {
        return;
    }
    let size = 32 * MIB;
    let server = TestServer::start(MemDevice::new(size)).await;
    let input = server.dir.path().join("in.img");
    let output = server.dir.path().join("out.img");
    let data: Vec<u8> = {
        use rand::{RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x4e42_4443);
        let mut d = vec![0u8; usize::try_from(size).expect("fits memory")];
        rng.fill_bytes(&mut d);
        d
    };
    std::fs::write(&input, &data).expect("write input file");
    let input_arg = input.to_str().expect("utf-8 path");
    let output_arg = output.to_str().expect("utf-8 path");
    let uri = server.tcp_uri();
    run(
        "nbdcopy in",
        Command::new("nbdcopy").args([input_arg, uri.as_str()]),
    )
    .await;
    assert!(
        server.device.snapshot(0, size) == data,
        "device differs from input"
    );
    let unix = server.unix_uri();
    run(
        "nbdcopy out",
        Command::new("nbdcopy").args([unix.as_str(), output_arg]),
    )
    .await;
    assert_eq!(sha256(&input).await, sha256(&output).await);
    assert_aligned_writes(&server);
    server.shutdown().await;
}
