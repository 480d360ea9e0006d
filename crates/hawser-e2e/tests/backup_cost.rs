//! What an incremental backup costs (issue 43 acceptance b), through the real binary and a
//! real S3 server (SeaweedFS): a 1 GiB volume full of random data (incompressible, so zstd
//! hides nothing) is backed up, 1% of its 1 MiB blocks are changed by 4 KiB each, and the
//! second backup must cost at most 2% of the volume, as the S3 server counts it: the bytes
//! its S3 gateway received into the bucket (its own metric), and its disk's growth.

use hawser_api::backup::{Backup, BackupState};
use hawser_e2e::cluster::Cluster;
use hawser_e2e::run::qemu_io;
use hawser_e2e::{S3Server, TempDir};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 1024 * MIB;
/// Blocks changed between the backups: 1% of the volume's 1024.
const CHANGED: u64 = 10;

fn backup(c: &Cluster) -> Backup {
    let out = c.cli_ok(&[
        "backup", "create", "big", "--target", "offsite", "--wait", "-o", "json",
    ]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Ready, "{b:?}");
    b
}

fn disk_bytes(dir: &std::path::Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-s", "-B1"])
        .arg(dir)
        .output()
        .expect("du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du's answer")
}

#[test]
fn a_second_backup_after_one_percent_changed_costs_under_two_percent() {
    let dir = TempDir::new("backup-cost-s3");
    let s3 = S3Server::start(dir.path(), "backups");
    let c = Cluster::start("backup-cost", 1);
    s3.add_to(&c, "offsite", "");
    let uri = c.attached_volume("big", "1GiB", 1, "n1");
    // 1 GiB of random data, streamed into the volume.
    let fill = format!(
        "dd if=/dev/urandom bs=1M count={} iflag=fullblock status=none | nbdcopy - '{uri}'",
        SIZE / MIB
    );
    hawser_e2e::run_ok("sh", &["-c", &fill]);
    let first = backup(&c);
    let st = first.stats.clone().expect("stats");
    assert_eq!(st.new_blocks, SIZE / MIB, "{st:?}");

    // 1% of the blocks changed, 4 KiB in each, spread over the volume.
    let writes: Vec<String> = (0..CHANGED)
        .map(|i| format!("write -P {} {}M 4k", 0x40 + i, i * 97 + 5))
        .chain(["flush".to_string()])
        .collect();
    qemu_io(&uri, &writes.iter().map(String::as_str).collect::<Vec<_>>());

    let (got0, disk0) = (s3.received_bytes(), disk_bytes(&s3.data_dir()));
    let second = backup(&c);
    let (got1, disk1) = (s3.received_bytes(), disk_bytes(&s3.data_dir()));
    let st = second.stats.clone().expect("stats");
    assert_eq!(
        (st.new_blocks, st.reused_blocks),
        (CHANGED, SIZE / MIB - CHANGED),
        "{st:?}"
    );
    let received = got1 - got0;
    let grew = disk1.saturating_sub(disk0);
    let pct = |n: u64| n as f64 * 100.0 / SIZE as f64;
    eprintln!(
        "backup cost: second backup of 1 GiB with {CHANGED} of 1024 blocks changed: stored {} \
         bytes ({:.2}%), the S3 server received {received} bytes ({:.2}%), its disk grew {grew} \
         bytes ({:.2}%)",
        st.stored_bytes,
        pct(st.stored_bytes),
        pct(received),
        pct(grew)
    );
    let limit = SIZE / 50;
    assert!(st.stored_bytes <= limit, "{st:?}");
    assert!(received <= limit, "the S3 server received {received} bytes");
    assert!(grew <= limit, "the S3 server's disk grew by {grew} bytes");
    // And it did receive the changed blocks (random data does not compress): the counter
    // counts what it should.
    assert!(
        received >= CHANGED * MIB,
        "the S3 server received only {received} bytes"
    );
    let first_got = got0;
    assert!(
        first_got >= SIZE,
        "the first backup: {first_got} bytes received"
    );
}
